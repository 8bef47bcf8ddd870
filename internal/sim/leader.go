package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/sluice-go/sluice/configd/alloc"
	"github.com/sluice-go/sluice/configd/plan"
	"github.com/sluice-go/sluice/internal/follow"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/internal/share"
	"github.com/sluice-go/sluice/limiter/skew"
)

// The leader: configd's publisher for the one provider.

// leaderBatch is how long the leader takes to gather a batch of watch
// events before it publishes, unless the scenario says (LeaderBatch):
// etcd hands a watcher many events at once.
const leaderBatch = int64(5 * time.Millisecond)

func (e *engine) notifyLeader() {
	if !e.leaderUp || e.batchArmed {
		return
	}
	e.batchArmed = true
	ep := e.epoch
	batch := leaderBatch
	if b := int64(e.sc.LeaderBatch); b > 0 {
		batch = b
	}
	e.at(e.now+batch, func() {
		if ep != e.epoch {
			return
		}
		e.batchArmed = false
		e.publish()
	})
}

func (e *engine) leaderDown() {
	e.leaderUp = false
	e.epoch++
	e.batchArmed = false
	e.due, e.dueTimer = never, never
	e.target = nil // a new leader starts with no target, as configd's state does
	e.held = map[string]simHold{}
	e.m.failovers++
}

// simHold is configd's hold of a gone instance's grant.
type simHold struct {
	until  int64         // true time
	settle time.Duration // the Settle it counted
}

// holdGrant keeps instance id's grant from the others for Settle from
// now, as configd does when its key goes, and decides again then.
func (e *engine) holdGrant(id string) {
	if e.noHold {
		return
	}
	settle := e.settle(e.cfg)
	until := e.now + int64(settle)
	if until <= e.held[id].until {
		return
	}
	e.held[id] = simHold{until: until, settle: settle}
	e.at(until, e.notifyLeader)
}

// settle is schema.ProviderConfig.Settle of config c (nil: a deleted
// provider's, the defaults').
func (e *engine) settle(c *config) time.Duration {
	w := schema.DefaultWindow
	if c != nil {
		w = c.window
	}
	b := e.sc.ClockBound.D()
	if b <= 0 {
		b = skew.DefaultBound(w)
	}
	return w + 2*b
}

// settleChanged lengthens each hold by what Settle grew since the one it
// counted, as configd's configChanged does.
func (e *engine) settleChanged() {
	now := e.settle(e.cfg)
	for id, h := range e.held {
		if d := now - h.settle; d > 0 {
			h.until += int64(d)
			e.at(h.until, e.notifyLeader)
		}
		h.settle = now
		e.held[id] = h
	}
}

// heldGrants returns what each held instance may still enforce by the
// records, and forgets the holds that ended or whose instance is back.
func (e *engine) heldGrants() map[string]int64 {
	var held map[string]int64
	for id, h := range e.held {
		if _, live := e.records[id]; live || e.now >= h.until || e.rec == nil {
			delete(e.held, id)
			continue
		}
		if g := e.rec.enforcing(id); g > 0 {
			if held == nil {
				held = map[string]int64{}
			}
			held[id] = g
		}
	}
	return held
}

// leaderClock is the leader's reading of its clock.
func (e *engine) leaderClock() int64 { return e.now + e.clock }

// leaderResume is a new leader loading from etcd: the last publish, its
// time (clamped to its clock), every record; then it publishes at once.
func (e *engine) leaderResume() {
	e.leaderUp = true
	if e.rec != nil {
		e.published = min(e.rec.published, e.leaderClock())
		e.maxGen = max(e.maxGen, e.rec.gen)
		// It cannot know when the instances it has records of and no key
		// for left: it holds them all (configd's holdMissing).
		for id := range e.rec.granted {
			if _, live := e.records[id]; !live {
				e.holdGrant(id)
			}
		}
	}
	e.publish()
}

// armDue sets the leader's timer for a damped or waiting change; due is on
// the leader's clock.
func (e *engine) armDue() {
	if e.due == never || e.due == e.dueTimer {
		return
	}
	e.dueTimer = e.due
	ep, at := e.epoch, e.due
	e.at(at-e.clock, func() {
		if ep != e.epoch || e.due != at {
			return
		}
		e.dueTimer = never
		e.publish()
	})
}

