// Package sim is a deterministic, virtual-time simulator of sluice's
// protocol: a configd leader and from a few to thousands of instances,
// running the real code of each side over virtual time, so that the
// guarantee — no aligned window over the limit, also while shares, limits,
// windows and clocks change — is checked for whole random histories
// (Search) and its cost measured (Run over scenario files, make sim).
//
// Time is an int64 nanosecond clock advanced by an event queue; nothing
// sleeps and nothing runs concurrently. Randomness (message delays, lost
// writes, demand walks) comes from one generator seeded by the scenario, so
// the same scenario always gives the same Report.
//
// What runs, and where it comes from:
//
//   - The leader (configd/publisher.go, publish): on every batch of record
//     changes, and when its last decision's Due time comes, it allocates the
//     target from the reported demands (alloc.ByName, alloc.DefaultFloor)
//     and runs configd's very publish decision, plan.Decide, on its own
//     clock (Scenario.ConfigdClock, configd-clock events): damping, the
//     handover (alloc.Handover over share.Bound), the boundary a publish
//     takes effect from. Around it, the leader's state as configd keeps it:
//     the published record, its time, the target under way, the timer.
//   - Instances (limiter/cluster/session.go, apply and report): each is a
//     real limiter.Limiter on a virtual clock that is off from true time by
//     the instance's skew. What it enforces is decided by the member's very
//     rules (follow.Next, follow.Schedule) and set with the limiter's
//     Schedule, as cluster.Member does; with ClockCut its share is cut by
//     skew.EnforcedShare and its limiter keeps a guard band of its clock's
//     uncertainty. A new generation is acknowledged by a record write that
//     reaches etcd after a delay, or is lost; demand is smoothed by
//     follow.Smooth and written when follow.Due says so. With no configd
//     alive an instance enforces total / live instances.
//   - Admissions: every instance offers a steady load and takes what its
//     limiter grants (TryAcquireN), a few times per window on its own
//     clock: with pacing ("spread") or taking its backlog at once
//     ("bunched"). Each grant is counted into the aligned windows of true
//     time it falls in.
//   - The oracle (oracle.go) checks every aligned window of every length
//     the run used against the largest limit any instance may have been
//     enforcing during it (see Report.Over).
//   - Joins (an instance is live once its first record reaches etcd),
//     crashes (it stops at once; its lease and record go after the TTL),
//     restarts with the same id, limit and window changes, deleting and
//     re-creating the provider, leader failover (a standby resumes from
//     etcd after a pause, with no memory), a full configd outage
//     (instances fall back to total/N, then return), late, lost and
//     reordered messages.
package sim

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"

	"github.com/sluice-go/sluice/configd/alloc"
	"github.com/sluice-go/sluice/configd/plan"
	"github.com/sluice-go/sluice/internal/follow"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/internal/share"
)

// HandoverFunc is the signature of alloc.Handover.
type HandoverFunc func(total int64, target, bound map[string]int64) (shares, granted map[string]int64)

// ScheduleFunc is the signature of follow.Schedule.
type ScheduleFunc func(prev, next follow.Applied, cur follow.InForce, at, now int64, margin time.Duration) follow.Step

// Sim runs one scenario. The function fields default to the real code;
// tests replace them to check that the simulator catches a broken
// protocol.
type Sim struct {
	Scenario Scenario
	Handover HandoverFunc                 // nil: alloc.Handover
	Bound    func(s share.Standing) int64 // nil: share.Bound
	Schedule ScheduleFunc                 // nil: follow.Schedule, then follow.Returned
	// Trace, if set, receives a line for every publish, every quota an
	// instance applies and every record that reaches etcd: what a replay
	// reads to find out why a window went over.
	Trace io.Writer
	// noHold, for tests, frees a gone instance's grant as soon as its key
	// goes, as the leader did before late records grew at once.
	noHold bool
}

// Run runs sc with the real code.
func Run(sc Scenario) (Report, error) { return (&Sim{Scenario: sc}).Run() }

// never stands for "no time": no timer armed, no record write yet.
const never = math.MinInt64

// config is the provider's config as etcd holds it.
type config struct {
	limit  int64
	window time.Duration
	rev    int64 // its ModRevision: bumped by every change
	idx    int   // which of the run's configs (regimes) it is
}

// sharesRec is the provider's share records as etcd holds them after a
// publish (schema.ShareRecord, one per instance, the fields that matter
// here): each instance's record keeps the generation, boundary, regime and
// write time of the publish that last changed it.
type sharesRec struct {
	gen       int64
	effective int64 // the newest publish's EffectiveFrom, ns
	window    time.Duration
	total     int64
	shares    map[string]int64
	granted   map[string]int64
	cfgRev    int64
	cfgIdx    int // the config the newest publish was computed under
	before    *plan.Transition
	published int64 // on the leader's clock

	// Per instance ID: its record's generation, boundary (ns), the config
	// it was computed under, and when it was written in true time (the
	// order etcd gives it among writes).
	gens, froms, pubs map[string]int64
	idxs              map[string]int
}

