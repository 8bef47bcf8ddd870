package adapt

import "time"

// Report is what one instance's latest record says of the provider. The
// counters are running totals of one incarnation: Tally turns them into
// what happened between two rounds.
type Report struct {
	ID      string
	Started time.Time // the incarnation: a restart counts from zero
	// Pushbacks is the calls the provider answered 429 or 503, since
	// Started.
	Pushbacks int64
	// Enforced is the instance's quota per window, Demand what it wants;
	// it sends the least of the two. Enforced ≤ 0: not known, not counted.
	Enforced, Demand int64
	// RetryUntil is the latest end of a Retry-After it was told; zero:
	// none.
	RetryUntil time.Time
	// Remaining is the least remaining the provider said in its window
	// that ended at RemainingAt; zero RemainingAt: none said.
	Remaining   int64
	RemainingAt time.Time
}

// Tally sums a fleet's reports into rounds. It keeps each instance's
// counters of the previous round, so a pushback is counted once however
// often its record is read. The zero Tally is ready; its first Round only
// takes the baselines (Ok false): what the instances counted before is
// not that interval's.
type Tally struct {
	started bool
	totals  map[string]counter
}

type counter struct {
	started   time.Time
	pushbacks int64
}

// Round returns what the reports say happened since the previous call,
// as the controller's round at at, for a provider of window w; ok is false
// on the first call.
//
// The provider's last window that ended is the latest RemainingAt: each
// instance computes it from a reset, so the instances' ends agree to
// within a tenth of a window, and the least remaining said in it is what
// the fleet as a whole left unused.
func (t *Tally) Round(at time.Time, w time.Duration, reps []Report) (r Round, ok bool) {
	r.At = at
	seen := make(map[string]counter, len(reps))
	for _, rep := range reps {
		cur := counter{started: rep.Started, pushbacks: rep.Pushbacks}
		seen[rep.ID] = cur
		prev, had := t.totals[rep.ID]
		if !had || !prev.started.Equal(cur.started) || cur.pushbacks < prev.pushbacks {
			prev = counter{} // a new incarnation: all it counted is new
		}
		r.Pushbacks += max(cur.pushbacks-prev.pushbacks, 0)
		// What it sends per window: its quota, or its demand if less.
		// Both are in its record whenever they move, where a count of
		// admissions is only as fresh as the record's last write.
		if rep.Enforced > 0 {
			r.Sent += min(rep.Enforced, max(rep.Demand, 0))
		}
		if rep.RetryUntil.After(r.RetryUntil) {
			r.RetryUntil = rep.RetryUntil
		}
		if rep.RemainingAt.After(r.RemainingAt) {
			r.RemainingAt = rep.RemainingAt
		}
	}
	for _, rep := range reps {
		if !rep.RemainingAt.IsZero() && r.RemainingAt.Sub(rep.RemainingAt) <= w/10 && (!r.HasRemaining || rep.Remaining < r.Remaining) {
			r.HasRemaining, r.Remaining = true, rep.Remaining
		}
	}
	t.totals = seen
	first := !t.started
	t.started = true
	return r, !first
}
