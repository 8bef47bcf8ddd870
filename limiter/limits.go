package limiter

import (
	"context"
	"fmt"
	"math"
	"time"
)

// Backoff pauses the limiter: no permit is valid before now+d. Call it when
// the provider answers 429 or 503 with Retry-After, so that a limit set too
// high on our side does not keep hammering it. Acquire's waiters whose
// permits fall inside the pause are moved after it, in their order, or
// fail with ErrTimeout at once if that is beyond their deadline; a
// Reservation made by Reserve keeps its time (see Reservation). A d of 0 or less
// does nothing; a later Backoff that ends earlier than the current one does
// not shorten it.
func (l *Limiter) Backoff(d time.Duration) {
	if d <= 0 {
		return
	}
	l.lockChange()
	defer l.unlockChange()
	now := l.now()
	until := addClamped(now, d)
	if until <= l.backoffUntil || l.closed {
		return
	}
	l.advanceLocked(now)
	rs := l.unplaceLocked(now)
	l.backoffUntil = until
	l.advanceLocked(now)
	l.replaceLocked(rs, now, 0)
}

// SetQuota sets the quota from the first window that starts at or after at,
// keeping the window length in force then. An at not after now (the zero
// Time included) changes the current window at once: if more than q of its
// permits are already taken, none is admitted until the next window. Use
// the same at on every instance to switch them at the same boundary. q
// must lie between 0 and MaxQuota.
//
// Acquire's waiters are placed again under the new quota, in the order
// they asked: a raise serves them earlier, a drop moves them later and
// fails those it moves past their deadline with ErrTimeout. Waiters for
// quota are placed as soon as it suffices. Reservations made by Reserve
// keep their windows (see Reservation).
func (l *Limiter) SetQuota(q int64, at time.Time) error {
	_, err := l.setLimit(q, 0, at)
	return err
}

// SetLimit sets the quota and the window length together, from at on. A
// change of window length takes effect at the first instant at or after at
// (and after the current window) that is a boundary of both the old and the
// new window, so that no window is cut short; a change of quota alone, as in
// SetQuota. Changes scheduled for later are kept in order: a call replaces
// every change scheduled at or after the instant it asks for (at, or the
// end of the current window if that is later) and leaves earlier ones
// alone, so two changes sent in a row for later and later boundaries take
// effect one after the other, and a change for now (or an earlier
// boundary) overrides one scheduled further ahead.
func (l *Limiter) SetLimit(q int64, window time.Duration, at time.Time) error {
	_, err := l.Schedule(q, window, at)
	return err
}

// Schedule is SetLimit, and also returns from when the new limit governs
// whole windows: the boundary at which it takes effect when that lies
// ahead (at, or the first boundary at or after it that both lengths
// share); when it takes effect at once, the end of the current window,
// since what that window admitted before the change stays admitted. A
// caller that coordinates with others, as cluster.Member does with
// configd, reports this time rather than at: a change that arrives late,
// or of another window length, governs only from a later boundary. It is
// later still past a window whose reservations made by Reserve hold more
// than the new limit gives it (see Reservation): that window admits them
// whatever the limit.
func (l *Limiter) Schedule(q int64, window time.Duration, at time.Time) (time.Time, error) {
	if err := ValidateWindow(window); err != nil {
		return time.Time{}, err
	}
	from, err := l.setLimit(q, int64(window), at)
	if err != nil {
		return time.Time{}, err
	}
	return time.Unix(0, from), nil
}

