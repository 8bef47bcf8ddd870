package limiter

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"
)

// Requests is the dimension that counts calls: the one a Limit counts when
// it names none, and the one an acquisition takes 1 of unless it says
// otherwise.
const Requests = "requests"

// MaxLimits is the most limits one Multi enforces together.
const MaxLimits = 4

// Limit is one of a provider's limits: at most Quota units of Dimension in
// every aligned window of length Window. Dimension is Requests when empty,
// or a cost the caller names, such as "tokens".
type Limit struct {
	Dimension string
	Quota     int64
	Window    time.Duration
}

func (lm Limit) String() string {
	return fmt.Sprintf("%s %d/%v", lm.dim(), lm.Quota, lm.Window)
}

func (lm Limit) dim() string {
	if lm.Dimension == "" {
		return Requests
	}
	return lm.Dimension
}

// Amount is what an acquisition takes in one dimension: Cost("tokens",
// 700). A zero Dimension is Requests.
type Amount struct {
	Dimension string
	N         int64
}

// Cost returns the amount n of dimension dim.
func Cost(dim string, n int64) Amount { return Amount{Dimension: dim, N: n} }

// Multi enforces several limits together, such as "100 requests per second
// and 50,000 per day" or "500 requests and 200,000 tokens per minute": an
// acquisition is granted only when every limit has room for its cost in
// its own aligned window, and takes nothing from any limit otherwise.
//
// Each limit is a Limiter of its own, with its own windows and quota (a
// cluster member sets each limit's share with SetQuota or Schedule), and
// all of them read one clock: SetClockOffset, SetClockUncertainty,
// SetExpiry, Backoff, SetPacing and SetShadow apply to every limit. A
// coordinator may set a limit's quota, expiry, pacing or shadow mode on
// that limit alone (Limiter(i); cluster.JoinGroup does); an acquisition
// is then admitted past the quotas only where every limit it takes from
// is in shadow mode.
//
// TryAcquire never waits; Acquire waits, up to a maximum, for the earliest
// instant at which every limit has room, and Reserve answers when that is.
// Waiters of every limit are served first come, first served, as in a
// Limiter. Each returns a Grant, whose Settle reports the actual cost once
// the provider answered (the tokens a call used), giving back what was
// charged too much. When every limit has room now, TryAcquire and Acquire
// take no lock and make no allocation.
//
// A Multi serves priority classes as a Limiter does (WithClasses): each
// limit keeps its classes' reserves of its own quota, and an acquisition
// of a class is admitted only where every limit it takes from, after it,
// still covers what the other classes have not used of their reserves
// there; it takes from none otherwise. A class's reserve is thus kept
// from lower classes in every limit that lists it, and a limit without
// classes keeps none. NewMulti's WithClasses and SetClasses give every
// limit the same classes, Limiter(i).SetClasses one limit its own (a
// cluster.Group gives its provider's first limit the provider's). A call
// names its class with WithClass: Acquire reads it from its context, and
// so do TryAcquireContext and ReserveContext; TryAcquire and Reserve are
// of the default class. Each limit finds the class by name among its own,
// a name it does not list being its default class. A waiter of a higher
// class is placed ahead of waiters of lower classes not yet valid, in
// every limit at once, the first limit both take from that has classes
// deciding which is higher. With classes, every acquisition is decided
// under the limits' locks.
//
// A Multi is safe for concurrent use. Use NewMulti to create one.
type Multi struct {
	lims   []*Limiter
	limits []Limit  // as given, each with its dimension named
	dim    []int    // limit i counts dimension names[dim[i]]
	names  []string // the distinct dimensions, in order of first use
	req    int      // index of Requests in names; -1: no limit counts requests

	nextSeq uint64 // MultiReservation order; guarded by every limit's mu
}

