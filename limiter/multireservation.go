package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// MultiReservation is a Multi's promise of permits from every limit, all
// valid at one instant, made by Multi.Reserve (or inside Multi.Acquire).
//
// Each limit holds its part as a Reservation charged to the window that
// contains the instant. One made by Multi.Reserve keeps its instant in
// every limit, as a Reservation made by Reserve does: when one limit is
// closed alone, the others keep their parts charged, since the instant
// may have been told on. One made inside Acquire moves instead: a change
// of one limit can move its part, and the others then follow, so that
// every part is charged to the window, of its own limit, that contains
// the new instant. Delay is 0 when the permits are valid, and
// math.MaxInt64 when the reservation failed (Err says why) or waits for
// quota.
type MultiReservation struct {
	m      *Multi
	ns     [MaxLimits]int64
	seq    uint64 // order of making, in its Multi
	holder bool
	// The deadline less the clock offset when it was made: it stands for
	// an instant of real time, so it moves with the offset, as a
	// Reservation's does (see deadlineLocked).
	realDeadline int64
	wake         chan struct{} // every part pokes it

	// Guarded by every limit's mu (Multi.lock).
	rs     [MaxLimits]*Reservation // nil where the cost takes nothing
	placed [MaxLimits]bool         // rs[i] is charged to a window, or waits for quota
	due    int64                   // the instant; math.MaxInt64 while a part waits for quota
	state  int
	err    error
	grant  Grant
	// settled: the holder settled the Grant, reporting what it used, so
	// Cancel has nothing more to give back.
	settled bool
	shadow  [MaxLimits]int // what shadow mode counted each part as
}

// deadlineLocked is r's deadline on the limits' clock as it reads now.
func (r *MultiReservation) deadlineLocked() int64 {
	return addClamped(r.realDeadline, time.Duration(r.m.lims[0].offset.Load()))
}

// reserve is the slow path of Acquire and Reserve, taking ns from each
// limit.
func (m *Multi) reserve(ctx context.Context, ns [MaxLimits]int64, maxWait time.Duration, holder bool) (*MultiReservation, error) {
	if err := ctx.Err(); err != nil {
		return nil, canceledError(err)
	}
	m.lock()
	defer m.unlock()
	now := m.lims[0].now()
	for _, l := range m.lims {
		if l.closed {
			return nil, ErrClosed
		}
		l.advanceLocked(now)
	}
	// Each limit finds the class among its own classes.
	var cls [MaxLimits]int
	for i, l := range m.lims {
		cls[i] = l.classes.of(ctx)
	}
	m.nextSeq++
	r := &MultiReservation{m: m, ns: ns, seq: m.nextSeq, holder: holder, wake: make(chan struct{}, 1)}
	if m.takeAllLocked(r, now, &cls) {
		return r, nil
	}
	deadline := addClamped(now, max(maxWait, 0))
	if d, ok := ctx.Deadline(); ok {
		deadline = min(deadline, addClamped(now, time.Until(d)))
	}
	r.realDeadline = addClamped(deadline, -time.Duration(m.lims[0].offset.Load()))
	if m.allShadow(ns) {
		m.shadowLocked(r, now, &cls)
		return r, nil
	}
	for i, l := range m.lims {
		if ns[i] > 0 {
			r.rs[i] = l.newReservation(ns[i], now, deadline, holder)
			r.rs[i].wake, r.rs[i].multi = r.wake, r
			r.rs[i].class, r.rs[i].set = cls[i], l.classes
		}
	}
	bumped := m.unplaceBelowLocked(r, now)
	k, err := m.placeAllLocked(r, now, math.MinInt64)
	m.replaceAllLocked(bumped, now)
	switch {
	case err == nil:
		return r, nil
	case !holder && m.lims[k].waitsForQuotaLocked(err, now, deadline):
		m.waitForQuotaLocked(r, k)
		return r, nil
	}
	for i, l := range m.lims {
		l.counts.timedOut += ns[i]
		if ns[i] > 0 {
			l.countClassLocked(cls[i], ns[i], 0, 0)
		}
	}
	if err == ErrNoQuota {
		// The limit in force, not m.limits[k], the one the Multi was made
		// with: a cluster member's starts at 0/1s until its share comes.
		p := m.lims[k].sched.at(now)
		lm := Limit{Dimension: m.limits[k].Dimension, Quota: p.quota, Window: time.Duration(p.window)}
		return nil, fmt.Errorf("%w: %w: limit %v: %s", ErrTimeout, ErrNoQuota, lm, m.lims[k].noQuotaLocked(ns[k], "is"))
	}
	return nil, fmt.Errorf("%w: %s not available within %v", ErrTimeout, m.describe(ns), time.Duration(deadline-now))
}