// SetWindowQuota sets the quota of the window that begins at start to q,
// and 0 for every window after it, if that window is the current one
// when the call takes effect; it reports whether it was. Nothing changes
// when another window is current, nor when the window length in force
// is not window.
//
// It is for a quota good for one window alone, such as permits taken for
// it from a counter shared by several instances (a budget, see
// cluster.JoinProvider): checking the window and then calling SetQuota
// would give the next window the quota when a boundary passes between
// the two, which here cannot happen.
func (l *Limiter) SetWindowQuota(q int64, window time.Duration, start time.Time) (bool, error) {
	if err := ValidateQuota(q); err != nil {
		return false, err
	}
	l.lockChange()
	defer l.unlockChange()
	if l.closed {
		return false, ErrClosed
	}
	now := l.now()
	l.advanceLocked(now)
	if l.cur.start != start.UnixNano() || l.cur.end-l.cur.start != int64(window) || l.sched.cur.window != int64(window) {
		return false, nil
	}
	rs := l.unplaceLocked(now)
	l.sched.cur = params{quota: q, window: int64(window)}
	l.sched.changes = []change{{from: l.cur.end, p: params{quota: 0, window: int64(window)}}}
	l.setCurrentQuotaLocked()
	l.rebookFixedLocked()
	l.replaceLocked(rs, now, 0)
	return true, nil
}

// Step is one piece of a schedule for SetSchedule: Quota per Window from
// At on.
type Step struct {
	At     time.Time
	Quota  int64
	Window time.Duration
}

// SetSchedule replaces every limit change and the expiry in one change,
// and returns the start of the first window it governs whole: a caller
// that lowers its quota may count on the lower quota from there on, not
// before, since the window under way may have admitted more already.
//
// The last step whose At is not after the current window's start, or the
// limiter's clock if later, governs the current window at once, as
// SetLimit with a zero at does; the later steps take effect at their
// times, as SetLimit schedules them; the expiry is set as by SetExpiry. A
// step of another window length takes effect at the first boundary both
// lengths share. Between the current window and the first step to take
// effect, windows admit nothing: the start returned is that step's, or
// later, past the last window whose reservations made by Reserve hold
// more than the steps give it (see Reservation).
// Because the step in force is chosen under the same lock as every other
// change, a window boundary that passes while the caller builds the steps
// cannot give the new window the quota of the one before. Steps must be
// in order of At; nothing changes when one is invalid or steps is empty.
func (l *Limiter) SetSchedule(steps []Step, expiry time.Time) (time.Time, error) {
	if err := validateSteps(steps); err != nil {
		return time.Time{}, err
	}
	l.lockChange()
	defer l.unlockChange()
	if l.closed {
		return time.Time{}, ErrClosed
	}
	now := l.now()
	l.advanceLocked(now)
	rs := l.unplaceLocked(now)
	l.sched.expires, l.sched.expiry = !expiry.IsZero(), 0
	if l.sched.expires {
		l.sched.expiry = clampUnixNano(expiry)
	}
	// A clock set back leaves the limiter in its window: that window is
	// the one under way, whatever the clock reads.
	ref := max(now, l.cur.start)
	cur := 0
	for i, s := range steps {
		if clampUnixNano(s.At) <= ref {
			cur = i
		}
	}
	from := l.cur.end
	l.sched.changes = nil
	for i, s := range steps[cur:] {
		p := params{quota: s.Quota, window: int64(s.Window)}
		if at := clampUnixNano(s.At); i > 0 || at > ref || p.window != l.sched.cur.window {
			b := l.sched.setFrom(max(at, l.cur.end), p)
			if i == 0 {
				from = b
			}
			continue
		}
		l.sched.cur = p
	}
	if from > l.cur.end {
		// The windows before the first step admit nothing: the schedule
		// does not cover them, and what an earlier call scheduled there
		// (a lowered quota, a grant's end) is gone.
		l.sched.changes = append([]change{{from: l.cur.end, p: params{window: l.sched.cur.window}}}, l.sched.changes...)
	}
	l.setCurrentQuotaLocked()
	l.rebookFixedLocked()
	l.replaceLocked(rs, now, 0)
	return time.Unix(0, l.governedFromLocked(from)), nil
}

