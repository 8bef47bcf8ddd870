package alloc

import (
	"maps"
	"slices"
)

// The safe handover: the sum of the shares in force in any window never
// exceeds the provider's total, also while shares move.
//
// Every publish carries, besides the shares to enforce, grants: for each
// instance the most it may still be enforcing. An instance told to shrink
// may keep its old, larger share until it has applied the new one — until it
// has acknowledged the publish and the publish's first window has begun — so
// until then its grant stays at the old value. A share grows only out of
// what no grant holds, so the grants, and with them every mix of old and new
// shares the instances can be enforcing at once, add up to at most the
// total. As acknowledgements arrive, grants drop, the leader publishes again
// and the growing shares take the rest: a move completes in two publishes
// once the shrinking instances have acknowledged.
//
// Late or lost acknowledgements never make the leader grow anyone; they only
// delay. An instance whose lease is gone holds nothing. A new leader resumes
// from the published grants, with no learning period. What each instance
// may still be enforcing — its bound — is package share's accounting
// (share.Bound), as for the instances' own even split.

// Handover returns the shares to publish toward target, and the grants that
// go with them, given each instance's bound (see share.Bound). Shrinking
// instances get their target at once; growing ones get what the bounds leave
// free, in order of id, up to their target. If the bounds already exceed
// total (it was just lowered) nobody grows until they drop.
func Handover(total int64, target, bound map[string]int64) (shares, granted map[string]int64) {
	var held int64
	for _, v := range bound {
		held += v
	}
	free := max(0, total-held)
	shares = make(map[string]int64, len(target))
	granted = make(map[string]int64, len(target))
	for _, id := range slices.Sorted(maps.Keys(target)) {
		t, b := target[id], bound[id]
		s := t
		if t > b {
			give := min(t-b, free)
			free -= give
			s = b + give
		}
		shares[id] = s
		granted[id] = max(b, s)
	}
	return shares, granted
}

// Pending reports whether a later publish can move shares further toward
// target: some share is still below its target.
func Pending(shares, target map[string]int64) bool {
	for id, t := range target {
		if shares[id] < t {
			return true
		}
	}
	return false
}
