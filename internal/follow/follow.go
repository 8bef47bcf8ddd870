// Package follow holds the pure rules by which an instance follows its
// provider (limiter/cluster): how its limiter moves from one quota to the
// next, how its demand is smoothed, and when its instance record is worth
// writing again. No I/O and no clock (times are arguments), so that the
// simulator (internal/sim) runs the very same rules.
package follow

import (
	"time"

	"github.com/sluice-go/sluice/internal/share"
)

// Sources of an instance's quota (cluster.Status.Source).
const (
	SourceFallback = "fallback" // no provider config: the instance's own fallback
	SourceEven     = "even"     // no configd replica alive: total / live instances
	SourceShares   = "shares"   // configd's published share
	SourceLapsed   = "lapsed"   // the last share lapsed while etcd was out of reach: nothing yet
	SourceBudget   = "budget"   // a budget lane: what this instance took of the window's limit
	SourceLedger   = "ledger"   // a ledger provider: what its grants in the ledger allow
)

// Applied is what an instance's limiter enforces and where it comes from.
type Applied struct {
	Source string // SourceFallback, SourceEven or SourceShares; "": nothing yet
	Quota  int64  // permits per window, as enforced (after any clock cut)
	Window time.Duration
	// Generation is the shares generation the quota comes from (0: none),
	// and At when that record applies (Unix ns, a boundary; 0: as soon as
	// may be).
	Generation, At int64
	// InForce is from when the generation's share governs whole windows
	// of the limiter (Unix ns, the limiter's clock), as limiter.Schedule
	// said when the generation was first applied: what the instance
	// acknowledges, as its record's AppliedFrom.
	InForce int64
	// ClockCut says Quota is below the record's share, cut for the
	// uncertainty of the instance's clock (skew.EnforcedShare).
	ClockCut bool
	// Settled (Unix ns, the instance's clock; 0: unknown) is an instant by
	// which whatever a share of configd's grows into had stopped being
	// admitted by anyone else, as far as the instance can tell: see
	// growsAtOnce.
	Settled int64
	// Switched (Unix ns; 0: none) is the boundary from which the last
	// switch of source governs: before it, other instances may still be
	// on the old source, so no growth applies before it. It is carried on
	// across steps of the same source, which may take the place of the
	// switch's own step in the limiter (Step.Switched).
	Switched int64
}

// View is what an instance knows of its provider when it decides what to
// enforce.
type View struct {
	Config *Config // the provider's config; nil: none yet, or deleted
	Leader bool    // a configd replica is alive (an election key exists)
	Shares *Shares // configd's last record, as it concerns this instance; nil: none yet
	Even   int64   // this instance's even split, for when no replica is alive
	// EvenFrom (Unix ns; 0: none) is the boundary of the share record whose
	// grant caps Even: the leader counted that grant from there on only,
	// and before it the others may still enforce the shares it replaced.
	EvenFrom int64
}

// Config is what of a provider's config the rules read.
type Config struct {
	Limit  int64
	Window time.Duration
}

// Shares is what of a shares record the rules read: its generation, its
// boundary and window, and this instance's share in it (0 if not named).
type Shares struct {
	Generation, EffectiveFrom int64
	Window                    time.Duration
	Share                     int64
}

// Next returns what an instance enforces with what it knows, before any
// cut for clock uncertainty:
//
//   - with a configd replica alive, its published share in the record's
//     own window (0 for an instance it has not named yet, or before its
//     first publish: a joining instance starts with nothing), from the
//     record's boundary. A record of another window than the config's is
//     kept as it is until configd republishes for the new window, which
//     it does at once: scaled to the new window at the same rate, a share
//     could put a whole longer window's worth into one window of the
//     shorter length, which neither the old limit nor the new allows;
//   - with none alive, the even split v.Even, in the config's window, from
//     as soon as may be, but not before v.EvenFrom: a grant counts from
//     its record's boundary, as the share it came with does;
//   - without a config, fallback.
func Next(v View, fallback Applied) Applied {
	c := v.Config
	if c == nil {
		return fallback
	}
	next := Applied{Source: SourceShares, Window: c.Window}
	switch s := v.Shares; {
	case !v.Leader:
		next.Source, next.Quota, next.At = SourceEven, v.Even, v.EvenFrom
	case s == nil: // configd is alive but has not published yet
	default:
		next.Quota, next.Window, next.Generation, next.At = s.Share, s.Window, s.Generation, s.EffectiveFrom
	}
	return next
}