// NewMulti returns a Multi enforcing limits, 1 to MaxLimits of them. A
// dimension name is 1 to 32 lower-case letters, digits or '_', starting
// with a letter; quotas and windows are those New accepts (windows up to a
// day). Two limits may count one dimension in one window: both hold, so
// the smaller binds (a Multi whose limits are kept by several providers'
// shares, cluster.JoinGroup, starts so). opts apply to every limit. It
// returns an error wrapping ErrInvalid for anything else.
func NewMulti(limits []Limit, opts ...Option) (*Multi, error) {
	if len(limits) < 1 || len(limits) > MaxLimits {
		return nil, fmt.Errorf("%w: a Multi enforces 1 to %d limits, got %d", ErrInvalid, MaxLimits, len(limits))
	}
	m := &Multi{req: -1}
	for i, lm := range limits {
		lm.Dimension = lm.dim()
		if err := ValidateDimension(lm.Dimension); err != nil {
			return nil, fmt.Errorf("limit %d: %w", i, err)
		}
		l, err := New(lm.Quota, lm.Window, opts...)
		if err != nil {
			return nil, fmt.Errorf("limit %v: %w", lm, err)
		}
		if len(m.lims) > 0 {
			l.shareClock(m.lims[0])
		}
		d := m.dimIndex(lm.Dimension)
		if d < 0 {
			d = len(m.names)
			m.names = append(m.names, lm.Dimension)
			if lm.Dimension == Requests {
				m.req = d
			}
		}
		l.group = m
		m.lims = append(m.lims, l)
		m.limits = append(m.limits, lm)
		m.dim = append(m.dim, d)
	}
	return m, nil
}

// ValidateDimension reports whether name is a usable dimension: 1 to 32
// lower-case letters, digits or '_', starting with a letter.
func ValidateDimension(name string) error {
	ok := len(name) >= 1 && len(name) <= 32 && name[0] >= 'a' && name[0] <= 'z'
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_'
	}
	if !ok {
		return fmt.Errorf("%w: a dimension is 1 to 32 lower-case letters, digits or '_', starting with a letter, got %.40q", ErrInvalid, name)
	}
	return nil
}

// shareClock makes l read the same clock as src: the same anchor, offset
// and custom clock, so that one reading of time holds for both.
func (l *Limiter) shareClock(src *Limiter) {
	l.clock = src.clock
	l.base = src.base
	l.offset.Store(src.offset.Load())
	l.delta.Store(src.delta.Load())
}

func (m *Multi) dimIndex(name string) int {
	for i, n := range m.names {
		if n == name {
			return i
		}
	}
	return -1
}

// Limits returns the limits the Multi was made with.
func (m *Multi) Limits() []Limit { return append([]Limit(nil), m.limits...) }

// costs turns an acquisition's amounts into what it takes from each limit:
// 1 request unless the amounts name requests, nothing from a dimension
// they do not name.
func (m *Multi) costs(cost []Amount, ns *[MaxLimits]int64) error {
	var per [MaxLimits]int64
	if m.req >= 0 {
		per[m.req] = 1
	}
	if err := m.named(cost, &per, nil); err != nil {
		return err
	}
	any := false
	for i, d := range m.dim {
		ns[i] = per[d]
		any = any || ns[i] > 0
	}
	if !any {
		return fmt.Errorf("%w: the cost takes nothing from any limit", ErrInvalid)
	}
	return nil
}

// named sets per[d] to the amount cost names for each dimension d, and
// marks it in seen if not nil.
func (m *Multi) named(cost []Amount, per *[MaxLimits]int64, seen *[MaxLimits]bool) error {
	var dup [MaxLimits]bool
	for _, a := range cost {
		name := a.Dimension
		if name == "" {
			name = Requests
		}
		d := m.dimIndex(name)
		switch {
		case d < 0:
			return fmt.Errorf("%w: dimension %q is none of the limits' (%s)", ErrInvalid, name, strings.Join(m.names, ", "))
		case dup[d]:
			return fmt.Errorf("%w: dimension %q named twice", ErrInvalid, name)
		case a.N < 0 || a.N > MaxQuota:
			return fmt.Errorf("%w: %s must be between 0 and %d, got %d", ErrInvalid, name, int64(MaxQuota), a.N)
		}
		dup[d], per[d] = true, a.N
		if seen != nil {
			seen[d] = true
		}
	}
	return nil
}

// Grant is what one acquisition took from each limit, for Settle. The zero
// Grant, and one already settled, settle nothing.
type Grant struct {
	m       *Multi
	at      int64             // when it was granted, corrected ns
	n       [MaxLimits]int64  // permits charged to each limit
	seq     [MaxLimits]uint64 // the window each was charged to (see fastAt)
	charged [MaxLimits]bool   // false: none taken (shadow mode admitted it)
	class   [MaxLimits]uint8  // the class each was charged to, in set
	set     [MaxLimits]*classes
	res     *MultiReservation // the reservation it came from, if any: Settle and its Cancel give back once
	_       [0]func()         // not comparable
}

