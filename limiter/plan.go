package limiter

import (
	"context"
	"fmt"
	"math"
	"time"
)

// Placing permits that are not available now: in the current window's
// later paced slots, or in a future window, first fit from the earliest,
// in the order callers asked. A placed Reservation is charged to its window
// — the current one in the state word, future ones in the book — so the
// window's quota counts it before anyone else.

// placement is where a reservation fits: a window and a slot in it.
type placement struct {
	win  span
	slot int64 // first slot taken, for pacing
	due  int64 // when the last of its permits is valid
}

type fitStatus int

const (
	fits fitStatus = iota
	full           // no room in the window
	late           // room, but past the deadline
)

// reserve is the slow path shared by AcquireN and Reserve. It returns a nil
// Reservation and a nil error when wait is set and the permits were taken
// at once.
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
	cls := l.classes.of(ctx)
	if l.takeLocked(n, now, cls) {
		if wait {
			return nil, nil
		}
		return &Reservation{l: l, n: n, class: cls, set: l.classes, win: l.cur.start, due: now, state: resDone}, nil
	}
	deadline := addClamped(now, max(maxWait, 0))
	if d, ok := ctx.Deadline(); ok {
		deadline = min(deadline, addClamped(now, time.Until(d)))
	}
	if l.shadow.Load() {
		// Admit at once; count what enforcing would have done: place the
		// permits within the wait, wait for a quota, or refuse.
		kind := shadowRejected
		if _, err := l.placeLocked(n, now, deadline, math.MinInt64, nil, cls); err == nil || (wait && l.waitsForQuotaLocked(err, now, deadline)) {
			kind = shadowDelayed
		}
		l.counts.shadow(kind, n)
		l.countClassLocked(cls, 0, 0, n)
		if wait {
			return nil, nil
		}
		return &Reservation{l: l, n: n, class: cls, set: l.classes, win: math.MinInt64, due: now, state: resDone, shadow: kind}, nil
	}
	r := l.newReservation(n, now, deadline, !wait)
	r.class, r.set = cls, l.classes
	bumped := l.unplaceBelowLocked(cls, now)
	_, err := l.placeLocked(n, now, deadline, math.MinInt64, r, cls)
	if bumped != nil {
		l.replaceLocked(bumped, now, 0)
	}
	switch {
	case err == nil:
		return r, nil
	case wait && l.waitsForQuotaLocked(err, now, deadline):
		r.due, r.state = math.MaxInt64, resPending
		l.noQuota = append(l.noQuota, r)
		return r, nil
	case err == ErrNoQuota:
		l.counts.timedOut += n
		l.countClassLocked(cls, n, 0, 0)
		return nil, fmt.Errorf("%w: %w: %s", ErrTimeout, ErrNoQuota, l.noQuotaLocked(n, "is"))
	}
	l.counts.timedOut += n
	l.countClassLocked(cls, n, 0, 0)
	return nil, fmt.Errorf("%w: %d permits not available within %v", ErrTimeout, n, time.Duration(deadline-now))
}

// waitsForQuotaLocked reports whether a placement that failed with err
// waits, queued, for a quota large enough: it found none (ErrNoQuota),
// and one may still come before deadline.
func (l *Limiter) waitsForQuotaLocked(err error, now, deadline int64) bool {
	return err == ErrNoQuota && deadline > now && l.quotaMayComeLocked(deadline)
}

// quotaMayComeLocked reports whether a change of limits could still give a
// waiter for quota its permits by deadline. One can come at any time (a
// SetQuota that takes effect at once), unless the current window began at
// or after the expiry: no change reopens that window, so only a window that
// begins by deadline can serve the waiter.
func (l *Limiter) quotaMayComeLocked(deadline int64) bool {
	if l.cur.start >= timeEnd || l.backoffUntil >= timeEnd {
		return false // time has ended, or will before the backoff does
	}
	return !l.sched.expires || l.cur.start < l.sched.expiry || deadline >= l.cur.end
}

