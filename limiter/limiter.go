package limiter

import (
	"context"
	"errors"
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
// Waiters are served first come, first served: each is given the earliest
// permit free when it asks, later callers get later ones, and each waiter
// sleeps until its own permit is valid, so a window boundary wakes only the
// waiters whose permits are due. When the limits change (SetQuota, Backoff,
// SetClockOffset, SetExpiry) Acquire's waiters are placed again in the
// order they asked; a Reservation made by Reserve keeps its window and
// time (see Reservation). A waiter whose context is cancelled gives its
// permit back for the next caller.
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
	// by the hot path. start, quota and paced are stored before the state
	// word changes and end after it (see roll). A reader that pairs a new
	// word with the old end finds the window over and takes the slow path;
	// one that pairs an old word with new values fails its CAS.
	end     atomic.Int64 // corrected Unix ns at which the current window ends
	start   atomic.Int64 // corrected Unix ns at which the current window began
	quota   atomic.Int64 // the current window's quota
	paced   atomic.Int64 // the current window's length in ns if paced, else 0
	delta   atomic.Int64 // corrected Unix ns = ns since base + delta (system clock)
	offset  atomic.Int64 // correction added to clock.Now (custom clock)
	wasted  atomic.Int64 // paced slots that went unused by their time
	shadow  atomic.Bool
	wakeups atomic.Int64 // times a waiter woke, for tests of herd behaviour

	base  time.Time  // monotonic anchor of the system clock
	clock Clock      // nil: the system clock through base
	group *Multi     // the Multi this is a limit of, if any (see lockChange)
	mu    sync.Mutex // guards the fields below, and every change of the window
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
	guard        int64                 // clock uncertainty: no admission this close to a boundary
	backoffUntil int64
	closed       bool
	counts       counts
	// classes are the priority classes served (WithClasses, SetClasses);
	// nil: none, and then every call is alike and the hot path serves it.
	classes *classes
	// curUsed is what each class took of the current window, promised
	// permits included; nil without classes. A future window's is in its
	// book entry.
	curUsed     []int64
	classCounts []classCount // by class; nil without classes

	fb feedback // what the provider's answers said (Observe)
}

// bookWindow is what one window has reserved for waiters. For future windows
// charged is the permits promised and next the first paced slot not yet
// promised; the current window's promises are already in the state word.
type bookWindow struct {
	charged int64
	// held is what charged counts that is held, not admitted: a fixed
	// reservation's second window, a failed Multi's part kept charged. It
	// becomes wasted when the window is under way, so that Stats.Admitted
	// never goes down.
	held int64
	next int64
	res  map[*Reservation]struct{}
	used []int64 // charged by class; nil without classes
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
	if err := validateClasses(cfg.classes); err != nil {
		return nil, err
	}
	l := &Limiter{
		clock:        cfg.clock,
		pacing:       cfg.pacing,
		sched:        schedule{cur: params{quota: quota, window: int64(window)}},
		book:         make(map[int64]*bookWindow),
		scanFrom:     math.MinInt64,
		backoffUntil: math.MinInt64,
		fb:           feedback{news: make(chan struct{}, 1)},
		classes:      newClasses(cfg.classes),
	}
	if l.classes != nil {
		l.curUsed = make([]int64, len(cfg.classes))
		l.classCounts = make([]classCount, len(cfg.classes))
	}
	l.shadow.Store(cfg.shadow)
	l.base = time.Now()
	l.setOffsetLocked(cfg.offset, time.Now())
	// Start on an exhausted placeholder window that ends at once, so the
	// first call rolls the word into the real window under mu.
	l.cur = span{start: math.MinInt64, end: math.MinInt64}
	l.state.Store(0)
	l.end.Store(math.MinInt64)
	return l, nil
}

// now returns the limiter's time: corrected Unix nanoseconds. A custom
// clock's time saturates at the ends of what int64 holds (and then lies
// outside the limiter's time, where nothing is admitted), so that no
// reading wraps around; the system clock cannot get there (offsets are
// clamped).
func (l *Limiter) now() int64 {
	if l.clock != nil {
		t := addClamped(clampUnixNano(l.clock.Now()), time.Duration(l.offset.Load()))
		return min(t, math.MaxInt64-1) // inside the last window, [timeEnd, MaxInt64)
	}
	return int64(time.Since(l.base)) + l.delta.Load()
}