// publish is configd's publisher.publish for one provider: allocate, let
// plan.Decide decide on the leader's clock, publish what it says.
func (e *engine) publish() {
	if !e.leaderUp {
		return
	}
	e.due = never
	defer e.armDue()
	c := e.cfg
	if c == nil {
		return // deleted: the shares went with the config
	}
	ids := make([]string, 0, e.keyed)
	for id := range e.records {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	ins := make([]alloc.Instance, len(ids))
	for i, id := range ids {
		ins[i] = alloc.Instance{ID: id, Demand: float64(e.records[id].demand)}
	}
	split, err := e.algo(c.limit, alloc.DefaultFloor(c.limit, len(ins)), ins)
	if err != nil {
		panic(fmt.Sprintf("sim: allocation failed: %v", err)) // inputs are built valid
	}
	target := make(map[string]int64, len(ids))
	acked := make(map[string]plan.Ack, len(ids))
	for i, id := range ids {
		target[id] = split[i]
		r := e.records[id]
		ack := plan.Ack{Generation: r.gen, From: r.appliedFrom}
		ack.Even = r.source == follow.SourceEven
		acked[id] = ack
	}
	var cur *plan.Published
	rewrite := false
	if r := e.rec; r != nil {
		cur = &plan.Published{
			Generation:     r.gen,
			EffectiveFrom:  time.Unix(0, r.effective),
			Total:          r.total,
			Window:         r.window,
			ConfigRevision: r.cfgRev,
			Shares:         r.shares,
			Granted:        r.granted,
			Before:         r.before,
			Generations:    r.gens,
			From:           r.froms,
			At:             time.Unix(0, e.published),
		}
		for _, id := range ids {
			// A record written before this process registered is not its:
			// it gives it nothing (cluster.Member.registered), so it is
			// written again.
			if pub, ok := r.pubs[id]; ok && pub < e.records[id].regAt {
				rewrite = true
			}
		}
	}
	now := e.leaderClock()
	d := e.planner.Decide(plan.Input{
		Total:          c.limit,
		Window:         c.window,
		ConfigRevision: c.rev,
		Margin:         e.sc.Margin.D(),
		Target:         target,
		Acked:          acked,
		Cur:            cur,
		Rewrite:        rewrite,
		Moving:         e.target,
		Held:           e.heldGrants(),
		Now:            time.Unix(0, now),
	})
	e.target = d.Target
	if !d.Due.IsZero() {
		e.due = d.Due.UnixNano()
	}
	if d.Damped != "" {
		e.m.damped[d.Damped]++
	}
	if !d.Publish {
		return
	}
	var sum int64
	for _, v := range d.Shares {
		sum += v
	}
	if sum > c.limit {
		e.m.refused++ // schema.Encode refuses shares over the limit
		return
	}
	e.maxGen++
	if b := d.Before; b != nil && b.Since == 0 {
		b.Since = e.maxGen
	}
	rec := &sharesRec{gen: e.maxGen, effective: d.EffectiveFrom.UnixNano(), window: c.window, total: c.limit,
		shares: d.Shares, granted: d.Granted, before: d.Before, cfgRev: c.rev, cfgIdx: c.idx, published: now,
		gens: map[string]int64{}, froms: map[string]int64{}, pubs: map[string]int64{}, idxs: map[string]int{}}
	// Only the records that change are written; the others keep theirs.
	changed := map[string]bool{}
	for id := range d.Granted {
		prev := e.rec
		if prev != nil && sameRecord(prev, rec, id) && prev.pubs[id] >= e.recordRegAt(id) {
			rec.gens[id], rec.froms[id], rec.pubs[id], rec.idxs[id] = prev.gens[id], prev.froms[id], prev.pubs[id], prev.idxs[id]
			continue
		}
		changed[id] = true
		rec.gens[id], rec.froms[id], rec.pubs[id], rec.idxs[id] = rec.gen, rec.effective, e.now, c.idx
	}
	e.rec, e.published = rec, now
	e.m.publishes++
	e.tracef("leader (clock %v) publishes gen %d from %v: shares %v granted %v (records written: %d)",
		time.Duration(now), rec.gen, time.Duration(rec.effective), rec.shares, rec.granted, len(changed))
	if b := rec.before; b != nil {
		e.tracef("  before: window %v since %d granted %v; acks %v; target %v", b.Window, b.Since, b.Granted, acked, target)
	} else {
		e.tracef("  no transition; acks %v; target %v", acked, target)
	}
	for _, in := range e.inst {
		if in.alive && changed[in.id] {
			e.deliver(in, func() { in.onShares(e, rec, false) })
		}
	}
}

// enforcing is schema.ShareRecord.Enforcing of id's record: the most it
// may still enforce by it, per window of the record's length.
func (r *sharesRec) enforcing(id string) int64 {
	g := max(r.shares[id], r.granted[id])
	if b := r.before; b != nil {
		g = max(g, share.In(b.Granted[id], b.Window, r.window))
	}
	return g
}

// recordRegAt is when the process whose instance record etcd holds for id
// registered (never: none).
func (e *engine) recordRegAt(id string) int64 {
	if r := e.records[id]; r != nil {
		return r.regAt
	}
	return never
}

// sameRecord reports whether id's record would be written alike in prev
// and next: the same share (or the same absence), grant, regime and
// transition.
func sameRecord(prev, next *sharesRec, id string) bool {
	ps, pok := prev.shares[id]
	ns, nok := next.shares[id]
	pg, pgok := prev.granted[id]
	ng, ngok := next.granted[id]
	if ps != ns || pok != nok || pg != ng || pgok != ngok || prev.window != next.window || prev.total != next.total ||
		prev.cfgRev != next.cfgRev || (prev.before == nil) != (next.before == nil) {
		return false
	}
	if pb, nb := prev.before, next.before; pb != nil {
		return pb.Window == nb.Window && pb.Since == nb.Since && pb.Granted[id] == nb.Granted[id]
	}
	return true
}
