// Package follow holds the pure rules by which an instance follows its
// provider (limiter/cluster): how its limiter moves from one quota to the
// next, how its demand is smoothed, and when its instance record is worth
// writing again. No I/O and no clock (times are arguments), so that the
// simulator (internal/sim) runs the very same rules.
package follow

import "time"

// Applied is what an instance's limiter enforces and where it comes from.
type Applied struct {
	Source string // "fallback", "even" or "shares" (cluster.Status.Source); "": nothing yet
	Quota  int64  // permits per window, as enforced (after any clock cut)
	Window time.Duration
}

// Step is how the limiter moves to a new quota.
type Step struct {
	// Cut says to set Interim at once, in the current window, before the
	// new quota takes over.
	Cut     bool
	Interim int64
	// From (Unix ns) is when the new quota applies: from the first window
	// boundary at or after it.
	From int64
}

// Schedule returns how an instance whose limiter enforces prev moves to
// next, published to apply from at (Unix ns, a window boundary; 0: as soon
// as may be), on its clock reading now (Unix ns), with the propagation
// margin.
//
// A quota without a boundary of its own (the even split, the fallback, a
// share whose window changed) applies from the first boundary at least the
// margin ahead, by which the other instances have it too. Switching
// sources in the same window length is done in two steps: the instances do
// not switch at the same instant, and within a window two sources disagree
// on who holds what (the even split against configd's shares), so the
// smaller of the two quotas applies at once and the new one only from a
// boundary at least the margin ahead, when the others have switched too.
func Schedule(prev, next Applied, at, now int64, margin time.Duration) Step {
	soon := NextBoundary(now+int64(margin), int64(next.Window))
	st := Step{From: at}
	if st.From == 0 {
		st.From = soon
	}
	if prev.Source != next.Source && prev.Source != "" && prev.Window == next.Window {
		st.Cut, st.Interim = true, min(prev.Quota, next.Quota)
		st.From = max(st.From, soon)
	}
	return st
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
// more than a millisecond, whether it is known, or the fail_static the
// instance's expiry counts with (configd holds a lapsed share by it).
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
		cur.FailStatic != old.FailStatic
}
