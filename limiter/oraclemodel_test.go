package limiter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// The reference model of the core oracle (oracle_test.go): the limits in
// force, by the documented semantics of SetLimit, SetQuota, SetExpiry, the
// clock and Close, written as plainly as possible and apart from the
// limiter's code. Corrected times are the limiter's (true time plus the
// offset the history set); the model follows them exactly, because the
// driver knows the offset whenever it calls.

type oparams struct{ q, w int64 }

type ochange struct {
	from int64 // corrected ns, a boundary of the windows before and after
	p    oparams
}

type omodel struct {
	base    oparams   // in force now, or from the last SetLimit that took effect at once
	changes []ochange // scheduled, in order; those already in force stay listed
	// The limiter's current window: the window that contains the highest
	// corrected time it was called at (it never goes back, also when the
	// clock does). decided is each entered window's quota, as decided when
	// it began or by a SetLimit that took effect at once.
	hw         int64
	curS, curE int64
	decided    map[int64]int64

	off, u   int64
	expSet   bool
	expTrue  int64 // the expiry as an instant of true time: it moves with the clock
	backoffC int64 // corrected end of the backoff
	closed   bool
	closedAt int64
	shadow   bool
	pacing   bool
	// When pacing was last on (corrected ns, as windows are): a window in
	// which it was on at any time may have dropped slots.
	pacingLast int64
}

func newModel(q, w int64, pacing bool) *omodel {
	return &omodel{base: oparams{q, w}, hw: math.MinInt64, curS: math.MinInt64, curE: math.MinInt64,
		decided: map[int64]int64{}, backoffC: math.MinInt64, pacing: pacing, pacingLast: math.MinInt64}
}

// paramsAt is the quota and window in force at corrected time c.
func (m *omodel) paramsAt(c int64) oparams {
	p := m.base
	for _, ch := range m.changes {
		if ch.from <= c {
			p = ch.p
		}
	}
	return p
}

// win is the window that contains corrected time c, and its params. From
// the last whole day int64 holds on, time has ended: one window, quota 0.
func (m *omodel) win(c int64) (s, e int64, p oparams) {
	if c >= timeEndForTest {
		return timeEndForTest, math.MaxInt64, oparams{}
	}
	p = m.paramsAt(c)
	s = c - floorMod(c, p.w)
	return s, s + p.w, p
}

// decide is the quota of window [s, …) with params p as the limits stand
// now: 0 past the end of time or when it begins at or after the expiry.
func (m *omodel) decide(s int64, p oparams) int64 {
	if s >= timeEndForTest || (m.expSet && s >= m.expTrue+m.off) {
		return 0
	}
	return p.q
}

// quotaOf is the quota of the window that begins at s.
func (m *omodel) quotaOf(s int64, p oparams) int64 {
	if q, ok := m.decided[s]; ok {
		return q
	}
	return m.decide(s, p)
}

// roll is a call into the limiter at corrected time c: it enters the
// window that contains c if c is past the current one.
func (m *omodel) roll(c int64) {
	if c < m.curE {
		m.hw = max(m.hw, c)
		return
	}
	m.hw = c
	s, e, p := m.win(c)
	m.curS, m.curE = s, e
	m.decided[s] = m.decide(s, p)
}

func lcm(a, b int64) int64 { return a / gcd(a, b) * b }

