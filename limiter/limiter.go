package limiter

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// The state word describes the current window in one atomic uint64, so that
// the hot path is a load, two comparisons and a compare-and-swap:
//
//	bit 63      slow: every call must take the slow path (closed, backing off)
//	bits 40..62 seq: the window's rollover count, modulo 2^23
//	bits 0..39  remaining: permits the current window can still admit
//
// Only the slow path, holding mu, rolls the word over to a new window, and it
// always changes seq when it does, so a compare-and-swap prepared against one
// window can never succeed against the next.
const (
	remBits  = 40
	remMask  = 1<<remBits - 1
	seqBits  = 23
	seqShift = remBits
	seqMask  = (1<<seqBits - 1) << seqShift
	slowBit  = 1 << 63
)

// Limiter admits at most a quota of permits in every wall-clock-aligned
// window: windows of length W start at multiples of W since the Unix epoch,
// on the limiter's clock corrected by its offset, so every instance that
// shares a provider agrees on where windows begin.
//
// Limiter has three ways to ask for permits. TryAcquire never waits.
// Acquire waits for a permit up to a maximum, returning ErrTimeout at once
// when the earliest permit lies further away. Reserve answers when a permit
// will be valid without waiting for it. Each has an N form for several
// permits counted in one window. Most callers should use Acquire.
//
// Waiters are served first come, first served: a permit that becomes free is
// reserved for the earliest waiter that asked, and each waiter sleeps until
// its own permit is valid, so a window boundary wakes only the waiters whose
// permits are due. A waiter whose context is cancelled gives its permit back
// for later callers.
//
// When a permit is available in the current window, the Limiter takes no
// lock, makes no allocation and starts no goroutine or timer. A Limiter
// starts no goroutines of its own; Close releases waiters.
//
// A Limiter is safe for concurrent use. Use New to create one; the zero value
// is not usable.
type Limiter struct {
	state atomic.Uint64
	_     [56]byte // keep the contended word off the read-mostly line below

	// Written under mu when a window rolls over or the limits change; read
	// by the hot path. start, quota and interval are stored before the state
	// word changes and end after it, so a reader that sees a new state word
	// never pairs it with an old end (see roll).
	end      atomic.Int64 // corrected Unix ns at which the current window ends
	start    atomic.Int64 // corrected Unix ns at which the current window began
	quota    atomic.Int64 // the current window's quota
	interval atomic.Int64 // ns between paced slots; 0 when not paced
	delta    atomic.Int64 // corrected Unix ns = ns since base + delta (system clock)
	offset   atomic.Int64 // correction added to clock.Now (custom clock)
	wasted   atomic.Int64 // paced slots that went unused by their time
	shadow   atomic.Bool
	wakeups  atomic.Int64 // times a waiter woke, for tests of herd behaviour

	base  time.Time // monotonic anchor of the system clock
	clock Clock     // nil: the system clock through base

	mu sync.Mutex // guards the fields below, and every change of the window
	// in the state word

	sched        schedule
	pacing       bool
	cur          span // the window the state word describes
	seq          uint64
	book         map[int64]*bookWindow // reservations by window start, current and future
	scanFrom     int64                 // windows before this start are known full
	noQuota      []*Reservation        // waiting for a quota ≥ n, first come first
	nextSeq      uint64                // reservation order
	overCur      int64                 // permits the current window took beyond a lowered quota
	backoffUntil int64
	closed       bool
	counts       counts
}

// bookWindow is what one window has reserved for waiters. For future windows
// charged is the permits promised; the current window's promises are already
// taken out of the state word's remaining.
type bookWindow struct {
	charged int64
	res     map[*Reservation]struct{}
}

