// Package sim is a deterministic, virtual-time simulator of sluice's
// redistributor: a configd leader and hundreds to thousands of instances,
// driving the real allocation (alloc.ByName, alloc.DefaultFloor) and the
// real safe handover (alloc.Bound, alloc.Handover, alloc.Pending), to
// measure what the protocol promises: no aligned window over the limit,
// utilization of the limit, and how fast shares follow demand.
//
// Time is an int64 nanosecond clock advanced by an event queue; nothing
// sleeps and nothing runs concurrently. Randomness (message delays, lost
// writes, clock errors, demand walks) comes from one generator seeded by
// the scenario, so the same scenario always gives the same Report.
//
// What is modelled, and where it comes from:
//
//   - The leader (configd/publisher.go, publish and damp): on every batch of
//     record changes it allocates the target from the reported demands,
//     computes bounds from the last publish and the acknowledgements
//     (configd/handover.go, bounds), takes the handover step, looks again at
//     the publish's EffectiveFrom when growth waits for it, damps
//     demand-only changes (hysteresis max(1, total/100), at most one publish
//     per window) and publishes with EffectiveFrom = the first boundary at
//     least the margin ahead. configd's package main cannot be imported, so
//     bounds, damp and the publish step are transcribed here; alloc's
//     functions are called as they are.
//   - Instances (limiter/cluster/session.go, apply and report; the
//     limiter's SetLimit): a publish arrives after a delay, is applied from
//     its EffectiveFrom on the instance's own clock, or at once (in the
//     current window, keeping what it consumed) when it arrives late; a new
//     generation is acknowledged by a record write that reaches etcd after
//     another delay, or is lost; demand is an EWMA (½ old + ½ new) reported
//     every report interval, written only on a meaningful change or every
//     ten intervals; with no configd alive an instance enforces total / live
//     instances from the next boundary at least the margin ahead.
//   - Admissions: per instance per local window, min(offered, share in
//     force), spread evenly over the window or bunched at its start; an
//     instance whose clock is off by e has its window k in true time
//     [kW+e, (k+1)W+e), and its permits are counted into the true aligned
//     windows they fall in.
//   - Joins (an instance is live once its first record reaches etcd),
//     crashes (it stops at once; its lease and record go after the TTL),
//     leader failover (a standby resumes from etcd after a pause), a full
//     configd outage (instances fall back to total/N, then return).
package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/sluice-go/sluice/configd/alloc"
	"github.com/sluice-go/sluice/limiter/skew"
)

// HandoverFunc is the signature of alloc.Handover.
type HandoverFunc func(total int64, target, bound map[string]int64) (shares, granted map[string]int64)

// Sim runs one scenario. The function fields default to the real code;
// tests replace them to check that the simulator catches a broken
// protocol.
type Sim struct {
	Scenario Scenario
	Handover HandoverFunc                 // nil: alloc.Handover
	Bound    func(s alloc.Standing) int64 // nil: alloc.Bound
}

// Run runs sc with the real allocation and handover.
func Run(sc Scenario) (Report, error) { return (&Sim{Scenario: sc}).Run() }

// never stands for Go's zero time.Time in the transcribed leader logic: it
// is before every other time.
const never = math.MinInt64

// sharesRec is a published Shares record (schema.Shares, the fields that
// matter here).
type sharesRec struct {
	gen       int64
	effective int64 // EffectiveFrom, true ns
	total     int64
	shares    map[string]int64
	granted   map[string]int64
	cfgRev    int64
	published int64
}

// record is an instance record as etcd holds it (schema.InstanceRecord).
type record struct {
	demand int64
	gen    int64 // AppliedGeneration
}

// change is a scheduled quota change of an instance's limiter, from a
// boundary of its local clock.
type change struct{ from, q int64 }

// seg is a part of an instance's current local window with one quota and
// one offered load, from true time start.
type seg struct{ start, q, offered int64 }