// apply makes controller event ev, at true time ev.at.
func (m *omodel) apply(ev ctlEv) {
	c := ev.at + m.off
	switch ev.kind {
	case ctlLimit:
		if m.closed {
			return
		}
		m.roll(c)
		w := ev.w
		if w == 0 { // SetQuota: the window in force at its at
			w = m.paramsAt(max(ev.to, m.hw)).w
		}
		at := ev.to
		if at == math.MinInt64 {
			at = c
		}
		p := oparams{ev.q, w}
		if w == m.paramsAt(m.hw).w && at <= c {
			// From now on: the current window too, keeping what it took.
			m.base, m.changes = p, nil
			m.decided[m.curS] = m.decide(m.curS, p)
			return
		}
		// From the first boundary of both lengths at or after at and the
		// current window's end, replacing what was scheduled from there.
		f0 := max(at, m.curE)
		m.changes = slices.DeleteFunc(m.changes, func(ch ochange) bool { return ch.from >= f0 })
		step := lcm(m.paramsAt(f0).w, w)
		from := f0 + floorMod(-f0, step)
		if from > f0 && from < f0 { // overflow guard, never in these histories
			return
		}
		m.changes = append(m.changes, ochange{from, p})
	case ctlOffset:
		if m.closed {
			m.off = ev.v
			return
		}
		m.roll(c)
		m.off = ev.v
		m.roll(ev.at + m.off)
	case ctlUncertainty:
		if !m.closed {
			m.roll(c)
		}
		m.u = ev.v
	case ctlBackoff:
		if ev.v > 0 && !m.closed && c+ev.v > m.backoffC {
			m.roll(c)
			m.backoffC = c + ev.v
		}
	case ctlExpiry:
		if !m.closed {
			m.roll(c)
		}
		m.expSet, m.expTrue = ev.on, ev.v-m.off
	case ctlPacing:
		if m.pacing || ev.on {
			m.pacingLast = c
		}
		m.pacing = ev.on
	case ctlShadow:
		m.shadow = ev.on
	case ctlClose:
		if !m.closed {
			m.roll(c)
			m.closed, m.closedAt = true, ev.at
		}
	}
}

// paced reports whether window s saw pacing on at any time so far: it may
// have dropped slots.
func (m *omodel) paced(s int64) bool { return m.pacing || m.pacingLast >= s }

// ---------------------------------------------------------------------------
// The checks.

const (
	evCtl = iota
	evStart
	evEnd
)

type oev struct {
	t, seq int64
	kind   int
	i      int // into ctl or calls
}

func validN(n int64) bool { return n >= 1 && n <= MaxQuota }

// waits reports whether c may hold permits between its start and its end:
// an Acquire, or a Reserve that got its reservation.
func (c *callEv) waits() bool {
	return validN(c.n) && (c.kind == callAcquire || c.kind == callReserve && c.held)
}