// describe says what ns takes, for errors: "3 requests, 700 tokens".
func (m *Multi) describe(ns [MaxLimits]int64) string {
	var per [MaxLimits]int64
	for i, d := range m.dim {
		per[d] = max(per[d], ns[i])
	}
	s := ""
	for d, name := range m.names {
		if per[d] > 0 {
			if s != "" {
				s += ", "
			}
			s += fmt.Sprintf("%d %s", per[d], name)
		}
	}
	return s
}

// takeAllLocked takes r's permits, of class cls[i] in limit i, from every
// limit's current window if each has them valid now, and marks r granted;
// otherwise it takes none.
func (m *Multi) takeAllLocked(r *MultiReservation, now int64, cls *[MaxLimits]int) bool {
	for i, l := range m.lims {
		if r.ns[i] > 0 && !l.takeLocked(r.ns[i], now, cls[i]) {
			for j := range i {
				if r.ns[j] > 0 {
					m.lims[j].addRemainingLocked(r.ns[j])
					m.lims[j].useClassLocked(m.lims[j].classes, cls[j], true, -r.ns[j])
				}
			}
			return false
		}
	}
	for i, l := range m.lims {
		if r.ns[i] > 0 {
			r.grant.seq[i], r.grant.charged[i] = seqOf(l.seq), true
			r.grant.set[i], r.grant.class[i] = l.classes, uint8(cls[i])
		}
	}
	r.grant.m, r.grant.at, r.grant.n, r.grant.res = m, now, r.ns, r
	r.due, r.state = now, resDone
	return true
}

// shadowLocked admits r at once in shadow mode, counting in each limit
// what enforcing would have done with its part.
func (m *Multi) shadowLocked(r *MultiReservation, now int64, cls *[MaxLimits]int) {
	for i, l := range m.lims {
		if r.ns[i] == 0 {
			continue
		}
		kind := shadowRejected
		if _, err := l.placeLocked(r.ns[i], now, r.deadlineLocked(), math.MinInt64, nil, cls[i]); err == nil {
			kind = shadowDelayed
		}
		l.counts.shadow(kind, r.ns[i])
		l.countClassLocked(cls[i], 0, 0, r.ns[i])
		r.shadow[i] = kind
		r.grant.set[i], r.grant.class[i] = l.classes, uint8(cls[i])
	}
	r.grant.m, r.grant.at, r.grant.n, r.grant.res = m, now, r.ns, r
	r.due, r.state = now, resDone
}

// placeAllLocked charges every part of r to the window of its limit that
// contains the earliest instant, at or after now and minDue, at which
// every limit has room for its part by r's deadline. On failure nothing is
// charged, and k is the limit that had no room.
func (m *Multi) placeAllLocked(r *MultiReservation, now, minDue int64) (k int, err error) {
	t := max(now, minDue)
	deadline := r.deadlineLocked()
	for _, rr := range r.rs {
		if rr != nil {
			rr.deadline = deadline
		}
	}
	for {
		// The earliest instant each limit allows from t; where one allows
		// only a later one, ask every limit again from there.
		agreed := true
		for i, l := range m.lims {
			if r.ns[i] == 0 {
				continue
			}
			p, err := l.placeLocked(r.ns[i], now, deadline, t, nil, max(0, l.classOfLocked(r.rs[i], l.classes)))
			if err != nil {
				return i, err
			}
			if p.due > t {
				t, agreed = p.due, false
			}
		}
		if !agreed {
			continue
		}
		// Charge them. The hot path may have taken room in a current
		// window since: then a part lands later, and all go again from
		// there.
		for i, l := range m.lims {
			if r.ns[i] == 0 {
				continue
			}
			rr := r.rs[i]
			rr.class, rr.set = max(0, l.classOfLocked(rr, l.classes)), l.classes
			p, err := l.placeLocked(r.ns[i], now, deadline, t, rr, rr.class)
			if err == nil {
				r.placed[i] = true
			}
			if err != nil || p.due != t {
				m.unplaceAllLocked(r)
				if err != nil {
					return i, err
				}
				t = p.due
				agreed = false
				break
			}
		}
		if agreed {
			r.due = t
			return -1, nil
		}
	}
}