// noWindow is a seq no state word holds: the window is unknown or closed.
const noWindow = ^uint64(0)

// Cost returns what the grant took, or still holds after Settle, in
// dimension dim: the most any limit of that dimension was charged.
func (g *Grant) Cost(dim string) int64 {
	if g.m == nil {
		return 0
	}
	var n int64
	for i, lm := range g.m.limits {
		if lm.Dimension == dim || dim == "" && lm.Dimension == Requests {
			n = max(n, g.n[i])
		}
	}
	return n
}

// TryAcquire takes cost from every limit if each has room for it now, and
// reports whether it did; it never waits. cost names an amount per
// dimension: 1 request unless it names requests, nothing from a dimension
// it does not name. A refusal takes nothing from any limit, and is counted
// in the Stats of the first limit, in order, that had no room. An invalid
// cost is refused. In shadow mode it reports true.
func (m *Multi) TryAcquire(cost ...Amount) (Grant, bool) {
	return m.tryAcquire(context.Background(), cost)
}

// TryAcquireContext is TryAcquire of the priority class ctx names
// (WithClass). It never waits: ctx is read for its class alone, not for
// its deadline or cancellation.
func (m *Multi) TryAcquireContext(ctx context.Context, cost ...Amount) (Grant, bool) {
	return m.tryAcquire(ctx, cost)
}

func (m *Multi) tryAcquire(ctx context.Context, cost []Amount) (Grant, bool) {
	var g Grant
	if m.costs(cost, &g.n) != nil {
		return Grant{}, false
	}
	now := m.lims[0].now()
	g.at = now
	shadow := -1 // unknown until a limit has no room: 1 if every limit g takes from is in shadow
	for i, l := range m.lims {
		n := g.n[i]
		if n == 0 {
			continue
		}
		seq, ok := l.fastAt(n, now)
		charged := ok
		if !ok {
			if shadow < 0 {
				shadow = 0
				if m.allShadow(g.n) {
					shadow = 1
				}
			}
			var set *classes
			var cls int
			seq, charged, ok, set, cls = l.trySlow(ctx, n, shadow == 1)
			g.set[i], g.class[i] = set, uint8(cls)
		}
		if !ok {
			m.giveBack(&g, i)
			return Grant{}, false
		}
		g.seq[i], g.charged[i] = seq, charged
	}
	g.m = m
	return g, true
}

// allShadow reports whether every limit ns takes from is in shadow mode,
// so that the acquisition only counts what enforcing would do. The limits
// of one Multi may disagree (a cluster.Group sets each from its own
// provider's config): then every part is taken as if enforced, so that an
// enforcing limit never admits past its quota because another limit is in
// shadow, nor a shadow one past its own while another enforces.
func (m *Multi) allShadow(ns [MaxLimits]int64) bool {
	for i, l := range m.lims {
		if ns[i] > 0 && !l.shadow.Load() {
			return false
		}
	}
	return true
}

// giveBack returns what g took from the limits before limit k, to the
// window it took it from.
func (m *Multi) giveBack(g *Grant, k int) {
	for i := range k {
		if g.charged[i] {
			m.lims[i].settle(g.seq[i], g.at, g.n[i], 0, false, g.set[i], int(g.class[i]))
			g.charged[i] = false
		}
	}
}