// check replays the history through the model and returns the first
// violation, or "", and what it saw.
func (h *ohist) check() (string, oracleCover) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var evs []oev
	ctlAt := map[int64]bool{}
	for i, e := range h.ctl {
		evs = append(evs, oev{e.at, e.seq, evCtl, i})
		ctlAt[e.at] = true
	}
	for i, c := range h.calls {
		evs = append(evs, oev{c.start, c.startSeq, evStart, i}, oev{c.end, c.endSeq, evEnd, i})
	}
	slices.SortFunc(evs, func(a, b oev) int {
		if a.t != b.t {
			return cmp.Compare(a.t, b.t)
		}
		return cmp.Compare(a.seq, b.seq)
	})
	q0, w0 := h.firstLimits()
	m := newModel(q0, w0, h.firstPacing())
	count := map[int64]int64{} // permits granted per window (its start, true ns)
	quota := map[int64]int64{} // the largest quota each window was judged by
	// Windows in which shadow mode admitted: beyond their quota, and at
	// once, also inside the guard band (so in the next aligned window).
	shadowed := map[int64]bool{}
	cov := oracleCover{ops: int64(len(h.ctl) + len(h.calls))}
	var outstanding int64 // permits of waiters and holders not yet answered
	var problem string
	fail := func(format string, args ...any) {
		if problem == "" {
			problem = fmt.Sprintf(format, args...)
		}
	}
	fixed := newFixedBook()
	type pending struct {
		c       *callEv
		s       int64
		p       oparams
		sum, qS int64
	}
	for i := 0; i < len(evs); {
		// One instant at a time: where the controller changed something
		// at the same instant as a grant, the grant may have come before
		// or after the change, so it is judged by the kinder of the two.
		j := i
		for j < len(evs) && evs[j].t == evs[i].t {
			j++
		}
		t := evs[i].t
		ambiguous := ctlAt[t]
		fixed.cancelsFirst(evs[i:j], func(k int) bool { return h.calls[k].canceled }, count)
		var deferred []pending
		for _, ev := range evs[i:j] {
			switch ev.kind {
			case evCtl:
				m.apply(h.ctl[ev.i])
				fixed.follow(m, count)
			case evStart:
				c := h.calls[ev.i]
				if validN(c.n) && !m.closed {
					m.roll(t + m.off)
				}
				if c.kind == callTry {
					if !c.granted {
						why, judged := h.refusalUnexcused(m, c, count, outstanding, ambiguous)
						if judged {
							cov.refusals++
						}
						if why != "" {
							fail("call %d: TryAcquireN(%d) refused at %s: %s", ev.i, c.n, h.at(t), why)
						}
					}
					continue
				}
				if c.waits() {
					outstanding += c.n
				}
				if c.kind == callReserve && c.held && !c.shadow {
					s, q := fixed.promise(ev.i, t+c.readyIn, c.n, m, count)
					if !ambiguous && count[s] > q && !shadowed[s] {
						fail("call %d: window %s (%v) has %d permits after this promise of %d at %s; its quota is %d",
							ev.i, h.at(s), time.Duration(m.paramsAt(s).w), count[s], c.n, h.at(t), q)
					}
				}
			case evEnd:
				c := h.calls[ev.i]
				if c.rolled && !m.closed {
					m.roll(t + m.off)
				}
				if c.waits() {
					outstanding -= c.n
				}
				pr, isFixed := fixed.end(ev.i, c.canceled, count)
				if !c.granted {
					continue
				}
				s, _, p := m.win(t)
				if isFixed && t != pr.t && !pr.since(m) {
					fail("call %d: a Reserve told ready in %v was valid after %v", ev.i, time.Duration(c.readyIn), time.Duration(t-c.start))
				}
				if isFixed && s != pr.s && !pr.moved {
					fail("call %d: a Reserve promised in window %s was used at %s, outside it", ev.i, h.at(pr.s), h.at(t))
				}
				if !isFixed || s != pr.s {
					count[s] += c.n
				}
				shadowed[s] = shadowed[s] || c.shadow
				if m.closed && t > m.closedAt {
					fail("call %d: %d permits granted at %s, after Close at %s", ev.i, c.n, h.at(t), h.at(m.closedAt))
				}
				if !ambiguous && !c.shadow && t+m.off < m.backoffC && !(isFixed && pr.since(m)) {
					fail("call %d: %d permits granted at %s during a backoff that ends at %s", ev.i, c.n, h.at(t), h.atC(m, m.backoffC))
				}
				if isFixed && s == pr.s {
					continue // counted when promised
				}
				q := max(m.quotaOf(s, p), fixed.excused[s])
				if ambiguous {
					deferred = append(deferred, pending{c: c, s: s, p: p, sum: count[s], qS: q})
					continue
				}
				cov.grants++
				quota[s] = max(quota[s], q)
				if count[s] > q && !shadowed[s] {
					fail("call %d: window %s (%v) has %d permits after this grant of %d at %s; its quota is %d",
						ev.i, h.at(s), time.Duration(p.w), count[s], c.n, h.at(t), q)
				}
			}
		}
		for _, d := range deferred {
			q := max(d.qS, m.quotaOf(d.s, d.p), h.quotaBefore(evs[:i], t))
			cov.grants++
			quota[d.s] = max(quota[d.s], q)
			if d.sum > q && !shadowed[d.s] {
				fail("window %s (%v) has %d permits after a grant of %d at %s; its quota is at most %d",
					h.at(d.s), time.Duration(d.p.w), d.sum, d.c.n, h.at(t), q)
			}
		}
		i = j
	}
	if problem == "" {
		problem = h.checkCalls()
	}
	if problem == "" {
		problem = h.checkStats()
	}
	for s, q := range quota {
		if shadowed[s] {
			continue
		}
		cov.windows++
		if q > 0 {
			cov.fullest = max(cov.fullest, float64(count[s])/float64(q))
			if count[s] == q {
				cov.full++
			}
		}
	}
	return problem, cov
}

