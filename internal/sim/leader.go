package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/sluice-go/sluice/configd/alloc"
	"github.com/sluice-go/sluice/configd/plan"
)

// The leader: configd's publisher for the one provider.

// leaderBatch is how long the leader takes to gather a batch of watch
// events before it publishes: etcd hands a watcher many events at once.
const leaderBatch = int64(5 * time.Millisecond)

func (e *engine) notifyLeader() {
	if !e.leaderUp || e.batchArmed {
		return
	}
	e.batchArmed = true
	ep := e.epoch
	e.at(e.now+leaderBatch, func() {
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
	e.m.failovers++
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
		acked[id] = plan.Ack{Generation: e.records[id].gen, From: e.records[id].appliedFrom}
	}
	var cur *plan.Published
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
			At:             time.Unix(0, e.published),
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
		Moving:         e.target,
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
		shares: d.Shares, granted: d.Granted, before: d.Before, cfgRev: c.rev, cfgIdx: c.idx, published: now, pubTrue: e.now}
	e.rec, e.published = rec, now
	e.m.publishes++
	e.tracef("leader (clock %v) publishes gen %d from %v: shares %v granted %v", time.Duration(now), rec.gen, time.Duration(rec.effective), rec.shares, rec.granted)
	for _, in := range e.inst {
		if in.alive {
			e.deliver(in, func() { in.onShares(e, rec, false) })
		}
	}
}
