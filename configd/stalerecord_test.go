package main

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestTakeoverOfAStaleRecordCountsEveryBound: a replica takes over what
// the leader left: a and b of generation 5 (limit 100, no change of regime
// under way; a shrinking from 60 to 20, not acknowledged yet, b waiting
// at 20 for a's room), and g's record of generation 2 of the limit 50
// before a raise, whose deletion was cut short (g gone: holdMissing
// holds it). The config is unchanged (100). b wants 80. The view of the
// records keeps g's as an old regime that no record's transition names
// (Since 0), and the publish counted nothing of a's 60 beside it: b took
// 70, 140 in a window of 100 (found by review; with g's record of another
// window, before the change to AssembleShares too).
func TestTakeoverOfAStaleRecordCountsEveryBound(t *testing.T) {
	for _, v := range []string{"limit", "window"} {
		t.Run(v, func(t *testing.T) { staleRecordTakeover(t, v) })
	}
}

func staleRecordTakeover(t *testing.T, variant string) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	name := "szero"
	cfg := schema.ProviderConfig{Name: name, Limit: 100, Algorithm: schema.AlgorithmFair}.WithDefaults()
	b, _ := schema.Encode(cfg)
	put, err := cli.Put(ctxT(t), keys.Config(name), string(b))
	if err != nil {
		t.Fatal(err)
	}
	cfgRev := put.Header.Revision
	now := time.Now()
	e5 := now.Add(-3 * time.Second).Truncate(time.Second).UnixNano()
	e2 := now.Add(-30 * time.Second).Truncate(time.Second).UnixNano()
	rec := func(id string, gen, from, total, sh, gr int64, w time.Duration) {
		r := schema.ShareRecord{Version: schema.Version, Provider: name, Instance: id, Generation: gen, EffectiveFrom: from,
			Window: schema.Duration(w), Total: total, Share: sh, Granted: gr, ConfigRevision: cfgRev,
			Published: time.Unix(0, from).Add(-time.Second).UTC(), Leader: "r1"}
		v, err := schema.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctxT(t), keys.Share(name, id), string(v)); err != nil {
			t.Fatal(err)
		}
	}
	rec("a", 5, e5, 100, 20, 60, time.Second)
	rec("b", 5, e5, 100, 20, 20, time.Second)
	if variant == "limit" {
		rec("g", 2, e2, 50, 10, 10, time.Second) // of the limit 50 before a raise
	} else {
		// of 100 per 2 s before the window became 1 s: 10 per 2 s
		rec("g", 2, now.Add(-30*time.Second).Truncate(2*time.Second).UnixNano(), 200, 10, 10, 2*time.Second)
	}
	inst := func(id string, demand, gen, from int64) {
		r := schema.InstanceRecord{Version: schema.Version, ID: id, Started: now.UTC(), Updated: now.UTC(), Demand: demand,
			AppliedGeneration: gen, AppliedFrom: from, Source: schema.SourceShares}
		v, _ := schema.Encode(r)
		if _, err := cli.Put(ctxT(t), keys.Instance(name, id), string(v)); err != nil {
			t.Fatal(err)
		}
	}
	inst("a", 20, 4, e5-int64(time.Second)) // acknowledged 4 (60), not 5 yet
	inst("b", 80, 5, e5)
	p := newLeader(t, cli, name, "r2")
	if err := p.readProvider(ctxT(t), name); err != nil {
		t.Fatal(err)
	}
	st := p.providers[name]
	t.Logf("held: %v; view before: %+v", st.held, st.shares.published(name, now).Before)
	if err := p.publish(ctxT(t), p.fences[name], name, st); err != nil {
		t.Fatal(err)
	}
	s, _, err := layoutRead(ctxT(t), cli, name)
	if err != nil {
		t.Fatal(err)
	}
	gb := s.resolved["b"].rec
	t.Logf("b: generation %d share %d from %v; a: share %d granted %d", gb.Generation, gb.Share,
		time.Unix(0, gb.EffectiveFrom).Sub(time.Unix(0, e5)), s.resolved["a"].rec.Share, s.resolved["a"].rec.Granted)
	if sum := gb.Share + 60 + 10; sum > 100 {
		t.Errorf("b takes %d while a may still admit 60 (not acknowledged its shrink) and g 10 (held): %d in a window of 100", gb.Share, sum)
	}
}