// quotaBefore is the quota of the window that contains true time t, as
// the model stood after evs: replayed from the start. Only needed at
// instants of changes, a few per history.
func (h *ohist) quotaBefore(evs []oev, t int64) int64 {
	q0, w0 := h.firstLimits()
	m := newModel(q0, w0, h.firstPacing())
	for _, ev := range evs {
		switch ev.kind {
		case evCtl:
			m.apply(h.ctl[ev.i])
		case evStart:
			if c := h.calls[ev.i]; validN(c.n) && !m.closed {
				m.roll(ev.t + m.off)
			}
		case evEnd:
			if c := h.calls[ev.i]; c.rolled && !m.closed {
				m.roll(ev.t + m.off)
			}
		}
	}
	s, _, p := m.win(t)
	return m.quotaOf(s, p)
}

// refusalUnexcused says why a TryAcquire refusal lost permits, or "" if
// something excuses it: the current window's guard band, a backoff,
// pacing, shadow mode, a change at the same instant, a closed limiter, or
// the window being full with what was granted and what waiters may hold.
//
// judged says whether the refusal was weighed against the window's
// count at all (nothing else excused it).
func (h *ohist) refusalUnexcused(m *omodel, c *callEv, count map[int64]int64, outstanding int64, ambiguous bool) (why string, judged bool) {
	if !validN(c.n) || m.closed || ambiguous {
		return "", false
	}
	t := c.start
	if c.shadow {
		return "shadow mode never refuses", true
	}
	g := t + m.off
	if g < m.curS || g >= m.curE {
		return "", false // after the clock went back: the limiter is still in a later window
	}
	if m.paced(m.curS) {
		return "", false
	}
	guard := min(m.u, (m.curE-m.curS-1)/2)
	if g < m.curS+guard || g >= m.curE-guard || g < m.backoffC {
		return "", false
	}
	q := m.decided[m.curS]
	if used := count[m.curS] + outstanding; used+c.n > q {
		return "", true
	}
	return fmt.Sprintf("window %s has quota %d, %d granted and at most %d promised to waiters",
		h.at(m.curS), q, count[m.curS], outstanding), true
}

// checkCalls checks every caller's answer against its maxWait, its
// context and the instants at which something happened.
func (h *ohist) checkCalls() string {
	changed := map[int64]bool{}
	closedAt := int64(math.MaxInt64)
	for _, e := range h.ctl {
		changed[e.at] = true
		if e.kind == ctlClose {
			closedAt = min(closedAt, e.at)
		}
	}
	// A Reserve's permits are valid once their window has begun on the
	// limiter's clock: a correction backwards after they were told delays
	// them to there (Limiter.shiftFixedLocked).
	for i, c := range h.calls {
		if c.kind == callTry {
			continue
		}
		waited := c.end - c.start
		limit := max(c.maxWait, 0)
		if c.deadline != 0 {
			limit = min(limit, c.deadline-c.start)
		}
		err := c.err
		switch {
		case !validN(c.n):
			if !errors.Is(err, ErrInvalid) {
				return fmt.Sprintf("call %d: n=%d gave %v, want ErrInvalid", i, c.n, err)
			}
			continue
		case c.kind == callReserve && c.canceled:
			if waited > limit && !h.offsetWithin(c.startSeq, c.end) {
				return fmt.Sprintf("call %d: the holder cancelled %v after Reserve(maxWait %v)", i, time.Duration(waited), time.Duration(c.maxWait))
			}
			continue
		case errors.Is(err, ErrClosed):
			if c.end < closedAt {
				return fmt.Sprintf("call %d: ErrClosed at %s before Close", i, h.at(c.end))
			}
			continue
		case errors.Is(err, ErrInvalid):
			return fmt.Sprintf("call %d: ErrInvalid for n=%d", i, c.n)
		}
		corrected := c.kind == callReserve && c.granted && h.offsetWithin(c.startSeq, c.end)
		if c.granted || errors.Is(err, ErrTimeout) {
			if waited > limit && !corrected {
				return fmt.Sprintf("call %d: answered (%v) after %v; maxWait %v, deadline %v", i, err, time.Duration(waited),
					time.Duration(c.maxWait), time.Duration(c.deadline-c.start))
			}
		}
		if c.kind == callReserve && c.err == nil && c.readyIn > limit {
			return fmt.Sprintf("call %d: Reserve(maxWait %v) said ready in %v", i, time.Duration(c.maxWait), time.Duration(c.readyIn))
		}
		switch {
		case c.granted:
			if c.cancelAt != 0 && c.end > c.cancelAt {
				return fmt.Sprintf("call %d: granted at %s after its context was cancelled at %s", i, h.at(c.end), h.at(c.cancelAt))
			}
			if c.kind == callReserve && waited < c.readyIn {
				return fmt.Sprintf("call %d: valid after %v; Reserve said %v", i, time.Duration(waited), time.Duration(c.readyIn))
			}
		case errors.Is(err, ErrTimeout):
			if errors.Is(err, ErrCanceled) {
				return fmt.Sprintf("call %d: an error matching both ErrTimeout and ErrCanceled: %v", i, err)
			}
			if errors.Is(err, context.DeadlineExceeded) && (c.deadline == 0 || c.end != c.deadline) {
				return fmt.Sprintf("call %d: %v at %s; ctx deadline %s", i, err, h.at(c.end), h.at(c.deadline))
			}
			// A waiter is woken when it fails; a Reserve holder finds out
			// when it next looks.
			if c.kind == callAcquire && c.end != c.start && !changed[c.end] && c.end != c.start+c.maxWait && c.end != c.deadline {
				return fmt.Sprintf("call %d: timed out (%v) at %s, when nothing changed", i, err, h.at(c.end))
			}
			if c.kind == callReserve && c.end != c.start && !h.changedWithin(c.startSeq, c.end) {
				return fmt.Sprintf("call %d: a reservation failed (%v) though nothing changed after it was made", i, err)
			}
		case errors.Is(err, ErrCanceled):
			if c.kind == callAcquire && (c.cancelAt == 0 || c.end != c.cancelAt || !errors.Is(err, context.Canceled)) {
				return fmt.Sprintf("call %d: %v at %s; its context was cancelled at %s", i, err, h.at(c.end), h.at(c.cancelAt))
			}
		default:
			return fmt.Sprintf("call %d: unexpected outcome %v", i, err)
		}
	}
	return ""
}

