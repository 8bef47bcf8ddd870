// Package plan is configd's publish decision for one provider: given the
// shares record last published, the allocation just computed and what each
// live instance has acknowledged, Decide says whether the leader publishes
// now and what — shares and grants through the safe handover of package
// alloc, effective from which window boundary — or why not, and when to
// decide again. It is pure: no I/O, no clock (the time is an argument), no
// randomness, standard library and package alloc only, so that configd's
// leader and the simulator (internal/sim) run the very same decision.
//
// # When shares are republished
//
// The leader decides again whenever something the shares depend on changes
// (the config's algorithm, limit and floor, the live instances and their
// demand or acknowledgements) and when a Decision's Due time comes. The
// allocation it computes is the target. It is published at once when the
// provider's limit or window changed, when an instance joined or left, or
// when the config changed since the published shares were computed (a new
// algorithm or floor, say). A change of demand alone — shares moving among
// the same instances under the same config, which only "fair" does — is
// damped, so that etcd writes stay flat while demand jitters:
//
//   - Hysteresis: it is published only when some instance's target differs
//     from its published share by more than Hysteresis(total, n) =
//     max(1, min(⌊total/100⌋, ⌊total/(10n)⌋)) permits for n instances: by
//     more than 1% of the total and a tenth of an average share, and by more
//     than one permit. Smaller moves are dropped, not deferred. Moves are
//     measured against the published shares, not against the last
//     computation, so a slow drift is published once it leaves the band.
//   - Rate: shares are republished for demand at most once per window: not
//     before one window after the last publish, nor before the published
//     shares take effect. A change that comes sooner is decided again then
//     (Due), with the demand known then, and published if it is still
//     outside the band.
//
// A target once chosen is reached through the safe handover (see package
// alloc): shrinks first, growth only out of what no instance may still be
// enforcing, so a move takes two publishes or more. A handover under way
// is finished whatever the band and the rate: a new target that damping
// holds back does not replace it (it is kept in Decision.Target and given
// back as Input.Moving). While growth waits for a publish whose first
// window has not begun, the decision is due again at that boundary.
//
// A publish takes effect from the first window boundary at least the
// propagation margin ahead, so that every instance has it before it
// applies.
package plan

import (
	"maps"
	"time"

	"github.com/sluice-go/sluice/configd/alloc"
)

// Reasons a change of demand was not published (Decision.Damped); configd
// counts them in configd_shares_damped_total{provider,reason}.
const (
	DampedHysteresis = "hysteresis" // every target within Hysteresis(total, n) of its published share
	DampedRate       = "rate_limit" // outside the band, but less than a window since the last publish, or before it takes effect
)

// unchanged is damp's answer when the target is what is published.
const unchanged = "unchanged"

// Published is the shares record last published, as the leader knows it.
type Published struct {
	Generation     int64
	EffectiveFrom  time.Time // its first window begins then
	Total          int64     // the limit it divides
	Window         time.Duration
	ConfigRevision int64            // the revision of the config it was computed under
	Shares         map[string]int64 // instance ID → share
	// Granted is, per instance ID, the most it may still be enforcing; nil
	// for a record from before grants, whose shares count as the grants.
	Granted map[string]int64
	// At is when it was published, no later than the Input's Now (a leader
	// whose clock is ahead must not hold publishing back).
	At time.Time
}

// Input is what one decision is made from. Nothing in it is modified.
type Input struct {
	Total          int64         // the provider's limit
	Window         time.Duration // the provider's window
	ConfigRevision int64         // the revision of the config Target was computed under
	Margin         time.Duration // a publish takes effect at least this far after Now

	// Target is the allocation just computed over the live instances:
	// instance ID → share, one entry per live instance.
	Target map[string]int64
	// Acked is, per live instance ID, the last generation it acknowledged
	// (its record's AppliedGeneration); a missing one acknowledged none.
	Acked map[string]int64

	Cur *Published // the last publish; nil: none
	// Rewrite means the shares key holds a malformed record (Cur is the
	// last good one): publish even if nothing moved.
	Rewrite bool
	// Moving is the target a handover under way moves toward: the previous
	// Decision's Target; nil: none chosen yet.
	Moving map[string]int64
	// Held is, per instance ID that is no longer live, the permits it may
	// still be enforcing: an instance whose lease expired keeps its share
	// for the provider's fail_static (it may only be cut off from etcd), so
	// its grant stays taken until then. They count against the total like a
	// live instance's bound, and stay in the published Granted so that a new
	// leader holds them too. IDs that are live are ignored.
	Held map[string]int64

	Now time.Time
}

