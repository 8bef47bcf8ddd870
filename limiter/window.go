package limiter

import (
	"fmt"
	"math"
	"math/bits"
	"time"
)

// Bounds on a window's length and on a window's quota.
const (
	// MinWindow is the shortest window a Limiter accepts.
	MinWindow = 10 * time.Millisecond
	// MaxWindow is the longest window a Limiter accepts: a day, for a
	// provider's daily quota beside its per-second limit (see Multi).
	MaxWindow = 24 * time.Hour
	// MaxQuota is the largest quota (permits per window) and the largest n a
	// single call may ask for: 2^40-1, about 1.1e12.
	MaxQuota = 1<<40 - 1
)

const day = int64(24 * time.Hour)

// The limiter's time is the whole days int64 nanoseconds since the Unix
// epoch hold, 1677-09-22 to 2262-04-11: every window length divides a day,
// so every window within them is whole. Outside them nothing is admitted.
// (A window cut short by the end of int64 time would have no next window
// to roll over to.)
const (
	timeStart = math.MinInt64 / day * day // rounds toward zero: the first whole day
	timeEnd   = math.MaxInt64 / day * day // 2262-04-11T00:00:00Z: the end of the last
)

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

// schedule is the quota and window in force now and the changes scheduled
// to take effect later, in order of time. Each change starts at a boundary
// of both the window before it and its own. An expiry overrides them all:
// a window that begins at or after it has quota 0 (see SetExpiry).
type schedule struct {
	cur     params
	changes []change
	expires bool  // whether expiry is set; the zero schedule never expires
	expiry  int64 // corrected Unix ns
}

type change struct {
	from int64 // corrected Unix ns at which p takes effect
	p    params
}

// at returns the params in force at corrected time t.
func (s *schedule) at(t int64) params {
	p := s.cur
	for _, c := range s.changes {
		if c.from > t {
			break
		}
		p = c.p
	}
	return p
}

// nextChange returns the time of the first change after t, and false if
// there is none: the params in force at t hold for good. The first window
// to begin at or after the expiry is a change, to quota 0 for good: from it
// on nothing changes any more.
func (s *schedule) nextChange(t int64) (int64, bool) {
	e, expires := s.expiryStart()
	if expires && e <= t {
		return 0, false
	}
	for _, c := range s.changes {
		if c.from > t {
			if expires {
				return min(c.from, e), true
			}
			return c.from, true
		}
	}
	return e, expires
}

// quotaAhead reports whether a change scheduled after t gives a quota of
// at least n to a window that begins before the expiry.
func (s *schedule) quotaAhead(t, n int64) bool {
	e, expires := s.expiryStart()
	for _, c := range s.changes {
		if c.from > t && c.from < timeEnd && c.p.quota >= n && (!expires || c.from < e) {
			return true
		}
	}
	return false
}

// expiryStart returns the start of the first window that begins at or
// after the expiry, and false if there is no expiry, or no such window
// before the end of int64 time.
func (s *schedule) expiryStart() (int64, bool) {
	if !s.expires {
		return 0, false
	}
	sp := s.spanAt(s.expiry, false)
	switch {
	case sp.start == s.expiry:
		return sp.start, true
	case sp.end == math.MaxInt64: // cut short: no valid window divides 2^63-1
		return 0, false
	}
	return sp.end, true
}

// advance folds the changes in effect by t into cur.
func (s *schedule) advance(t int64) {
	i := 0
	for i < len(s.changes) && s.changes[i].from <= t {
		s.cur = s.changes[i].p
		i++
	}
	s.changes = s.changes[i:]
}

// setFrom schedules p from the first instant at or after t that is a
// boundary of both p's window and the window in force just before it,
// after dropping every change scheduled at or after t: a later call
// overrides what an earlier one scheduled from the same point on, and the
// boundary is computed against the window really in force before it, so
// windows of the two lengths never overlap. Changes before t stay. It
// returns the boundary it chose (math.MaxInt64: none, time having ended).
func (s *schedule) setFrom(t int64, p params) int64 {
	i := 0
	for i < len(s.changes) && s.changes[i].from < t {
		i++
	}
	s.changes = s.changes[:i:i]
	if t >= timeEnd {
		return math.MaxInt64 // nothing takes effect once time has ended
	}
	cw := s.at(t).window
	step := p.window / gcd(p.window, cw) * cw // lcm: divides a day, as both do
	from := t + floorMod(-t, step)
	s.changes = append(s.changes, change{from: from, p: p})
	return from
}

// span is one window: its bounds and quota, and whether its permits are
// paced (slot k valid at start + k·(end−start)/quota) or all valid at start.
type span struct {
	start, end int64
	quota      int64
	paced      bool
	guard      int64 // nothing is admitted within guard of either end
}

// spanAt returns the window that contains corrected time t, with quota 0
// if it begins at or after the expiry. Before the limiter's time begins
// and after it ends there is one window each, with quota 0.
func (s *schedule) spanAt(t int64, pacing bool) span {
	switch {
	case t < timeStart:
		return span{start: math.MinInt64, end: timeStart}
	case t >= timeEnd:
		return span{start: timeEnd, end: math.MaxInt64}
	}
	p := s.at(t)
	start := t - floorMod(t, p.window)
	end := start + p.window
	q := p.quota
	if s.expires && start >= s.expiry {
		q = 0
	}
	return span{start: start, end: end, quota: q, paced: pacing && q > 0}
}

// withGuard sets the window's guard band, at most just under half the
// window so that some of it stays open.
func (sp span) withGuard(g int64) span {
	sp.guard = max(0, min(g, (sp.end-sp.start-1)/2))
	return sp
}

// open is the first instant of the window at which permits are admitted.
func (sp span) open() int64 { return sp.start + sp.guard }

// shut is the instant from which the window admits nothing more.
func (sp span) shut() int64 { return sp.end - sp.guard }

// slotTime is when slot k of the window becomes valid.
func (sp span) slotTime(k int64) int64 {
	if !sp.paced || k <= 0 {
		return sp.start
	}
	return sp.start + mulDiv(k, sp.end-sp.start, sp.quota)
}

// slotAt is the newest slot of the window valid at t (for t ≥ start).
func (sp span) slotAt(t int64) int64 {
	return min(mulDiv(t-sp.start, sp.quota, sp.end-sp.start), sp.quota-1)
}

// mulDiv returns a·b/c, rounded down, for a, b ≥ 0 and c > 0, saturating
// at math.MaxInt64: exact where a·b overflows int64.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(min(q, math.MaxInt64))
}