type instance struct {
	id    string
	group string
	skew  int64 // local clock = true − skew
	alive bool  // the process runs
	keyed bool  // its record (and lease) is in etcd

	offered int64 // permits per window it would admit if allowed

	// limiter
	cur      int64
	pending  []change
	winStart int64 // true start of the current local window
	segs     []seg
	soFar    int64

	// session view
	shares     *sharesRec
	leaderSeen bool
	apSource   string
	apQuota    int64
	apGen      int64

	// reporter
	demand    float64
	askedAcc  float64 // permits asked since the last report, integrated
	askedT    int64
	lastAt    int64 // last report; never: none yet
	written   record
	wroteAt   int64
	haveWrite bool

	lastWrite   int64 // arrival of its last record write at etcd (FIFO)
	lastDeliver int64 // arrival of its last watch event (FIFO)
}

type engine struct {
	sc       Scenario
	handover HandoverFunc
	bound    func(alloc.Standing) int64
	algo     alloc.Algorithm
	rng      *rand.Rand
	q        queue
	now      int64
	w        int64
	end      int64 // true time the measurement ends (a whole number of windows)

	limit  int64
	cfgRev int64

	inst   []*instance
	groups map[string][]*instance
	keyed  int // instances with a record in etcd

	// etcd
	rec     *sharesRec
	records map[string]*record
	keys    bool // some configd replica holds an election key

	// leader
	leaderUp   bool
	epoch      int // bumped when a leader dies: stale timers are ignored
	published  int64
	maxGen     int64
	due        int64 // never: none
	dueTimer   int64 // time of the armed timer; never: none
	batchArmed bool

	m metrics
}

// Run runs the scenario and returns its report.
func (s *Sim) Run() (Report, error) {
	sc := s.Scenario
	if err := sc.Validate(); err != nil {
		return Report{}, err
	}
	algo, err := alloc.ByName(sc.Algorithm)
	if err != nil {
		return Report{}, err
	}
	e := &engine{
		sc:       sc,
		handover: s.Handover,
		bound:    s.Bound,
		algo:     algo,
		rng:      rand.New(rand.NewPCG(sc.Seed, sc.Seed^0x5eed51)),
		w:        int64(sc.Window),
		limit:    sc.Limit,
		cfgRev:   1,
		groups:   map[string][]*instance{},
		records:  map[string]*record{},
		keys:     true,
		leaderUp: true,
		due:      never,
		dueTimer: never,
	}
	if e.handover == nil {
		e.handover = alloc.Handover
	}
	if e.bound == nil {
		e.bound = alloc.Bound
	}
	e.end = int64(sc.Duration) / e.w * e.w
	e.m.init(e)
	e.setup()
	for e.q.len() > 0 {
		ev := e.q.pop()
		if ev.at > e.end+2*e.w {
			break
		}
		e.now = ev.at
		ev.fn()
	}
	return e.m.report(e), nil
}

func (e *engine) at(t int64, fn func()) { e.q.push(max(t, e.now), fn) }

func (e *engine) setup() {
	for _, g := range e.sc.Groups {
		for range g.Count {
			in := e.newInstance(g.Name, g.Demand, g.Skew, g.SkewSpread)
			e.at(int64(g.Join), func() { e.join(in) })
		}
	}
	for _, ev := range e.sc.Events {
		e.at(int64(ev.At), func() { e.event(ev) })
	}
	if w := e.sc.Walk; w != nil {
		var step func()
		step = func() {
			for _, in := range e.inst {
				if in.alive {
					f := math.Exp(w.Sigma * e.rng.NormFloat64())
					d := int64(math.Round(float64(in.offered) * f))
					e.setOffered(in, min(max(d, w.Min), w.Max))
				}
			}
			e.at(e.now+int64(w.Every), step)
		}
		e.at(int64(w.Every), step)
	}
	// Per aligned window: sample the shares in force against the ideal.
	for k := int64(0); k*e.w < e.end; k++ {
		e.at(k*e.w, func() { e.m.sample(e, k) })
	}
}

