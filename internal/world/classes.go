package world

import (
	"context"
	"slices"

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
// critical in the window of its own clock, and counts it there.
func (m *member) takeCritical() int64 {
	k := ledger.WindowOf(m.clock(), m.w.window)
	if k != m.critWindow {
		m.critWindow, m.critTaken = k, 0
	}
	var got int64
	for m.critTaken+got < m.critical && m.lim.Acquire(criticalCtx, 0) == nil {
		got++
	}
	m.critTaken += got
	m.w.critical[k] += got
	return got
}

// applyClasses gives m's limiter the classes its grants keep
// (ledger.State.Reserves), as a cluster member does; under the broken
// rule "own-part" each keeps the part of its quota that the reserve is
// of the limit instead.
func (m *member) applyClasses(st *ledger.State) {
	w := m.w
	if w.cfg.Critical == 0 {
		return
	}
	reserve, _ := st.Reserves(m.holder, m.clock())
	cs := ledger.LimiterClasses(classNames, reserve)
	if w.cfg.Break == "own-part" {
		cs = []limiter.Class{{Name: "critical", Reserve: w.reserve(w.limit), Of: w.limit}, {Name: "batch"}}
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