func validateSteps(steps []Step) error {
	if len(steps) == 0 {
		return fmt.Errorf("%w: a schedule needs at least one step", ErrInvalid)
	}
	for i, s := range steps {
		if err := ValidateQuota(s.Quota); err != nil {
			return err
		}
		if err := ValidateWindow(s.Window); err != nil {
			return err
		}
		if i > 0 && s.At.Before(steps[i-1].At) {
			return fmt.Errorf("%w: schedule steps must be in order of time, step %d at %v is before step %d at %v", ErrInvalid, i, s.At, i-1, steps[i-1].At)
		}
	}
	return nil
}

// setLimit is Schedule, and SetQuota when window is 0: the length in force
// at at (or now), read once the schedule is brought up to now.
func (l *Limiter) setLimit(q, window int64, at time.Time) (from int64, err error) {
	if err := ValidateQuota(q); err != nil {
		return 0, err
	}
	l.lockChange()
	defer l.unlockChange()
	if l.closed {
		return 0, ErrClosed
	}
	now := l.now()
	l.advanceLocked(now)
	rs := l.unplaceLocked(now)
	atNs := now
	if !at.IsZero() {
		atNs = clampUnixNano(at)
	}
	if window == 0 {
		window = l.sched.at(max(atNs, now)).window
	}
	p := params{quota: q, window: window}
	if p.window == l.sched.cur.window && atNs <= now {
		// From now on, p: the current window changes at once and every
		// scheduled change is dropped.
		l.sched.cur, l.sched.changes = p, nil
		l.setCurrentQuotaLocked()
		from = l.cur.end
	} else {
		// From the first boundary, at or after at and after the current
		// window, that the window in force there and the new one share.
		from = l.sched.setFrom(max(atNs, l.cur.end), p)
	}
	l.rebookFixedLocked()
	l.replaceLocked(rs, now, 0)
	return l.governedFromLocked(from), nil
}

// rebookFixedLocked charges every fixed reservation (see
// Reservation.fixed) of a future window to the windows, as the schedule
// now stands, that the interval holding its true instant meets: one, or
// two when a new boundary falls inside it. A change of window length
// moves boundaries, never the instant its holder was given. The caller
// has taken every other future reservation out of the book.
func (l *Limiter) rebookFixedLocked() {
	var rs []*Reservation
	for start, bw := range l.book {
		if start > l.cur.start {
			for r := range bw.res {
				rs = append(rs, r)
			}
		}
	}
	sortReservations(rs)
	for _, r := range rs {
		lo, hi := max(r.tLo, r.told-l.guard), min(r.tHi, r.told+l.guard+1)
		if lo >= hi { // the clock was further off than it was told
			lo, hi = r.told-l.guard, r.told+l.guard+1
		}
		a, b := l.spanLocked(lo), l.spanLocked(hi-1)
		if a.start == r.win && (a.start == b.start) != r.alsoSet && (!r.alsoSet || r.also == b.start) {
			continue
		}
		l.releaseLocked(r)
		r.tLo, r.tHi = lo, hi
		r.win = a.start
		l.chargeFutureLocked(r, a.start)
		l.bookWindowLocked(a.start).res[r] = struct{}{}
		if b.start != a.start {
			r.also, r.alsoSet = b.start, true
			bw := l.bookWindowLocked(b.start)
			bw.charged += r.n
			bw.next = max(bw.next, bw.charged)
			bw.held += r.n // not admitted: Stats counts it once
		}
	}
}

// chargeFutureLocked charges r's permits to the future window that
// begins at start.
func (l *Limiter) chargeFutureLocked(r *Reservation, start int64) {
	bw := l.bookWindowLocked(start)
	bw.charged += r.n
	bw.next = max(bw.next, bw.charged)
	if l.classes != nil {
		if bw.used == nil {
			bw.used = make([]int64, len(l.curUsed))
		}
		bw.used[max(0, l.classOfLocked(r, l.classes))] += r.n
	}
}