// Decision is what the leader does.
type Decision struct {
	// Publish says to publish Shares and Granted now, as a new generation
	// in force from EffectiveFrom, a window boundary.
	Publish         bool
	Shares, Granted map[string]int64
	EffectiveFrom   time.Time

	// Target is what the leader moves toward from now on; pass it back as
	// the next Input's Moving.
	Target map[string]int64
	// Damped is why a change was not published (DampedHysteresis,
	// DampedRate); "" when it was, when nothing changed, and while a
	// handover waits for acknowledgements.
	Damped string
	// Due is when to decide again even if nothing changes: a damped move's
	// retry, or the EffectiveFrom of Cur when growth waits for its window
	// to begin. Zero: at the next change.
	Due time.Time
}

// Planner decides with the handover functions it holds. The zero value
// uses package alloc's (alloc.Handover, alloc.Bound), as configd does; the
// simulator gives it broken ones to check that it catches them.
type Planner struct {
	Handover func(total int64, target, bound map[string]int64) (shares, granted map[string]int64) // nil: alloc.Handover
	Bound    func(alloc.Standing) int64                                                           // nil: alloc.Bound
}

// Decide is Planner{}.Decide: the decision with package alloc's handover.
func Decide(in Input) Decision { return Planner{}.Decide(in) }

// Decide returns what the leader does with in (see "When shares are
// republished").
func (p Planner) Decide(in Input) Decision {
	d := Decision{Target: in.Moving}
	cur, target := in.Cur, in.Target
	// Damping judges the target against what is published. A target it
	// holds back does not replace the one a handover is still moving
	// toward: that move is finished whatever the band and the rate.
	reason, retry := damp(cur, in.Total, in.Window, in.ConfigRevision, target, in.Now)
	// The holds of instances gone from the target (the same IDs whichever
	// target the switch keeps).
	held := heldOnly(in.Held, target)
	switch {
	case reason == "" || in.Rewrite:
		d.Target = target
	case in.Moving != nil && cur != nil && alloc.Pending(cur.Shares, in.Moving) && sameIDs(in.Moving, target):
		target = in.Moving
	case reason == unchanged && cur != nil && !sameHeld(held, cur, target):
		d.Target = target // a hold began or ended: the grants change
	case reason == unchanged:
		return d
	default:
		d.Damped, d.Due = reason, retry
		return d
	}
	// The target is reached through the safe handover: growth only out of
	// what no instance may still be enforcing.
	b := bounds(cur, target, in.Acked, in.Now, p.bound())
	maps.Copy(b, held)
	shares, granted := p.handover()(in.Total, target, b)
	maps.Copy(granted, held) // bounds covers only the target's IDs
	if alloc.Pending(shares, target) && cur != nil && in.Now.Before(cur.EffectiveFrom) {
		// Acknowledged shrinks free their permits when their window begins.
		d.Due = cur.EffectiveFrom
	}
	if cur != nil && !in.Rewrite && maps.Equal(shares, cur.Shares) && sameHeld(granted, cur, target) &&
		cur.Total == in.Total && cur.Window == in.Window && cur.ConfigRevision == in.ConfigRevision {
		return d // waiting for acknowledgements
	}
	d.Publish, d.Shares, d.Granted = true, shares, granted
	// Strictly after now, whatever the margin: a publish that took effect
	// at the instant it is made reaches every instance late, and a late
	// instance applies it at once, inside a window in which the others may
	// still hold what it takes. (With a margin of 0, a follow-up published
	// exactly at its predecessor's boundary did; the simulator showed it.)
	// Two publishes within one window may share a boundary: the second can
	// grow nobody out of the first's shrinks before that boundary passes.
	d.EffectiveFrom = NextBoundary(in.Now.Add(in.Margin+1), in.Window)
	return d
}