// Acquire waits until every limit has room for cost in the window that
// contains one instant, and returns the Grant then; the permits are the
// caller's to use at once. cost is as for TryAcquire.
//
// If that instant lies further away than maxWait, or past ctx's deadline,
// it returns an error wrapping ErrTimeout at once, without sleeping and
// without taking anything. If ctx is cancelled while it sleeps it returns
// an error matching ErrCanceled and context.Canceled (ErrTimeout and
// context.DeadlineExceeded for its deadline), and every limit gets its
// permits back. A change of one limit (SetQuota, say) may move the instant
// later, for every limit at once, or fail the wait with ErrTimeout when
// that is past the deadline. When a limit's quota in force is below its
// cost, Acquire waits for a change as Limiter.AcquireN does and then
// returns an error matching ErrTimeout and ErrNoQuota. An invalid cost
// gives ErrInvalid, a closed Multi ErrClosed; in shadow mode it returns at
// once.
func (m *Multi) Acquire(ctx context.Context, maxWait time.Duration, cost ...Amount) (Grant, error) {
	if err := ctx.Err(); err != nil {
		return Grant{}, canceledError(err)
	}
	var g Grant
	if err := m.costs(cost, &g.n); err != nil {
		return Grant{}, err
	}
	now := m.lims[0].now()
	g.at = now
	i := 0
	for ; i < len(m.lims); i++ {
		if g.n[i] == 0 {
			continue
		}
		seq, ok := m.lims[i].fastAt(g.n[i], now)
		if !ok {
			break
		}
		g.seq[i], g.charged[i] = seq, true
	}
	if i == len(m.lims) {
		g.m = m
		return g, nil
	}
	m.giveBack(&g, i) // the slow path places them all together
	r, err := m.reserve(ctx, g.n, maxWait, false)
	if err != nil {
		return Grant{}, err
	}
	return r.Wait(ctx)
}

// AcquireN is Acquire of n requests and nothing of any other dimension,
// for callers that count permits (consumer.Limiter); it returns
// ErrInvalid when no limit counts requests.
func (m *Multi) AcquireN(ctx context.Context, n int64, maxWait time.Duration) error {
	_, err := m.Acquire(ctx, maxWait, Cost(Requests, n))
	return err
}

// Reserve reserves cost from every limit at the earliest instant each has
// room for it within maxWait, and returns at once: the MultiReservation
// says when, and Cancel gives every limit its permits back. It returns an
// error wrapping ErrTimeout when no such instant lies within maxWait,
// ErrNoQuota when a limit's quota in force is below its cost, ErrInvalid
// for an invalid cost and ErrClosed after Close. In shadow mode the
// reservation is valid at once.
func (m *Multi) Reserve(maxWait time.Duration, cost ...Amount) (*MultiReservation, error) {
	return m.ReserveContext(context.Background(), maxWait, cost...)
}

// ReserveContext is Reserve of the priority class ctx names (WithClass).
// It returns at once, as Reserve does: ctx's deadline, like maxWait,
// bounds when the permits may become valid, and a ctx already done gives
// an error matching ErrCanceled and ctx.Err(), but the reservation
// outlives ctx: only Cancel gives its permits back.
func (m *Multi) ReserveContext(ctx context.Context, maxWait time.Duration, cost ...Amount) (*MultiReservation, error) {
	var ns [MaxLimits]int64
	if err := m.costs(cost, &ns); err != nil {
		return nil, err
	}
	return m.reserve(ctx, ns, maxWait, true)
}

// SetClasses gives every limit the priority classes cs, as
// Limiter.SetClasses does for one, all at once: none makes the Multi one
// without classes again. It returns an error wrapping ErrInvalid for a
// list WithClasses refuses, ErrClosed when a limit is closed; then
// nothing changes.
func (m *Multi) SetClasses(cs ...Class) error {
	if err := validateClasses(cs); err != nil {
		return err
	}
	cs = append([]Class(nil), cs...)
	m.lock()
	defer m.unlock()
	for _, l := range m.lims {
		if l.closed {
			return ErrClosed
		}
	}
	for _, l := range m.lims {
		l.setClassesLocked(cs)
	}
	return nil
}

// lock takes every limit's mutex, in order: the only place more than one
// is held, so no two callers can deadlock.
func (m *Multi) lock() {
	for _, l := range m.lims {
		l.mu.Lock()
	}
}

func (m *Multi) unlock() {
	for i := len(m.lims) - 1; i >= 0; i-- {
		m.lims[i].mu.Unlock()
	}
}

// Backoff pauses every limit until now+d (see Limiter.Backoff).
func (m *Multi) Backoff(d time.Duration) {
	for _, l := range m.lims {
		l.Backoff(d)
	}
}

// Pushback records a pushback of the provider on the first limit (the one
// a provider's config states) and pauses every limit for retryAfter (see
// Limiter.Pushback).
func (m *Multi) Pushback(retryAfter time.Duration) {
	m.Observe(Signal{Pushback: true, RetryAfter: retryAfter})
}