// record is an instance record as etcd holds it (schema.InstanceRecord).
type record struct {
	demand      int64
	gen         int64 // AppliedGeneration
	appliedFrom int64 // AppliedFrom: when that generation governs whole windows
	source      string
	enforced    int64 // Enforced: the quota applied, per window of its source
	inc         int   // the process (incarnation) that wrote it
	regAt       int64 // when that process registered (its key's creation), true time
}

func (r record) follow() follow.Record {
	return follow.Record{Demand: r.demand, Generation: r.gen, Source: r.source, Enforced: r.enforced}
}

type engine struct {
	sc       Scenario
	trace    io.Writer
	planner  plan.Planner
	schedule ScheduleFunc
	algo     alloc.Algorithm
	rng      *rand.Rand
	q        queue
	now      int64
	end      int64 // true time the measurement ends (a whole number of windows)
	tick     int64 // how often an instance takes permits, on its own clock

	cfg    *config  // nil: the provider is deleted
	cfgRev int64    // the config key's revision, never reused
	limits []regime // every config the run set, in order (config.idx)

	inst   []*instance
	groups map[string][]*instance
	keyed  int // instances with a record (lease) in etcd
	marks  int // of them, even-split confirmations in etcd

	// etcd
	rec     *sharesRec
	records map[string]*record
	keys    bool // some configd replica holds an election key

	// leader
	leaderUp   bool
	clock      int64 // the leader's clock minus true time
	epoch      int   // bumped when a leader dies: stale timers are ignored
	published  int64
	maxGen     int64
	target     map[string]int64 // the target a handover is moving toward (plan.Decision.Target)
	due        int64            // never: none
	dueTimer   int64            // time of the armed timer; never: none
	batchArmed bool
	// held is, per instance whose key went, until when (true time) the
	// leader keeps its grant from the others, and the Settle it counted:
	// configd's hold, of which only Settle matters here
	// (schema.ProviderConfig.Settle), since a simulated process stops at
	// once, its key going a lease TTL later.
	held   map[string]simHold
	noHold bool // Sim.noHold

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
		trace:    s.Trace,
		algo:     algo,
		rng:      rand.New(rand.NewPCG(sc.Seed, sc.Seed^0x5eed51)),
		groups:   map[string][]*instance{},
		records:  map[string]*record{},
		held:     map[string]simHold{},
		noHold:   s.noHold,
		keys:     true,
		leaderUp: true,
		clock:    int64(sc.ConfigdClock),
		due:      never,
		dueTimer: never,
	}
	if e.schedule == nil {
		e.schedule = func(prev, next follow.Applied, cur follow.InForce, at, now int64, margin time.Duration) follow.Step {
			return follow.Returned(follow.Schedule(prev, next, cur, at, now, margin), prev, next, cur, now, e.hold())
		}
	}
	w := int64(sc.Window)
	e.end = int64(sc.Duration) / w * w
	e.tick = e.shortestWindow() / ticksPerWindow
	e.setConfig(sc.Limit, sc.Window.D())
	e.m.init(e)
	e.setup()
	for e.q.len() > 0 {
		ev := e.q.pop()
		if ev.at > e.end+2*w {
			break
		}
		e.now = ev.at
		ev.fn()
	}
	e.now = e.end
	for _, in := range e.inst {
		in.stop(e)
	}
	return e.m.report(e), nil
}

// ticksPerWindow is how many times per window of the shortest length an
// instance takes permits.
const ticksPerWindow = 8

func (e *engine) shortestWindow() int64 {
	w := int64(e.sc.Window)
	for _, ev := range e.sc.Events {
		if ev.Window > 0 {
			w = min(w, int64(ev.Window))
		}
	}
	return w
}

func (e *engine) at(t int64, fn func()) { e.q.push(max(t, e.now), fn) }

// tracef writes a line of the trace, if one is wanted.
func (e *engine) tracef(format string, args ...any) {
	if e.trace != nil {
		fmt.Fprintf(e.trace, "%12s  %s\n", time.Duration(e.now), fmt.Sprintf(format, args...))
	}
}

// setConfig is the operator writing the provider's config (create or
// change): a new revision and a new regime for the oracle.
func (e *engine) setConfig(limit int64, window time.Duration) {
	e.cfgRev++
	e.cfg = &config{limit: limit, window: window, rev: e.cfgRev, idx: len(e.limits)}
	e.limits = append(e.limits, regime{limit: limit, window: window})
	e.settleChanged()
}

