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
//   - The leader (configd/publisher.go, publish): on every batch of record
//     changes, and when its last decision's Due time comes, it allocates the
//     target from the reported demands (alloc.ByName, alloc.DefaultFloor)
//     and runs configd's very publish decision, plan.Decide: damping,
//     the handover under way, the safe handover step, the follow-up at the
//     publish's EffectiveFrom and the boundary a publish takes effect from.
//     What is left here is the plumbing around it: the leader's state
//     (the published record, its time, the target under way, the timer)
//     and the refusal of shares over the limit (schema.Encode).
//   - Instances (limiter/cluster/session.go, apply and report; the
//     limiter's SetLimit): a publish arrives after a delay and is
//     scheduled by the session's very rule, follow.Schedule: from its
//     EffectiveFrom on the instance's own clock, or at once (in the
//     current window, keeping what it consumed) when it arrives late; a
//     switch between the even split and configd's shares takes the smaller
//     quota at once and the new one from the first boundary at least the
//     margin ahead. A new generation is acknowledged by a record write
//     that reaches etcd after another delay, or is lost; demand is
//     smoothed by follow.Smooth and reported every report interval,
//     written when follow.Due says so (a meaningful change, or ten
//     intervals); with no configd alive an instance enforces
//     total / live instances.
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
	"github.com/sluice-go/sluice/configd/plan"
	"github.com/sluice-go/sluice/internal/follow"
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
	Schedule ScheduleFunc                 // nil: follow.Schedule
}

// ScheduleFunc is the signature of follow.Schedule.
type ScheduleFunc func(prev, next follow.Applied, at, now int64, margin time.Duration) follow.Step

// Run runs sc with the real allocation and handover.
func Run(sc Scenario) (Report, error) { return (&Sim{Scenario: sc}).Run() }

// never stands for "no time": no timer armed, no record write yet.
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

func (r record) follow() follow.Record { return follow.Record{Demand: r.demand, Generation: r.gen} }

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
	planner  plan.Planner
	schedule ScheduleFunc
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
	target     map[string]int64 // the target a handover is moving toward (plan.Decision.Target)
	due        int64            // never: none
	dueTimer   int64            // time of the armed timer; never: none
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
		planner:  plan.Planner{Handover: s.Handover, Bound: s.Bound},
		schedule: s.Schedule,
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
	if e.schedule == nil {
		e.schedule = follow.Schedule
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
// set on its limiter (follow.Schedule) if it changed. It reports whether a
// new generation was applied, which the caller acknowledges (a forced
// record write).
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
	w := e.sc.Window.D()
	nowL := e.now - in.skew
	step := e.schedule(follow.Applied{Source: in.apSource, Quota: in.apQuota, Window: w},
		follow.Applied{Source: source, Quota: quota, Window: w}, at, nowL, e.sc.Margin.D())
	if step.Cut {
		e.setLimit(in, step.Interim, nowL)
	}
	e.setLimit(in, quota, step.From)
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

// report is session.report: update the demand estimate, and write the
// record when forced or when follow.Due says so.
func (e *engine) report(in *instance, force bool) {
	e.accrue(in)
	if in.lastAt != never {
		if el := e.now - in.lastAt; el > 0 {
			perWindow := in.askedAcc * float64(e.w) / float64(el)
			in.demand = follow.Smooth(in.demand, perWindow)
		}
	}
	in.askedAcc, in.lastAt = 0, e.now
	rec := record{demand: int64(math.Round(in.demand)), gen: in.apGen}
	if !force && in.haveWrite && !follow.Due(in.written.follow(), rec.follow(), time.Duration(e.now-in.wroteAt), e.sc.ReportInterval.D()) {
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
	e.target = nil // a new leader starts with no target, as configd's state does
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

// publish is configd's publisher.publish for one provider: allocate, let
// plan.Decide decide, publish what it says.
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
	acked := make(map[string]int64, len(ids))
	for i, id := range ids {
		target[id] = split[i]
		acked[id] = e.records[id].gen
	}
	var cur *plan.Published
	if r := e.rec; r != nil {
		cur = &plan.Published{
			Generation:     r.gen,
			EffectiveFrom:  time.Unix(0, r.effective),
			Total:          r.total,
			Window:         e.sc.Window.D(),
			ConfigRevision: r.cfgRev,
			Shares:         r.shares,
			Granted:        r.granted,
			At:             time.Unix(0, e.published),
		}
	}
	d := e.planner.Decide(plan.Input{
		Total:          e.limit,
		Window:         e.sc.Window.D(),
		ConfigRevision: e.cfgRev,
		Margin:         e.sc.Margin.D(),
		Target:         target,
		Acked:          acked,
		Cur:            cur,
		Moving:         e.target,
		Now:            time.Unix(0, e.now),
	})
	e.target = d.Target
	if !d.Due.IsZero() {
		e.due = d.Due.UnixNano()
	}
	if d.Damped != "" {
		e.m.damped[d.Damped]++
	}
	if !d.Publish {
		return
	}
	var sum int64
	for _, v := range d.Shares {
		sum += v
	}
	if sum > e.limit {
		e.m.refused++ // schema.Encode refuses shares over the limit
		return
	}
	e.maxGen++
	rec := &sharesRec{gen: e.maxGen, effective: d.EffectiveFrom.UnixNano(), total: e.limit, shares: d.Shares,
		granted: d.Granted, cfgRev: e.cfgRev, published: e.now}
	e.rec, e.published = rec, e.now
	e.m.publishes++
	for _, in := range e.inst {
		if in.alive {
			e.deliver(in, func() { e.onShares(in, rec) })
		}
	}
}