// Observe records s on the first limit and pauses every limit for a
// pushback's RetryAfter (see Limiter.Observe).
func (m *Multi) Observe(s Signal) {
	m.lims[0].Observe(s)
	if s.Pushback {
		m.Backoff(s.RetryAfter)
	}
}

// SetQuota sets limit i's quota from at on (see Limiter.SetQuota).
func (m *Multi) SetQuota(i int, q int64, at time.Time) error {
	l, err := m.limit(i)
	if err != nil {
		return err
	}
	return l.SetQuota(q, at)
}

// Schedule sets limit i's quota and window from at on, and returns from
// when they govern whole windows (see Limiter.Schedule).
func (m *Multi) Schedule(i int, q int64, window time.Duration, at time.Time) (time.Time, error) {
	l, err := m.limit(i)
	if err != nil {
		return time.Time{}, err
	}
	return l.Schedule(q, window, at)
}

// Limiter returns limit i's Limiter (nil when there is none), for a
// coordinator that keeps that limit's quota, as cluster.JoinGroup does.
// Acquire through the Multi, never from it alone: an acquisition from one
// limit is not all-or-nothing. Set the clock (SetClockOffset,
// SetClockUncertainty) on the Multi, never on one limit: the limits must
// read one clock.
func (m *Multi) Limiter(i int) *Limiter {
	l, _ := m.limit(i)
	return l
}

func (m *Multi) limit(i int) (*Limiter, error) {
	if i < 0 || i >= len(m.lims) {
		return nil, fmt.Errorf("%w: limit index must be between 0 and %d, got %d", ErrInvalid, len(m.lims)-1, i)
	}
	return m.lims[i], nil
}

// SetClockOffset sets the clock correction of every limit at once (see
// Limiter.SetClockOffset).
func (m *Multi) SetClockOffset(d time.Duration) {
	m.lock()
	defer m.unlock()
	anchor := time.Now()
	for _, l := range m.lims {
		l.setClockOffsetLocked(d, anchor)
	}
	m.alignFixedLocked()
}

// alignFixedLocked brings the parts of every MultiReservation made by
// Reserve, which a clock correction moved alike (Limiter.shiftFixedLocked),
// into the band (open to shut) of every part's window on the limiters'
// clock, so that it is valid while every part's window is under way.
func (m *Multi) alignFixedLocked() {
	for _, l := range m.lims {
		for _, bw := range l.book {
			for r := range bw.res {
				mr := r.multi
				if mr == nil || !mr.holder || mr.state != resPending || r.due == math.MaxInt64 {
					continue
				}
				lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
				for i, p := range mr.rs {
					if p != nil && mr.placed[i] {
						sp := m.lims[i].spanLocked(p.win)
						lo, hi = max(lo, sp.open()), min(hi, sp.shut()-1)
					}
				}
				t := r.told // when a wider band leaves no instant in every part's
				if lo <= hi {
					t = max(min(t, hi), lo)
				}

				for i, p := range mr.rs {
					if p != nil && mr.placed[i] {
						p.due = t
					}
				}
				mr.due = t
			}
		}
	}
}

// SetClockUncertainty sets every limit's guard band at once (see
// Limiter.SetClockUncertainty).
func (m *Multi) SetClockUncertainty(u time.Duration) {
	m.lock()
	defer m.unlock()
	for _, l := range m.lims {
		l.setClockUncertaintyLocked(u)
	}
}

// SetExpiry sets every limit's expiry (see Limiter.SetExpiry).
func (m *Multi) SetExpiry(t time.Time) {
	for _, l := range m.lims {
		l.SetExpiry(t)
	}
}

// SetPacing turns pacing on or off for every limit (see WithPacing).
func (m *Multi) SetPacing(on bool) {
	for _, l := range m.lims {
		l.SetPacing(on)
	}
}

// SetShadow turns shadow mode on or off for every limit (see WithShadow).
func (m *Multi) SetShadow(on bool) {
	for _, l := range m.lims {
		l.SetShadow(on)
	}
}

// Now returns the time every limit reads (see Limiter.Now).
func (m *Multi) Now() time.Time { return m.lims[0].Now() }

// Stats returns each limit's Stats, in the order of Limits.
func (m *Multi) Stats() []Stats {
	st := make([]Stats, len(m.lims))
	for i, l := range m.lims {
		st[i] = l.Stats()
	}
	return st
}

