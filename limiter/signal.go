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
//
// A remaining is only worth something at the end of the provider's
// window: said mid-window, it counts calls still to come as room. So the
// answers' resets delimit the provider's windows, and what is reported is
// the least remaining said in the last window that ended: the room the
// fleet left unused in it (as seen by this instance; configd takes the
// least over the instances). A remaining without a reset is ignored.
type feedback struct {
	mu         sync.Mutex
	pushbacks  int64         // answers that pushed back, since New
	retryUntil int64         // corrected Unix ns: the latest end of a Retry-After
	curEnd     int64         // corrected Unix ns: the end of the provider's window under way; 0: none
	curRem     int64         // the least remaining said in it
	endAt      int64         // the end of the last window that ended; 0: none
	endRem     int64         // the least remaining said in it
	toldEnd    int64         // the endAt ProviderNews last told of
	news       chan struct{} // ProviderNews; one value waits, buffered
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
// remaining with its reset counts towards the provider's window it names
// (see Stats.ProviderRemaining). Call it with every answer that
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
	news := s.Pushback
	if s.HasRemaining && s.Reset > 0 {
		f.rollLocked(now)
		if f.endAt != f.toldEnd { // rolled now, or by a Stats since the last answer
			f.toldEnd, news = f.endAt, true
		}
		if f.curEnd == 0 {
			f.curEnd, f.curRem = addClamped(now, s.Reset), max(s.Remaining, 0)
		} else {
			f.curRem = min(f.curRem, max(s.Remaining, 0))
		}
	}
	f.mu.Unlock()
	if news {
		select {
		case f.news <- struct{}{}:
		default: // news already waits
		}
	}
	if s.Pushback {
		l.Backoff(s.RetryAfter)
	}
}

// ProviderNews returns a channel that receives when an answer of the
// provider (Observe, Pushback) brought news for the instance's report: a
// pushback, or the end of the provider's window with its remaining
// (Stats.ProviderWindowEnd moved). One value waits until it is taken,
// however much news came meanwhile; Observe never blocks on it. A cluster
// Member reports on it, so that its fleet's controller hears of a pushback
// without waiting for the next report interval.
func (l *Limiter) ProviderNews() <-chan struct{} { return l.fb.news }

// rollLocked ends the window under way if its reset has passed at now.
// f.mu must be held.
func (f *feedback) rollLocked(now int64) {
	if f.curEnd != 0 && now >= f.curEnd {
		f.endAt, f.endRem, f.curEnd = f.curEnd, f.curRem, 0
	}
}

// fill copies the feedback into st.
func (f *feedback) fill(st *Stats, now int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st.Pushbacks = f.pushbacks
	if f.retryUntil != 0 {
		st.RetryUntil = time.Unix(0, f.retryUntil)
	}
	f.rollLocked(now)
	if f.endAt != 0 {
		st.ProviderRemaining, st.ProviderWindowEnd = f.endRem, time.Unix(0, f.endAt)
	}
}
