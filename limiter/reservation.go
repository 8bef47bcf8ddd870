package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

const (
	resPending = iota
	resDone
	resCanceled
	resFailed
)

// Reservation is a promise of permits counted in one window, made by
// Reserve (or internally by Acquire). The permits are the holder's from
// ReadyAt on; Cancel gives them back.
//
// One made by Reserve keeps its time: its holder may have told it on to a
// caller that cannot be told again (sluice-agent's /v1/reserve does). No
// later change of limits moves or fails it: a lowered quota, a new
// schedule, a Backoff, an earlier expiry or a higher class arriving leave
// it charged to its window, which then admits nothing more while it holds
// the window's quota or more; a change of window length charges it to the
// new windows its time may fall in, and a clock correction keeps its real
// time. Only Cancel and Close end it. Schedule and SetSchedule report the
// first window free of such excess (see SetSchedule).
//
// One made inside Acquire is moved instead: a change of limits before it
// is valid places it again, in the order reservations were made, later or
// (past its deadline) failed. Once valid a reservation stays valid, even
// when a clock correction makes its time look ahead again, since its
// holder may be using it. Delay is 0 when the permits are valid and
// math.MaxInt64 when the reservation failed (Err says why: Close, for one
// made by Reserve).
//
// Cancel gives the permits back to callers that ask after it; waiters
// already placed keep their times (as with golang.org/x/time/rate), so a
// cancellation is O(1) however many wait.
type Reservation struct {
	l     *Limiter
	n     int64
	seq   uint64   // order of making
	class int      // priority class, 0 the highest (WithClasses), in set
	set   *classes // the classes in force when class was last set; guarded by l.mu
	asked int64    // corrected ns at which it was made

	// Guarded by l.mu.
	deadline int64
	win      int64 // start of the window it is charged to
	slot     int64 // its first slot there
	due      int64 // corrected ns; math.MaxInt64 while waiting for quota
	state    int
	err      error
	counted  bool // in Stats.Delayed already
	holder   bool // made by Reserve: its holder uses it at ReadyAt, so it never moves earlier
	// The MultiReservation r is a part of, or nil: a part is valid only
	// when every part is, at the instant they share (see validLocked), so
	// it never moves earlier either; the Multi moves all its parts
	// together.
	multi  *MultiReservation
	shadow int // admitted by shadow mode beyond the quota: what it was counted as (shadowDelayed, shadowRejected)
	// For a fixed reservation (see fixed): [tLo, tHi) holds the true
	// instant its holder was given, and also, when alsoSet, is the start
	// of a second window it is charged to because that interval meets it.
	tLo, tHi int64
	told     int64 // the instant given, on the limiter's clock as it reads now; due may be clamped from it
	also     int64
	alsoSet  bool
	held     bool // a part of a failed MultiReservation, kept charged until Cancel

	wake chan struct{} // poked when due or state change; nil for done ones
}

// fixed reports whether r keeps its window and time whatever changes
// after it was made: one made by Reserve, whose holder may have told its
// time to a caller that cannot be told again (sluice-agent's
// /v1/reserve). Its permits count as taken in its window, as an
// admission's do, until Cancel gives them back or Close ends it.
func (r *Reservation) fixed() bool { return r.holder }

// ReadyAt returns when the permits become valid, on the system clock. For a
// Reservation that failed or was cancelled, or that still waits for a
// quota, it returns the zero Time.
func (r *Reservation) ReadyAt() time.Time {
	d, ok := r.delay()
	if !ok {
		return time.Time{}
	}
	return time.Now().Add(d)
}

// Delay returns how long from now until the permits become valid: 0 if they
// are valid already, and math.MaxInt64 (as a Duration) for a Reservation that
// failed or still waits for quota.
func (r *Reservation) Delay() time.Duration {
	d, ok := r.delay()
	if !ok {
		return math.MaxInt64
	}
	return d
}

func (r *Reservation) delay() (time.Duration, bool) {
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case r.state == resFailed || r.state == resCanceled || r.due == math.MaxInt64:
		return 0, false
	case r.state == resDone:
		return 0, true // valid, even if a clock moved back since says otherwise
	}
	return time.Duration(max(0, r.due-l.now())), true
}

// Err returns nil while the Reservation holds, or the error that ended it:
// ErrClosed when the Limiter was closed, ErrCanceled after Cancel.
func (r *Reservation) Err() error {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	if r.state == resCanceled {
		return ErrCanceled
	}
	return r.err
}

