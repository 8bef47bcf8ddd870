package main

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
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
	leadFollowers(t, cli, name, 30, 33)
	putInst := func(id string, gen int64) { putAcked(t, cli, name, id, gen) }
	// r1's second publish wrote the common record alone.
	if g := mustGet(t, cli, keys.Share(name, "a")); g.Version != 1 {
		t.Fatalf("a's pointer written %d times, want once", g.Version)
	}
	// The common record goes; a newcomer d registers; r2 takes over.
	if _, err := cli.Delete(ctxT(t), keys.CommonShare(name)); err != nil {
		t.Fatal(err)
	}
	putInst("d", 0)
	if _, err := cli.Delete(ctxT(t), keys.Owner(name)); err != nil {
		t.Fatal(err)
	}
	p2 := newLeader(t, cli, name, "r2")
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
