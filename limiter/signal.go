package limiter

import (
	"sync"
	"time"
)

// Signal is what one answer of the provider said about its limit: whether
// it pushed back (HTTP 429 or 503), for how long (Retry-After), and what
// its rate-limit headers said is left of its window. The limiter/feedback
// package reads one from an HTTP response.
type Signal struct {
	// Pushback says the provider refused the call for its limit.
	Pushback bool
	// RetryAfter is how long the provider asked to wait; 0: not said.
	RetryAfter time.Duration
	// Remaining is what the provider said is left of its window, valid
	// when HasRemaining; Reset is how long until that window resets (0:
	// not said).
	Remaining    int64
	HasRemaining bool
	Reset        time.Duration
}

// feedback is what the provider's answers said, for the instance's report
// (Stats). It has its own mutex: answers arrive at the rate of calls, and
// must not queue behind the slow path's.
type feedback struct {
	mu          sync.Mutex
	pushbacks   int64 // answers that pushed back, since New
	retryUntil  int64 // corrected Unix ns: the latest end of a Retry-After
	remaining   int64
	remainingAt int64 // corrected Unix ns of the freshest remaining; 0: none
	reset       int64 // corrected Unix ns when that remaining's window resets; 0: not said
}

// Pushback records that the provider refused a call for its limit (429 or
// 503), and pauses the limiter for retryAfter as Backoff does. The count
// goes into the instance's report, so that configd can lower the fleet's
// effective limit (an adaptive provider); Backoff alone only pauses this
// instance.
func (l *Limiter) Pushback(retryAfter time.Duration) {
	l.Observe(Signal{Pushback: true, RetryAfter: retryAfter})
}

// Observe records what one answer of the provider said: a pushback is
// counted and pauses the limiter for its RetryAfter (as Pushback); a
// remaining is kept if it is the freshest. Call it with every answer that
// carries rate-limit headers; it takes no lock the permits take.
func (l *Limiter) Observe(s Signal) {
	now := l.now()
	f := &l.fb
	f.mu.Lock()
	if s.Pushback {
		f.pushbacks++
		if s.RetryAfter > 0 {
			f.retryUntil = max(f.retryUntil, addClamped(now, s.RetryAfter))
		}
	}
	if s.HasRemaining && now >= f.remainingAt {
		f.remaining, f.remainingAt, f.reset = max(s.Remaining, 0), now, 0
		if s.Reset > 0 {
			f.reset = addClamped(now, s.Reset)
		}
	}
	f.mu.Unlock()
	if s.Pushback {
		l.Backoff(s.RetryAfter)
	}
}

// fill copies the feedback into st.
func (f *feedback) fill(st *Stats) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st.Pushbacks = f.pushbacks
	if f.retryUntil != 0 {
		st.RetryUntil = time.Unix(0, f.retryUntil)
	}
	if f.remainingAt != 0 {
		st.ProviderRemaining, st.ProviderRemainingAt = f.remaining, time.Unix(0, f.remainingAt)
		if f.reset != 0 {
			st.ProviderReset = time.Unix(0, f.reset)
		}
	}
}