func (e *engine) newInstance(group string, demand int64, sk, spread Duration) *instance {
	n := len(e.groups[group])
	off := int64(sk)
	if spread > 0 {
		off += e.rng.Int64N(2*int64(spread)+1) - int64(spread)
	}
	in := &instance{
		id:      fmt.Sprintf("%s-%04d", group, n),
		group:   group,
		skew:    off,
		offered: demand,
		lastAt:  never,
	}
	e.inst = append(e.inst, in)
	e.groups[group] = append(e.groups[group], in)
	return in
}

func (e *engine) event(ev Event) {
	e.m.shift(e, ev)
	switch ev.Kind {
	case EventDemand:
		n := 0
		for _, in := range e.groups[ev.Group] {
			if in.alive && (ev.Count == 0 || n < ev.Count) {
				e.setOffered(in, ev.Demand)
				n++
			}
		}
	case EventJoin:
		g := e.group(ev.Group)
		for range ev.Count {
			e.join(e.newInstance(ev.Group, ev.Demand, g.Skew, g.SkewSpread))
		}
	case EventCrash:
		n := 0
		for _, in := range e.groups[ev.Group] {
			if in.alive && (ev.Count == 0 || n < ev.Count) {
				e.crash(in)
				n++
			}
		}
	case EventLimit:
		e.limit = ev.Limit
		e.cfgRev++
		for _, in := range e.inst {
			if in.alive {
				e.deliver(in, func() { e.apply(in) })
			}
		}
		e.notifyLeader()
	case EventFailover:
		e.leaderDown()
		e.at(e.now+int64(ev.Down), e.leaderResume)
	case EventOutage:
		e.leaderDown()
		if ev.Down > e.sc.LeaseTTL {
			e.at(e.now+int64(e.sc.LeaseTTL), func() { e.setKeys(false) })
		}
		e.at(e.now+int64(ev.Down), func() {
			e.setKeys(true)
			e.leaderResume()
		})
	}
}

func (e *engine) group(name string) Group {
	for _, g := range e.sc.Groups {
		if g.Name == name {
			return g
		}
	}
	return Group{}
}

// delay draws from d.
func (e *engine) delay(d Delay) int64 {
	v := int64(d.Min)
	if d.Max > d.Min {
		v += e.rng.Int64N(int64(d.Max-d.Min) + 1)
	}
	if d.TailP > 0 && e.rng.Float64() < d.TailP {
		v += int64(e.rng.ExpFloat64() * float64(d.TailMean))
	}
	return v
}

// deliver runs fn at in after a publish delay, in order with the instance's
// other watch events.
func (e *engine) deliver(in *instance, fn func()) {
	t := max(e.now+e.delay(e.sc.Publish), in.lastDeliver)
	in.lastDeliver = t
	e.at(t, func() {
		if in.alive {
			fn()
		}
	})
}

func (e *engine) setKeys(on bool) {
	e.keys = on
	for _, in := range e.inst {
		if in.alive {
			e.deliver(in, func() {
				in.leaderSeen = on
				e.apply(in) // the session does not acknowledge on a leader change
			})
		}
	}
}

// --- instances -------------------------------------------------------------

func (e *engine) join(in *instance) {
	if in.alive {
		return
	}
	in.alive = true
	in.askedT, in.askedAcc = e.now, 0
	in.lastDeliver, in.lastWrite = e.now, e.now
	// The limiter starts at quota 0 in the current local window.
	in.winStart = e.localWindowStart(in, e.now)
	in.segs = []seg{{start: e.now, q: 0, offered: in.offered}}
	e.at(in.winStart+e.w, func() { e.rollover(in) })
	// Session: the first (forced) record write makes it live; then it
	// loads the provider and applies.
	e.report(in, true)
	in.shares, in.leaderSeen = e.rec, e.keys
	e.apply(in)
	// Report ticker, at a random phase.
	ri := int64(e.sc.ReportInterval)
	var tick func()
	tick = func() {
		if !in.alive {
			return
		}
		e.apply(in)
		e.report(in, false)
		e.at(e.now+ri, tick)
	}
	e.at(e.now+ri, tick)
}

func (e *engine) crash(in *instance) {
	e.finishWindow(in, e.now)
	in.alive = false
	e.at(e.now+int64(e.sc.LeaseTTL), func() {
		if in.keyed {
			in.keyed = false
			e.keyed--
			delete(e.records, in.id)
			e.notifyLeader()
		}
	})
}

