// Package share is the accounting of what an instance may admit, done one
// way for every part of sluice that needs it: how many permits a share can
// put into one aligned window of another length, and what an instance may
// still be enforcing while shares move. configd's leader (configd/plan and
// configd/alloc's handover), the instances' even split (limiter/cluster)
// and the simulator (internal/sim) all count with it; two copies of this
// arithmetic once drifted apart, and a change of window length let the
// leader grow shares while others still enforced more than it counted.
//
// It is pure: no I/O, no clock, standard library only.
package share

import (
	"math"
	"time"
)

// In returns the most permits that q permits per window of length per can
// put into one aligned window of length w:
//
//   - per == w: q;
//   - per divides w: q·(w/per), one share for each shorter window inside;
//   - w divides per: q, since a whole longer window's permits may fall into
//     any one of the shorter windows it holds;
//   - otherwise: q·(⌊w/per⌋ + 2), the most windows of per that one window of
//     w can overlap.
//
// Every window length sluice accepts divides a day, so windows of two
// lengths share a boundary at least once a day and these cases are exact
// for aligned windows. The result saturates at math.MaxInt64; q ≤ 0 or a
// length ≤ 0 gives q unchanged.
func In(q int64, per, w time.Duration) int64 {
	switch {
	case q <= 0 || per <= 0 || w <= 0 || per == w:
		return q
	case w%per == 0:
		return satMul(q, int64(w/per))
	case per%w == 0:
		return q
	}
	return satMul(q, int64(w/per)+2)
}

// Within returns the largest q such that In(q, per, w) ≤ b: the most
// permits per window of length per that put at most b into any aligned
// window of length w. b ≤ 0 gives 0.
func Within(b int64, per, w time.Duration) int64 {
	if b <= 0 {
		return 0
	}
	f := In(1, per, w) // In is q times this factor
	return b / f
}

// satMul returns a×b for a, b > 0, or math.MaxInt64 where that overflows.
func satMul(a, b int64) int64 {
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}

// Standing is what the leader knows of one live instance under the shares
// record last published.
type Standing struct {
	Share    int64 // the share the record gives it
	Grant    int64 // the most the record says it may still be enforcing (at least Share)
	Named    bool  // the record names it (a newcomer is not named)
	Acked    bool  // it acknowledged the record
	InEffect bool  // the record is in force on it for whole windows (see Applied)
}

// Bound returns the most the instance may be enforcing now, per window of
// the record: its share once it has acknowledged the record and the record
// is in force on it, else the larger of its grant and its share; 0 for an
// instance the record does not name.
func Bound(s Standing) int64 {
	switch {
	case !s.Named:
		return 0
	case s.Acked && s.InEffect:
		return s.Share
	}
	return max(s.Grant, s.Share)
}

// InForce returns from when a record in force from effectiveFrom governs,
// for whole windows, an instance that acknowledged it from appliedFrom (the
// boundary its limiter said; 0 when unknown, as from instances older than
// the field): the later of the two. An instance that received the record
// after effectiveFrom enforces it only from a later boundary, and until
// then may enforce what it had.
func InForce(effectiveFrom, appliedFrom int64) int64 { return max(effectiveFrom, appliedFrom) }