// Step is how the limiter moves to a new quota.
type Step struct {
	// Cut says to set Interim at once, in the current window and at its
	// length (limiter.SetQuota), before the new quota takes over.
	Cut     bool
	Interim int64
	// From (Unix ns) is when the new quota applies: from the first window
	// boundary at or after it.
	From int64
	// Switched is the new Applied.Switched: From if this step switches
	// source, else the previous one's.
	Switched int64
}

// InForce is what a limiter enforces in the window under way: its quota
// and its length (limiter.Stats). It can differ from the last quota
// applied, which may take effect only at a boundary ahead.
type InForce struct {
	Quota  int64
	Window time.Duration
}

// Schedule returns how an instance moves to next, published to apply from
// at (Unix ns, a window boundary; 0: as soon as may be), on its clock
// reading now (Unix ns), with the propagation margin; prev is what it
// applied last and cur what its limiter enforces in the window under way.
//
// A quota without a boundary of its own (the even split, the fallback)
// applies from the first boundary at least the margin ahead, by which the
// other instances have it too; the even split, where it grows the quota
// in force, also not before at, the boundary of the grant that caps it
// (View.EvenFrom). Switching sources is done in two steps: the instances
// do not switch at the same instant, and within a window two sources
// disagree on who holds what (the even split against configd's shares),
// so the smaller of the quota in force and the new one applies at once, in
// the window under way, and the new one only from a boundary at least the
// margin ahead, when the others have switched too; with no cut as well
// (an adversarial review found a switch to a record of another length,
// not smaller, applied at the next boundary: 6,020 in a window of 6,000).
// A new quota of another window length must hold in windows of both
// lengths for that cut: counted into the length in force (share.In), and
// no more per window of it than keeps every window of the new length
// within the new quota (share.Within). An instance that joined during a
// configd outage and took an even share kept it, in 100 ms windows, until
// configd's first record of a 5 s window took over seconds later (found by
// the protocol search: 888 in a 100 ms window of 862); one cut to 30 per
// 1 s by a record of 30 per minute put 1,800 into a minute (found by the
// review: 7,770 in a minute of 6,000). Interim is per window of the
// length in force.
//
// A quota that arrives after its boundary applies at once if it shrinks
// the quota in force in the window under way, in the same length; the
// window under way keeps what it admitted. A growth applies to that window
// only where growsAtOnce says the room it grows into was free for all of
// it, and from the next boundary otherwise. What counts is the quota in
// force now, not the last one applied: that may be larger, scheduled for a
// boundary ahead.
func Schedule(prev, next Applied, cur InForce, at, now int64, margin time.Duration) Step {
	soon := NextBoundary(now+int64(margin), int64(next.Window))
	st := Step{From: at, Switched: prev.Switched}
	if st.From == 0 || next.Source == SourceEven {
		st.From = soon
		// The grant that caps the even split counts from its record's
		// boundary on: what the split adds to the quota in force waits
		// for it. A shrink never waits.
		if next.Source == SourceEven && share.In(next.Quota, next.Window, cur.Window) > cur.Quota {
			st.From = max(NextBoundary(at, int64(next.Window)), soon)
		}
	}
	if prev.Source != next.Source && prev.Source != "" {
		st.From = max(st.From, soon)
		interim := min(cur.Quota, share.In(next.Quota, next.Window, cur.Window), share.Within(next.Quota, cur.Window, next.Window))
		if prev.Window == next.Window || interim < cur.Quota {
			st.Cut, st.Interim = true, interim
		}
	}
	if prev.Source == next.Source && (next.Quota > cur.Quota || next.Window != cur.Window) {
		// A growth waits for the step still pending before it, and for
		// the last switch of source: its second step, a margin ahead, is
		// what keeps it apart from the instances still on the old source
		// (found by review: a record that came right after the switch,
		// its boundary passed, grew over the cut at the next boundary
		// beside an even share: 1,450 in a window of 1,000). The switch's
		// boundary is kept apart from the step pending: a clock cut below
		// the quota in force applies at once and takes the pending step's
		// place, and the growth back when the cut lifted came before the
		// switch's boundary (found by review).
		st.From = max(st.From, prev.At, prev.Switched)
	}
	if st.From <= now && (next.Quota > cur.Quota || next.Window != cur.Window) && !growsAtOnce(prev, next, cur, now) {
		st.From = NextBoundary(now+1, int64(next.Window))
	}
	if prev.Source != next.Source && prev.Source != "" {
		st.Switched = st.From
	}
	return st
}