func (e *engine) setup() {
	for _, g := range e.sc.Groups {
		for range g.Count {
			in := e.newInstance(g, g.Demand)
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
					in.setOffered(e, min(max(d, w.Min), w.Max))
				}
			}
			e.at(e.now+int64(w.Every), step)
		}
		e.at(int64(w.Every), step)
	}
	// Per aligned window of the scenario's length: the shares in force
	// against the ideal allocation, for the convergence figures.
	for k := int64(0); k*int64(e.sc.Window) < e.end; k++ {
		e.at(k*int64(e.sc.Window), func() { e.m.sample(e, k) })
	}
}

func (e *engine) newInstance(g Group, demand int64) *instance {
	group := g.Name
	n := len(e.groups[group])
	off := int64(g.Skew)
	if g.SkewSpread > 0 {
		off += e.rng.Int64N(2*int64(g.SkewSpread)+1) - int64(g.SkewSpread)
	}
	in := &instance{
		id:       fmt.Sprintf("%s-%04d", group, n),
		group:    group,
		skew:     off,
		offered:  demand,
		phase:    e.rng.Int64N(e.tick),
		interval: cmp.Or(g.ReportInterval.D(), e.sc.ReportInterval.D()),
	}
	e.inst = append(e.inst, in)
	e.groups[group] = append(e.groups[group], in)
	return in
}

// members returns up to count live members of group (all when count is 0).
func (e *engine) members(group string, count int) []*instance {
	var out []*instance
	for _, in := range e.groups[group] {
		if in.alive && (count == 0 || len(out) < count) {
			out = append(out, in)
		}
	}
	return out
}

func (e *engine) event(ev Event) {
	e.m.shift(e, ev)
	switch ev.Kind {
	case EventDemand:
		for _, in := range e.members(ev.Group, ev.Count) {
			in.setOffered(e, ev.Demand)
		}
	case EventJoin:
		g := e.group(ev.Group)
		for range ev.Count {
			e.join(e.newInstance(g, ev.Demand))
		}
	case EventCrash:
		for _, in := range e.members(ev.Group, ev.Count) {
			e.crash(in)
		}
	case EventRestart:
		for _, in := range e.members(ev.Group, ev.Count) {
			e.crash(in)
			e.at(e.now+int64(ev.Down), func() { e.join(in) })
		}
	case EventLimit, EventCreate:
		w := ev.Window.D()
		if w == 0 {
			w = e.sc.Window.D()
			if e.cfg != nil {
				w = e.cfg.window
			}
		}
		e.setConfig(ev.Limit, w)
		e.broadcastConfig()
	case EventDelete:
		// configd delete removes the config; the shares record stays,
		// with the grants instances that have not yet seen the deletion
		// may still enforce, for a provider created again to start from.
		e.cfg = nil
		e.cfgRev++
		e.broadcastConfig()
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
	case EventClock:
		e.clock = int64(ev.Offset)
	}
}

// broadcastConfig delivers the config as it now is to every instance and
// to the leader.
func (e *engine) broadcastConfig() {
	c, rev := e.cfg, e.cfgRev
	for _, in := range e.inst {
		if in.alive {
			e.deliver(in, func() { in.onConfig(e, c, rev) })
		}
	}
	e.notifyLeader()
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
// other watch events unless the scenario reorders this one; an event for a
// process that has since crashed is dropped.
func (e *engine) deliver(in *instance, fn func()) {
	t := e.now + e.delay(e.sc.Publish)
	if e.sc.PublishReorder == 0 || e.rng.Float64() >= e.sc.PublishReorder {
		t = max(t, in.lastDeliver)
		in.lastDeliver = t
	}
	inc := in.inc
	e.at(t, func() {
		if in.alive && in.inc == inc {
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
				if on {
					in.even.Reset()
				}
				in.apply(e) // the session does not acknowledge on a leader change
				in.confirm(e)
			})
		}
	}
}

// hold is the even split's hold (cluster's evenHold): the provider's
// fail_static, the clock bound and follow.CountsValid.
func (e *engine) hold() time.Duration {
	return schema.ProviderConfig{Window: schema.Duration(e.sc.Window.D()), MaxClockOffset: schema.Duration(e.sc.ClockBound.D()),
		FailStatic: schema.Duration(e.sc.FailStatic.D())}.HoldAfter(0) + follow.CountsValid
}

func floorMod(a, b int64) int64 {
	r := a % b
	if r < 0 {
		r += b
	}
	return r
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