// changedWithin reports whether the controller changed something after
// sequence number seq and by true time to.
func (h *ohist) changedWithin(seq, to int64) bool {
	for _, e := range h.ctl {
		if e.seq > seq && e.at <= to {
			return true
		}
	}
	return false
}

// offsetWithin reports whether the clock offset changed after the
// operation numbered seq and by to.
func (h *ohist) offsetWithin(seq, to int64) bool {
	for _, e := range h.ctl {
		if e.kind == ctlOffset && e.seq > seq && e.at <= to {
			return true
		}
	}
	return false
}

// checkStats compares Stats, read once every caller was done, with what
// the callers saw.
func (h *ohist) checkStats() string {
	var admitted, rejected, timedOut, canceled, mayDelay int64
	closed := int64(math.MaxInt64) // Close's sequence number
	for _, e := range h.ctl {
		if e.kind == ctlClose {
			closed = min(closed, e.seq)
		}
	}
	for _, c := range h.calls {
		if !validN(c.n) {
			continue
		}
		switch {
		case c.granted:
			admitted += c.n
		case c.kind == callTry && !c.shadow && c.startSeq < closed:
			rejected += c.n
		case c.canceled || errors.Is(c.err, ErrCanceled):
			canceled += c.n
		case errors.Is(c.err, ErrTimeout):
			timedOut += c.n
		}
		if c.shadow && c.kind != callTry && c.maxWait > 0 {
			mayDelay += c.n
		}
	}
	st := h.stats
	switch {
	case st.Admitted != admitted:
		return fmt.Sprintf("Stats.Admitted %d, callers were granted %d", st.Admitted, admitted)
	case st.Rejected != rejected:
		return fmt.Sprintf("Stats.Rejected %d, TryAcquire refused %d", st.Rejected, rejected)
	case st.TimedOut != timedOut:
		return fmt.Sprintf("Stats.TimedOut %d, callers saw ErrTimeout for %d", st.TimedOut, timedOut)
	case st.Canceled != canceled:
		return fmt.Sprintf("Stats.Canceled %d, callers cancelled %d", st.Canceled, canceled)
	case st.ShadowDelayed+st.ShadowRejected != st.ShadowAdmitted:
		return fmt.Sprintf("Stats: shadow delayed %d + rejected %d != admitted %d", st.ShadowDelayed, st.ShadowRejected, st.ShadowAdmitted)
	case st.ShadowDelayed > mayDelay:
		return fmt.Sprintf("Stats.ShadowDelayed %d, but only %d permits were asked for in shadow mode with a wait", st.ShadowDelayed, mayDelay)
	case st.Waiting != 0 || st.WaitingPermits != 0:
		return fmt.Sprintf("Stats: %d waiting (%d permits) after every caller returned", st.Waiting, st.WaitingPermits)
	}
	return ""
}