// localWindowStart is the true start time of the local window that
// contains true time t.
func (e *engine) localWindowStart(in *instance, t int64) int64 {
	l := t - in.skew
	return l - floorMod(l, e.w) + in.skew
}

func floorMod(a, b int64) int64 {
	r := a % b
	if r < 0 {
		r += b
	}
	return r
}

func (e *engine) setOffered(in *instance, o int64) {
	e.accrue(in)
	in.offered = o
	if in.alive {
		in.segs = append(in.segs, seg{start: e.now, q: in.cur, offered: o})
	}
}

// accrue integrates the permits asked up to now.
func (e *engine) accrue(in *instance) {
	in.askedAcc += float64(in.offered) * float64(e.now-in.askedT) / float64(e.w)
	in.askedT = e.now
}

// setLimit is limiter.SetLimit with an unchanged window: at ≤ now changes
// the current window at once (keeping what it consumed) and drops every
// scheduled change; a later at takes effect from the first local boundary
// at or after it and after the current window, replacing scheduled changes
// from then on.
func (e *engine) setLimit(in *instance, q, at int64) {
	nowL := e.now - in.skew
	if at <= nowL {
		in.pending = in.pending[:0]
		in.cur = q
		in.segs = append(in.segs, seg{start: e.now, q: q, offered: in.offered})
		return
	}
	from := max(at, in.winStart-in.skew+e.w)
	from += floorMod(-from, e.w)
	i := 0
	for i < len(in.pending) && in.pending[i].from < from {
		i++
	}
	in.pending = append(in.pending[:i], change{from: from, q: q})
}

// rollover ends the instance's local window and starts the next.
func (e *engine) rollover(in *instance) {
	if !in.alive {
		return
	}
	end := in.winStart + e.w
	e.finishWindow(in, end)
	in.winStart = end
	startL := end - in.skew
	for len(in.pending) > 0 && in.pending[0].from <= startL {
		in.cur = in.pending[0].q
		in.pending = in.pending[1:]
	}
	in.segs = append(in.segs[:0], seg{start: end, q: in.cur, offered: in.offered})
	in.soFar = 0
	e.at(end+e.w, func() { e.rollover(in) })
}

// finishWindow counts the admissions of the instance's current local
// window, up to true time end, into the aligned windows they fall in.
func (e *engine) finishWindow(in *instance, end int64) {
	bunched := e.sc.Admissions == AdmitBunched
	for j, s := range in.segs {
		c := end
		if j+1 < len(in.segs) {
			c = in.segs[j+1].start
		}
		if c <= s.start {
			continue
		}
		e.m.addOffered(e, s.start, c, s.offered)
		want := min(s.offered, s.q)
		if bunched {
			if n := want - in.soFar; n > 0 {
				e.m.admit(e, s.start, n)
				in.soFar += n
			}
			continue
		}
		if want <= 0 || in.soFar >= s.q {
			continue
		}
		r := float64(want) / float64(e.w) // permits per ns
		n := min(int64(math.Floor(r*float64(c-s.start)+1e-9)), s.q-in.soFar)
		if n <= 0 {
			continue
		}
		e.m.admitSpread(e, s.start, r, n)
		in.soFar += n
	}
}

// apply is session.apply: the share in force from the instance's view,
// set on its limiter if it changed. A new generation is acknowledged (a
// forced record write) when ack is true.
func (e *engine) apply(in *instance) bool {
	source, quota, gen, at := "", int64(0), int64(0), int64(0)
	switch s := in.shares; {
	case in.leaderSeen && s == nil:
		source = "shares"
	case in.leaderSeen:
		source, quota, gen, at = "shares", s.shares[in.id], s.gen, s.effective
	default:
		source, quota = "even", e.limit/int64(max(1, e.keyed))
	}
	if e.sc.ClockCut {
		bound := e.sc.ClockBound.D()
		u := time.Duration(in.skew)
		if u < 0 {
			u = -u
		}
		quota = skew.EnforcedShare(quota, e.sc.Window.D(), skew.Measurement{Known: true, Uncertainty: u}, bound)
	}
	if source == in.apSource && quota == in.apQuota && gen == in.apGen {
		return false
	}
	if at == 0 {
		nowL := e.now - in.skew + int64(e.sc.Margin)
		at = nowL + floorMod(-nowL, e.w)
	}
	e.setLimit(in, quota, at)
	newGen := gen != in.apGen
	in.apSource, in.apQuota, in.apGen = source, quota, gen
	return newGen && gen != 0
}