// noQuotaLocked says why n permits found no quota, for an ErrNoQuota
// message: verb is "is" or "stayed".
func (l *Limiter) noQuotaLocked(n int64, verb string) string {
	if l.backoffUntil >= timeEnd {
		return "a backoff lasts past the end of the limiter's time"
	}
	if l.cur.start >= timeEnd || l.cur.end <= timeStart {
		return fmt.Sprintf("the limiter's time runs from %s to %s, and its clock is outside it",
			time.Unix(0, timeStart).UTC().Format(time.RFC3339), time.Unix(0, timeEnd).UTC().Format(time.RFC3339))
	}
	if l.sched.expires {
		return fmt.Sprintf("%d permits fit in no window before the expiry at %s", n, time.Unix(0, l.sched.expiry).UTC().Format(time.RFC3339Nano))
	}
	return fmt.Sprintf("quota %d %s below the %d permits asked for", l.cur.quota, verb, n)
}

func (l *Limiter) newReservation(n, now, deadline int64, holder bool) *Reservation {
	l.nextSeq++
	return &Reservation{l: l, n: n, seq: l.nextSeq, asked: now, deadline: deadline, holder: holder, wake: make(chan struct{}, 1)}
}

// placeLocked finds the earliest place, at or after now, minDue and the end
// of any backoff, where n permits are free and valid no later than
// deadline, and, if r is not nil, charges r to it. It returns ErrTimeout
// when that place lies beyond deadline and ErrNoQuota when the quota in
// force is below n for good.
func (l *Limiter) placeLocked(n, now, deadline, minDue int64, r *Reservation, cls int) (placement, error) {
	t := max(now, l.backoffUntil, minDue)
	if t < l.cur.end {
		p, st := l.placeCurrentLocked(n, t, deadline, r != nil, cls)
		switch st {
		case fits:
			if r != nil {
				l.bookLocked(r, p)
			}
			return p, nil
		case late:
			return placement{}, ErrTimeout
		}
	}
	p, err := l.placeFutureLocked(n, t, deadline, cls)
	if err != nil || r == nil {
		return p, err
	}
	bw := l.bookWindowLocked(p.win.start)
	bw.charged += n
	if l.classes != nil {
		if bw.used == nil {
			bw.used = make([]int64, len(l.curUsed))
		}
		bw.used[cls] += n
	}
	bw.next = max(bw.next, p.slot+n)
	if l.scanFrom == p.win.start && max(bw.charged, bw.next) >= p.win.quota {
		l.scanFrom = p.win.end
	}
	l.bookLocked(r, p)
	return p, nil
}

// placeCurrentLocked places n permits of class cls in the current window,
// valid at t or later, taking them from the state word at once if commit
// is set: a compare-and-swap, as the hot path may be taking permits
// meanwhile.
func (l *Limiter) placeCurrentLocked(n, t, deadline int64, commit bool, cls int) (placement, fitStatus) {
	w := l.cur
	limit := l.classes.limit(w.quota, l.curUsed, cls)
	for {
		s := l.state.Load()
		k := w.quota - int64(s&remMask)
		p, ok := fit(w, k, n, t, limit)
		switch {
		case !ok:
			return placement{}, full
		case p.due > deadline:
			return placement{}, late
		case !commit:
			return p, fits
		}
		if l.state.CompareAndSwap(s, s&^remMask|uint64(w.quota-p.slot-n)) {
			if p.slot > k {
				l.wasted.Add(p.slot - k)
			}
			if l.curUsed != nil {
				l.curUsed[cls] += n
			}
			return p, fits
		}
	}
}