// unplaceAllLocked gives back every part of r that is charged or waits
// for quota, leaving r pending.
func (m *Multi) unplaceAllLocked(r *MultiReservation) {
	for i, l := range m.lims {
		if !r.placed[i] {
			continue
		}
		rr := r.rs[i]
		switch {
		case rr.due == math.MaxInt64:
			l.dropNoQuotaLocked(rr)
		case rr.win >= l.cur.start:
			l.releaseLocked(rr)
		default:
			// Its window closed before the others agreed (a waiter that
			// woke late): unused, and nothing can go back to it.
			if bw := l.book[rr.win]; bw != nil {
				delete(bw.res, rr)
			}
			l.counts.closedConsumed -= rr.n
		}
		rr.state = resPending
		r.placed[i] = false
	}
}

// unplaceBelowLocked takes every MultiReservation of a class lower than
// r's, placed and not yet valid, out of its windows in every limit, as
// Limiter.unplaceBelowLocked does for a Limiter's waiters, and returns
// them in the order they are placed again (replaceAllLocked), highest
// class first, then in the order they were made: r is about to be placed
// ahead of them. The first limit both take from that has
// classes decides which class is lower. It returns nil when no limit r
// takes from has classes.
func (m *Multi) unplaceBelowLocked(r *MultiReservation, now int64) []*MultiReservation {
	var out []*MultiReservation
	for i, l := range m.lims {
		if r.ns[i] == 0 || l.classes == nil {
			continue
		}
		for _, bw := range l.book {
			for rr := range bw.res {
				if o := rr.multi; o != nil && o != r && !slices.Contains(out, o) && m.movableLocked(o, now) && m.lowerLocked(o, r) {
					out = append(out, o)
				}
			}
		}
	}
	for _, o := range out {
		m.unplaceAllLocked(o)
	}
	// An insertion sort: out is short, and the order is pairwise.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && m.aheadLocked(out[j], out[j-1]); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// aheadLocked reports whether a is placed again before b: of a higher
// class, or of the same and made earlier.
func (m *Multi) aheadLocked(a, b *MultiReservation) bool {
	switch {
	case m.lowerLocked(b, a):
		return true
	case m.lowerLocked(a, b):
		return false
	}
	return a.seq < b.seq
}

// movableLocked reports whether r is pending with every part placed, none
// waiting for quota, and not yet valid at now: one a higher class may
// move later.
func (m *Multi) movableLocked(r *MultiReservation, now int64) bool {
	if r.holder || r.state != resPending || r.due == math.MaxInt64 {
		return false
	}
	valid := true
	for i, rr := range r.rs {
		if rr == nil {
			continue
		}
		if !r.placed[i] || rr.state != resPending || rr.due == math.MaxInt64 {
			return false
		}
		valid = valid && rr.validLocked(now)
	}
	return !valid
}

// lowerLocked reports whether o is of a lower class than r in the first
// limit both take from that has classes.
func (m *Multi) lowerLocked(o, r *MultiReservation) bool {
	for i, l := range m.lims {
		if o.rs[i] != nil && r.rs[i] != nil && l.classes != nil {
			return l.classOfLocked(o.rs[i], l.classes) > l.classOfLocked(r.rs[i], l.classes)
		}
	}
	return false
}

// replaceAllLocked places again, in order, the reservations
// unplaceBelowLocked returned, as Limiter.replaceLocked does: a holder's
// never earlier than the time it was given; one that fits no more by its
// deadline fails with ErrTimeout. Each waiter is woken to follow.
func (m *Multi) replaceAllLocked(rs []*MultiReservation, now int64) {
	for _, o := range rs {
		minDue := int64(math.MinInt64)
		if o.holder {
			minDue = o.due
		}
		k, err := m.placeAllLocked(o, now, minDue)
		switch {
		case err == nil:
		case !o.holder && m.lims[k].waitsForQuotaLocked(err, now, o.deadlineLocked()):
			m.waitForQuotaLocked(o, k)
		case err == ErrNoQuota:
			m.failLocked(o, fmt.Errorf("%w: %w", ErrTimeout, ErrNoQuota))
		default:
			m.failLocked(o, ErrTimeout)
		}
		o.poke()
	}
}

// waitForQuotaLocked makes r wait, unplaced, for limit k's quota to
// become large enough for its part; limit k places that part when it
// does, and r follows.
func (m *Multi) waitForQuotaLocked(r *MultiReservation, k int) {
	m.unplaceAllLocked(r)
	rr := r.rs[k]
	rr.due, rr.state = math.MaxInt64, resPending
	m.lims[k].noQuota = append(m.lims[k].noQuota, rr)
	r.placed[k] = true
	r.due = math.MaxInt64
}

// reconcileLocked brings r's parts back to one instant after a limit
// changed under one of them: a part failed fails r; a part moved moves
// every part to the new instant (for a holder, never earlier than the
// time it was given).
func (m *Multi) reconcileLocked(r *MultiReservation, now int64) {
	if r.state != resPending {
		return
	}
	for i, l := range m.lims {
		if r.ns[i] > 0 && l.closed {
			// One limit closed alone (a Group's Member left, its share
			// handed on): nothing more is granted from it, also to a wait
			// that held no part of it when it closed.
			m.failLocked(r, ErrClosed)
			r.poke()
			return
		}
	}
	for _, l := range m.lims {
		l.advanceLocked(now)
	}
	t, waiting, complete := int64(math.MinInt64), -1, true
	for i, rr := range r.rs {
		switch {
		case rr == nil:
		case !r.placed[i]:
			complete = false
		case rr.state == resFailed:
			m.failLocked(r, rr.err)
			return
		case rr.due == math.MaxInt64:
			waiting = i
		default:
			t = max(t, rr.due)
		}
	}
	if r.holder && complete && waiting < 0 {
		return // its parts are fixed (Reservation.fixed): they never move
	}
	if waiting >= 0 {
		r.due = math.MaxInt64
		if complete && t != math.MinInt64 {
			m.waitForQuotaLocked(r, waiting) // the others hold nothing meanwhile
		}
		return
	}
	if complete && m.agreeLocked(r, t) {
		// Every part is valid from t only: one valid earlier would stay
		// valid through a change of its limit (see unplaceLocked) while
		// the others are not yet.
		for _, rr := range r.rs {
			if rr != nil {
				rr.due = t
			}
		}
		r.due = t
		return
	}
	minDue := t
	if r.holder && r.due != math.MaxInt64 {
		minDue = max(minDue, r.due)
	}
	m.unplaceAllLocked(r)
	k, err := m.placeAllLocked(r, now, minDue)
	switch {
	case err == nil:
	case !r.holder && m.lims[k].waitsForQuotaLocked(err, now, r.deadlineLocked()):
		m.waitForQuotaLocked(r, k)
	default:
		if err == ErrNoQuota {
			err = fmt.Errorf("%w: %w", ErrTimeout, ErrNoQuota)
		} else {
			err = ErrTimeout
		}
		m.failLocked(r, err)
	}
	r.poke()
}

// agreeLocked reports whether every part of r is valid at t in the window
// it is charged to. A part due at t was placed there by its limit; one due
// earlier (the others moved later) must have t in its window.
func (m *Multi) agreeLocked(r *MultiReservation, t int64) bool {
	for i, rr := range r.rs {
		if rr == nil || rr.due == t {
			continue
		}
		sp := m.lims[i].spanLocked(rr.win)
		if rr.due > t || sp.start != rr.win || t < sp.open() || t >= sp.shut() {
			return false
		}
	}
	return true
}

// failLocked ends r with err, giving every part back: counted as timed
// out in every limit when err is a timeout.
func (m *Multi) failLocked(r *MultiReservation, err error) {
	for i, l := range m.lims {
		rr := r.rs[i]
		if rr == nil {
			continue
		}
		if rr.state != resFailed { // a part that failed was counted by its limit
			cls := l.classOfLocked(rr, l.classes)
			switch {
			case r.placed[i] && rr.fixed() && !l.closed && (rr.state == resPending || rr.state == resDone):
				// Its time may have been told: the part stays charged
				// in its window, as Reservation.fixed says, held and
				// not admitted, until Cancel.
				l.holdLocked(rr.win, rr.n)
				rr.held = true
			case r.placed[i]:
				rr.cancelLocked()
				l.counts.canceled -= rr.n
				l.countClassLocked(cls, 0, -rr.n, 0)
			}
			if errors.Is(err, ErrTimeout) {
				l.counts.timedOut += rr.n
				l.countClassLocked(cls, rr.n, 0, 0)
			}
		}
		rr.state, rr.err = resFailed, err
		r.placed[i] = false
	}
	r.state, r.err = resFailed, err
}

// grantLocked makes r's permits valid: the caller's from now on.
func (m *Multi) grantLocked(r *MultiReservation, now int64) {
	for i, l := range m.lims {
		rr := r.rs[i]
		if rr == nil {
			continue
		}
		rr.state = resDone
		r.grant.seq[i], r.grant.charged[i] = noWindow, true
		if rr.win == l.cur.start {
			r.grant.seq[i] = seqOf(l.seq)
		}
		r.grant.set[i], r.grant.class[i] = rr.set, uint8(rr.class)
	}
	r.grant.m, r.grant.at, r.grant.n, r.grant.res = m, now, r.ns, r
	r.state = resDone
}

func (r *MultiReservation) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// dropNoQuotaLocked takes r off the list of waiters for quota.
func (l *Limiter) dropNoQuotaLocked(r *Reservation) {
	for i, x := range l.noQuota {
		if x == r {
			l.noQuota = append(l.noQuota[:i], l.noQuota[i+1:]...)
			return
		}
	}
}

// Delay returns how long from now until the permits become valid: 0 if
// they are valid already, and math.MaxInt64 (as a Duration) for a
// reservation that failed, was cancelled or still waits for quota.
func (r *MultiReservation) Delay() time.Duration {
	m := r.m
	m.lock()
	defer m.unlock()
	now := m.lims[0].now()
	m.reconcileLocked(r, now)
	switch {
	case r.state == resDone || r.partsValidLocked():
		return 0
	case r.state != resPending || r.due == math.MaxInt64:
		return math.MaxInt64
	}
	return time.Duration(max(0, r.due-now))
}

// partsValidLocked reports whether every part of r was found valid by a
// change of its limit (see Reservation.validLocked): valid it stays, even
// when a clock corrected backwards makes its instant look ahead again.
func (r *MultiReservation) partsValidLocked() bool {
	if r.state != resPending {
		return false
	}
	for i, rr := range r.rs {
		if rr != nil && (!r.placed[i] || rr.state != resDone) {
			return false
		}
	}
	return r.rs != [MaxLimits]*Reservation{}
}

// Err returns nil while the reservation holds, or the error that ended it
// (see Reservation.Err).
func (r *MultiReservation) Err() error {
	m := r.m
	m.lock()
	defer m.unlock()
	m.reconcileLocked(r, m.lims[0].now())
	if r.state == resCanceled {
		return ErrCanceled
	}
	return r.err
}

// Cancel gives every limit its permits back, as Reservation.Cancel does;
// it is idempotent. After the Grant that Wait returned was settled, it
// gives nothing back: Settle did, for what the call did not use.
func (r *MultiReservation) Cancel() {
	m := r.m
	m.lock()
	defer m.unlock()
	r.cancelLocked()
}

func (r *MultiReservation) cancelLocked() {
	if r.state == resFailed {
		r.releaseHeldLocked()
		return
	}
	if r.state != resPending && r.state != resDone || r.settled {
		return
	}
	for i, rr := range r.rs {
		if rr != nil && (r.placed[i] || r.state == resDone) {
			rr.cancelLocked()
		}
		r.placed[i] = false
	}
	if r.state == resDone && r.rs == [MaxLimits]*Reservation{} {
		// Taken at once, or admitted by shadow mode: the parts were
		// never reservations.
		for i, l := range r.m.lims {
			switch {
			case r.grant.charged[i]:
				l.releaseTakenLocked(r.grant.seq[i], r.grant.at, r.ns[i], r.grant.set[i], int(r.grant.class[i]))
			case r.shadow[i] != shadowNone:
				l.counts.shadow(r.shadow[i], -r.ns[i])
				l.counts.canceled += r.ns[i]
				cls := remapClass(r.grant.set[i], int(r.grant.class[i]), l.classes)
				l.countClassLocked(cls, 0, r.ns[i], -r.ns[i])
			}
		}
	}
	r.state = resCanceled
}

// releaseHeldLocked gives back the parts a failed r kept charged (see
// failLocked): its holder says, by Cancel, that nobody uses them.
func (r *MultiReservation) releaseHeldLocked() {
	for i, rr := range r.rs {
		if rr == nil || !rr.held {
			continue
		}
		l := r.m.lims[i]
		rr.held = false
		if l.closed {
			continue // Close counted it closed: nothing goes back
		}
		l.advanceLocked(l.now())
		switch {
		case rr.win >= l.cur.start:
			l.unholdLocked(rr.win, rr.n)
			l.releaseLocked(rr)
		default:
			l.counts.closedConsumed -= rr.n // its window closed unused
			l.wasted.Add(-rr.n)
			if bw := l.book[rr.win]; bw != nil {
				delete(bw.res, rr)
			}
		}
	}
}

// releaseTakenLocked gives back n permits of class cls of set taken at
// once at time at from window seq, as Cancel does for a reservation.
func (l *Limiter) releaseTakenLocked(seq uint64, at, n int64, set *classes, cls int) {
	now := l.now()
	if !l.closed {
		l.advanceLocked(now)
	}
	w := l.cur.end - l.cur.start
	open := l.cur.end != math.MinInt64 && seq == seqOf(l.seq) && at < l.cur.end && at >= l.cur.start-w
	if open {
		l.addRemainingLocked(n)
	} else {
		l.counts.closedConsumed -= n
	}
	l.useClassLocked(set, cls, open, -n)
	l.counts.canceled += n
	l.countClassLocked(remapClass(set, cls, l.classes), 0, n, 0)
}

// Wait sleeps until the permits are valid and returns the Grant, following
// any move of the reservation. If ctx ends first it cancels the
// reservation and returns an error matching ErrCanceled (ErrTimeout for an
// expired deadline) and ctx.Err(). It returns the reservation's error if it
// failed.
func (r *MultiReservation) Wait(ctx context.Context) (Grant, error) {
	m := r.m
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		m.lock()
		now := m.lims[0].now()
		d, g, err, done := r.stepLocked(now)
		m.unlock()
		if done {
			return g, err
		}
		if t == nil {
			t = time.NewTimer(time.Duration(d))
		} else {
			t.Reset(time.Duration(d))
		}
		select {
		case <-t.C:
		case <-r.wake:
		case <-ctx.Done():
			m.lock()
			g, err := r.endLocked(ctx.Err())
			m.unlock()
			return g, err
		}
	}
}