// Close releases every waiter with ErrClosed and makes every later call
// fail, as Limiter.Close. It is idempotent and returns nil.
func (m *Multi) Close() error {
	for _, l := range m.lims {
		l.Close()
	}
	return nil
}

// Settle reports what the call the Grant paid for actually cost, once the
// provider answered: actual names an amount per dimension, and a dimension
// it does not name keeps what was charged. Each limit's difference goes to
// the window the Grant was charged to:
//
//   - less than charged: the rest goes back to that window for later
//     callers, if it is still open; once it has closed nothing can go back
//     to it (and nothing goes to another), but Stats no longer counts it
//     as admitted;
//   - more than charged: the excess is taken from that window's room if it
//     is still open, and where the room does not suffice, or the window
//     has closed, it is counted beyond the quota, in Stats.Overdrawn: the
//     provider received it and no later window pays for it. The guarantee
//     that no window goes over its quota holds for what was charged, so
//     charge an upper bound (a request's max_tokens) and settle down.
//
// A Grant settles once; Settle on a Grant already settled, or the zero
// Grant, returns an error wrapping ErrInvalid, as does an invalid amount,
// and then changes nothing. So does Settle on the Grant of a
// MultiReservation cancelled since (Cancel gave everything back), and
// after Settle, Cancel of that reservation gives nothing back: the
// permits go back once.
func (g *Grant) Settle(actual ...Amount) error {
	if g.m == nil {
		return fmt.Errorf("%w: the grant was settled already, or is empty", ErrInvalid)
	}
	m := g.m
	var per [MaxLimits]int64
	var seen [MaxLimits]bool
	if err := m.named(actual, &per, &seen); err != nil {
		return err
	}
	if r := g.res; r != nil && r.holder { // only a holder can Cancel
		m.lock()
		canceled := r.state == resCanceled
		r.settled = !canceled
		m.unlock()
		if canceled {
			return fmt.Errorf("%w: the reservation was cancelled, which gave its permits back", ErrInvalid)
		}
	}
	for i, l := range m.lims {
		d := m.dim[i]
		if !seen[d] || !g.charged[i] || per[d] == g.n[i] {
			continue
		}
		l.settle(g.seq[i], g.at, g.n[i], per[d], true, g.set[i], int(g.class[i]))
		g.n[i] = per[d]
	}
	g.m = nil
	return nil
}

// settle changes permits charged at corrected time at to the window seq,
// by class cls of set, from charged to actual (see Grant.Settle). A refund
// at once after a partial take (giveBack) counts as never taken: it does
// not count as Settled.
func (l *Limiter) settle(seq uint64, at, charged, actual int64, settled bool, set *classes, cls int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if !l.closed {
		l.advanceLocked(now)
	}
	// The window the permits were charged to is the current one if its
	// rollover count matches and the charge's time is within a window of
	// it (the count wraps after 2^23 windows; a hot-path charge may read
	// its time just before the window it lands in begins).
	// A closed limiter's window is closed too: what it had left may have
	// been handed on (a budget's Close gives it back to the counter), so
	// a settle above the charge is overdrawn, not taken from it (found by
	// review: a settle after Close spent what Close gave back, 120 in a
	// day of 100, none of it counted as overdrawn).
	w := l.cur.end - l.cur.start
	open := !l.closed && l.cur.end != math.MinInt64 && seq == seqOf(l.seq) && at < l.cur.end && at >= l.cur.start-w
	d := actual - charged
	l.useClassLocked(set, cls, open, d)
	switch {
	case d < 0 && open:
		l.addRemainingLocked(-d)
	case d < 0:
		l.counts.closedConsumed += d // not used, but its window has closed
	case open:
		// Beyond the room left, the window goes over its quota: counted
		// like consumption beyond a lowered quota.
		over := d - l.takeRemainingLocked(d)
		l.overCur += over
		l.counts.overdrawn += over
	default:
		l.counts.closedConsumed += d
		l.counts.overdrawn += d
	}
	if settled {
		l.counts.settled += d
	}
}

// takeRemainingLocked takes up to d of the current window's remaining
// permits and returns how many it took.
func (l *Limiter) takeRemainingLocked(d int64) int64 {
	for {
		s := l.state.Load()
		take := min(d, int64(s&remMask))
		if take == 0 || l.state.CompareAndSwap(s, s-uint64(take)) {
			return take
		}
	}
}
