package limiter

import (
	"fmt"
	"time"
)

// Bounds on a window's length and on a window's quota.
const (
	// MinWindow is the shortest window a Limiter accepts.
	MinWindow = 10 * time.Millisecond
	// MaxWindow is the longest window a Limiter accepts.
	MaxWindow = time.Hour
	// MaxQuota is the largest quota (permits per window) and the largest n a
	// single call may ask for: 2^40-1, about 1.1e12.
	MaxQuota = 1<<40 - 1
)

const day = int64(24 * time.Hour)

// ValidateWindow reports whether w is a usable window length: between
// MinWindow and MaxWindow and dividing 24 hours exactly, so that windows
// start at the same instants on every machine, every day.
func ValidateWindow(w time.Duration) error {
	if w < MinWindow || w > MaxWindow {
		return fmt.Errorf("%w: window must be between %v and %v, got %v", ErrInvalid, MinWindow, MaxWindow, w)
	}
	if day%int64(w) != 0 {
		return fmt.Errorf("%w: window must divide 24h exactly, got %v", ErrInvalid, w)
	}
	return nil
}

// ValidateQuota reports whether q is a usable quota: 0 to MaxQuota.
func ValidateQuota(q int64) error {
	if q < 0 || q > MaxQuota {
		return fmt.Errorf("%w: quota must be between 0 and %d permits per window, got %d", ErrInvalid, int64(MaxQuota), q)
	}
	return nil
}

// WindowStart returns the start of the window of length w that contains t:
// the largest multiple of w since the Unix epoch not after t.
func WindowStart(t time.Time, w time.Duration) time.Time {
	ns := t.UnixNano()
	return time.Unix(0, ns-floorMod(ns, int64(w))).In(t.Location())
}

// floorMod is the modulus with the sign of m, so that windows before 1970
// (never seen in practice, but possible with a test clock) still align.
func floorMod(x, m int64) int64 {
	r := x % m
	if r < 0 {
		r += m
	}
	return r
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// params is what a window is configured with.
type params struct {
	quota  int64 // permits per window
	window int64 // length in ns
}

// schedule is the quota and window in force now and, optionally, a change
// that takes effect at a boundary both windows share.
type schedule struct {
	cur     params
	next    params
	from    int64 // corrected Unix ns at which next takes effect
	hasNext bool
}

// at returns the params in force at corrected time t.
func (s *schedule) at(t int64) params {
	if s.hasNext && t >= s.from {
		return s.next
	}
	return s.cur
}

// final reports whether the params in force at t can never change again
// without a new call.
func (s *schedule) final(t int64) bool { return !s.hasNext || t >= s.from }

// span is one window: its bounds and quota, and the pacing interval between
// its slots (0 when permits are not paced).
type span struct {
	start, end int64
	quota      int64
	interval   int64
}

// spanAt returns the window that contains corrected time t.
func (s *schedule) spanAt(t int64, pacing bool) span {
	p := s.at(t)
	start := t - floorMod(t, p.window)
	sp := span{start: start, end: start + p.window, quota: p.quota}
	if pacing && p.quota > 0 {
		sp.interval = max(1, p.window/p.quota)
	}
	return sp
}

// slotTime is when slot k of the window becomes valid.
func (sp span) slotTime(k int64) int64 { return sp.start + k*sp.interval }