func (h *ohist) firstLimits() (q, w int64) { return h.q0, h.w0 }

func (h *ohist) firstPacing() bool { return h.p0 }

// at formats true time t relative to the history's start.
func (h *ohist) at(t int64) string {
	return fmt.Sprintf("%.6fms", float64(t-h.startTrue)/1e6)
}

// atC formats corrected time c at the model's offset.
func (h *ohist) atC(m *omodel, c int64) string { return h.at(c - m.off) }

// fixedBook follows, for an oracle, the permits of reservations made by
// Reserve (Reservation.fixed): they count in the window of the instant
// they were given from when they were promised, judged by that window's
// quota then; Cancel takes them back. When used, they count again only
// where the window holding that instant is not theirs, beyond its quota
// if need be (excused: the window holds them alone, if more). A backoff
// set since, or moved by a clock correction since, does not stop them.
type fixedBook struct {
	byCall  map[int]*promise
	active  map[int]*promise // promised, not yet used or given back
	excused map[int64]int64
}

type promise struct {
	t, n, s, e, backoff, off int64
	moved                    bool // counted in excused[s]
	given                    bool // given back by Cancel
}

func newFixedBook() *fixedBook {
	return &fixedBook{byCall: map[int]*promise{}, active: map[int]*promise{}, excused: map[int64]int64{}}
}

// promise counts call i's n permits, given for true instant t, in the
// window of m holding t, and returns that window and its quota.
func (b *fixedBook) promise(i int, t, n int64, m *omodel, count map[int64]int64) (s, q int64) {
	s, e, p := m.win(t)
	pr := &promise{t: t, n: n, s: s, e: e, backoff: m.backoffC, off: m.off}
	b.byCall[i], b.active[i] = pr, pr
	count[s] += n
	return s, m.quotaOf(s, p)
}

// follow moves, after a change of m, the permits whose instant a change
// of window length put in another window: they count in that one.
func (b *fixedBook) follow(m *omodel, count map[int64]int64) {
	for _, pr := range b.active {
		if s, e, _ := m.win(pr.t); s != pr.s || e != pr.e {
			count[pr.s] -= pr.n
			if pr.moved {
				b.excused[pr.s] -= pr.n
			}
			count[s] += pr.n
			b.excused[s] += pr.n
			pr.s, pr.e, pr.moved = s, e, true
		}
	}
}

// end is call i's answer: its promise, if it made one, given back if
// canceled.
func (b *fixedBook) end(i int, canceled bool, count map[int64]int64) (*promise, bool) {
	pr, ok := b.byCall[i]
	if !ok {
		return nil, false
	}
	delete(b.active, i)
	if canceled && !pr.given {
		pr.given = true
		count[pr.s] -= pr.n
		if pr.moved {
			b.excused[pr.s] -= pr.n
		}
	}
	return pr, true
}

// cancelsFirst gives back, before anything else at that instant, what
// the Cancels among evs (one instant's events) gave back: a call racing
// a holder that cancels when its permits come due may have come after
// the Cancel in the limiter, whatever order the driver recorded.
func (b *fixedBook) cancelsFirst(evs []oev, canceled func(i int) bool, count map[int64]int64) {
	for _, ev := range evs {
		if pr, ok := b.byCall[ev.i]; ok && ev.kind == evEnd && canceled(ev.i) && !pr.given {
			pr.given = true
			count[pr.s] -= pr.n
			if pr.moved {
				b.excused[pr.s] -= pr.n
			}
		}
	}
}

// since reports whether m's backoff or clock changed since pr was made.
func (pr *promise) since(m *omodel) bool { return m.backoffC > pr.backoff || m.off != pr.off }
