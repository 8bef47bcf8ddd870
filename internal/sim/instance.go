package sim

import (
	"math"
	"time"

	"github.com/sluice-go/sluice/internal/follow"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/skew"
)

// instance is one process of the service: a member of the provider, with a
// real limiter on a virtual clock.
type instance struct {
	id    string
	group string
	skew  int64 // its clock = true time − skew: its windows begin skew late
	phase int64 // where in the tick its takes fall
	// interval is its report interval: the group's, or the scenario's.
	interval time.Duration
	inc      int  // its process: bumped by every (re)start
	alive    bool // the process runs
	keyed    bool // its record (and lease) is in etcd

	offered int64   // permits per window it would admit if allowed
	backlog float64 // permits offered and not yet taken
	lastAcc int64   // when backlog was last brought up to date

	lim *limiter.Limiter
	// regAt is when this process's first record reached etcd (never: not
	// yet): a shares record published before it gives this process
	// nothing (cluster.Member.registered).
	regAt int64

	// The session's view.
	cfg        *config
	cfgRev     int64 // the config key's revision cfg is as of
	cfgAt      int64 // when (true time) this process first saw cfgRev
	shares     *sharesRec
	leaderSeen bool
	ap         follow.Applied
	even       follow.Even // the even split's polls
	marked     bool        // an even-split confirmation for its id is in etcd
	markInc    int         // the process whose lease it is on
	markWant   bool        // what this process's last confirmation write says
	enforced   int64       // the generation of the last share record it applied

	// The reporter.
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

// clock is an instance's clock: true time minus its skew.
type clock struct {
	e  *engine
	in *instance
}

func (c clock) Now() time.Time { return time.Unix(0, c.e.now-c.in.skew) }

func (e *engine) join(in *instance) {
	if in.alive {
		return
	}
	in.inc++
	in.alive = true
	in.regAt = never
	in.askedT, in.askedAcc, in.lastAt, in.demand, in.haveWrite = e.now, 0, never, 0, false
	in.backlog, in.lastAcc = 0, e.now
	in.lastDeliver, in.lastWrite = e.now, e.now
	in.ap = follow.Applied{}
	in.markWant = false // this process has written no confirmation yet
	in.enforced = 0
	// A new process: its limiter starts on the fallback, quota 0.
	lim, err := limiter.New(0, e.sc.Window.D(), limiter.WithClock(clock{e, in}),
		limiter.WithPacing(e.sc.Admissions == AdmitSpread))
	if err != nil {
		panic("sim: " + err.Error()) // the scenario's window was validated
	}
	in.lim = lim
	if e.sc.ClockCut {
		lim.SetClockUncertainty(time.Duration(abs64(in.skew)))
	}
	// Session: the first (forced) record write makes it live; then it
	// loads the provider and applies.
	e.m.startEnforcing(e, in, nil)
	in.report(e, true)
	in.shares, in.leaderSeen, in.cfg, in.cfgRev, in.cfgAt = e.rec, e.keys, e.cfg, e.cfgRev, e.now
	in.even.Reset()
	if !in.leaderSeen {
		in.even.Observe(time.Unix(0, e.now), int64(e.keyed), int64(e.marks), e.hold())
	}
	if in.apply(e) {
		in.report(e, true)
	}
	in.confirm(e)
	inc := in.inc
	// Report ticker, at a random phase; takes every tick on its own clock.
	ri := int64(in.interval)
	var report func()
	report = func() {
		if !in.alive || in.inc != inc {
			return
		}
		if !in.leaderSeen {
			in.even.Observe(time.Unix(0, e.now), int64(e.keyed), int64(e.marks), e.hold())
		}
		in.apply(e)
		in.confirm(e)
		in.report(e, false)
		e.at(e.now+ri, report)
	}
	e.at(e.now+e.rng.Int64N(ri)+1, report)
	if every := int64(follow.PollEvery(in.interval)); every < ri {
		// The even split's counts, at least every follow.MaxPoll (the
		// member's poll ticker).
		var poll func()
		poll = func() {
			if !in.alive || in.inc != inc {
				return
			}
			if !in.leaderSeen {
				in.even.Observe(time.Unix(0, e.now), int64(e.keyed), int64(e.marks), e.hold())
				in.apply(e)
			}
			e.at(e.now+every, poll)
		}
		e.at(e.now+e.rng.Int64N(every)+1, poll)
	}
	var take func()
	take = func() {
		if !in.alive || in.inc != inc {
			return
		}
		in.take(e)
		e.at(e.now+e.tick, take)
	}
	local := e.now - in.skew
	next := local - floorMod(local-in.phase, e.tick) + e.tick
	e.at(next+in.skew, take)
}

func (e *engine) crash(in *instance) {
	if !in.alive {
		return
	}
	in.stop(e)
	in.alive = false
	in.lim.Close()
	inc := in.inc
	e.at(e.now+int64(e.sc.LeaseTTL), func() {
		// The lease of this process ends: its key goes, unless a newer
		// process of the same id has written it under a lease of its own.
		if r := e.records[in.id]; in.keyed && r != nil && r.inc == inc {
			in.keyed = false
			e.keyed--
			delete(e.records, in.id)
			if e.rec != nil && e.rec.enforcing(in.id) > 0 {
				e.holdGrant(in.id)
			}
			e.notifyLeader()
		}
		if in.marked && in.markInc == inc {
			in.setMarked(e, false) // gone with the lease
		}
	})
}

// stop ends what the oracle counts the instance as enforcing.
func (in *instance) stop(e *engine) {
	if in.alive {
		in.accrue(e)
		e.m.startEnforcing(e, in, nil)
	}
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// setOffered changes the load the instance offers.
func (in *instance) setOffered(e *engine, o int64) {
	in.accrue(e)
	in.offered = o
}

// rate is the instance's offered load in permits per ns.
func (in *instance) rate(e *engine) float64 {
	return float64(in.offered) / float64(e.sc.Window)
}

// accrue integrates the permits offered up to now: into the backlog, and
// into what the next report counts as asked for.
func (in *instance) accrue(e *engine) {
	d := float64(e.now - in.askedT)
	in.askedAcc += float64(in.offered) * d / float64(e.sc.Window)
	in.askedT = e.now
	in.backlog += in.rate(e) * float64(e.now-in.lastAcc)
	in.lastAcc = e.now
	e.m.addOffered(e, in.offered, d)
}

// take asks the limiter for the permits offered since the last take. With
// pacing ("spread") the instance is a caller that waits for its permits:
// it reserves them, for at most one window, and uses them when valid;
// what cannot be served within a window is dropped. Without ("bunched") it
// takes as many as the limiter grants now and keeps the rest as a backlog,
// which comes back at the next window's start, up to one window of load.
func (in *instance) take(e *engine) {
	in.accrue(e)
	n := int64(in.backlog)
	if n <= 0 {
		return
	}
	if e.sc.Admissions == AdmitSpread {
		// In reservations of at most a tick's worth of the quota, so that
		// each fits into the slots a tick brings.
		in.backlog -= float64(n)
		chunk := max(1, in.ap.Quota/ticksPerWindow)
		for n > 0 {
			k := min(n, chunk)
			if rem := in.lim.Stats().Remaining; rem > 0 {
				k = min(k, rem) // the end of the current window first
			}
			r, err := in.lim.Reserve(k, in.ap.Window)
			if err != nil {
				return // the rest cannot be served within a window: dropped
			}
			in.hold(e, r, k)
			n -= k
		}
		return
	}
	got := int64(0)
	for k := n; k > 0; {
		if in.lim.TryAcquireN(k) {
			got += k
			k = min(k, n-got)
		} else {
			k /= 2
		}
	}
	if got > 0 {
		e.m.admit(e, e.now, got)
		e.tracef("%s takes %d", in.id, got)
	}
	in.backlog = min(in.backlog-float64(got), float64(in.offered)+1)
}

// hold is a Reserve holder: it uses the n permits of r when they are
// valid, following any move, and drops them if r fails or the process
// stops first.
func (in *instance) hold(e *engine, r *limiter.Reservation, n int64) {
	switch d := r.Delay(); {
	case d == math.MaxInt64: // failed: moved past its wait by a change of limits
	case d == 0:
		e.m.admit(e, e.now, n)
		e.tracef("%s uses %d reserved", in.id, n)
	default:
		inc := in.inc
		e.at(e.now+int64(d), func() {
			if in.alive && in.inc == inc {
				in.hold(e, r, n)
			}
		})
	}
}

// onConfig is the session receiving the provider's config (nil: deleted)
// as of the config key's revision rev. etcd delivers a key's events in
// order, and a watch that reconnects reads the key as it is then: an
// event delivered late never undoes a newer one.
func (in *instance) onConfig(e *engine, c *config, rev int64) {
	if rev < in.cfgRev {
		return
	}
	// A deletion keeps the shares record, as the member does: configd
	// keeps the records while their instances may enforce them, for a
	// provider created again to start from, and a record of before the
	// deletion that arrives late must still not undo a newer one. The
	// simulator dropped it, and a publish of generation 1 delayed past a
	// deletion and a creation gave 1,094 beside others' 877 of 2,631
	// (found by the protocol search, seed 929665938495620497).
	if rev != in.cfgRev {
		in.cfgAt = e.now
	}
	in.cfg, in.cfgRev = c, rev
	in.apply(e)
}

// onShares is the session receiving a shares record (nil with deleted:
// the record is gone); it acknowledges a new generation at once.
func (in *instance) onShares(e *engine, rec *sharesRec, deleted bool) {
	switch {
	case deleted:
		in.shares = nil
	case in.shares != nil && rec.gens[in.id] < in.shares.gens[in.id]:
		return // an older publish arriving late never undoes a newer one
	default:
		in.shares = rec
	}
	if in.apply(e) {
		in.report(e, true)
	}
}

// settled is cluster.Member's settled: twice the clock bound past the
// later of when this process registered and when it saw the config its
// record was computed under, on its clock (0: either not known yet).
func (in *instance) settled(e *engine) int64 {
	if in.shares == nil || in.regAt == never || in.cfgRev < in.shares.cfgRev {
		return 0
	}
	b := e.sc.ClockBound.D()
	if b <= 0 {
		b = skew.DefaultBound(in.shares.window)
	}
	return max(in.cfgAt, in.regAt) - in.skew + 2*int64(b)
}

// apply is session.apply: what is in force for this instance by the
// member's rules (follow.Next), cut for its clock, set on its limiter
// (follow.Schedule and follow.Returned, limiter.Schedule) if it changed. It reports whether a
// new generation was applied, which the caller acknowledges.
func (in *instance) apply(e *engine) bool {
	v := follow.View{Leader: in.leaderSeen}
	if c := in.cfg; c != nil {
		v.Config = &follow.Config{Limit: c.limit, Window: c.window}
	}
	if s := in.shares; s != nil && in.leaderSeen {
		v.Shares = &follow.Shares{Generation: s.gens[in.id], EffectiveFrom: s.froms[in.id], Window: s.window, Share: s.shares[in.id]}
		if _, ok := s.gens[in.id]; !ok {
			v.Shares.Generation, v.Shares.EffectiveFrom = s.gen, s.effective // no record of its own yet: nothing
		}
		if in.regAt == never || s.pubs[in.id] < in.regAt {
			v.Shares.Share = 0 // published before this process registered
		}
	}
	if c := in.cfg; c != nil && !in.leaderSeen {
		grant := in.grant(c)
		v.Even = in.even.Share(c.limit, grant, time.Unix(0, in.regAt), time.Unix(0, e.now), e.hold())
		if grant > 0 {
			v.EvenFrom = in.shares.froms[in.id]
		}
		if in.regAt == never {
			v.Even = 0 // not registered yet
		}

	}
	next := follow.Next(v, follow.Applied{Source: follow.SourceFallback, Window: e.sc.Window.D()})
	// The config (regime) the quota comes from: a share from the config
	// its record was computed under, the even split from the config.
	var regimes []int
	switch {
	case next.Source == follow.SourceShares && v.Shares != nil:
		regimes = []int{in.shares.idxs[in.id]}
	case next.Source == follow.SourceEven:
		regimes = []int{in.cfg.idx}
	}
	if e.sc.ClockCut && next.Source != follow.SourceFallback {
		m := skew.Measurement{Known: true, Uncertainty: time.Duration(abs64(in.skew))}
		cut := skew.EnforcedShare(next.Quota, next.Window, m, e.sc.ClockBound.D())
		next.Quota, next.ClockCut = cut, cut < next.Quota
	}
	if next.Source == follow.SourceShares {
		next.Settled = in.settled(e)
	}
	ap := in.ap
	if next.Source == ap.Source && next.Quota == ap.Quota && next.Window == ap.Window && next.Generation == ap.Generation {
		return false
	}
	now := e.now - in.skew
	st := in.lim.Stats()
	step := e.schedule(ap, next, follow.InForce{Quota: st.Quota, Window: st.Window}, next.At, now, e.sc.Margin.D())
	next.At, next.Switched = step.From, step.Switched
	from, err := follow.Move(in.lim, step, next)
	if err != nil {
		panic("sim: " + err.Error()) // quotas and windows come validated
	}
	// The oracle counts the instance as enforcing both what it had and
	// the new quota's configs until the new one governs whole windows.
	e.m.enforceFrom(e, in, from.UnixNano()+in.skew, regimes)
	e.tracef("%s applies %s %d/%v gen %d (record from %v, asked from %v), whole windows from %v (true)",
		in.id, next.Source, next.Quota, next.Window, next.Generation, time.Duration(next.At), time.Duration(step.From), time.Duration(from.UnixNano()+in.skew))
	newGen := next.Generation != ap.Generation
	next.InForce = ap.InForce
	if newGen {
		next.InForce = from.UnixNano()
	}
	in.ap = next
	if next.Source == follow.SourceShares && next.Generation != 0 {
		in.enforced = next.Generation
	}
	return newGen && next.Generation != 0
}

// grant is the most this process's own share record lets it enforce per
// window of c (cluster.Member.apply): 0 without one, or with one published
// before this process registered.
func (in *instance) grant(c *config) int64 {
	s := in.shares
	if s == nil || in.regAt == never || s.pubs[in.id] < in.regAt {
		return 0
	}
	if _, ok := s.gens[in.id]; !ok {
		return 0
	}
	r := schema.ShareRecord{Window: schema.Duration(s.window), Total: s.total, Share: s.shares[in.id], Granted: s.granted[in.id]}
	if in.enforced == s.gens[in.id] {
		r.Granted = r.Share // enforced: configd counts it at the share (cluster.Member.apply)
	}
	return r.GrantPer(c.window, c.limit)
}

// confirm is cluster.Member.confirmEven: with no configd seen and a config
// known, the instance says it follows the even split; once configd is
// seen, it takes that back. The write reaches etcd after a delay.
func (in *instance) confirm(e *engine) {
	want := !in.leaderSeen && in.cfg != nil
	if want == in.markWant || !in.keyed {
		return
	}
	in.markWant = want
	inc := in.inc
	e.at(max(e.now+e.delay(e.sc.Ack), in.lastWrite), func() {
		if in.alive && in.inc == inc && in.keyed {
			in.setMarked(e, want)
		}
	})
}

// setMarked puts (on the current process's lease) or removes the
// instance's confirmation in etcd.
func (in *instance) setMarked(e *engine, on bool) {
	if on {
		in.markInc = in.inc
	}
	if in.marked == on {
		return
	}
	in.marked = on
	if on {
		e.marks++
	} else {
		e.marks--
	}
}

// report is session.report: update the demand estimate, and write the
// record when forced or when follow.Due says so.
func (in *instance) report(e *engine, force bool) {
	in.accrue(e)
	if in.lastAt != never {
		if el := e.now - in.lastAt; el > 0 {
			perWindow := in.askedAcc * float64(e.sc.Window) / float64(el)
			in.demand = follow.Smooth(in.demand, perWindow)
		}
	}
	in.askedAcc, in.lastAt = 0, e.now
	rec := record{demand: int64(math.Round(in.demand)), gen: in.ap.Generation, appliedFrom: in.ap.InForce,
		source: in.ap.Source, enforced: in.ap.Quota, inc: in.inc}
	if !force && in.haveWrite && !follow.Due(in.written.follow(), rec.follow(), time.Duration(e.now-in.wroteAt), in.interval) {
		return
	}
	e.m.writes++
	if e.sc.AckLoss > 0 && e.rng.Float64() < e.sc.AckLoss {
		// Lost: the write failed, and the member knows it (an error, or
		// no answer in time). It writes the record again at its next
		// report, follow.Due seeing the difference from the last one
		// written (cluster's following.report). Taken as written, a lost
		// acknowledgement waited for the next forced report, ten report
		// intervals, and at 10,000 instances with 1% lost a lowering came
		// while two changes were under way more often than a member sees.
		e.m.lost++
		return
	}
	in.written, in.wroteAt, in.haveWrite = rec, e.now, true
	t := max(e.now+e.delay(e.sc.Ack), in.lastWrite)
	in.lastWrite = t
	inc := in.inc
	e.at(t, func() {
		if !in.alive || in.inc != inc {
			return // a write from a process that crashed before it landed
		}
		if !in.keyed {
			in.keyed = true
			e.keyed++
			// Registered with no configd alive: the key and the even-split
			// confirmation in one transaction (cluster.Member.register).
			if !e.keys && e.cfg != nil {
				in.markWant = true
				in.setMarked(e, true)
			}
		}
		if in.regAt == never {
			in.regAt = e.now
		}
		r := rec
		r.regAt = in.regAt
		e.records[in.id] = &r
		e.tracef("%s record: demand %d, applied gen %d from %v", in.id, r.demand, r.gen, time.Duration(r.appliedFrom))
		e.notifyLeader()
	})
}