// New returns a Limiter that admits at most quota permits in every window of
// the given length. quota may be 0 (nothing is admitted and waiters wait
// until SetQuota raises it) up to MaxQuota; window must lie between
// MinWindow and MaxWindow and divide 24 hours. It returns an error wrapping
// ErrInvalid for anything else.
func New(quota int64, window time.Duration, opts ...Option) (*Limiter, error) {
	if err := ValidateQuota(quota); err != nil {
		return nil, err
	}
	if err := ValidateWindow(window); err != nil {
		return nil, err
	}
	var cfg config
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	l := &Limiter{
		clock:  cfg.clock,
		pacing: cfg.pacing,
		sched:  schedule{cur: params{quota: quota, window: int64(window)}},
		book:   make(map[int64]*bookWindow),
	}
	l.shadow.Store(cfg.shadow)
	l.base = time.Now()
	l.setOffsetLocked(cfg.offset)
	// Start on an exhausted placeholder window that ends at once, so the
	// first call rolls the word into the real window under mu.
	l.cur = span{start: math.MinInt64, end: math.MinInt64}
	l.state.Store(0)
	l.end.Store(math.MinInt64)
	return l, nil
}

// now returns the limiter's time: corrected Unix nanoseconds.
func (l *Limiter) now() int64 {
	if l.clock != nil {
		return l.clock.Now().UnixNano() + l.offset.Load()
	}
	return int64(time.Since(l.base)) + l.delta.Load()
}

// setOffsetLocked re-anchors the system clock mapping, so that drift between
// the monotonic and the wall clock since the last anchor is dropped too.
func (l *Limiter) setOffsetLocked(d time.Duration) {
	l.offset.Store(int64(d))
	t := time.Now()
	l.delta.Store(t.UnixNano() + int64(d) - int64(t.Sub(l.base)))
}

// TryAcquire reports whether a permit is available now, and takes it if so.
// It never waits. It is TryAcquireN(1).
func (l *Limiter) TryAcquire() bool { return l.TryAcquireN(1) }

// TryAcquireN takes n permits, counted in the current window, if they are
// available now, and reports whether it did. It never waits, and never
// takes permits that earlier callers are waiting for. n outside 1..MaxQuota
// is refused. In shadow mode it always reports true.
func (l *Limiter) TryAcquireN(n int64) bool {
	if l.fast(n) {
		return true
	}
	return l.tryAcquireSlow(n)
}

// fast is the hot path: a permit from the current window, lock-free.
func (l *Limiter) fast(n int64) bool {
	if n < 1 || n > MaxQuota {
		return false
	}
	now := l.now()
	for {
		s := l.state.Load()
		if s&slowBit != 0 || int64(s&remMask) < n || now >= l.end.Load() {
			return false
		}
		next := s - uint64(n)
		var skipped int64
		if iv := l.interval.Load(); iv != 0 {
			var ok bool
			if next, skipped, ok = l.paced(s, n, now, iv); !ok {
				return false
			}
		}
		if l.state.CompareAndSwap(s, next) {
			if skipped > 0 {
				l.wasted.Add(skipped)
			}
			return true
		}
	}
}

// paced takes n paced slots from state word s at time now: the slots due
// by now that are unused, the newest n of them. Older unused slots are
// skipped (reported as skipped) so that pacing never turns into a burst.
func (l *Limiter) paced(s uint64, n, now, iv int64) (next uint64, skipped int64, ok bool) {
	q, start := l.quota.Load(), l.start.Load()
	rem := int64(s & remMask)
	k := q - rem // next unused slot
	if now < start {
		return 0, 0, false
	}
	due := min((now-start)/iv, q-1) // newest slot valid by now
	if due+1-k < n {
		return 0, 0, false
	}
	return s&^remMask | uint64(q-due-1), due + 1 - k - n, true
}

