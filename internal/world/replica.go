package world

import (
	"strings"

	"github.com/sluice-go/sluice/configd/adapt"
	"github.com/sluice-go/sluice/configd/round"
	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/schema"
)

// replica is one configd replica: it reads the ledger and the members'
// demands from etcd, runs ledger.Plan on its own clock, and writes the
// change conditioned on the head it read. It keeps nothing between
// rounds: an unknown outcome, a refusal or another leader's write is
// answered by the next round's fresh read.
type replica struct {
	w      *World
	id     int
	off    int64 // its clock's offset from true time
	leader bool
	paused int64 // true time it wakes at
	busy   int64 // true time a write went out, 0 with none in flight
	// The adaptive controller's, while it leads: lost when it stops, as
	// a configd replica's are.
	tally  *adapt.Tally
	state  adapt.State
	rounds int
}

func newReplica(w *World, id int) *replica {
	r := &replica{w: w, id: id, off: w.rng.Int64N(2*int64(w.cfg.SkewBound)+1) - int64(w.cfg.SkewBound) + int64(w.cfg.ConfigdOff)}
	w.at(w.now+w.rng.Int64N(int64(w.window)/4+1), r.tick)
	return r
}

func (r *replica) clock() int64 { return r.w.now + r.off }

func (r *replica) tick() {
	w := r.w
	defer w.at(w.now+int64(w.window)/4+w.rng.Int64N(int64(w.window)/8+1), r.tick)
	// A write unanswered for a window no longer holds the next round up:
	// the head's condition orders the two.
	if !r.leader {
		r.tally = nil
	}
	if !r.leader || w.now < r.paused || w.down {
		return
	}
	// The controller's round, every other tick: about configd's default
	// of half a report interval.
	if r.rounds++; w.prov != nil && r.rounds%2 == 0 {
		r.adapt()
	}
	if r.busy != 0 && w.now-r.busy < int64(w.window) {
		return
	}
	if w.coord != coordLedger {
		return // deleted, or on the shares: no ledger to publish
	}
	st, headMod := w.read()
	limit := w.limit
	if w.cfg.Break == "twice-ceiling" && w.prov != nil {
		limit = 2 * w.prov.ctl.Ceiling
	}
	cfg := w.config(limit)
	target, reserves := r.target(cfg)
	p := round.Policy(cfg)
	p.MaxOps, p.Reserves = w.cfg.MaxOps, reserves
	ch, err := ledger.Plan(w.begun(st), p, target, r.clock())
	if err != nil {
		w.fail("replica %d: %v", r.id, err)
		return
	}
	if ch.Empty() {
		return
	}
	ops, err := w.ops(ch)
	if err != nil {
		w.fail("replica %d: %v", r.id, err)
		return
	}
	w.tracef("replica %d writes %d ops on head %d: %s", r.id, len(ops), headMod, strings.Join(ch.Why, "; "))
	r.busy = w.now
	// Sometimes the process stops between its read and its write.
	var pause int64
	if !w.calm && w.rng.Float64() < 0.03 {
		pause = w.rng.Int64N(2 * int64(w.window))
	}
	w.at(w.now+pause, func() {
		conds := []cond{{key: w.keys.Head(), mod: headMod}}
		if w.cfg.Break == "unconditioned" {
			conds = nil
		}
		w.write(conds, ops, func(ok, known bool) {
			r.busy = 0
			w.tracef("replica %d write: ok=%v known=%v", r.id, ok, known)
		})
	})
}

// target is what configd's leader asks for the members registered in
// etcd (round.Target).
func (r *replica) target(cfg schema.ProviderConfig) (map[string]int64, map[string]map[string]int64) {
	w := r.w
	live, err := w.instances()
	if err != nil {
		w.fail("replica %d: %v", r.id, err)
		return nil, nil
	}
	t, rs, err := round.Target(cfg, live)
	if err != nil {
		w.fail("round: %v", err)
		return nil, nil
	}
	return t, rs
}

// ops turns a change into etcd operations.
func (w *World) ops(ch ledger.Change) ([]op, error) {
	lops, err := w.keys.Ops(ch)
	if err != nil {
		return nil, err
	}
	ops := make([]op, 0, len(lops))
	for _, o := range lops {
		ops = append(ops, op{key: o.Key, value: o.Value})
	}
	return ops, nil
}
