package world

import (
	"context"
	"slices"
	"time"

	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// classNames are the provider's classes when Config.Critical is set.
var classNames = []string{"critical", "batch"}

var criticalCtx = limiter.WithClass(context.Background(), "critical")

// classes returns the provider's classes: critical reserving
// Config.Critical hundredths of a percent of the limit, then batch.
func (w *World) classes() []schema.Class {
	if w.cfg.Critical == 0 {
		return nil
	}
	return []schema.Class{{Name: "critical", Reserve: schema.Reserve{Share: w.cfg.Critical}}, {Name: "batch"}}
}

// reserve returns critical's reserve of limit.
func (w *World) reserve(limit int64) int64 {
	return schema.ProviderConfig{Limit: limit, Classes: w.classes()}.Reserves(limit)[0]
}

// wantCritical draws what a new member wants of critical: nothing for
// half of them, else up to the whole reserve.
func (w *World) wantCritical() int64 {
	if w.cfg.Critical == 0 || w.rng.IntN(2) == 0 {
		return 0
	}
	return 1 + w.rng.Int64N(w.reserve(w.limit)+1)
}

// takeCritical has m take, decided at once, what it still wants of
// critical in the window of its own clock, and counts it there. A call
// refused is checked against the reserve of m's grants (checkClassWindow).
func (m *member) takeCritical() int64 {
	k := ledger.WindowOf(m.clock(), m.w.window)
	if k != m.critWindow {
		m.critWindow, m.critTaken = k, 0
	}
	m.observeClasses()
	var got int64
	var err error
	for m.critTaken+got < m.critical {
		if err = m.lim.Acquire(criticalCtx, 0); err != nil {
			break
		}
		got++
	}
	m.critTaken += got
	m.w.critical[k] += got
	if cw := m.cw; cw != nil {
		cw.admitted += got
		if err != nil {
			m.checkClassWindow()
		}
	}
	return got
}

// classWindow is what the world knows of one window of a member's
// limiter (Config.Critical): its bounds on the member's clock, the quota
// and the reserve the member's grants keep for critical in it, and what
// critical was admitted there.
type classWindow struct {
	start, length int64
	// quota is the limiter's quota for the window, and reserve the
	// reserve for critical of the grants the member enforces (viewReserve)
	// as the limiter cuts it to the quota: both as they were when the
	// window was first seen, at its start or before any change in it.
	quota, reserve int64
	changed        bool // the quota or the grants' reserve changed within the window
	checked        bool // counted in Result.ClassWindows
	admitted       int64
}

// observeClasses notes m's limiter's current window and what the grants
// m enforces keep in it for critical; a change within the window marks
// it changed. It runs before and after every change m makes to its
// limiter and before critical asks, so the first look at a window sees
// it as it began: only m's commits change its limiter.
func (m *member) observeClasses() {
	if m.w.cfg.Critical == 0 || m.crashed {
		return
	}
	st := m.lim.Stats()
	start, length := st.WindowStart.UnixNano(), int64(st.Window)
	r := min(m.viewReserve, st.Quota)
	if cw := m.cw; cw != nil && cw.start == start && cw.length == length {
		cw.changed = cw.changed || cw.quota != st.Quota || cw.reserve != r
		return
	}
	m.cw = &classWindow{start: start, length: length, quota: st.Quota, reserve: r}
}

// checkClassWindow checks the window in which m's limiter just refused
// critical a call decided at once. The limiter keeps a class's reserve
// from the lower classes (limiter.WithClasses): in a window with no
// change of quota or classes, a class refused was admitted at least its
// reserve, cut to the quota. m's grants set that reserve (State.Reserves,
// applyClasses), so critical must have been admitted in the window at
// least the reserve of m's grants, or the quota if smaller. Summed over
// the members, in every window the fleet admits critical at least the
// reserve its grants keep for the members whose critical demand reached
// their part (they were refused). Not checked, as the design does not
// promise it there:
//   - a window in which the quota or the grants' reserve changed: the
//     limiter then promises only what the window had left beyond the
//     other classes' reserves since the change (TestClassChangeOracle);
//   - a refusal within the guard band at either end of the window
//     (SetClockUncertainty), where nothing is admitted.
//
// A member cut off from etcd, or paused, is checked like any other: it
// enforces the grants it holds until they end, reserves included.
func (m *member) checkClassWindow() {
	w, cw := m.w, m.cw
	now := m.clock()
	guard := min(int64(w.cfg.SkewBound), (cw.length-1)/2)
	if cw.changed || now < cw.start+guard || now >= cw.start+cw.length-guard {
		return
	}
	if !cw.checked {
		cw.checked = true
		w.res.ClassWindows++
	}
	if cw.admitted < cw.reserve {
		w.fail("classes: %s's window at %.3fs (%v, its clock) refused critical after admitting it %d, below the reserve %d its grants keep (quota %d)",
			m.holder, float64(cw.start-epoch)/1e9, time.Duration(cw.length), cw.admitted, cw.reserve, cw.quota)
	}
}

// applyClasses gives m's limiter the classes its grants keep
// (ledger.State.Reserves), as a cluster member does; under the broken
// rule "own-part" each keeps the part of its quota that the reserve is
// of the limit instead, and under "drop-reserve" none for a stretch of
// the faults.
func (m *member) applyClasses(st *ledger.State) {
	w := m.w
	if w.cfg.Critical == 0 {
		return
	}
	reserve, _ := st.Reserves(m.holder, m.clock())
	m.viewReserve = min(reserve["critical"], limiter.MaxQuota)
	cs := ledger.LimiterClasses(classNames, reserve)
	switch w.cfg.Break {
	case "own-part":
		cs = []limiter.Class{{Name: "critical", Reserve: w.reserve(w.limit), Of: w.limit}, {Name: "batch"}}
	case "drop-reserve":
		if w.now >= epoch+int64(w.cfg.Faults)/4 && w.now < epoch+int64(w.cfg.Faults)/2 {
			cs = ledger.LimiterClasses(classNames, nil)
		}
	}
	if slices.Equal(cs, m.classes) {
		return
	}
	if err := m.lim.SetClasses(cs...); err != nil {
		w.fail("%s cannot serve classes %v: %v", m.holder, cs, err)
		return
	}
	m.classes = cs
}

// checkCritical fails when the live members that want critical hold in
// window k, by their grants and what they keep of them for it, less
// than the reserve or what they want of it, the smaller, and schedules
// the check of what they are admitted in the next window. Each may be a
// permit short by rounding.
func (w *World) checkCritical(st *ledger.State, era ledger.Era, k int64) {
	var want, held int64
	for _, m := range w.live() {
		if m.critical == 0 {
			continue
		}
		want += m.critical
		reserve, _ := st.Reserves(m.holder, m.clock())
		held += min(reserve["critical"], st.Allowance(m.holder, era.Seq, k))
	}
	want = min(want, w.reserve(w.limit))
	if held < want-int64(len(w.live())) {
		w.fail("classes: the members that want critical keep %d of window %d for it, want %d (its reserve %d)", held, k, want, w.reserve(w.limit))
		return
	}
	// Members ask at every tick for what they still want of critical in
	// the window, each on its own clock: counted there, each admits its
	// part, or what it wants, in every window it ticks in.
	next := k + 1
	w.at(ledger.StartOf(next+1, w.window)+int64(w.cfg.SkewBound), func() {
		if got := w.critical[next]; got < want-int64(len(w.live())) {
			w.fail("classes: critical was admitted %d in window %d, want %d", got, next, want)
		}
		w.stopAt = w.now
	})
}
