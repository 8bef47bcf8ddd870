// Package stub is the examples' rate-limited provider: an HTTP handler with
// a known limit per wall-clock-aligned window that counts every call by the
// window it arrives in, answers the calls beyond the limit with 429 and a
// Retry-After until the next window, and remembers each window's count so a
// program can show and check that the limit was never exceeded.
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
	Calls int64 // calls that arrived in it, answered or refused
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
func (s *Stub) Call() time.Duration {
	now := s.now()
	k := now.UnixNano() / int64(s.window)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total++
	w := s.wins[k]
	if w == nil {
		w = &Window{Start: time.Unix(0, k*int64(s.window)), Limit: s.limit}
		s.wins[k] = w
	}
	w.Calls++
	if w.Calls <= w.Limit {
		return 0
	}
	return w.Start.Add(s.window).Sub(now)
}

// ServeHTTP answers 200, or 429 Too Many Requests with Retry-After (whole
// seconds, rounded up, as HTTP wants) when the window's limit is used up.
func (s *Stub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if d := s.Call(); d > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10))
		http.Error(w, fmt.Sprintf("provider: over %d calls per %v", s.Limit(), s.window), http.StatusTooManyRequests)
		return
	}
	w.WriteHeader(http.StatusOK)
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

// Total returns the calls counted since New.
func (s *Stub) Total() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}