// unchargeAlsoLocked gives back what r held in its second window, if
// any, unless that window has closed (then it counted as wasted).
func (l *Limiter) unchargeAlsoLocked(r *Reservation) {
	if !r.alsoSet {
		return
	}
	r.alsoSet = false
	switch bw := l.book[r.also]; {
	case l.closed:
	case r.also == l.cur.start:
		l.addRemainingLocked(r.n)
		l.wasted.Add(-r.n)
	case r.also > l.cur.start && bw != nil:
		bw.charged -= r.n
		bw.held -= r.n
		if len(bw.res) == 0 && bw.charged == 0 {
			delete(l.book, r.also)
		}
		l.scanFrom = min(l.scanFrom, r.also)
	}
}

// holdLocked counts n permits charged to the window that begins at start
// as held, not admitted: Stats counts them as wasted once the window is
// under way (see bookWindow.held).
func (l *Limiter) holdLocked(start, n int64) {
	if bw := l.book[start]; start > l.cur.start && bw != nil {
		bw.held += n
		return
	}
	l.wasted.Add(n)
}

// unholdLocked undoes holdLocked for permits given back.
func (l *Limiter) unholdLocked(start, n int64) {
	if bw := l.book[start]; start > l.cur.start && bw != nil {
		bw.held -= n
		return
	}
	l.wasted.Add(-n)
}

// governedFromLocked returns from, or, if later, the end of the last
// window whose fixed reservations (see Reservation.fixed) hold more than
// the schedule now gives it: the schedule governs whole only the windows
// after it. Every other reservation was placed within the quota.
func (l *Limiter) governedFromLocked(from int64) int64 {
	for start, bw := range l.book {
		if sp := l.spanLocked(start); start > l.cur.start && bw.charged > sp.quota {
			from = max(from, sp.end)
		}
	}
	return from
}