// growsAtOnce reports whether next, a record of configd's that grows the
// quota in force and whose boundary has passed, may apply in the window
// under way rather than from the next boundary.
//
// configd hands out room from a boundary on only if it is free in every
// window from there on while each instance enforces any record it has not
// acknowledged as in force (share.Bound); the window under way is one of
// them, and this instance admits no more than its new share in it. What
// configd frees by the boundary's number alone (an acknowledged shrink
// governs from the boundary the instance said) is free in that window too.
// What it frees on its own clock is not: a configd whose clock is behind
// publishes boundaries that have already passed on the instances' clocks,
// and the room it freed may have been spent in the window under way. That
// room comes from three places, and each must have stopped being spent
// before the window under way began:
//
//   - a previous limit: the config the record was computed under was
//     written before the instance saw it;
//   - a previous process of this instance's id (a restart): it stopped
//     before this one registered (found by the protocol search: a
//     restarted process applied its late share on top of what the process
//     before it had spent);
//   - an instance that left or whose lease expired: configd holds its
//     grant for a window and twice the clock bound (schema's Settle) past
//     the instant it may have stopped admitting (its key gone, or its
//     fail_static hold after that), lengthened when a later config has a
//     longer window or a larger bound; so a publish that hands it on was
//     sent more than a window after it stopped, and a late record arrives
//     less than a window into the window under way.
//
// Settled is the later of the first two, plus twice the clock bound, on
// the instance's clock. Only within one source of shares, at one length,
// for a record newer than the last: a switch of source waits for the
// others to switch (the margin), and a new length for a boundary of both.
// Nor when the clock cut changed: the cut keeps the permits of a window
// inside its aligned window only if it held the whole window.
//
// Growing late records at once lets a retune reach a large fleet in the
// window it was published for, when delivering it takes longer than the
// margin: at 2,000 instances on 2 cores, some of them received it after
// its boundary and grew a window later (BENCHMARKS.md, section 12).
func growsAtOnce(prev, next Applied, cur InForce, now int64) bool {
	w := int64(next.Window)
	start := NextBoundary(now+1, w) - w // of the window under way
	return prev.Source == SourceShares && next.Source == SourceShares &&
		prev.Window == next.Window && cur.Window == next.Window &&
		next.Generation != 0 && next.Generation != prev.Generation &&
		!prev.ClockCut && !next.ClockCut &&
		next.Settled != 0 && next.Settled <= start
}

// Returned is st, a step from the even split back to configd's shares,
// with whatever it grows beyond the quota in force held back until hold
// (the even split's: follow.Even's hold with CountsValid) has passed since
// now, when the instance learned that configd is back. The margin of a
// switch of source is there for the other instances to switch too; one
// cut off from etcd cannot, and admits its even share until its own
// expiry, CountsValid and the fail_static past its last count read, which
// came before configd's return or it would have switched. configd's
// records from before the outage know nothing of that even share (found
// by review: 60 in windows of 40, an instance back on its old share of 40
// beside one cut off on its even 20). The cut at once is kept, and the
// hold carries on to the steps after it through Switched, as a switch's
// boundary does.
func Returned(st Step, prev, next Applied, cur InForce, now int64, hold time.Duration) Step {
	if prev.Source != SourceEven || next.Source != SourceShares {
		return st
	}
	if share.In(next.Quota, next.Window, cur.Window) <= cur.Quota && next.Window == cur.Window {
		return st // no growth
	}
	st.From = max(st.From, NextBoundary(now+int64(hold), int64(next.Window)))
	st.Switched = st.From
	return st
}