func (l *Limiter) tryAcquireSlow(n int64) bool {
	if n < 1 || n > MaxQuota {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	now := l.now()
	l.advanceLocked(now)
	if l.takeLocked(n, now) {
		return true
	}
	if l.shadow.Load() {
		l.counts.shadowRejected += n
		l.counts.shadowAdmitted += n
		return true
	}
	l.counts.rejected += n
	return false
}

// advanceLocked brings the state word up to time now: rolls it over to the
// window that contains now and sets or clears the slow bit.
func (l *Limiter) advanceLocked(now int64) {
	if now >= l.cur.end {
		l.roll(now)
	}
	slow := l.closed || now < l.backoffUntil
	for {
		s := l.state.Load()
		next := s &^ slowBit
		if slow {
			next |= slowBit
		}
		if next == s || l.state.CompareAndSwap(s, next) {
			return
		}
	}
}

// roll moves the state word to the window that contains now. The permits
// already promised to waiters in that window are taken out at once.
func (l *Limiter) roll(now int64) {
	if l.sched.hasNext && now >= l.sched.from {
		l.sched.cur, l.sched.hasNext = l.sched.next, false
	}
	l.counts.closedConsumed += l.consumedLocked()
	l.overCur = 0
	l.cur = l.sched.spanAt(now, l.pacing)
	charged := int64(0)
	for start, bw := range l.book {
		switch {
		case start < l.cur.start:
			delete(l.book, start) // due: their holders are admitted
		case start == l.cur.start:
			charged = bw.charged
			bw.charged = 0 // from now on in the state word
		}
	}
	if l.scanFrom < l.cur.start {
		l.scanFrom = l.cur.start
	}
	l.seq++
	l.start.Store(l.cur.start)
	l.quota.Store(l.cur.quota)
	l.interval.Store(l.cur.interval)
	rem := max(0, l.cur.quota-charged)
	for {
		s := l.state.Load()
		next := s&slowBit | (l.seq<<seqShift)&seqMask | uint64(rem)
		if l.state.CompareAndSwap(s, next) {
			break
		}
	}
	l.end.Store(l.cur.end)
}

// consumedLocked is how many of the current window's permits are taken,
// admitted or promised.
func (l *Limiter) consumedLocked() int64 {
	if l.cur.end == math.MinInt64 {
		return 0
	}
	return l.cur.quota - int64(l.state.Load()&remMask) + l.overCur
}

// takeLocked takes n permits from the current window if they are valid at
// now and nobody waits for them.
func (l *Limiter) takeLocked(n, now int64) bool {
	if now < l.backoffUntil || l.closed {
		return false
	}
	for {
		s := l.state.Load()
		if int64(s&remMask) < n || now >= l.cur.end {
			return false
		}
		next := s - uint64(n)
		var skipped int64
		if l.cur.interval != 0 {
			var ok bool
			if next, skipped, ok = l.paced(s, n, now, l.cur.interval); !ok {
				return false
			}
		}
		if l.state.CompareAndSwap(s, next) {
			l.wasted.Add(skipped)
			return true
		}
	}
}

// addRemainingLocked changes the current window's remaining permits by d,
// clamped to 0..quota.
func (l *Limiter) addRemainingLocked(d int64) {
	for {
		s := l.state.Load()
		rem := min(max(int64(s&remMask)+d, 0), l.cur.quota)
		next := s&^remMask | uint64(rem)
		if next == s || l.state.CompareAndSwap(s, next) {
			return
		}
	}
}

// Acquire waits for one permit for at most maxWait. See AcquireN.
func (l *Limiter) Acquire(ctx context.Context, maxWait time.Duration) error {
	return l.AcquireN(ctx, 1, maxWait)
}

// AcquireN waits until n permits, counted in one window, are valid, and
// returns nil then; the permits are the caller's to use at once.
//
// If the earliest such moment lies further away than maxWait, or past ctx's
// deadline, it returns an error wrapping ErrTimeout at once, without
// sleeping and without keeping a reservation. If ctx ends while it sleeps it
// returns an error that matches both ErrCanceled and ctx.Err(), and the
// permits go back to the limiter for later callers. A maxWait of 0 or less
// waits for nothing: AcquireN then behaves like TryAcquireN with an error.
//
// When the quota in force is smaller than n (a quota of 0 above all) the
// earliest moment is unknown: AcquireN waits for SetQuota to raise it, until
// maxWait or ctx's deadline, and then returns an error matching ErrTimeout
// and ErrNoQuota.
//
// n must lie between 1 and MaxQuota; otherwise AcquireN returns an error
// wrapping ErrInvalid at once. After Close it returns ErrClosed. In shadow
// mode it returns nil at once.
func (l *Limiter) AcquireN(ctx context.Context, n int64, maxWait time.Duration) error {
	if l.fast(n) {
		return nil
	}
	r, err := l.reserve(ctx, n, maxWait, true)
	if err != nil || r == nil {
		return err
	}
	return r.Wait(ctx)
}

// Reserve reserves n permits, counted in one window, that become valid
// within maxWait, and returns at once: the Reservation says when they are
// valid, and Cancel gives them back. It returns an error wrapping ErrTimeout
// if they cannot be valid within maxWait, ErrNoQuota if the quota in force is
// smaller than n, ErrInvalid for n outside 1..MaxQuota and ErrClosed after
// Close. In shadow mode the Reservation is valid at once.
func (l *Limiter) Reserve(n int64, maxWait time.Duration) (*Reservation, error) {
	if l.fast(n) {
		return &Reservation{l: l, n: n, win: l.start.Load(), due: l.now(), state: resDone}, nil
	}
	return l.reserve(context.Background(), n, maxWait, false)
}

// reserve is the slow path shared by AcquireN and Reserve. It returns a nil
// Reservation and a nil error when the permits were taken at once.
func (l *Limiter) reserve(ctx context.Context, n int64, maxWait time.Duration, wait bool) (*Reservation, error) {
	if n < 1 || n > MaxQuota {
		return nil, fmt.Errorf("%w: n must be between 1 and %d permits, got %d", ErrInvalid, int64(MaxQuota), n)
	}
	if err := ctx.Err(); err != nil {
		return nil, canceledError(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	now := l.now()
	l.advanceLocked(now)
	if l.takeLocked(n, now) {
		if !wait {
			return &Reservation{l: l, n: n, win: l.cur.start, due: now, state: resDone}, nil
		}
		return nil, nil
	}
	deadline := addClamped(now, max(maxWait, 0))
	if d, ok := ctx.Deadline(); ok {
		deadline = min(deadline, addClamped(now, time.Until(d)))
	}
	pl, err := l.placeLocked(n, now, deadline)
	if l.shadow.Load() {
		if err == nil || (wait && err == ErrNoQuota) {
			l.counts.shadowDelayed += n
		} else {
			l.counts.shadowRejected += n
		}
		l.counts.shadowAdmitted += n
		if !wait {
			return &Reservation{l: l, n: n, due: now, state: resDone}, nil
		}
		return nil, nil
	}
	switch {
	case err == ErrNoQuota && wait && deadline > now:
		r := l.newReservation(n, now, deadline)
		r.due = math.MaxInt64
		l.noQuota = append(l.noQuota, r)
		return r, nil
	case err == ErrNoQuota:
		l.counts.timedOut += n
		return nil, fmt.Errorf("%w: %w: quota %d is below the %d permits asked for", ErrTimeout, ErrNoQuota, l.cur.quota, n)
	case err != nil:
		l.counts.timedOut += n
		return nil, fmt.Errorf("%w: %d permits not available within %v", ErrTimeout, n, time.Duration(deadline-now))
	}
	r := l.newReservation(n, now, deadline)
	l.commitLocked(r, pl, now)
	return r, nil
}

func (l *Limiter) newReservation(n, now, deadline int64) *Reservation {
	l.nextSeq++
	return &Reservation{l: l, n: n, seq: l.nextSeq, asked: now, deadline: deadline, wake: make(chan struct{}, 1)}
}

// placement is where a reservation fits: a window and a slot in it.
type placement struct {
	win  span
	slot int64 // first slot, for pacing
	due  int64 // when the last of its permits is valid
}

// placeLocked finds the earliest window, at or after now and the end of
// any backoff, in which n permits are free and valid no later than deadline.
// It changes nothing. It returns ErrTimeout when that window lies beyond
// deadline and ErrNoQuota when the quota in force is below n for good.
func (l *Limiter) placeLocked(n, now, deadline int64) (placement, error) {
	t := max(now, l.backoffUntil)
	if t < l.cur.end && t >= l.cur.start {
		// The current window: its free slots are in the state word.
		w := l.cur
		k := w.quota - int64(l.state.Load()&remMask)
		if p, ok := fit(w, k, n, t); ok {
			return p, checkDeadline(p, deadline)
		}
	}
	ws := max(t, l.cur.end, l.scanFrom)
	for {
		w := l.sched.spanAt(ws, l.pacing)
		if w.quota < n && l.sched.final(w.start) {
			return placement{}, ErrNoQuota
		}
		if w.start > deadline {
			return placement{}, ErrTimeout
		}
		if w.quota < n {
			ws = l.sched.from // nothing fits before the scheduled change
			continue
		}
		var charged int64
		if bw := l.book[w.start]; bw != nil {
			charged = bw.charged
		}
		if p, ok := fit(w, charged, n, t); ok {
			return p, checkDeadline(p, deadline)
		}
		ws = w.end
	}
}

// fit places n permits in window w whose slots before k are taken, at time t
// or later.
func fit(w span, k, n, t int64) (placement, bool) {
	if w.interval != 0 && t > w.start {
		// Paced slots whose time has passed are gone.
		k = max(k, (t-w.start)/w.interval-(n-1))
	}
	if k < 0 || k+n > w.quota {
		return placement{}, false
	}
	due := max(w.slotTime(k+n-1), t)
	if due >= w.end {
		return placement{}, false
	}
	return placement{win: w, slot: k, due: due}, true
}

func checkDeadline(p placement, deadline int64) error {
	if p.due > deadline {
		return ErrTimeout
	}
	return nil
}

// commitLocked charges reservation r to the window of p.
func (l *Limiter) commitLocked(r *Reservation, p placement, now int64) {
	r.win, r.due, r.state = p.win.start, p.due, resPending
	if p.win.start == l.cur.start {
		// Slots up to the reservation's last one are now used.
		used := l.cur.quota - int64(l.state.Load()&remMask)
		if skipped := p.slot - used; skipped > 0 {
			l.wasted.Add(skipped)
		}
		l.addRemainingLocked(-(max(p.slot, used) + r.n - used))
	}
	bw := l.book[p.win.start]
	if bw == nil {
		bw = &bookWindow{res: make(map[*Reservation]struct{})}
		l.book[p.win.start] = bw
	}
	if p.win.start != l.cur.start {
		bw.charged += r.n
		if l.scanFrom == p.win.start && bw.charged >= p.win.quota {
			l.scanFrom = p.win.end
		}
	}
	bw.res[r] = struct{}{}
	if !r.counted {
		r.counted = true
		l.counts.delayed += r.n
		l.counts.observeWait(time.Duration(p.due - now))
	}
}

// releaseLocked gives reservation r's permits back: to the state word if
// its window is the current one, else to its future window's free permits.
// Permits of a window already closed are gone.
func (l *Limiter) releaseLocked(r *Reservation) {
	bw := l.book[r.win]
	if bw != nil {
		delete(bw.res, r)
	}
	switch {
	case r.win == l.cur.start:
		back := min(l.overCur, r.n) // first undo consumption beyond the quota
		l.overCur -= back
		l.addRemainingLocked(r.n - back)
	case r.win > l.cur.start && bw != nil:
		bw.charged -= r.n
		l.scanFrom = min(l.scanFrom, r.win)
	}
	if bw != nil && len(bw.res) == 0 && bw.charged == 0 {
		delete(l.book, r.win)
	}
}

// replanLocked moves reservations that no longer fit — their window's quota
// was lowered, the window length changed, a backoff covers them — to the
// earliest place that does, in the order they were made, and places waiters
// that had no quota. A reservation that cannot be placed by its deadline
// fails with ErrTimeout. Waiters are woken to follow their new time.
func (l *Limiter) replanLocked(now int64) {
	l.scanFrom = l.cur.end // a raised quota may have made room anywhere
	var moved []*Reservation
	for start, bw := range l.book {
		w := l.sched.spanAt(start, l.pacing)
		var over int64
		switch {
		case w.start != start || (start == l.cur.start && w.end != l.cur.end):
			over = math.MaxInt64 // the window no longer exists
		case start == l.cur.start:
			over = l.overCur
		default:
			over = bw.charged - w.quota
		}
		var res []*Reservation
		for r := range bw.res {
			if r.due <= now {
				continue // valid already: admitted
			}
			if r.due < l.backoffUntil {
				moved = append(moved, r)
			} else {
				res = append(res, r)
			}
		}
		sortReservations(res)
		for i := len(res) - 1; i >= 0 && over > 0; i-- {
			over -= res[i].n
			moved = append(moved, res[i])
		}
	}
	if len(moved) > 0 {
		// Everything made after the first moved reservation is placed
		// again too, so that the order of making is kept.
		first := moved[0].seq
		for _, r := range moved {
			first = min(first, r.seq)
		}
		moved = moved[:0]
		for _, bw := range l.book {
			for r := range bw.res {
				if r.due > now && r.seq >= first {
					moved = append(moved, r)
				}
			}
		}
	}
	for _, r := range moved {
		l.releaseLocked(r)
	}
	// What the current window admitted beyond a lowered quota stays
	// admitted: count it, and admit nothing more in this window.
	l.counts.closedConsumed += l.overCur
	l.overCur = 0
	moved = append(moved, l.noQuota...)
	l.noQuota = l.noQuota[:0]
	sortReservations(moved)
	for _, r := range moved {
		pl, err := l.placeLocked(r.n, now, r.deadline)
		switch {
		case err == nil:
			l.commitLocked(r, pl, now)
		case err == ErrNoQuota && r.deadline > now:
			r.due = math.MaxInt64
			r.state = resPending
			l.noQuota = append(l.noQuota, r)
			continue
		default:
			r.state, r.err = resFailed, ErrTimeout
			if err == ErrNoQuota {
				r.err = fmt.Errorf("%w: %w", ErrTimeout, ErrNoQuota)
			}
			l.counts.timedOut += r.n
		}
		r.poke()
	}
}

// Backoff pauses the limiter: no permit is valid before now+d. Call it when
// the provider answers 429 or 503 with Retry-After, so that a limit set too
// high on our side does not keep hammering it. Waiters whose permits fall
// inside the pause are moved after it, in their order, or fail with
// ErrTimeout at once if that is beyond their deadline. A d of 0 or less
// does nothing; a later Backoff that ends earlier than the current one does
// not shorten it.
func (l *Limiter) Backoff(d time.Duration) {
	if d <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	until := addClamped(now, d)
	if until <= l.backoffUntil || l.closed {
		return
	}
	l.backoffUntil = until
	l.advanceLocked(now)
	l.replanLocked(now)
}

// SetQuota sets the quota from the first window that starts at or after at,
// keeping the window length. An at not after now (the zero Time included)
// changes the current window at once: if more than q of its permits are
// already taken, none is admitted until the next window. Reservations that
// no longer fit are moved later, the newest out first and all in the order
// they were made; one moved past its deadline fails with ErrTimeout.
// Waiters for quota are placed. Use the same at on every instance to switch
// them at the same boundary. q must lie between 0 and MaxQuota.
func (l *Limiter) SetQuota(q int64, at time.Time) error {
	l.mu.Lock()
	w := l.sched.at(math.MaxInt64).window
	l.mu.Unlock()
	return l.SetLimit(q, time.Duration(w), at)
}

// SetLimit sets the quota and the window length together. A change of
// window length takes effect at the first instant at or after at (and after
// the current window) that is a boundary of both the old and the new
// window, so that no window is cut short; a change of quota alone, as in
// SetQuota. A later call replaces a change not yet in effect.
func (l *Limiter) SetLimit(q int64, window time.Duration, at time.Time) error {
	if err := ValidateQuota(q); err != nil {
		return err
	}
	if err := ValidateWindow(window); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	now := l.now()
	l.advanceLocked(now)
	p := params{quota: q, window: int64(window)}
	atNs := now
	if !at.IsZero() {
		atNs = clampUnixNano(at)
	}
	cw := l.sched.cur.window
	if p.window == cw && atNs <= now {
		// The current window changes now; replanLocked settles what it
		// took beyond the new quota.
		used := l.consumedLocked()
		l.sched = schedule{cur: p}
		l.cur.quota = q
		l.cur.interval = l.sched.spanAt(l.cur.start, l.pacing).interval
		l.quota.Store(q)
		l.interval.Store(l.cur.interval)
		l.overCur = max(0, used-q)
		l.setRemainingLocked(q - used)
	} else {
		step := p.window / gcd(p.window, cw) * cw // lcm
		if p.window == cw {
			step = cw
		}
		from := max(atNs, l.cur.end)
		from += floorMod(-from, step)
		l.sched.next, l.sched.from, l.sched.hasNext = p, from, true
	}
	l.replanLocked(now)
	return nil
}

// setRemainingLocked sets the current window's remaining permits.
func (l *Limiter) setRemainingLocked(rem int64) {
	for {
		s := l.state.Load()
		next := s&^remMask | uint64(max(rem, 0))
		if next == s || l.state.CompareAndSwap(s, next) {
			return
		}
	}
}

// SetPacing turns pacing on or off (see WithPacing), from now on.
func (l *Limiter) SetPacing(on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pacing == on {
		return
	}
	l.pacing = on
	if l.cur.end != math.MinInt64 {
		l.cur.interval = l.sched.spanAt(l.cur.start, on).interval
		l.interval.Store(l.cur.interval)
	}
}

// SetShadow turns shadow mode on or off (see WithShadow), from now on.
// Waiters already sleeping keep their permits and times.
func (l *Limiter) SetShadow(on bool) { l.shadow.Store(on) }

// SetClockOffset sets the correction added to the clock: the limiter's time
// becomes the clock's time plus d, which moves every window boundary by the
// change. Call it with each new NTP measurement. Waiters keep their permits
// and follow the new boundaries. A correction that moves time backwards does
// not reopen a window already closed: the current window lasts until its
// end on the new clock.
func (l *Limiter) SetClockOffset(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setOffsetLocked(d)
	for _, bw := range l.book {
		for r := range bw.res {
			r.poke()
		}
	}
}

// ClockOffset returns the correction set by SetClockOffset or
// WithClockOffset.
func (l *Limiter) ClockOffset() time.Duration { return time.Duration(l.offset.Load()) }

// Now returns the limiter's time: its clock plus the clock offset. Window
// boundaries are multiples of the window length on this time.
func (l *Limiter) Now() time.Time { return time.Unix(0, l.now()) }

// Close releases every waiter with ErrClosed and makes every later call
// fail: TryAcquire reports false, Acquire and Reserve return ErrClosed.
// Close is idempotent and always returns nil.
func (l *Limiter) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	l.advanceLocked(l.now())
	fail := func(r *Reservation) {
		r.state, r.err = resFailed, ErrClosed
		r.poke()
	}
	for _, bw := range l.book {
		for r := range bw.res {
			if r.due > l.now() {
				fail(r)
			}
		}
	}
	for _, r := range l.noQuota {
		fail(r)
	}
	clear(l.book)
	l.noQuota = nil
	return nil
}

func addClamped(t int64, d time.Duration) int64 {
	if d > 0 && t > math.MaxInt64-int64(d) {
		return math.MaxInt64
	}
	return t + int64(d)
}

// clampUnixNano is t in Unix ns, clamped to the range int64 can hold
// (years 1678 to 2262).
func clampUnixNano(t time.Time) int64 {
	switch {
	case t.Before(time.Unix(0, math.MinInt64)):
		return math.MinInt64
	case t.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	}
	return t.UnixNano()
}

func canceledError(ctxErr error) error {
	if ctxErr == context.DeadlineExceeded {
		return fmt.Errorf("%w: %w", ErrTimeout, ctxErr)
	}
	return fmt.Errorf("%w: %w", ErrCanceled, ctxErr)
}
