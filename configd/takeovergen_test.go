package main

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestUnknownClearedByAnOlderLeadersGeneration: r1 publishes a common
// record (generation 1, pointers at 1), then retunes it alone (generation
// 2: only the common record is written). The common record goes; r2
// takes over. It sees generations up to 1 (pointers, their key versions),
// so its first publish is generation 2 — the very number a, b, c
// acknowledged for r1's common record of 33. holdUnknown takes their
// AppliedGeneration 2 for an acknowledgement of r2's record of 0 and
// clears them; plan counts them at 0 and hands their room to d, while a,
// b, c (which have read nothing of r2's yet) still admit 33 each.
func TestUnknownClearedByAnOlderLeadersGeneration(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	name := "gen-collide"
	cfg, cfgRev := reviewConfig(t, cli, name, 100)
	ids := []string{"a", "b", "c"}
	putInst := func(id string, gen int64) {
		now := time.Now().UTC()
		rec := schema.InstanceRecord{Version: schema.Version, ID: id, Started: now, Updated: now,
			AppliedGeneration: gen, ReadsCommon: true, Source: schema.SourceShares}
		b, err := schema.Encode(rec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctxT(t), keys.Instance(name, id), string(b)); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		putInst(id, 0)
	}
	p1 := reviewPublisher(t, cli, name, "r1")
	st1 := p1.state(name)
	st1.cfg, st1.cfgRev, st1.keyRev = &cfg, cfgRev, cfgRev
	for _, id := range ids {
		st1.instances[id] = schema.InstanceRecord{ID: id, ReadsCommon: true}
	}
	cond := clientv3.Compare(clientv3.ModRevision(keys.Config(name)), "=", cfgRev)
	for _, step := range []struct{ gen, share int64 }{{1, 30}, {2, 33}} {
		want := map[string]schema.ShareRecord{}
		for _, id := range ids {
			want[id] = reviewRec(name, id, step.gen, step.share, cfgRev)
		}
		if _, _, ok, err := p1.writeRecords(ctxT(t), p1.fences[name], name, st1, cond, want); err != nil || !ok {
			t.Fatalf("publish %d: %v %v", step.gen, err, ok)
		}
	}
	if g := mustGet(t, cli, keys.Share(name, "a")); g.Version != 1 {
		t.Fatalf("a's pointer written %d times, want once", g.Version)
	}
	// Every instance applied and acknowledged r1's generation 2 (33 each).
	for _, id := range ids {
		putInst(id, 2)
	}
	// The common record goes; a newcomer d registers; r2 takes over.
	if _, err := cli.Delete(ctxT(t), keys.CommonShare(name)); err != nil {
		t.Fatal(err)
	}
	putInst("d", 0)
	if _, err := cli.Delete(ctxT(t), keys.Owner(name)); err != nil {
		t.Fatal(err)
	}
	p2 := reviewPublisher(t, cli, name, "r2")
	clock := time.Now()
	p2.now = func() time.Time { return clock }
	if err := p2.readProvider(ctxT(t), name); err != nil {
		t.Fatal(err)
	}
	st := p2.providers[name]
	t.Logf("r2 read: maxGen %d, unknown %v", st.maxGen, st.shares.unknown)
	f := p2.fences[name]
	for i := 0; i < 4; i++ {
		if err := p2.publish(ctxT(t), f, name, st); err != nil {
			t.Fatal(err)
		}
		v := st.shares.view(name)
		t.Logf("publish %d: gen %d shares %v granted %v unknown %v", i, v.Generation, v.Shares, v.Granted, st.shares.unknown)
		// a, b, c have read nothing of r2's: they still admit 33 each.
		if got := v.Shares["d"]; got+3*33 > 100 {
			t.Fatalf("r2 gives d %d (generation %d) while a, b, c, which never read a record of r2's, admit 33 each: %d of 100",
				got, v.Generations["d"], got+99)
		}
		clock = clock.Add(3 * time.Second) // past every boundary
	}
}
