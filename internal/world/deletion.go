package world

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/schema"
)

// configKey holds the provider's config as the members read it: what
// coordinates it, and its limit and window. configd's replicas and the
// stand-ins read the limit and the window from the World, which the same
// changes set.
const configKey = "C/world"

// The provider's coordination, as its config names it: the ledger, or
// the shares (which the world does not play: an instance on them admits
// nothing). "" is a provider deleted.
const (
	coordLedger = "ledger"
	coordShares = "shares"
)

// configRecord is the config stored at configKey.
type configRecord struct {
	Coordination string        `json:"coordination"`
	Limit        int64         `json:"limit"`
	Window       time.Duration `json:"window"`
}

// putConfig stores the config the World holds, as an operator's write:
// its outcome known at once.
func (w *World) putConfig() {
	b, _ := json.Marshal(configRecord{w.coord, w.limit, w.window}) // integers and a string: no error
	w.etcd.commit(nil, []op{{key: configKey, value: b}})
	w.afterWrite()
}

// deleteProvider deletes the provider's config. configd's leader stops
// writing its ledger (a deleted ledger provider has nothing to publish)
// and keeps the ledger: its grants run to their end. Members ignore a
// deleted config, as limiter/cluster does, and keep enforcing them.
func (w *World) deleteProvider() {
	w.coord = ""
	w.etcd.commit(nil, []op{{key: configKey}})
	w.afterWrite()
	w.res.Deletes++
	w.tracef("the provider is deleted")
}

// createLedger creates the provider again on the ledger, with limit and
// window. Its ledger, if one is left, goes on under the new config:
// configd deletes a ledger only for a config that counts no grant
// (createShares).
func (w *World) createLedger(limit int64, window time.Duration) {
	w.coord = coordLedger
	w.setLimit(limit)
	if window > 0 {
		w.window = window
		w.longest = max(w.longest, w.window)
	}
	w.putConfig()
	w.res.Creates++
	w.tracef("the provider is created on the ledger: limit %d, window %v", w.limit, w.window)
}

// createShares creates the deleted provider again on the shares, as
// configd's store does (configd/coordination.go, ledgerEnded): refused
// while any grant of its ledger may still let an instance admit
// (ledger.State.Ended, on configd's clock), and retried a window later;
// then written with the deletion of every record of the ledger but its
// head, which it keeps emptied (ledger.State.Emptied), conditioned on
// its head and on the config still absent. then runs once it is
// written.
func (w *World) createShares(then func()) {
	if w.coord != "" {
		return // created meanwhile (heal)
	}
	st, headMod := w.read()
	cfg := w.config(w.limit)
	end := st.Ended(func(win time.Duration) time.Duration {
		cfg.Window = schema.Duration(win) // the bound the grants' holders kept
		return cfg.ClockBound()
	})
	if now := w.reps[0].clock(); now < end {
		w.tracef("the shares' config is refused: the ledger grants room until %.3fs", float64(end-epoch)/1e9)
		w.at(w.now+int64(w.window), func() { w.createShares(then) })
		return
	}
	w.coord = coordShares
	b, _ := json.Marshal(configRecord{w.coord, w.limit, w.window})
	ops := []op{{key: configKey, value: b}}
	keys, _, _ := w.etcd.get(string(w.keys))
	for _, k := range keys {
		if k != w.keys.Head() {
			ops = append(ops, op{key: k})
		}
	}
	if headMod != 0 {
		head, err := ledger.Encode(st.Emptied(end))
		if err != nil {
			w.fail("the emptied head: %v", err)
			return
		}
		ops = append(ops, op{key: w.keys.Head(), value: head})
	}
	pubs := st.Head.Pubs
	if ok, _ := w.etcd.commit([]cond{{key: w.keys.Head(), mod: headMod}, {key: configKey}}, ops); !ok {
		w.fail("the shares' config and the ledger's emptying, conditioned on what the world just read, were refused")
		return
	}
	w.ledgerEmptied(pubs)
	w.afterWrite()
	w.res.Shares++
	w.tracef("the provider is created on the shares; its ledger is emptied (%d keys deleted), its head kept", len(ops)-1)
	then()
}