// onShares is the session receiving a Shares record through its watch.
func (e *engine) onShares(in *instance, rec *sharesRec) {
	if in.shares != nil && rec.gen < in.shares.gen {
		return
	}
	in.shares = rec
	if e.apply(in) {
		e.report(in, true)
	}
}

// report is session.report: update the demand EWMA, and write the record
// when it changed meaningfully, when forced, or every ten intervals.
func (e *engine) report(in *instance, force bool) {
	e.accrue(in)
	if in.lastAt != never {
		if el := e.now - in.lastAt; el > 0 {
			perWindow := in.askedAcc * float64(e.w) / float64(el)
			in.demand = 0.5*in.demand + 0.5*perWindow
		}
	}
	in.askedAcc, in.lastAt = 0, e.now
	rec := record{demand: int64(math.Round(in.demand)), gen: in.apGen}
	if !force && in.haveWrite && !meaningful(in.written, rec) && e.now-in.wroteAt < 10*int64(e.sc.ReportInterval) {
		return
	}
	in.written, in.wroteAt, in.haveWrite = rec, e.now, true
	e.m.writes++
	if e.sc.AckLoss > 0 && e.rng.Float64() < e.sc.AckLoss {
		e.m.lost++
		return
	}
	t := max(e.now+e.delay(e.sc.Ack), in.lastWrite)
	in.lastWrite = t
	e.at(t, func() {
		if !in.alive && !in.keyed {
			return // a write from a process that crashed before it landed
		}
		if !in.keyed {
			if !in.alive {
				return
			}
			in.keyed = true
			e.keyed++
		}
		r := rec
		e.records[in.id] = &r
		e.notifyLeader()
	})
}

func meaningful(old, cur record) bool {
	dd := cur.demand - old.demand
	if dd < 0 {
		dd = -dd
	}
	return cur.gen != old.gen || (dd > 1 && float64(dd) > 0.05*float64(max(old.demand, 1)))
}

// --- the leader -------------------------------------------------------------

// leaderBatch is how long the leader takes to gather a batch of watch
// events before it publishes: etcd hands a watcher many events at once.
const leaderBatch = int64(5 * time.Millisecond)

func (e *engine) notifyLeader() {
	if !e.leaderUp || e.batchArmed {
		return
	}
	e.batchArmed = true
	ep := e.epoch
	e.at(e.now+leaderBatch, func() {
		if ep != e.epoch {
			return
		}
		e.batchArmed = false
		e.publish()
	})
}

func (e *engine) leaderDown() {
	e.leaderUp = false
	e.epoch++
	e.batchArmed = false
	e.due, e.dueTimer = never, never
	e.m.failovers++
}

// leaderResume is a new leader loading from etcd: the last publish, its
// time (clamped to now), every record; then it publishes at once.
func (e *engine) leaderResume() {
	e.leaderUp = true
	if e.rec != nil {
		e.published = min(e.rec.published, e.now)
		e.maxGen = max(e.maxGen, e.rec.gen)
	}
	e.publish()
}

// armDue sets the leader's timer for a damped or waiting change.
func (e *engine) armDue() {
	if e.due == never || e.due == e.dueTimer {
		return
	}
	e.dueTimer = e.due
	ep, at := e.epoch, e.due
	e.at(at, func() {
		if ep != e.epoch || e.due != at {
			return
		}
		e.dueTimer = never
		e.publish()
	})
}

