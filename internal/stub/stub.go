// Package stub is the examples' rate-limited provider: an HTTP handler with
// a known limit per wall-clock-aligned window that counts every call by the
// window it arrives in, answers the calls beyond the limit with 429 and a
// Retry-After until the next window, and remembers each window's count so a
// program can show and check that the limit was never exceeded. A second
// Stub can count a cost instead of calls: the tokens each call uses, as a
// model API limits tokens per minute (Stub.Tokens).
package stub

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Window is one aligned window as the stub saw it.
type Window struct {
	Start time.Time
	Calls int64 // calls (or tokens) that arrived in it, answered or refused
	Limit int64 // the limit in force when its first call arrived
}

// Over reports whether more calls arrived than the limit.
func (w Window) Over() bool { return w.Calls > w.Limit }

// Stub is a provider with a limit of calls per aligned window. It is safe
// for concurrent use.
type Stub struct {
	window time.Duration
	now    func() time.Time

	mu    sync.Mutex
	limit int64
	wins  map[int64]*Window // by window index (Unix time / window)
	total int64

	tokens *Stub                      // counts the tokens of each call; nil: none
	use    func(estimate int64) int64 // the tokens a call of that estimate uses
}

// New returns a Stub allowing limit calls per window of length window,
// windows starting at multiples of it on the system clock.
func New(limit int64, window time.Duration) *Stub {
	return &Stub{window: window, now: time.Now, limit: limit, wins: map[int64]*Window{}}
}

// SetLimit changes the limit from the current window on.
func (s *Stub) SetLimit(n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limit = n
	if w := s.wins[s.now().UnixNano()/int64(s.window)]; w != nil {
		w.Limit = n
	}
}

// Limit returns the limit in force.
func (s *Stub) Limit() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limit
}

// Call counts one call now. It returns 0 when the call is within the limit,
// or else how long until the next window (the Retry-After to answer).
func (s *Stub) Call() time.Duration { return s.Add(1) }

// Add counts n units now: calls, or for a Stub counting tokens, tokens.
// Like Call, it returns 0 when the window is within the limit, or else
// how long until the next window.
func (s *Stub) Add(n int64) time.Duration {
	now := s.now()
	k := now.UnixNano() / int64(s.window)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total += n
	w := s.wins[k]
	if w == nil {
		w = &Window{Start: time.Unix(0, k*int64(s.window)), Limit: s.limit}
		s.wins[k] = w
	}
	w.Calls += n
	if w.Calls <= w.Limit {
		return 0
	}
	return w.Start.Add(s.window).Sub(now)
}

// Tokens gives s a tokens limit too, counted by t: a call sends its
// estimated tokens in the X-Tokens header, uses use(estimate) of them
// (counted in t's window even if refused), and is answered with the
// tokens used in X-Tokens-Used, or 429 once t's window is over its limit.
// Call it before serving.
func (s *Stub) Tokens(t *Stub, use func(estimate int64) int64) {
	s.tokens, s.use = t, use
}

// ServeHTTP answers 200, or 429 Too Many Requests with Retry-After (whole
// seconds, rounded up, as HTTP wants) when the window's limit is used up,
// of calls or of tokens.
func (s *Stub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if d := s.Call(); d > 0 {
		tooMany(w, d, fmt.Sprintf("provider: over %d calls per %v", s.Limit(), s.window))
		return
	}
	if s.tokens != nil {
		estimate, err := strconv.ParseInt(r.Header.Get("X-Tokens"), 10, 64)
		if err != nil || estimate < 0 {
			http.Error(w, "provider: X-Tokens: want the call's estimated tokens, a whole number, 0 or more", http.StatusBadRequest)
			return
		}
		used := s.use(estimate)
		if d := s.tokens.Add(used); d > 0 {
			tooMany(w, d, fmt.Sprintf("provider: over %d tokens per %v", s.tokens.Limit(), s.tokens.window))
			return
		}
		w.Header().Set("X-Tokens-Used", strconv.FormatInt(used, 10))
	}
	w.WriteHeader(http.StatusOK)
}

func tooMany(w http.ResponseWriter, d time.Duration, why string) {
	w.Header().Set("Retry-After", strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10))
	http.Error(w, why, http.StatusTooManyRequests)
}

// Windows returns the windows that are over (before the current one),
// oldest first; windows with no call are absent.
func (s *Stub) Windows() []Window {
	cur := s.now().UnixNano() / int64(s.window)
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Window
	for _, k := range slices.Sorted(maps.Keys(s.wins)) {
		if k < cur {
			out = append(out, *s.wins[k])
		}
	}
	return out
}

// Last returns the last complete window (the one before the current one);
// ok is false when no call arrived in it.
func (s *Stub) Last() (w Window, ok bool) {
	k := s.now().UnixNano()/int64(s.window) - 1
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.wins[k]; p != nil {
		return *p, true
	}
	return Window{Start: time.Unix(0, k*int64(s.window)), Limit: s.limit}, false
}

// Total returns the calls (or tokens) counted since New.
func (s *Stub) Total() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}
