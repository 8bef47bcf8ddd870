package main

import (
	"io"
	"log/slog"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestHandoverJoinConverges: instances that acknowledge; a join reaches
// the even split (the old holders shrink, acknowledge, then the newcomer
// grows), and so does a leave. Every generation on the way keeps the
// grants within the total and every share within its grant.
func TestHandoverJoinConverges(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	r := startReplica(t, srv, "r1")
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", "100", "--server", r.url())
	sim := instancesOf(t, cli, "pay")
	addInstance(t, cli, "pay", "i-a")
	waitShares(t, cli, "pay", "i-a alone", func(s schema.Shares) bool { return s.Shares["i-a"] == 100 })
	addInstance(t, cli, "pay", "i-b")
	waitShares(t, cli, "pay", "the even split of 2", func(s schema.Shares) bool {
		return maps.Equal(s.Shares, map[string]int64{"i-a": 50, "i-b": 50})
	})
	addInstance(t, cli, "pay", "i-c")
	want := map[string]int64{"i-a": 34, "i-b": 33, "i-c": 33}
	sh := waitShares(t, cli, "pay", "the even split of 3", func(s schema.Shares) bool { return maps.Equal(s.Shares, want) })
	if !maps.Equal(sh.Granted, want) {
		t.Errorf("converged shares %v with grants %v", sh.Shares, sh.Granted)
	}
	// The join took a shrink (the newcomer at 0, the old grants kept) and
	// then growth.
	sim.seen(t, sh.Generation)
	var sawShrink bool
	for _, p := range sim.publications() {
		if p.Instances == 3 && p.Shares["i-c"] == 0 && p.Granted["i-a"] == 50 && p.Granted["i-b"] == 50 {
			sawShrink = true
		}
	}
	if !sawShrink {
		t.Errorf("no generation shrank i-a and i-b while keeping their grants:\n%s", sim)
	}
	sim.leave("i-c")
	waitShares(t, cli, "pay", "the even split after the leave", func(s schema.Shares) bool {
		return maps.Equal(s.Shares, map[string]int64{"i-a": 50, "i-b": 50})
	})
	sim.checkHandover(t)
}

// TestHandoverDemandShiftConverges: under fair, demand moving from one
// instance to another reaches alloc.Fair's split: the one that loses
// shrinks first, the one that gains grows once that is acknowledged.
func TestHandoverDemandShiftConverges(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	r := startReplica(t, srv, "r1")
	const total = 300
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", itoa(total), "--algorithm", "fair", "--server", r.url())
	sim := instancesOf(t, cli, "pay")
	demand := map[string]int64{"i-a": 10, "i-b": 40, "i-c": 1000}
	leases := map[string]clientv3.LeaseID{}
	for _, id := range []string{"i-a", "i-b", "i-c"} {
		leases[id] = addInstanceDemand(t, cli, "pay", id, demand[id])
	}
	want := fairShares(t, total, demand)
	sh := waitShares(t, cli, "pay", "the fair split", func(s schema.Shares) bool { return maps.Equal(s.Shares, want) })
	// i-a now wants 200 and i-c 100: i-c (250 → 100) shrinks, i-a (10 →
	// 160) grows.
	demand["i-a"], demand["i-c"] = 200, 100
	putDemand(t, cli, "pay", "i-a", leases["i-a"], demand["i-a"])
	putDemand(t, cli, "pay", "i-c", leases["i-c"], demand["i-c"])
	want2 := fairShares(t, total, demand)
	if want2["i-a"] <= want["i-a"] || want2["i-c"] >= want["i-c"] {
		t.Fatalf("alloc.Fair: %v → %v", want, want2)
	}
	shifted := waitShares(t, cli, "pay", "the fair split after the shift", func(s schema.Shares) bool { return maps.Equal(s.Shares, want2) })
	sim.seen(t, shifted.Generation)
	// No generation grew i-a before i-c's shrink was acknowledged: i-a's
	// share never exceeded what i-c's grant left.
	var steps int
	for _, p := range sim.publications() {
		if p.Generation <= sh.Generation {
			continue
		}
		steps++
		if free := p.Total - p.Granted["i-b"] - p.Granted["i-c"]; p.Shares["i-a"] > free {
			t.Errorf("generation %d: i-a %d beyond what the grants leave (%d)", p.Generation, p.Shares["i-a"], free)
		}
	}
	if steps < 2 {
		t.Errorf("the shift took %d publishes, want a shrink and then growth:\n%s", steps, sim)
	}
	sim.checkHandover(t)
}

// TestHandoverWaitsForSilentInstance: an instance that stops acknowledging
// keeps its grant, so the share taken from it is not handed on: the
// newcomer grows only by what the others freed, stays below its target
// through later publishes, and grows once the silent one acknowledges.
// The same with a silent instance whose lease expires: its grant is held
// for the provider's fail_static, then handed on.
func TestHandoverWaitsForSilentInstance(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	r := startReplica(t, srv, "r1")
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", "100", "--fail-static", "1s", "--server", r.url())
	sim := instancesOf(t, cli, "pay")
	leases := map[string]clientv3.LeaseID{}
	for _, id := range []string{"i-a", "i-b"} {
		leases[id] = addInstance(t, cli, "pay", id)
	}
	waitShares(t, cli, "pay", "the even split of 2", func(s schema.Shares) bool {
		return maps.Equal(s.Shares, map[string]int64{"i-a": 50, "i-b": 50})
	})
	sim.settled(t)

	// i-a goes silent; i-c joins. i-a and i-b shrink to 34 and 33; only
	// i-b acknowledges, so i-c gets what i-b freed: 100 - 50 - 33 = 17.
	sim.silence("i-a")
	leases["i-c"] = addInstance(t, cli, "pay", "i-c")
	waitShares(t, cli, "pay", "i-c grown by what i-b freed", func(s schema.Shares) bool { return s.Shares["i-c"] == 17 })
	// Once the leader knows every acknowledgement and the generation is in
	// effect, a later publish (i-d joins) still grows no one beyond what
	// i-a's grant leaves.
	settledGen := sim.settled(t).Generation
	leases["i-d"] = addInstance(t, cli, "pay", "i-d")
	probe := waitShares(t, cli, "pay", "i-d's join published", func(s schema.Shares) bool { return s.Instances == 4 })
	if probe.Generation != settledGen+1 || probe.Granted["i-a"] != 50 || probe.Shares["i-c"] != 17 || probe.Shares["i-d"] != 0 {
		t.Errorf("the join after the silence: %+v\n%s", probe, sim)
	}
	// i-b acknowledges its shrink to 25, and what it frees goes to i-c (up
	// to its target, 25); i-d stays at 0, below its 25, while i-a is silent.
	waitShares(t, cli, "pay", "i-c at its target", func(s schema.Shares) bool { return s.Shares["i-c"] == 25 })
	last := sim.settled(t)
	if last.Shares["i-d"] != 0 || last.Granted["i-a"] != 50 {
		t.Errorf("while i-a is silent: %+v", last)
	}
	for _, p := range sim.publications() { // all since i-c joined, while i-a is silent
		if p.Instances >= 3 && (p.Granted["i-a"] != 50 || p.Shares["i-c"]+p.Shares["i-d"] > 100-50-p.Granted["i-b"]) {
			t.Errorf("generation %d while i-a was silent: shares %v granted %v", p.Generation, p.Shares, p.Granted)
		}
	}
	// i-a acknowledges: i-d grows to the even split.
	sim.resume("i-a")
	even4 := map[string]int64{"i-a": 25, "i-b": 25, "i-c": 25, "i-d": 25}
	waitShares(t, cli, "pay", "the even split of 4 once i-a acknowledged", func(s schema.Shares) bool { return maps.Equal(s.Shares, even4) })
	sim.settled(t)

	// i-b goes silent; i-e joins (20 each): i-e gets only what the others
	// freed, 100 - 3×20 - 25 = 15.
	sim.silence("i-b")
	addInstance(t, cli, "pay", "i-e")
	waitShares(t, cli, "pay", "i-e grown by what the others freed", func(s schema.Shares) bool { return s.Shares["i-e"] == 15 })
	last = sim.settled(t)
	if last.Shares["i-e"] != 15 || last.Granted["i-b"] != 25 {
		t.Errorf("while i-b is silent: %+v", last)
	}
	// i-b's lease ends without a leaving mark (as when it expires): its
	// grant stays held for the fail_static (it may still be enforcing it,
	// cut off from etcd); then the rest reach 25 each.
	sim.revoke(t, cli, "i-b", leases["i-b"], time.Second) // --fail-static 1s
	heldGen := waitShares(t, cli, "pay", "i-b gone and held", func(s schema.Shares) bool {
		_, named := s.Shares["i-b"]
		return s.Instances == 4 && !named
	})
	if heldGen.Granted["i-b"] != 25 || heldGen.Shares["i-e"] != 15 {
		t.Errorf("the publish after i-b's lease ended: %+v, want i-b's 25 still granted and i-e still at 15", heldGen)
	}
	waitShares(t, cli, "pay", "the even split once i-b's hold ends", func(s schema.Shares) bool {
		return maps.Equal(s.Shares, map[string]int64{"i-a": 25, "i-c": 25, "i-d": 25, "i-e": 25})
	})
	sim.checkHandover(t)
}

// TestHandoverFailoverResumesFromGrants: a new leader computes its bounds
// from the grants in etcd: a share the old leader took from a silent
// instance stays held, so the new leader's first publish grows no one
// beyond what the grants leave free; once the silent instance
// acknowledges, the new leader completes the move.
func TestHandoverFailoverResumesFromGrants(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	r1 := startReplica(t, srv, "r1")
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", "100", "--server", r1.url())
	sim := instancesOf(t, cli, "pay")
	for _, id := range []string{"i-a", "i-b"} {
		addInstance(t, cli, "pay", id)
	}
	waitShares(t, cli, "pay", "the even split of 2", func(s schema.Shares) bool {
		return maps.Equal(s.Shares, map[string]int64{"i-a": 50, "i-b": 50})
	})
	sim.settled(t)
	sim.silence("i-a")
	addInstance(t, cli, "pay", "i-c")
	waitShares(t, cli, "pay", "i-c grown by what i-b freed", func(s schema.Shares) bool { return s.Shares["i-c"] == 17 })
	before := sim.settled(t)
	if before.Leader != "r1" || before.Granted["i-a"] != 50 || before.Shares["i-a"] != 34 {
		t.Fatalf("before the failover: %+v", before)
	}
	if err := r1.stop(); err != nil {
		t.Fatal(err)
	}
	r2 := startReplica(t, srv, "r2")
	waitFor(t, 10*time.Second, "r2 to lead", r2.leading)
	// r2 publishes on the next change: i-d joins (25 each). i-a's grant of
	// 50 still holds, so i-c stays at 17 and i-d at 0: nothing is free.
	addInstance(t, cli, "pay", "i-d")
	first := waitShares(t, cli, "pay", "r2's first publish", func(s schema.Shares) bool { return s.Leader == "r2" })
	if first.Generation != before.Generation+1 || first.Instances != 4 || first.Granted["i-a"] != 50 ||
		first.Shares["i-c"] != 17 || first.Shares["i-d"] != 0 || sum(first.Granted) > 100 {
		t.Errorf("r2's first publish: %+v\n%s", first, sim)
	}
	// i-a acknowledges: r2 completes the move.
	sim.resume("i-a")
	waitShares(t, cli, "pay", "the even split of 4 under r2", func(s schema.Shares) bool {
		return s.Leader == "r2" && maps.Equal(s.Shares, map[string]int64{"i-a": 25, "i-b": 25, "i-c": 25, "i-d": 25})
	})
	sim.checkHandover(t)
}

// TestHandoverIgnoresItsOwnStaleEcho drives a publisher by hand, in the
// order its watch can deliver events: it publishes generations 1 and 2
// (i-1 alone with the whole limit; i-1 shrunk to 50 with its grant kept at
// 100 for i-2's join), and only then does the watch deliver the echo of
// its own write of i-1's record of generation 1. The publish that follows
// must still count i-1's grant of 100: i-1 may be enforcing the 100 of
// generation 1, so nothing is free for i-2.
func TestHandoverIgnoresItsOwnStaleEcho(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := ctxT(t)
	cfg, _ := schema.Encode(schema.ProviderConfig{Name: "pay", Limit: 100}.WithDefaults())
	if _, err := cli.Put(ctx, keys.Config("pay"), string(cfg)); err != nil {
		t.Fatal(err)
	}
	put, err := cli.Put(ctx, keys.Election()+"/r1", "r1")
	if err != nil {
		t.Fatal(err)
	}
	f := fence{key: keys.Election() + "/r1", rev: put.Header.Revision}
	p := &publisher{
		cli: cli, keys: keys, log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(prometheus.NewRegistry()),
		margin: DefaultPropagationMargin, replica: "r1", now: time.Now,
	}
	if _, err := p.load(ctx); err != nil {
		t.Fatal(err)
	}
	p.fences = map[string]fence{"pay": f}
	sharesKV := func() *mvccpb.KeyValue {
		resp, err := cli.Get(ctx, keys.Share("pay", "i-1"))
		if err != nil || len(resp.Kvs) == 0 {
			t.Fatalf("no shares: %v", err)
		}
		return resp.Kvs[0]
	}
	join := func(id string, applied int64) {
		rec, _ := schema.Encode(schema.InstanceRecord{ID: id, AppliedGeneration: applied})
		lease, err := cli.Grant(ctx, 60)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, keys.Instance("pay", id), string(rec), clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
		resp, err := cli.Get(ctx, keys.Instance("pay", id))
		if err != nil {
			t.Fatal(err)
		}
		p.apply(mvccpb.PUT, resp.Kvs[0])
	}
	publish := func(wantGen int64) schema.Shares {
		t.Helper()
		if err := p.publishAll(ctx); err != nil {
			t.Fatal(err)
		}
		sh, _ := readShares(t, cli, "pay")
		if sh.Generation != wantGen {
			t.Fatalf("generation %d published, want %d: %+v", sh.Generation, wantGen, sh)
		}
		return sh
	}
	join("i-1", 0)
	if sh := publish(1); sh.Shares["i-1"] != 100 {
		t.Fatalf("generation 1: %v", sh.Shares)
	}
	gen1 := sharesKV()
	join("i-2", 0)
	join("i-1", 1) // i-1 applied generation 1: it may enforce 100
	sh2 := publish(2)
	if want := map[string]int64{"i-1": 50, "i-2": 0}; !maps.Equal(sh2.Shares, want) || sh2.Granted["i-1"] != 100 {
		t.Fatalf("generation 2: shares %v granted %v", sh2.Shares, sh2.Granted)
	}
	// The watch delivers the echo of i-1's record of generation 1 now.
	p.apply(mvccpb.PUT, gen1)
	if err := p.publishAll(ctx); err != nil {
		t.Fatal(err)
	}
	sh, _ := readShares(t, cli, "pay")
	if sh.Generation != 2 && (sh.Shares["i-2"] != 0 || sh.Granted["i-1"] < 100) {
		t.Errorf("after a stale echo of generation 1: generation %d grows i-2 to %d and grants i-1 %d, though i-1 acknowledged only generation 1 (share 100): shares %v granted %v",
			sh.Generation, sh.Shares["i-2"], sh.Granted["i-1"], sh.Shares, sh.Granted)
	}
}

// TestDeleteAndCreateAgainKeepsTheGrants: a provider deleted and created
// again at once, while its instances have not seen the deletion (they are
// silent: they keep enforcing their shares), starts from their grants, not
// from nothing: no share grows into what another may still enforce. Found
// by the protocol search (internal/sim): configd deleted the shares with
// the config, and the provider created again handed out its whole limit
// while an instance still enforced its old share.
func TestDeleteAndCreateAgainKeepsTheGrants(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	r := startReplica(t, srv, "r1")
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", "100", "--algorithm", "fair", "--server", r.url())
	sim := instancesOf(t, cli, "pay")
	addInstanceDemand(t, cli, "pay", "i-a", 80)
	addInstanceDemand(t, cli, "pay", "i-b", 20)
	waitShares(t, cli, "pay", "80/20 by demand", func(s schema.Shares) bool {
		return maps.Equal(s.Shares, map[string]int64{"i-a": 80, "i-b": 20}) && maps.Equal(s.Granted, s.Shares)
	})
	sim.silence("i-a") // it never sees the deletion: it keeps enforcing 80
	cliOK(t, "delete", "pay", "--server", r.url())
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", "100", "--algorithm", "even", "--server", r.url())
	sh := waitShares(t, cli, "pay", "the first publish after the provider came back", func(s schema.Shares) bool { return s.Total == 100 && s.Shares["i-a"] == 50 })
	if sh.Shares["i-b"] > 20 || sh.Granted["i-a"] < 80 {
		t.Errorf("after delete and create, with i-a still on its old 80: shares %v, grants %v; want i-b kept at 20 and i-a's grant at 80",
			sh.Shares, sh.Granted)
	}
	sim.resume("i-a")
	waitShares(t, cli, "pay", "the even split once i-a acknowledges", func(s schema.Shares) bool {
		return maps.Equal(s.Shares, map[string]int64{"i-a": 50, "i-b": 50})
	})
}