// publish is configd's publisher.publish for one provider.
func (e *engine) publish() {
	if !e.leaderUp {
		return
	}
	e.due = never
	defer e.armDue()
	ids := make([]string, 0, e.keyed)
	for _, in := range e.inst {
		if in.keyed {
			ids = append(ids, in.id)
		}
	}
	slices.Sort(ids)
	ins := make([]alloc.Instance, len(ids))
	for i, id := range ids {
		ins[i] = alloc.Instance{ID: id, Demand: float64(e.records[id].demand)}
	}
	split, err := e.algo(e.limit, alloc.DefaultFloor(e.limit, len(ins)), ins)
	if err != nil {
		panic(fmt.Sprintf("sim: allocation failed: %v", err)) // inputs are built valid
	}
	target := make(map[string]int64, len(ids))
	for i, id := range ids {
		target[id] = split[i]
	}
	shares, granted := e.handover(e.limit, target, e.bounds())
	cur := e.rec
	if alloc.Pending(shares, target) && cur != nil && e.now < cur.effective {
		e.due = cur.effective
	}
	reason, retry := e.damp(shares)
	if wi := e.sc.WhatIf; wi != nil && wi.UndampedGrowth && reason == dampHysteresis && cur != nil && alloc.Pending(cur.shares, target) && grows(cur.shares, shares) {
		reason, retry = "", never
		if next := e.published + e.w; e.now < next {
			reason, retry = dampRate, next
		}
	}
	switch reason {
	case "":
	case dampUnchanged:
		return
	default:
		if wi := e.sc.WhatIf; wi != nil && wi.KeepDue && retry == never {
			e.m.damped[reason]++
			return
		}
		if e.due == never || retry < e.due {
			e.due = retry
		}
		e.m.damped[reason]++
		return
	}
	var sum int64
	for _, v := range shares {
		sum += v
	}
	if sum > e.limit {
		e.m.refused++ // schema.Encode refuses shares over the limit
		return
	}
	e.maxGen++
	eff := e.now + int64(e.sc.Margin)
	eff += floorMod(-eff, e.w)
	rec := &sharesRec{gen: e.maxGen, effective: eff, total: e.limit, shares: shares,
		granted: granted, cfgRev: e.cfgRev, published: e.now}
	e.rec, e.published = rec, e.now
	e.m.publishes++
	for _, in := range e.inst {
		if in.alive {
			e.deliver(in, func() { e.onShares(in, rec) })
		}
	}
}

// grows reports whether some share in next is above its published value.
func grows(published, next map[string]int64) bool {
	for id, v := range next {
		if v > published[id] {
			return true
		}
	}
	return false
}

// bounds is configd's bounds: what each live instance may be enforcing now
// under the last publish.
func (e *engine) bounds() map[string]int64 {
	b := make(map[string]int64, e.keyed)
	cur := e.rec
	if cur == nil {
		return b
	}
	inEffect := e.now >= cur.effective
	for _, in := range e.inst {
		if !in.keyed {
			continue
		}
		share, named := cur.shares[in.id]
		grant, granted := cur.granted[in.id]
		b[in.id] = e.bound(alloc.Standing{
			Share:    share,
			Grant:    grant,
			Named:    named || granted,
			Acked:    e.records[in.id].gen >= cur.gen,
			InEffect: inEffect,
		})
	}
	return b
}

const (
	dampUnchanged  = "unchanged"
	dampHysteresis = "hysteresis"
	dampRate       = "rate_limit"
)

// damp is configd's damp.
func (e *engine) damp(split map[string]int64) (string, int64) {
	cur := e.rec
	if cur == nil || cur.total != e.limit || len(cur.shares) != len(split) {
		return "", never
	}
	var moved int64
	for id, v := range split {
		old, ok := cur.shares[id]
		if !ok {
			return "", never
		}
		moved = max(moved, v-old, old-v)
	}
	switch {
	case moved == 0:
		return dampUnchanged, never
	case cur.cfgRev != e.cfgRev:
		return "", never
	case moved <= max(1, e.limit/100):
		return dampHysteresis, never
	}
	if next := e.published + e.w; e.now < next {
		return dampRate, next
	}
	return "", never
}