// Limiter is what Move sets (a *limiter.Limiter).
type Limiter interface {
	SetQuota(q int64, at time.Time) error
	Schedule(q int64, window time.Duration, at time.Time) (time.Time, error)
}

// Move takes lim to next by st: the cut at once, in the window under way
// and at the length in force (a SetLimit at next's length would leave that
// window alone while a change of length is pending, as the protocol search
// found), then next from st.From. It returns from when next governs whole
// windows (limiter.Schedule). The member and the simulator both move so.
func Move(lim Limiter, st Step, next Applied) (time.Time, error) {
	if st.Cut {
		if err := lim.SetQuota(st.Interim, time.Time{}); err != nil {
			return time.Time{}, err
		}
	}
	return lim.Schedule(next.Quota, next.Window, time.Unix(0, st.From))
}

// NextBoundary returns the first multiple of w at or after t.
func NextBoundary(t, w int64) int64 {
	r := t % w
	if r < 0 {
		r += w
	}
	if r == 0 {
		return t
	}
	return t + w - r
}

// Smooth returns the demand estimate after a report interval in which
// perWindow permits per window were asked for, given the estimate before:
// an exponentially weighted average in which the latest interval weighs ½
// when demand rises and ⅞ when it falls. Falling fast matters more: the
// permits an instance no longer wants can only go to the others after its
// share has shrunk, so a slow fall delays every other instance's growth
// (measured by bench/accuracy: 6 s to recover after load moved, with ½
// both ways). Rising at ½ keeps one burst from taking a large share.
func Smooth(prev, perWindow float64) float64 {
	if perWindow < prev {
		return 0.125*prev + 0.875*perWindow
	}
	return 0.5*prev + 0.5*perWindow
}

// Record is what of an instance record decides whether it is written again.
type Record struct {
	Demand      int64 // permits per window
	Generation  int64 // the shares generation applied
	ClockOffset time.Duration
	ClockKnown  bool
	FailStatic  time.Duration // the fail_static the instance's expiry counts with
	// Source and Enforced are where the quota enforced comes from and
	// how much it is (after any cut for the clock): what an operator
	// reads to see why an instance admits less than its share.
	Source   string
	Enforced int64
	// Pushbacks is the provider's pushbacks so far, and Remaining what
	// its headers said was left at the end of its window that ended at
	// RemainingEnd (Unix ns; 0: none): what an adaptive provider's
	// effective limit follows.
	Pushbacks    int64
	Remaining    int64
	RemainingEnd int64
}

// RefreshEvery is how many report intervals an unchanged record goes
// without being written again.
const RefreshEvery = 10

// Due reports whether cur is to be written, old having been written age
// ago with reports every interval: when it changed meaningfully, or after
// RefreshEvery intervals.
func Due(old, cur Record, age, interval time.Duration) bool {
	return Meaningful(old, cur) || age >= RefreshEvery*interval
}

// Meaningful reports whether cur differs from old enough to be written:
// another applied generation (the acknowledgement configd waits for),
// demand by more than 2% and more than one permit, the clock offset by
// more than a millisecond, whether it is known, the fail_static the
// instance's expiry counts with (configd holds a lapsed share by it), or
// the quota it enforces and its source (a clock cut moves it without a
// new generation; an operator must see it), a new pushback of the
// provider, or the end of another of its windows with a remaining (the
// controller needs every instance's word on the same window). Each is
// written at most once per report interval whatever the request rate.
func Meaningful(old, cur Record) bool {
	dd := cur.Demand - old.Demand
	if dd < 0 {
		dd = -dd
	}
	do := cur.ClockOffset - old.ClockOffset
	if do < 0 {
		do = -do
	}
	return cur.Generation != old.Generation ||
		(dd > 1 && float64(dd) > 0.02*float64(max(old.Demand, 1))) ||
		do > time.Millisecond || cur.ClockKnown != old.ClockKnown ||
		cur.FailStatic != old.FailStatic || cur.Source != old.Source || cur.Enforced != old.Enforced ||
		cur.Pushbacks != old.Pushbacks || cur.RemainingEnd != old.RemainingEnd
}