// Cancel gives the permits back: later callers can take them. Cancelling
// after ReadyAt still returns them if their window has not ended (the
// holder says it did not use them). Cancel is idempotent.
func (r *Reservation) Cancel() {
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	r.cancelLocked()
}

func (r *Reservation) cancelLocked() {
	l := r.l
	if r.state != resPending && r.state != resDone {
		return
	}
	if r.due == math.MaxInt64 {
		l.noQuota = slices.DeleteFunc(l.noQuota, func(x *Reservation) bool { return x == r })
	} else {
		// Also after Close: a closed limiter admits nothing, but Stats
		// must not count what the holder did not use.
		now := l.now()
		l.advanceLocked(now)
		l.unchargeAlsoLocked(r)
		switch {
		case r.shadow != shadowNone: // nothing was placed
		case r.win >= l.cur.start:
			l.releaseLocked(r)
		default:
			// Its window has closed: the permits cannot go back to it,
			// but they were not used either.
			l.counts.closedConsumed -= r.n
			if cls := l.classOfLocked(r, l.classes); cls >= 0 {
				l.classCounts[cls].closed -= r.n
			}
		}
	}
	r.state = resCanceled
	l.counts.canceled += r.n
	cls := l.classOfLocked(r, l.classes)
	l.countClassLocked(cls, 0, r.n, 0)
	if r.shadow != shadowNone {
		l.counts.shadow(r.shadow, -r.n) // the holder did not use what shadow mode admitted
		l.countClassLocked(cls, 0, 0, -r.n)
	}
}

// Wait sleeps until the permits are valid and returns nil, following any
// move of the Reservation. If ctx ends first it cancels the Reservation and
// returns an error matching ErrCanceled (ErrTimeout for an expired
// deadline) and ctx.Err(). It returns the Reservation's error if it failed.
func (r *Reservation) Wait(ctx context.Context) error {
	l := r.l
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		l.mu.Lock()
		switch r.state {
		case resDone:
			l.mu.Unlock()
			return nil
		case resFailed:
			err := r.err
			l.mu.Unlock()
			return err
		case resCanceled:
			l.mu.Unlock()
			return ErrCanceled
		}
		now := l.now()
		var d int64
		if r.due == math.MaxInt64 {
			if now >= r.deadline {
				r.cancelLocked()
				l.counts.canceled -= r.n
				l.counts.timedOut += r.n
				l.countClassLocked(l.classOfLocked(r, l.classes), r.n, -r.n, 0)
				err := fmt.Errorf("%w: %w: %s", ErrTimeout, ErrNoQuota, l.noQuotaLocked(r.n, "stayed"))
				l.mu.Unlock()
				return err
			}
			d = r.deadline - now
		} else {
			if now >= r.due {
				r.state = resDone
				l.mu.Unlock()
				return nil
			}
			d = r.due - now
		}
		l.mu.Unlock()
		if t == nil {
			t = time.NewTimer(time.Duration(d))
		} else {
			t.Reset(time.Duration(d))
		}
		select {
		case <-t.C:
			l.wakeups.Add(1)
		case <-r.wake:
			l.wakeups.Add(1)
		case <-ctx.Done():
			l.mu.Lock()
			switch {
			case r.state == resDone || r.state == resPending && r.due != math.MaxInt64 && l.now() >= r.due:
				// Valid already, or at the same instant: the permit wins.
				r.state = resDone
				l.mu.Unlock()
				return nil
			case r.state == resFailed:
				// Failed by a change at the same instant: that is the answer.
				err := r.err
				l.mu.Unlock()
				return err
			}
			r.cancelLocked()
			err := canceledError(ctx.Err())
			if errors.Is(err, ErrTimeout) {
				// Its deadline passed: a timeout, as the error says.
				l.counts.canceled -= r.n
				l.counts.timedOut += r.n
				l.countClassLocked(l.classOfLocked(r, l.classes), r.n, -r.n, 0)
			}
			l.mu.Unlock()
			return err
		}
	}
}

func (r *Reservation) poke() {
	if r.wake == nil {
		return
	}
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// sortReservations orders rs as they are placed: by class, highest first,
// then in the order they were made.
func sortReservations(rs []*Reservation) {
	slices.SortFunc(rs, func(a, b *Reservation) int {
		switch {
		case a.class != b.class:
			return a.class - b.class
		case a.seq < b.seq:
			return -1
		case a.seq > b.seq:
			return 1
		}
		return 0
	})
}