func (p Planner) handover() func(total int64, target, bound map[string]int64) (shares, granted map[string]int64) {
	if p.Handover == nil {
		return alloc.Handover
	}
	return p.Handover
}

func (p Planner) bound() func(alloc.Standing) int64 {
	if p.Bound == nil {
		return alloc.Bound
	}
	return p.Bound
}

// Hysteresis returns the band (permits) within which a demand-only change
// of a share among n instances is not published: 1% of the total, but no
// more than a tenth of an average share (so that with many instances a
// share's own moves still count), and at least one permit. For an integer
// change d, d > ⌊x⌋ exactly when d > x.
func Hysteresis(total int64, n int) int64 {
	return max(1, min(total/100, total/(10*int64(max(n, 1)))))
}

// damp decides whether target waits instead of replacing the published
// shares cur. It returns "" to publish now, unchanged, DampedHysteresis, or
// DampedRate with the time to decide again.
func damp(cur *Published, total int64, window time.Duration, cfgRev int64, target map[string]int64, now time.Time) (reason string, retry time.Time) {
	if cur == nil || cur.Total != total || cur.Window != window || len(cur.Shares) != len(target) {
		return "", time.Time{}
	}
	var moved int64 // the largest change of one share
	for id, v := range target {
		old, ok := cur.Shares[id]
		if !ok {
			return "", time.Time{} // another set of instances
		}
		moved = max(moved, v-old, old-v)
	}
	switch {
	case moved == 0:
		return unchanged, time.Time{}
	case cur.ConfigRevision != cfgRev:
		return "", time.Time{} // the operator changed the config
	case moved <= Hysteresis(total, len(target)):
		return DampedHysteresis, time.Time{}
	}
	// Not before the published shares are in effect either: a shrink is
	// only given to others once acknowledged and in effect, and a new
	// generation published before that restarts the wait, so publishing on
	// every demand report could hold growth back for good (measured by
	// bench/accuracy: 10 s with publishes 0.83 s into each window).
	next := cur.At.Add(window)
	if cur.EffectiveFrom.After(next) {
		next = cur.EffectiveFrom
	}
	if now.Before(next) {
		return DampedRate, next
	}
	return "", time.Time{}
}

// bounds returns, for each instance of live (its keys), the most it may be
// enforcing now under the published record cur (see alloc.Bound and the
// handover protocol in package alloc). A record from before grants counts
// its shares as the grants.
func bounds(cur *Published, live, acked map[string]int64, now time.Time, bound func(alloc.Standing) int64) map[string]int64 {
	b := make(map[string]int64, len(live))
	if cur == nil {
		return b
	}
	inEffect := !now.Before(cur.EffectiveFrom)
	for id := range live {
		share, named := cur.Shares[id]
		grant, granted := cur.Granted[id]
		if cur.Granted == nil {
			grant = share
		}
		b[id] = bound(alloc.Standing{
			Share:    share,
			Grant:    grant,
			Named:    named || granted,
			Acked:    acked[id] >= cur.Generation,
			InEffect: inEffect,
		})
	}
	return b
}

// NextBoundary returns the first window boundary (a multiple of w since
// the Unix epoch) at or after t.
func NextBoundary(t time.Time, w time.Duration) time.Time {
	ns, wn := t.UnixNano(), int64(w)
	b := ns / wn * wn
	if b < ns {
		b += wn
	}
	return time.Unix(0, b)
}

// heldOnly returns the holds of instances not in target, positive ones.
func heldOnly(held, target map[string]int64) map[string]int64 {
	m := map[string]int64{}
	for id, h := range held {
		if _, live := target[id]; !live && h > 0 {
			m[id] = h
		}
	}
	return m
}

// sameHeld reports whether granted holds for instances that are not live
// (not in target) exactly what cur's grants hold for them: a hold that
// ended is published even when no share moves.
func sameHeld(granted map[string]int64, cur *Published, target map[string]int64) bool {
	return maps.Equal(heldOnly(granted, target), heldOnly(cur.Granted, target))
}

// sameIDs reports whether a and b name the same instances.
func sameIDs(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for id := range a {
		if _, ok := b[id]; !ok {
			return false
		}
	}
	return true
}