// redraw is the limit and window a provider created again draws: the
// limit from a third of the last to twice it, the window one the world
// draws half the time (unless Config.FixedWindow).
func (w *World) redraw() (int64, time.Duration) {
	limit := max(10, min(500, w.limit/3+w.rng.Int64N(2*w.limit)))
	var window time.Duration
	if !w.cfg.FixedWindow && w.rng.IntN(2) == 0 {
		window = windows[w.rng.IntN(len(windows))]
	}
	return limit, window
}

// deleteAndCreate deletes the provider and, up to three horizons later,
// creates it again: on the ledger straight away half the time, else on
// the shares first (which deletes the ledger once its grants have ended)
// and on the ledger again up to two windows after.
func (w *World) deleteAndCreate() {
	w.deleteProvider()
	after := w.rng.Int64N(3 * int64(w.cfg.Horizon))
	if w.rng.IntN(2) == 0 {
		limit, window := w.redraw()
		w.at(w.now+after, func() {
			if w.coord == "" {
				w.createLedger(limit, window)
			}
		})
		return
	}
	w.at(w.now+after, func() {
		w.createShares(func() {
			limit, window := w.redraw()
			w.at(w.now+w.rng.Int64N(2*int64(w.window)), func() {
				if w.coord == coordShares {
					w.createLedger(limit, window)
				}
			})
		})
	})
}

// ledgerDeleted notes that the ledger's head went: what the ledger
// writes next is a new ledger, whose eras the oracle keeps apart
// (eraKey), and nothing may be admitted from now until its first grant.
func (w *World) ledgerDeleted() {
	w.gen++
	w.heads++
	w.gaps = append(w.gaps, gap{from: w.now, to: 1<<62 - 1})
	w.res.LedgersDeleted++
}

// ledgerEmptied notes that every record but the head went, with the
// publishes numbered up to pubs: nothing may be admitted from now until
// a later publish's first window.
func (w *World) ledgerEmptied(pubs int64) {
	w.gen++
	w.gaps = append(w.gaps, gap{from: w.now, to: 1<<62 - 1, after: pubs})
	w.res.Emptied++
}

// gap is true time with no grant in the ledger: from its deletion or
// emptying until the first window of a publish numbered past after.
type gap struct{ from, to, after int64 }

// closeGaps ends each gap at the first window of a publish in st
// numbered past the gap's last, or at once when that window began
// before the gap.
func (w *World) closeGaps(st *ledger.State) {
	for i := range w.gaps {
		g := &w.gaps[i]
		for _, p := range st.Pubs {
			if p.Seq > g.after {
				g.to = min(g.to, max(g.from, ledger.StartOf(p.A, p.Window)))
			}
		}
	}
}

// eraKey keys era seq of the gen-th ledger under the provider's keys:
// in order of time.
func eraKey(gen int, seq int64) int64 { return int64(gen)<<32 | seq }

// eraName names an era key for a message.
func eraName(key int64) string {
	if key>>32 == 0 {
		return fmt.Sprintf("era %d", key)
	}
	return fmt.Sprintf("era %d of ledger %d", key&(1<<32-1), key>>32)
}

// checkGaps fails any window of true time wholly within a gap that
// admitted anything: the ledger deleted or emptied had no grant left in
// effect.
func (w *World) checkGaps() {
	for _, g := range w.gaps {
		for _, win := range w.lengths {
			for k, n := range w.admitted[win] {
				if n > 0 && ledger.StartOf(k, win) >= g.from && ledger.StartOf(k+1, win) <= g.to {
					w.fail("window %d of %v (at %.3fs) admitted %d with no grant: the ledger was emptied or deleted at %.3fs", k, win, float64(ledger.StartOf(k, win)-epoch)/1e9, n, float64(g.from-epoch)/1e9)
				}
			}
		}
	}
}
