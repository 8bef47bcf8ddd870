package follow

import "time"

// The even split: with no configd alive, the instances of a provider split
// its limit evenly among themselves — without watching each other. This
// is cluster.Member's rule, and the simulator's (internal/sim). An
// instance reads two counts, each a count-only request of O(1) bytes, once
// a report interval: the live instance keys, and the confirmations (a key
// each under schema.Keys.Even, on its lease, written by every instance that
// enforces the split). Its own share record tells it its last grant.
//
// The split must never overlap with what configd's last shares let another
// instance enforce. Four rules keep them apart:
//
//  1. Capped until everyone has switched. While fewer instances have
//     confirmed than are live, at any poll within the last hold, an
//     instance takes min(limit/n, its last grant): every instance then
//     enforces at most its grant, whichever source it is on, and the
//     grants add up to at most the limit. (One that has not seen configd
//     go is counted as live and not confirmed. One that registers with no
//     configd alive writes its key and its confirmation in one
//     transaction, so a join does not hold the others at their grants.)
//  2. Capped for a hold after configd went. An instance whose key expired
//     before the first poll may have been on configd's shares, enforcing
//     its grant, which nobody counts any more; it stops by its fail-static
//     horizon, a fail_static past its lease's end, before a hold has
//     passed since the first poll that no longer sees its key.
//  3. A count that fell is held up. n is the largest count seen in the last
//     hold (the provider's fail_static, the clock bound and CountsValid):
//     an instance whose key went may be cut off from etcd and
//     still enforce its even share until its fail-static horizon. So
//     nobody grows into its room before it has stopped.
//  4. A newcomer waits. An instance registered less than a hold ago takes
//     nothing beyond its grant (0 for a new one): the others count it at
//     their next poll, within MaxPoll, and shrink at once. One that can
//     no longer poll (cut off from etcd) stops admitting CountsValid and
//     the fail_static after the last count read it sent (Member.arm),
//     before a newcomer registered after that read ends its hold; its
//     key and confirmation may outlive that by a lease (found by review:
//     a lease of 10 s kept a cut-off instance at the whole limit beside a
//     newcomer's half). An instance whose share lapsed while it was cut
//     off comes back as a newcomer: the others may have grown into its
//     room.
//
// Growth then applies from a boundary at least the change margin ahead,
// and shrinks at once (Schedule).

// MaxPoll is the longest any instance goes between two polls of the
// counts while it follows the even split, whatever its report interval
// (PollEvery): the hold includes it, so a newcomer waits until every
// other instance has counted it (rule 4). With a hold of the newcomer's
// own report interval, one reporting every 50 ms grew beside one that
// polled every 6 s and still took the whole limit (found by review: 60 in
// a window of 40).
const MaxPoll = time.Second

// PollEvery returns how often an instance that reports every report
// polls the counts under the even split.
func PollEvery(report time.Duration) time.Duration { return min(report, MaxPoll) }

// CountsValid is how long past the last count read it sent, beyond the
// provider's fail_static, an instance goes on admitting on the even
// split: two polls' time, so that one late poll does not stop it. The
// hold includes it: a newcomer that registered after that read, which
// the instance has not counted, waits until it has stopped (rule 4).
const CountsValid = 2 * MaxPoll

// countSample is a poll of the counts, and when it was read.
type countSample struct {
	at        time.Time // monotonic
	live      int64     // instance keys
	confirmed int64     // even-split confirmations
}

// Even is what an instance knows for the even split (no configd alive):
// the counts it polled within the last hold. The zero value is ready.
type Even struct {
	samples []countSample // the polls within the last hold, oldest first
	since   time.Time     // the first poll since configd was last seen alive; zero: none
}

// Observe records a poll at now, keeping the polls within hold.
func (e *Even) Observe(now time.Time, live, confirmed int64, hold time.Duration) {
	keep := e.samples[:0]
	for _, s := range e.samples {
		if now.Sub(s.at) < hold {
			keep = append(keep, s)
		}
	}
	e.samples = append(keep, countSample{now, live, confirmed})
	if e.since.IsZero() {
		e.since = now
	}
}

// Reset forgets the polls: configd is alive again.
func (e *Even) Reset() { *e = Even{} }

// Count is the largest live count in the hold; at least 1.
func (e *Even) Count() int64 {
	n := int64(1)
	for _, s := range e.samples {
		n = max(n, s.live)
	}
	return n
}

// allConfirmed reports whether every poll in the hold found every live
// instance confirmed.
func (e *Even) allConfirmed() bool {
	for _, s := range e.samples {
		if s.confirmed < s.live {
			return false
		}
	}
	return len(e.samples) > 0
}

// Share is this instance's quota per window of the config under the even
// split: limit/n once the rules allow it, else at most grant (its last
// grant from configd, per window of the config).
func (e *Even) Share(limit, grant int64, registered, now time.Time, hold time.Duration) int64 {
	even := limit / e.Count()
	if e.since.IsZero() || now.Sub(e.since) < hold || !e.allConfirmed() || registered.IsZero() || now.Sub(registered) < hold {
		return min(even, grant)
	}
	return even
}