// setCurrentQuotaLocked changes the current window's quota to the one the
// schedule now gives it (0 if it began at or after the expiry), keeping
// what it consumed: in one compare-and-swap against the hot path, so no
// admission between reading and writing the word is lost.
func (l *Limiter) setCurrentQuotaLocked() {
	old := l.cur.quota
	l.cur = l.spanLocked(l.cur.start)
	q := l.cur.quota
	l.quota.Store(q)
	l.paced.Store(l.cur.pacedWindow())
	for {
		s := l.state.Load()
		rem := int64(s&remMask) + q - old - l.overCur
		over := max(0, -rem)
		if l.state.CompareAndSwap(s, s&^remMask|uint64(max(0, rem))) {
			l.overCur = over
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
		l.cur.paced = on && l.cur.quota > 0
		l.paced.Store(l.cur.pacedWindow())
	}
}

// SetShadow turns shadow mode on or off (see WithShadow), from now on.
// Waiters already sleeping keep their permits and times.
func (l *Limiter) SetShadow(on bool) { l.shadow.Store(on) }

// SetClockOffset sets the correction added to the clock: the limiter's time
// becomes the clock's time plus d, which moves every window boundary by the
// change. d is clamped to ±100 years, so that corrected time stays within
// what Unix nanoseconds in an int64 hold. Call it with each new NTP
// measurement. Acquire's waiters are placed again on the new time, in
// order, with their real deadlines kept; a Reservation made by Reserve
// keeps its real time and window. A correction that moves time backwards does
// not reopen a window already closed: the current window lasts until its
// end on the new clock. Before the first window opens there is none to
// keep, so a new limiter admits on the new clock at once.
func (l *Limiter) SetClockOffset(d time.Duration) {
	l.lockChange()
	defer l.unlockChange()
	l.setClockOffsetLocked(d, time.Now())
	if l.group != nil {
		l.group.alignFixedLocked()
	}
}

// setClockOffsetLocked sets the offset, anchoring the system clock's
// mapping at anchor (a Multi gives all its limits the same).
func (l *Limiter) setClockOffsetLocked(d time.Duration, anchor time.Time) {
	d = clampOffset(d)
	if time.Duration(l.offset.Load()) == d {
		return
	}
	before := l.now()
	if l.closed {
		l.setOffsetLocked(d, anchor)
		return
	}
	if l.cur.end != math.MinInt64 {
		// A window is open: it may have admitted, so it is kept.
		l.advanceLocked(before)
	}
	rs := l.unplaceLocked(before)
	l.setOffsetLocked(d, anchor)
	now := l.now()
	if l.sched.expires {
		// The expiry names an instant of real time (a lease's end, say):
		// it moves with the clock, as waiters' deadlines do, so that a
		// correction backwards never lets the limiter admit past it.
		l.sched.expiry = addClamped(l.sched.expiry, time.Duration(now-before))
	}
	l.shiftFixedLocked(now - before)
	l.advanceLocked(now)
	l.replaceLocked(rs, now, now-before)
}

// shiftFixedLocked moves the time of every fixed reservation not yet
// valid by shift, the change of the clock offset: its holder uses it at
// the real time it was given, which lies in the window it is charged to,
// since the clock was within its uncertainty when it was placed. Its time
// stays inside that window's band on the limiter's clock (open to shut),
// so that it is valid while its window is under way and a holder in the
// process uses it there, a correction earlier or later than told.
// A part of a MultiReservation is brought into every part's band after
// every limit moved (Multi.alignFixedLocked).
func (l *Limiter) shiftFixedLocked(shift int64) {
	for _, bw := range l.book {
		for r := range bw.res {
			if !r.fixed() || r.state == resDone || r.due == math.MaxInt64 {
				continue
			}
			r.told = addClamped(r.told, time.Duration(shift))
			r.due = r.told
			r.deadline = addClamped(r.deadline, time.Duration(shift))
			if r.win >= l.cur.start && r.multi == nil {
				sp := l.spanLocked(r.win)
				r.due = min(max(r.due, sp.open()), sp.shut()-1)
			}
		}
	}
}

// SetClockUncertainty sets how far, at most, the corrected clock may be
// from true time (an NTP measurement's uncertainty). The limiter then
// admits nothing within u of a window boundary: every permit of one of its
// windows then falls inside the same aligned window in true time, whichever
// way its clock is off, so clock error cannot push an aligned window over
// the quota, even when permits bunch at a window's start. The band is capped
// just under half the window. 0 (the default) trusts the clock; a negative
// u counts as 0. Acquire's waiters are placed again, in order, outside the
// band.
func (l *Limiter) SetClockUncertainty(u time.Duration) {
	l.lockChange()
	defer l.unlockChange()
	l.setClockUncertaintyLocked(u)
}

func (l *Limiter) setClockUncertaintyLocked(u time.Duration) {
	g := max(int64(u), 0)
	if g == l.guard || l.closed {
		return
	}
	now := l.now()
	l.advanceLocked(now)
	rs := l.unplaceLocked(now)
	l.guard = g
	if l.cur.end != math.MinInt64 {
		l.cur = l.cur.withGuard(g)
		l.end.Store(l.cur.shut())
	}
	l.advanceLocked(now)
	l.replaceLocked(rs, now, 0)
}

// SetExpiry makes the limiter admit nothing in the windows that begin at or
// after t: their quota is 0 whatever SetLimit scheduled, until a later
// SetExpiry moves t. t is in corrected time, like every boundary (see
// SetClockOffset), and moves with later changes of the clock offset, so
// that it stays the same instant of real time; it need not be a boundary: the window that contains t
// keeps its quota, and the first to admit nothing is the first to begin at
// or after t. The zero Time removes the expiry; there is none by default.
//
// A window already begun keeps its quota: moving t earlier never takes back
// a permit of the current window, even one that began after the new t, and
// moving t later (or removing it) gives quota back from the next window
// that begins before the new t, never to the current one. A SetLimit that
// takes effect at once cannot give quota to a current window that began at
// or after t either.
//
// It is a dead man's switch for a share of a cluster-wide limit: a member
// re-arms it on every successful lease keep-alive, to the time after which
// its coordinator may hand the share to others. An instance cut off from
// its coordinator, or a process stopped and woken later, then stops
// admitting by itself once its share may be in use elsewhere, without
// needing a timer or a call that may never come. The expiry is applied
// when a window begins, on the slow path: it costs TryAcquire nothing.
//
// No permit is placed in a window at or after t. Reserve fails at once
// with ErrNoQuota when its permits fit in no window before t. Acquire then
// waits for quota, as under a quota of 0, until a change of limits (a later
// t above all) serves it or its deadline passes; it fails at once if the
// current window began at or after t and the deadline falls before the
// next window, as no change could serve it in time. When t changes,
// Acquire's waiters are placed again in the order they asked, as by
// SetLimit: an earlier t moves those past it to room before it, or makes
// them wait for quota, and a later t serves those waiting. A Reservation
// made by Reserve keeps its time, also past an earlier t (see
// Reservation).
func (l *Limiter) SetExpiry(t time.Time) {
	var e int64
	expires := !t.IsZero()
	if expires {
		e = clampUnixNano(t)
	}
	l.lockChange()
	defer l.unlockChange()
	if expires == l.sched.expires && e == l.sched.expiry {
		return
	}
	if l.closed {
		l.sched.expires, l.sched.expiry = expires, e
		return
	}
	now := l.now()
	l.advanceLocked(now)
	rs := l.unplaceLocked(now)
	l.sched.expires, l.sched.expiry = expires, e
	l.replaceLocked(rs, now, 0)
}

// Expiry returns the expiry in force (see SetExpiry), in corrected time: the
// time last given, moved by clock offset changes since; the zero Time if
// there is none.
func (l *Limiter) Expiry() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.sched.expires {
		return time.Time{}
	}
	return time.Unix(0, l.sched.expiry)
}