// setOffsetLocked re-anchors the system clock mapping at t (a reading of
// time.Now), so that drift between the monotonic and the wall clock since
// the last anchor is dropped too.
func (l *Limiter) setOffsetLocked(d time.Duration, t time.Time) {
	l.offset.Store(int64(d))
	l.delta.Store(t.UnixNano() + int64(d) - int64(t.Sub(l.base)))
}

// TryAcquire reports whether a permit is available now, and takes it if so.
// It never waits. It is TryAcquireN(1).
func (l *Limiter) TryAcquire() bool { return l.TryAcquireN(1) }

// TryAcquireN takes n permits, counted in the current window, if they are
// available now, and reports whether it did. It never waits, and never takes
// a permit already promised to a waiter. n outside 1..MaxQuota is refused,
// and so is every call after Close. Otherwise, in shadow mode, it reports
// true.
func (l *Limiter) TryAcquireN(n int64) bool {
	if l.fast(n) {
		return true
	}
	return l.tryAcquireSlow(context.Background(), n)
}

// TryAcquireContext is TryAcquireNContext of one permit.
func (l *Limiter) TryAcquireContext(ctx context.Context) bool {
	return l.TryAcquireNContext(ctx, 1)
}

// TryAcquireNContext is TryAcquireN of the priority class ctx names
// (WithClass). It never waits: ctx is read for its class alone, not for
// its deadline or cancellation.
func (l *Limiter) TryAcquireNContext(ctx context.Context, n int64) bool {
	if l.fast(n) {
		return true
	}
	return l.tryAcquireSlow(ctx, n)
}

// fast is the hot path: a permit from the current window, lock-free.
func (l *Limiter) fast(n int64) bool {
	if n < 1 || n > MaxQuota {
		return false
	}
	_, ok := l.fastAt(n, l.now())
	return ok
}

// fastAt takes n permits from the current window at time now, lock-free,
// and returns the window's rollover count as the state word held it (see
// seqOf), which names the window the permits were charged to.
func (l *Limiter) fastAt(n, now int64) (seq uint64, ok bool) {
	for {
		s := l.state.Load()
		if s&slowBit != 0 || int64(s&remMask) < n || now >= l.end.Load() {
			return 0, false
		}
		next := s - uint64(n)
		var skipped int64
		if w := l.paced.Load(); w != 0 {
			if next, skipped, ok = pacedTake(s, n, now, l.start.Load(), w, l.quota.Load()); !ok {
				return 0, false
			}
		}
		if l.state.CompareAndSwap(s, next) {
			if skipped > 0 {
				l.wasted.Add(skipped)
			}
			return s & seqMask, true
		}
	}
}

// seqOf is the rollover count n as the state word holds it: modulo 2^23.
func seqOf(n uint64) uint64 { return (n << seqShift) & seqMask }

// pacedTake takes n paced slots from state word s at time now, in a window
// of length w and quota q starting at start: the newest n of the slots valid
// by now and unused. Older unused slots are skipped (and counted as such),
// so pacing never turns into a burst.
func pacedTake(s uint64, n, now, start, w, q int64) (next uint64, skipped int64, ok bool) {
	if now < start {
		return 0, 0, false
	}
	k := q - int64(s&remMask) // first unused slot
	due := min(mulDiv(now-start, q, w), q-1)
	if due+1-k < n {
		return 0, 0, false
	}
	return s&^remMask | uint64(q-due-1), due + 1 - k - n, true
}

func (l *Limiter) tryAcquireSlow(ctx context.Context, n int64) bool {
	if n < 1 || n > MaxQuota {
		return false
	}
	_, _, ok, _, _ := l.trySlow(ctx, n, true)
	return ok
}

