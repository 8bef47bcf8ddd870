package world

import (
	"time"

	"github.com/sluice-go/sluice/internal/ledger"
)

// fault draws the next fault, and schedules the one after.
func (w *World) fault() {
	if w.now >= w.faultsEnd {
		return
	}
	defer w.at(w.now+w.rng.Int64N(int64(w.window)), w.fault)
	live := w.live()
	r := w.rng.IntN(100)
	if w.cfg.Script != nil && r >= 56 {
		return // the script decides the fleet, the limit and the window
	}
	switch {
	case r < 10 && len(live) > 1:
		m := live[w.rng.IntN(len(live))]
		w.tracef("%s crashes", m.holder)
		m.stop()
		w.at(w.now+w.rng.Int64N(6*int64(time.Second)), func() {
			if m.crashed {
				m.start()
			}
		})
	case r < 20 && len(live) > 0:
		m := live[w.rng.IntN(len(live))]
		m.paused = w.now + w.rng.Int64N(6*int64(time.Second))
		w.tracef("%s pauses until %.3fs", m.holder, float64(m.paused-epoch)/1e9)
	case r < 30 && len(live) > 0:
		m := live[w.rng.IntN(len(live))]
		m.cut = w.now + w.rng.Int64N(8*int64(time.Second))
		w.tracef("%s is cut off until %.3fs", m.holder, float64(m.cut-epoch)/1e9)
	case r < 36 && len(w.mems) < 10 && w.cfg.Script == nil:
		w.join()
	case r < 40 && len(live) > 1 && w.cfg.Script == nil:
		m := live[w.rng.IntN(len(live))]
		w.tracef("%s leaves", m.holder)
		m.depart()
		w.etcd.revoke(m.lease)
		m.stop()
		m.name += "-gone" // never restarts
	case r < 48:
		rp := w.reps[w.rng.IntN(len(w.reps))]
		rp.paused = w.now + w.rng.Int64N(5*int64(time.Second))
		w.tracef("replica %d pauses", rp.id)
	case r < 56 && len(w.reps) > 1:
		next := w.reps[w.rng.IntN(len(w.reps))]
		for _, rp := range w.reps {
			if rp.leader && rp != next {
				old := rp
				w.at(w.now+w.rng.Int64N(3*int64(time.Second)), func() { old.leader = old == w.leaderOf() })
			}
		}
		next.leader = true
		w.tracef("replica %d leads", next.id)
	case r < 66 && w.prov != nil:
		w.moveProvider()
	case r < 66:
		w.setLimit(max(10, min(500, w.limit/3+w.rng.Int64N(2*w.limit))))
		w.tracef("limit %d", w.limit)
	case r < 71 && !w.cfg.FixedWindow:
		w.window = windows[w.rng.IntN(len(windows))]
		w.longest = max(w.longest, w.window)
		w.tracef("window %v", w.window)
	case r < 85 && len(live) > 0:
		m := live[w.rng.IntN(len(live))]
		m.demand = w.rng.Int64N(2*w.limit/int64(len(live)) + 1)
		w.tracef("%s wants %d", m.holder, m.demand)
	case r < 87 && w.prov == nil && w.coord == coordLedger:
		// An adaptive provider's limit is the controller's: it is not
		// deleted.
		w.deleteAndCreate()
	case r < 89:
		w.outage(w.rng.Int64N(3 * int64(w.cfg.Horizon)))
	}
}

// leaderOf returns the replica the election names now: the last one
// made leader.
func (w *World) leaderOf() *replica {
	for _, rp := range w.reps {
		if rp.leader {
			return rp
		}
	}
	return nil
}

func (w *World) live() []*member {
	var out []*member
	for _, m := range w.mems {
		if !m.crashed {
			out = append(out, m)
		}
	}
	return out
}

// heal ends every fault: processes run and reach etcd, one replica
// leads; then the liveness check waits Settle windows.
func (w *World) heal() {
	w.tracef("faults end")
	w.calm = true
	w.endOutage()
	if w.coord != coordLedger && w.cfg.Script == nil {
		w.createLedger(w.limit, 0)
	}
	for _, m := range w.mems {
		if !m.crashed {
			m.paused, m.cut = 0, 0
		}
	}
	for i, rp := range w.reps {
		rp.paused, rp.leader = 0, i == 0
		if w.cfg.Script != nil {
			// A script's configd clock is a fault: it ends too.
			rp.off = w.rng.Int64N(2*int64(w.cfg.SkewBound)+1) - int64(w.cfg.SkewBound)
		}
	}
	settle := w.cfg.Settle
	if settle == 0 {
		settle = 2*w.cfg.Horizon + 4*max(w.longest, w.window)
	}
	// A replica whose clock ran ahead e granted windows up to e ahead and
	// raised the floor by as much: the whole limit is free again once true
	// time gets there.
	w.settle = leaseTTL + settle + w.ahead
	if w.cfg.LiveAhead > 0 && w.ahead > w.cfg.LiveAhead {
		w.settle = leaseTTL + settle
		w.tracef("configd's clock ran %v ahead: safety only", w.ahead)
		w.at(w.now+int64(w.settle), func() { w.stopAt = w.now })
		return
	}
	w.at(w.now+int64(w.settle), w.checkLive)
}

// checkLive fails when the grants of the current window do not add up to
// the limit, less the slack the policy leaves each holder.
func (w *World) checkLive() {
	w.stopAt = w.now
	if len(w.live()) == 0 {
		w.tracef("no instance is live: nothing to hand out")
		return
	}
	if w.coord != coordLedger {
		w.tracef("the provider is deleted: nothing to hand out")
		return
	}
	w.res.Live = true
	st, _ := w.read()
	e, ok := st.Head.Current()
	if !ok {
		w.fail("liveness: no era after the faults")
		return
	}
	if e.Window != w.window {
		w.fail("liveness: the era's window is %v, the config's %v", e.Window, w.window)
		return
	}
	k := max(e.Start, ledger.WindowOf(w.now, e.Window))
	live := len(w.live())
	sum := st.Sum(e.Seq, k)
	limit := w.limit
	if w.prov != nil {
		// A raise reaches the grants within the round after the next
		// window begins: the controller's last moves may not have. With
		// more holders than a transaction holds, its rounds go to the
		// publishes written ahead, which begin a horizon later.
		back := 2 * int64(w.window)
		if per := w.cfg.MaxOps - 2; live > per {
			rounds := 2 * int64((live+per-1)/per)
			back += int64(w.cfg.Horizon) + rounds*int64(w.window)*3/8
		}
		limit = w.prov.leastSince(w.now - back)
	}
	if floor := limit - int64(live)*(limit/50+1); sum < floor {
		w.fail("liveness: %v after the faults the grants of window %d add up to %d of the limit %d (at least %d wanted)", w.settle, k, sum, limit, floor)
		return
	}
	if w.cfg.Critical > 0 {
		w.stopAt = 0 // the history ends with checkCritical's second check
		w.checkCritical(st, e, k)
	}
}