// lockChange takes what a change of limits needs: l's mutex, or, for a
// limit of a Multi, every limit's, in the Multi's order. A change moves
// reservations not yet valid, and whether a part of a MultiReservation is
// valid depends on the other parts (see Reservation.validLocked).
func (l *Limiter) lockChange() {
	if l.group != nil {
		l.group.lock()
		return
	}
	l.mu.Lock()
}

func (l *Limiter) unlockChange() {
	if l.group != nil {
		l.group.unlock()
		return
	}
	l.mu.Unlock()
}

// maxOffset bounds a clock correction so that corrected time stays within
// what int64 nanoseconds hold (years 1678 to 2262) for any clock of this
// century: about 100 years either way.
const maxOffset = 100 * 365 * 24 * time.Hour

func clampOffset(d time.Duration) time.Duration { return min(max(d, -maxOffset), maxOffset) }

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
	l.lockChange()
	defer l.unlockChange()
	if l.closed {
		return nil
	}
	now := l.now()
	l.advanceLocked(now)
	for _, r := range l.unplaceWhereLocked(now, func(*Reservation) bool { return true }) {
		r.state, r.err = resFailed, ErrClosed
		r.poke()
	}
	// What future windows still hold is held, not admitted: a second
	// window's charge, a failed Multi's part. Their windows will not roll
	// now: count them closed, as rolling would, and give nothing back
	// after (see unchargeAlsoLocked).
	for start, bw := range l.book {
		if start > l.cur.start {
			l.counts.closedConsumed += bw.charged
			l.wasted.Add(bw.held)
			delete(l.book, start)
		}
	}
	l.closed = true
	l.advanceLocked(now)
	return nil
}

func addClamped(t int64, d time.Duration) int64 {
	switch {
	case d > 0 && t > math.MaxInt64-int64(d):
		return math.MaxInt64
	case d < 0 && t < math.MinInt64-int64(d):
		return math.MinInt64
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

// canceledError is the error of a wait whose context ended.
func canceledError(ctxErr error) error {
	if ctxErr == context.DeadlineExceeded {
		return fmt.Errorf("%w: %w", ErrTimeout, ctxErr)
	}
	return fmt.Errorf("%w: %w", ErrCanceled, ctxErr)
}