// trySlow is TryAcquireN's slow path: it rolls the window on and takes n
// permits of the class ctx names if they are valid now, or counts the
// refusal. charged says whether it took permits, and seq names their
// window (see fastAt); set and cls are the classes in force and the
// call's class in them. Shadow mode admits without taking any when none
// are free, if shadow allows it (a Multi's acquisition from limits not
// all in shadow does not).
func (l *Limiter) trySlow(ctx context.Context, n int64, shadow bool) (seq uint64, charged, ok bool, set *classes, cls int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, false, false, nil, 0
	}
	now := l.now()
	l.advanceLocked(now)
	set, cls = l.classes, l.classes.of(ctx)
	if l.takeLocked(n, now, cls) {
		return seqOf(l.seq), true, true, set, cls
	}
	if shadow && l.shadow.Load() {
		l.counts.shadow(shadowRejected, n)
		l.countClassLocked(cls, 0, 0, n)
		return 0, false, true, set, cls
	}
	l.counts.rejected += n
	l.countClassLocked(cls, n, 0, 0)
	return 0, false, false, set, cls
}

// advanceLocked brings the state word up to time now: rolls it over to the
// window that contains now and sets or clears the slow bit.
func (l *Limiter) advanceLocked(now int64) {
	if now >= l.cur.end {
		l.roll(now)
	}
	// A limiter with classes decides every call under mu, where the
	// reserves are counted.
	slow := l.closed || now < l.backoffUntil || now < l.cur.open() || l.classes != nil
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
// promised to waiters in that window are taken out of it at once; those of
// windows skipped over were admitted when due.
func (l *Limiter) roll(now int64) {
	l.sched.advance(now)
	old := l.cur
	l.cur = l.spanLocked(now)
	var charged, next int64
	for i, u := range l.curUsed {
		l.classCounts[i].closed += u
	}
	clear(l.curUsed)
	for start, bw := range l.book {
		switch {
		case start < l.cur.start:
			l.counts.closedConsumed += bw.charged
			l.wasted.Add(bw.held)
			for i, u := range bw.used {
				l.classCounts[i].closed += u
			}
			delete(l.book, start)
		case start == l.cur.start:
			charged, next = bw.charged, bw.next
			l.wasted.Add(bw.held) // from now on in the state word
			bw.held = 0
			bw.charged, bw.next = 0, 0 // from now on in the state word
			if bw.used != nil {
				copy(l.curUsed, bw.used) // from now on in curUsed
				clear(bw.used)
			}
		}
	}
	if l.cur.paced && next > charged {
		l.wasted.Add(next - charged)
		charged = next
	}
	l.scanFrom = max(l.scanFrom, l.cur.start)
	l.seq++
	l.start.Store(l.cur.start)
	l.quota.Store(l.cur.quota)
	l.paced.Store(l.cur.pacedWindow())
	rem := max(0, l.cur.quota-charged)
	for {
		s := l.state.Load()
		next := s&slowBit | seqOf(l.seq) | uint64(rem)
		if l.state.CompareAndSwap(s, next) {
			// Count what the old window consumed from the word swapped
			// out, so admissions racing the roll are not lost.
			if old.end != math.MinInt64 {
				l.counts.closedConsumed += old.quota - int64(s&remMask) + l.overCur
			}
			break
		}
	}
	// Reservations made by Reserve keep their window when its quota is
	// lowered after them: what they hold beyond it is taken too.
	l.overCur = max(0, charged-l.cur.quota)
	l.end.Store(l.cur.shut())
}

// spanLocked is the window that contains t, with the guard band in force.
func (l *Limiter) spanLocked(t int64) span {
	return l.sched.spanAt(t, l.pacing).withGuard(l.guard)
}

// pacedWindow is the window's length if it is paced, else 0: what the hot
// path's paced field holds.
func (sp span) pacedWindow() int64 {
	if sp.paced {
		return sp.end - sp.start
	}
	return 0
}

// consumedLocked is how many of the current window's permits are taken,
// admitted or promised.
func (l *Limiter) consumedLocked() int64 {
	if l.cur.end == math.MinInt64 {
		return 0
	}
	return l.cur.quota - int64(l.state.Load()&remMask) + l.overCur
}

// takeLocked takes n permits of class cls from the current window if they
// are valid at now and nobody waits for them.
func (l *Limiter) takeLocked(n, now int64, cls int) bool {
	if now < l.backoffUntil || l.closed || now >= l.cur.shut() || now < l.cur.open() {
		return false
	}
	p, st := l.placeCurrentLocked(n, now, now, true, cls)
	return st == fits && p.due <= now
}

// addRemainingLocked gives d permits back to the current window, first
// undoing consumption beyond a lowered quota.
func (l *Limiter) addRemainingLocked(d int64) {
	back := min(l.overCur, d)
	l.overCur -= back
	d -= back
	for {
		s := l.state.Load()
		rem := min(int64(s&remMask)+d, l.cur.quota)
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
// sleeping and without keeping a reservation. If ctx is cancelled while it
// sleeps it returns an error that matches both ErrCanceled and
// context.Canceled; if ctx's deadline passes first (possible only when the
// permit moved later, see Reservation) one that matches ErrTimeout and
// context.DeadlineExceeded. Either way the permits go back to the limiter.
// A maxWait of 0 or less waits for nothing.
//
// When the quota in force is smaller than n (a quota of 0 above all, or the
// windows past an expiry, see SetExpiry) the earliest moment is unknown:
// AcquireN waits for a quota change until maxWait or ctx's deadline, and
// then returns an error matching ErrTimeout and ErrNoQuota. It returns that
// error at once when no change could come in time: a maxWait of 0, or a
// deadline before the next window when the current one is past the expiry.
//
// n must lie between 1 and MaxQuota; otherwise AcquireN returns an error
// wrapping ErrInvalid at once. After Close it returns ErrClosed. In shadow
// mode it returns nil at once.
func (l *Limiter) AcquireN(ctx context.Context, n int64, maxWait time.Duration) error {
	if err := ctx.Err(); err != nil {
		err = canceledError(err)
		l.countEnded(ctx, n, err)
		return err
	}
	if l.fast(n) {
		return nil
	}
	r, err := l.reserve(ctx, n, maxWait, true)
	if err != nil || r == nil {
		return err
	}
	return r.Wait(ctx)
}

// countEnded counts n permits of a call whose context had ended before it
// began as what its error says, a timeout or a cancel, as Stats counts
// the same call ended a moment later (found by the limiter's oracle: an
// AcquireN whose deadline had passed returned ErrTimeout and counted
// nothing, seed 2952617324307874818).
func (l *Limiter) countEnded(ctx context.Context, n int64, err error) {
	if ValidateQuota(n) != nil || n == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	cls := l.classes.of(ctx)
	if errors.Is(err, ErrTimeout) {
		l.counts.timedOut += n
		l.countClassLocked(cls, n, 0, 0)
	} else {
		l.counts.canceled += n
		l.countClassLocked(cls, 0, n, 0)
	}
}

// Reserve reserves n permits, counted in one window, that become valid
// within maxWait, and returns at once: the Reservation says when they are
// valid, and Cancel gives them back. That time is fixed: no later change of
// limits moves or fails it (see Reservation). It returns an error wrapping ErrTimeout
// if they cannot be valid within maxWait, ErrNoQuota if the quota in force is
// smaller than n or they would fall past the expiry (SetExpiry), ErrInvalid
// for n outside 1..MaxQuota and ErrClosed after Close. In shadow mode the
// Reservation is valid at once.
func (l *Limiter) Reserve(n int64, maxWait time.Duration) (*Reservation, error) {
	return l.reserve(context.Background(), n, maxWait, false)
}

// ReserveContext is Reserve of the priority class ctx names (WithClass).
// It returns at once, as Reserve does: ctx's deadline, like maxWait,
// bounds when the permits may become valid, and a ctx already done gives
// an error matching ErrCanceled and ctx.Err(), but the Reservation
// outlives ctx: only Cancel gives its permits back.
func (l *Limiter) ReserveContext(ctx context.Context, n int64, maxWait time.Duration) (*Reservation, error) {
	return l.reserve(ctx, n, maxWait, false)
}