// stepLocked is one look of Wait at r: the outcome if there is one, else
// how long to sleep.
func (r *MultiReservation) stepLocked(now int64) (sleep int64, g Grant, err error, done bool) {
	m := r.m
	m.reconcileLocked(r, now)
	switch r.state {
	case resDone:
		return 0, r.grant, nil, true
	case resFailed:
		return 0, Grant{}, r.err, true
	case resCanceled:
		return 0, Grant{}, ErrCanceled, true
	}
	if r.due == math.MaxInt64 {
		deadline := r.deadlineLocked()
		if now >= deadline {
			m.failLocked(r, fmt.Errorf("%w: %w: %s stayed without quota", ErrTimeout, ErrNoQuota, m.describe(r.ns)))
			return 0, Grant{}, r.err, true
		}
		return deadline - now, Grant{}, nil, false
	}
	if now >= r.due {
		m.grantLocked(r, now)
		return 0, r.grant, nil, true
	}
	return r.due - now, Grant{}, nil, false
}

// endLocked ends a Wait whose context ended with ctxErr: the permits win
// if they are valid at this instant, else every limit gets them back.
func (r *MultiReservation) endLocked(ctxErr error) (Grant, error) {
	m := r.m
	now := m.lims[0].now()
	m.reconcileLocked(r, now)
	switch {
	case r.state == resDone:
		return r.grant, nil
	case r.state == resFailed:
		return Grant{}, r.err
	case r.state == resPending && r.due != math.MaxInt64 && now >= r.due:
		m.grantLocked(r, now)
		return r.grant, nil
	}
	err := canceledError(ctxErr)
	if errors.Is(err, ErrTimeout) {
		m.failLocked(r, err)
		return Grant{}, err
	}
	r.cancelLocked()
	return Grant{}, err
}
