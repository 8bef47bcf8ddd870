package limiter

import (
	"math"
	"time"
)

// waitBuckets are the upper bounds of the wait-time histogram in Stats.
var waitBuckets = [...]time.Duration{
	time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond,
	50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
}

// WaitBuckets returns the upper bounds of the buckets of
// Stats.WaitHistogram; the histogram has one more bucket, for longer waits.
func WaitBuckets() []time.Duration { return waitBuckets[:] }

// counts are the cumulative counters of the slow path; the hot path's
// admissions are derived from the windows' consumption instead, so that it
// writes nothing but the state word.
type counts struct {
	closedConsumed int64 // permits consumed by windows already closed
	rejected       int64
	timedOut       int64
	canceled       int64
	delayed        int64
	shadowAdmitted int64
	shadowDelayed  int64
	shadowRejected int64
	settled        int64 // what Grant.Settle changed: actual less charged
	overdrawn      int64 // what Settle charged beyond a window's quota
	waitSum        time.Duration
	waitHist       [len(waitBuckets) + 1]int64
}

// What shadow mode counted a permit as: what enforcing would have done.
const (
	shadowNone = iota
	shadowDelayed
	shadowRejected
)

// shadow counts n permits shadow mode admitted as kind (shadowDelayed or
// shadowRejected); a negative n takes them back.
func (c *counts) shadow(kind int, n int64) {
	c.shadowAdmitted += n
	switch kind {
	case shadowDelayed:
		c.shadowDelayed += n
	case shadowRejected:
		c.shadowRejected += n
	}
}

func (c *counts) observeWait(d time.Duration) {
	c.waitSum += d
	i := 0
	for i < len(waitBuckets) && d > waitBuckets[i] {
		i++
	}
	c.waitHist[i]++
}

// Stats is a snapshot of a Limiter's counters and settings. Counters are
// cumulative since New and count permits, not calls (AcquireN(ctx, 5, …)
// counts 5).
type Stats struct {
	// Admitted is the permits granted: taken at once, or reserved and now
	// valid, less those whose holders gave them back with Cancel. It
	// includes ShadowAdmitted.
	Admitted int64
	// Delayed is the permits that had to wait for a later slot or window,
	// counted when they were reserved.
	Delayed int64
	// Rejected is the permits TryAcquire refused.
	Rejected int64
	// TimedOut is the permits refused with ErrTimeout: at once because they
	// could not be valid within the caller's wait, or later because a change
	// of limits moved them past it.
	TimedOut int64
	// Canceled is the permits given back by cancelled waits and Cancel.
	Canceled int64
	// ShadowAdmitted is the permits shadow mode admitted beyond the quota;
	// ShadowDelayed and ShadowRejected split them by what enforcing would
	// have done: delay them within the caller's wait, or refuse them.
	ShadowAdmitted, ShadowDelayed, ShadowRejected int64
	// Settled is what Grant.Settle changed, actual less charged: negative
	// when calls cost less than they were charged. Admitted counts the
	// actual cost.
	Settled int64
	// Overdrawn is what Settle counted beyond a window's quota: calls that
	// cost more than they were charged where their window had no room left
	// for the excess, or had closed.
	Overdrawn int64
	// Wasted is the paced slots that passed unused, and the room held,
	// not admitted, for reservations made by Reserve: in a second window
	// when a change of window length left their time near a boundary,
	// and after a Multi's limit closed alone under them (see
	// Reservation).
	Wasted int64
	// Waiting is the reservations not yet valid (sleeping Acquire calls and
	// outstanding Reserve results), and WaitingPermits their permits.
	Waiting        int
	WaitingPermits int64
	// WaitTotal is the sum of the waits of Delayed permits' reservations,
	// and WaitHistogram their distribution over WaitBuckets (one count per
	// reservation).
	WaitTotal     time.Duration
	WaitHistogram [len(waitBuckets) + 1]int64

	// Quota is the current window's quota and Remaining what it can still
	// admit; Window is its length and WindowStart its start.
	Quota, Remaining int64
	Window           time.Duration
	WindowStart      time.Time
	// BackoffUntil is when the current Backoff ends; zero if none.
	BackoffUntil time.Time
	// ClockOffset is the correction added to the clock, and
	// ClockUncertainty the guard band kept at window boundaries.
	ClockOffset, ClockUncertainty time.Duration
	Pacing, Shadow, Closed        bool

	// Pushbacks is the provider's answers that pushed back (Pushback,
	// Observe), and RetryUntil the latest end of a Retry-After they named
	// (zero: none).
	Pushbacks  int64
	RetryUntil time.Time
	// ProviderRemaining is the least remaining the provider's headers
	// said (Observe) in its last window that ended, at ProviderWindowEnd
	// (zero: none yet): the room left unused in it. The answers' resets
	// delimit the provider's windows.
	ProviderRemaining int64
	ProviderWindowEnd time.Time

	// Classes is what each priority class the Limiter serves took and was
	// refused, highest class first; nil without classes (see WithClasses).
	Classes []ClassStats
}

// Stats returns a snapshot of the Limiter's counters and settings.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if !l.closed {
		l.advanceLocked(now)
	}
	var waiting int
	var waitingN, pendingCur int64
	var clsPending, clsWaiting []int64
	if l.classes != nil {
		clsPending, clsWaiting = make([]int64, len(l.curUsed)), make([]int64, len(l.curUsed))
	}
	for start, bw := range l.book {
		for r := range bw.res {
			if r.due > now && r.state == resPending {
				waiting++
				waitingN += r.n
				cls := l.classOfLocked(r, l.classes)
				if cls >= 0 {
					clsWaiting[cls] += r.n
				}
				if start == l.cur.start {
					pendingCur += r.n
					if cls >= 0 {
						clsPending[cls] += r.n
					}
				}
			}
		}
	}
	for _, r := range l.noQuota {
		waiting++
		waitingN += r.n
		if cls := l.classOfLocked(r, l.classes); cls >= 0 {
			clsWaiting[cls] += r.n
		}
	}
	c := l.counts
	st := Stats{
		Admitted:         c.closedConsumed + l.consumedLocked() - l.wasted.Load() - pendingCur + c.shadowAdmitted,
		Delayed:          c.delayed,
		Rejected:         c.rejected,
		TimedOut:         c.timedOut,
		Canceled:         c.canceled,
		ShadowAdmitted:   c.shadowAdmitted,
		ShadowDelayed:    c.shadowDelayed,
		ShadowRejected:   c.shadowRejected,
		Settled:          c.settled,
		Overdrawn:        c.overdrawn,
		Wasted:           l.wasted.Load(),
		Waiting:          waiting,
		WaitingPermits:   waitingN,
		WaitTotal:        c.waitSum,
		WaitHistogram:    c.waitHist,
		Quota:            l.cur.quota,
		Remaining:        int64(l.state.Load() & remMask),
		Window:           time.Duration(l.sched.cur.window),
		ClockOffset:      time.Duration(l.offset.Load()),
		ClockUncertainty: time.Duration(l.guard),
		Pacing:           l.pacing,
		Shadow:           l.shadow.Load(),
		Closed:           l.closed,
	}
	if l.cur.end != math.MinInt64 {
		st.WindowStart = time.Unix(0, l.cur.start)
		st.Window = time.Duration(l.cur.end - l.cur.start)
	}
	if l.backoffUntil > now {
		st.BackoffUntil = time.Unix(0, l.backoffUntil)
	}
	l.fb.fill(&st, now)
	l.classStatsLocked(&st, clsPending, clsWaiting)
	return st
}
