package skew

import (
	"math/bits"
	"time"
)

// DefaultBoundDivisor sets the default uncertainty bound: 1/50 (2%) of the
// window, 20 ms for a 1 s window.
const DefaultBoundDivisor = 50

// DefaultBound returns the largest uncertainty EnforcedShare accepts
// without a cut by default: window/DefaultBoundDivisor.
func DefaultBound(window time.Duration) time.Duration {
	return window / DefaultBoundDivisor
}

// EnforcedShare returns the share, in permits per window, that an instance
// should enforce when it was given q permits per window of length window
// and its clock measurement is m (take it from Monitor.Current, which
// applies the staleness limit). bound is the largest uncertainty accepted
// without a cut; bound ≤ 0 selects DefaultBound(window). With u =
// m.Uncertainty and W = window, the rule is:
//
//   - q ≤ 0: 0.
//   - m.Known and u ≤ bound: q, no cut. The instance corrects its window
//     boundaries by m.Offset (limiter.SetClockOffset) and keeps a band of u
//     at each boundary (limiter.SetClockUncertainty), which makes E = 0.
//   - m.Known and u > bound: max(⌊q·(1 − 2u/W)⌋, ⌊q/2⌋).
//   - m.Known false, or W ≤ 0: ⌊q/2⌋.
//
// Why. After correction an instance's window boundaries lie at kW + e in
// true time with |e| ≤ u. Say it admits at most s permits in each of its own
// windows. An aligned window [kW, (k+1)W) then holds the first W − |e| of one
// local window and the last |e| of a neighbouring one, so it receives at
// most s + E, where E counts the permits the instance admitted within |e| of
// a local boundary: E is this instance's overshoot of an aligned window.
//
//  1. Any span of length W meets at most two local windows, so the instance
//     puts at most 2s into any aligned window whatever its clock error. A
//     share of ⌊q/2⌋ is therefore safe with no clock information at all. It
//     is the fallback when the offset is unknown (rather than 0, which would
//     stop every instance whenever NTP is unreachable), and the least the
//     rule ever cuts to, since cutting further buys no more safety.
//  2. The span of a local window that lands inside its own aligned window
//     for every e in [−u, u] is its core [u, W − u), of length W − 2u. At the
//     window's average rate the core carries q·(1 − 2u/W): that is the cut.
//     It bounds the overshoot when the instance admits, within u of a local
//     boundary, at most twice its average rate s/W (so E ≤ 2us/W): the
//     aligned window gets at most s(1 + 2u/W) = q(1 − 4u²/W²) ≤ q.
//  3. Pacing (limiter.WithPacing: one permit per W/s, unused slots dropped)
//     satisfies that assumption and more: E ≤ 1, so a paced instance
//     overshoots by at most one permit per window whatever u is.
//
// Hence the default bound is small (2% of W): below it the cut would be
// smaller than the rounding of the share itself, and the instance's spill is
// at most the permits it admits within u ≤ bound of a boundary — at most one
// with pacing, 2·bound/W = 4% of q at twice the average rate. What no share
// cut short of ⌊q/2⌋ can bound is an unpaced instance that admits a burst in
// the last u of one window and another at the start of the next. The
// limiter's guard band closes that case: with limiter.SetClockUncertainty(u)
// an instance admits nothing within u of its boundaries, so every permit of
// a local window lands in its own aligned window, E = 0 and s = q is safe,
// bunched or not (cluster.WithClockMonitor sets both).
func EnforcedShare(q int64, window time.Duration, m Measurement, bound time.Duration) int64 {
	if q <= 0 {
		return 0
	}
	half := q / 2
	if !m.Known || window <= 0 {
		return half
	}
	if bound <= 0 {
		bound = DefaultBound(window)
	}
	u := max(m.Uncertainty, 0)
	if u <= bound {
		return q
	}
	if u >= window/2 { // 2u ≥ W: no core left
		return half
	}
	// cut = ⌈q·2u/W⌉ in 128-bit arithmetic; 2u < W, so the quotient fits.
	hi, lo := bits.Mul64(uint64(q), uint64(2*u))
	cut, rem := bits.Div64(hi, lo, uint64(window))
	if rem > 0 {
		cut++
	}
	return max(q-int64(cut), half)
}