// placeFutureLocked finds the earliest window after the current one, from
// time t on, with n permits free for class cls.
func (l *Limiter) placeFutureLocked(n, t, deadline int64, cls int) (placement, error) {
	ws := max(t, l.cur.end, l.scanFrom)
	for {
		w := l.spanLocked(ws)
		if w.quota < n && !l.sched.quotaAhead(w.start, n) {
			return placement{}, ErrNoQuota
		}
		if w.start > deadline {
			return placement{}, ErrTimeout
		}
		next := w.end
		if w.quota < n {
			// Too small: the next window worth a look is the next change.
			next, _ = l.sched.nextChange(w.start)
		} else {
			var k int64
			var used []int64
			if bw := l.book[w.start]; bw != nil {
				k, used = bw.charged, bw.used
				if w.paced {
					k = max(k, bw.next)
				}
			}
			if p, ok := fit(w, k, n, t, l.classes.limit(w.quota, used, cls)); ok {
				if p.due > deadline {
					return placement{}, ErrTimeout
				}
				return p, nil
			}
		}
		if next <= ws {
			return placement{}, ErrTimeout // the end of time
		}
		ws = next
	}
}

// fit places n permits in window w whose slots before k are taken, valid
// at t or later, taking no slot from limit on (w.quota, or less to keep
// classes' reserves).
func fit(w span, k, n, t, limit int64) (placement, bool) {
	t = max(t, w.open())
	if w.paced && t > w.start {
		// Paced slots whose time has passed are gone.
		k = max(k, w.slotAt(t)-(n-1))
	}
	if k+n > min(w.quota, limit) {
		return placement{}, false
	}
	due := max(w.slotTime(k+n-1), t)
	if due >= w.shut() {
		return placement{}, false
	}
	return placement{win: w, slot: k, due: due}, true
}

func (l *Limiter) bookWindowLocked(start int64) *bookWindow {
	bw := l.book[start]
	if bw == nil {
		bw = &bookWindow{res: make(map[*Reservation]struct{})}
		l.book[start] = bw
	}
	return bw
}

// bookLocked records r as placed at p; its permits are already charged.
func (l *Limiter) bookLocked(r *Reservation, p placement) {
	r.win, r.slot, r.due, r.state = p.win.start, p.slot, p.due, resPending
	r.tLo, r.tHi = p.win.start, p.win.end // the guard band keeps the true instant inside
	r.told = p.due
	l.bookWindowLocked(p.win.start).res[r] = struct{}{}
	if !r.counted {
		r.counted = true
		l.counts.delayed += r.n
		l.counts.observeWait(time.Duration(p.due - r.asked))
	}
}

// releaseLocked gives reservation r's permits back: to the state word if
// its window is the current one, else to its future window. Permits of a
// window already closed are gone.
func (l *Limiter) releaseLocked(r *Reservation) {
	l.unchargeAlsoLocked(r)
	bw := l.book[r.win]
	if bw != nil {
		delete(bw.res, r)
	}
	cls := l.classOfLocked(r, l.classes)
	switch {
	case r.win == l.cur.start:
		l.addRemainingLocked(r.n)
		if l.curUsed != nil {
			l.curUsed[cls] -= r.n
		}
	case r.win > l.cur.start && bw != nil:
		bw.charged -= r.n
		if bw.used != nil {
			bw.used[cls] -= r.n
		}
		if r.slot+r.n >= bw.next {
			// The slots from the end of those still held on are free
			// again: a paced window places after next, and a waiter of a
			// higher class placed ahead of lower ones (unplaceBelowLocked)
			// must not leave their slots behind as taken.
			bw.next = 0
			for o := range bw.res {
				bw.next = max(bw.next, o.slot+o.n)
			}
		}
		l.scanFrom = min(l.scanFrom, r.win)
	}
	if bw != nil && len(bw.res) == 0 && bw.charged == 0 {
		delete(l.book, r.win)
	}
}

// unplaceLocked takes every reservation not yet valid at now out of its
// window, giving its permits back, and returns them with the waiters for
// quota, in the order they were made: the limits are about to change. A
// reservation made by Reserve stays where it is (see Reservation.fixed).
func (l *Limiter) unplaceLocked(now int64) []*Reservation {
	return l.unplaceWhereLocked(now, func(r *Reservation) bool { return !r.fixed() })
}

// unplaceWhereLocked is unplaceLocked of the reservations movable reports
// true of.
func (l *Limiter) unplaceWhereLocked(now int64, movable func(*Reservation) bool) []*Reservation {
	var rs []*Reservation
	for _, bw := range l.book {
		for r := range bw.res {
			switch {
			case r.state != resPending:
			case !r.validLocked(now):
				if movable(r) {
					rs = append(rs, r)
				}
			default:
				// Valid already: it stays so whatever changes now (its
				// holder may be using it; a clock moved back would make it
				// look not yet due). Its waiter returns at once.
				r.state = resDone
				r.poke()
			}
		}
	}
	for _, r := range rs {
		l.releaseLocked(r)
	}
	rs = append(rs, l.noQuota...)
	l.noQuota = nil
	sortReservations(rs)
	return rs
}

// validLocked reports whether r's permits are valid at now. A part of a
// MultiReservation is valid only with the whole: every part placed at the
// instant the Multi agreed on, and that instant come. A part can be due
// alone, placed by its limit when the quota it waited for came, or left
// behind when another limit moved its part, until the Multi brings them
// together again; a change of its limit meanwhile must move it like any
// reservation not yet valid, or it would keep permits its limit no longer
// has. The caller holds every lock of r's Multi (lockChange).
func (r *Reservation) validLocked(now int64) bool {
	if r.due > now {
		return false
	}
	mr := r.multi
	if mr == nil {
		return true
	}
	if mr.state != resPending || mr.due != r.due {
		return false
	}
	for i, p := range mr.rs {
		if p != nil && (!mr.placed[i] || p.state == resFailed || p.due != mr.due) {
			return false
		}
	}
	return true
}

// unplaceBelowLocked takes every reservation of a class lower than cls
// not yet valid at now out of its window, as unplaceLocked does, and
// returns them in the order they are placed again: a waiter of class cls
// is about to be placed ahead of them. It returns nil without classes.
// Parts of a Multi are never among them: the Multi moves them whole
// (Multi.unplaceBelowLocked).
func (l *Limiter) unplaceBelowLocked(cls int, now int64) []*Reservation {
	if l.classes == nil || cls == len(l.curUsed)-1 {
		return nil
	}
	var rs []*Reservation
	for _, bw := range l.book {
		for r := range bw.res {
			if r.class > cls && r.state == resPending && r.multi == nil && !r.fixed() && !r.validLocked(now) {
				rs = append(rs, r)
			}
		}
	}
	for _, r := range rs {
		l.releaseLocked(r)
	}
	sortReservations(rs)
	return rs
}

// replaceLocked places the reservations unplaceLocked returned again, in
// order, under the new limits. shift is how far the limiter's time moved
// (a new clock offset): deadlines, which stand for real time, move with it,
// and a Reserve holder's permits, which it will use at the real time it was
// told, never move earlier than that. A reservation that cannot be placed by
// its deadline fails with ErrTimeout; Acquire waiters are woken to follow
// their new time.
func (l *Limiter) replaceLocked(rs []*Reservation, now, shift int64) {
	// overCur, what the current window admitted beyond a lowered quota,
	// stays as it is: it counts against any quota the window gets later.
	l.scanFrom = math.MinInt64
	for _, r := range rs {
		r.deadline = addClamped(r.deadline, time.Duration(shift))
		minDue := int64(math.MinInt64)
		if (r.holder || r.multi != nil) && r.due != math.MaxInt64 {
			minDue = addClamped(r.due, time.Duration(shift))
		}
		_, err := l.placeLocked(r.n, now, r.deadline, minDue, r, r.class)
		switch {
		case err == nil:
		case !r.holder && l.waitsForQuotaLocked(err, now, r.deadline):
			r.due, r.state = math.MaxInt64, resPending
			l.noQuota = append(l.noQuota, r)
			continue
		default:
			r.state, r.err = resFailed, ErrTimeout
			if err == ErrNoQuota {
				r.err = fmt.Errorf("%w: %w", ErrTimeout, ErrNoQuota)
			}
			l.counts.timedOut += r.n
			l.countClassLocked(r.class, r.n, 0, 0)
		}
		r.poke()
	}
}
