package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

func sum(m map[string]int64) (s int64) {
	for _, v := range m {
		s += v
	}
	return s
}

// TestSharesFollowInstances: the leader publishes an even split of the
// limit over the instances with live leases; a lease revoked (an instance
// gone) and a retune each publish a new generation, effective from a
// window boundary at least the propagation margin after publishing. The
// instances acknowledge (sim), so a join reaches the even split through
// the safe handover: the old holders shrink first, the newcomers grow in a
// later publish.
func TestSharesFollowInstances(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	r := startReplica(t, srv, "r1")
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", "100", "--server", r.url())
	leases := map[string]clientv3.LeaseID{}
	for _, id := range []string{"i-a", "i-b", "i-c"} {
		leases[id] = addInstance(t, cli, "pay", id)
	}
	want := map[string]int64{"i-a": 34, "i-b": 33, "i-c": 33}
	sh := waitShares(t, cli, "pay", "the even split of 3 instances", func(s schema.Shares) bool { return maps.Equal(s.Shares, want) })
	if sh.Total != 100 || sh.Instances != 3 {
		t.Fatalf("shares %+v, want %v of 100", sh, want)
	}
	checkTiming(t, sh, DefaultPropagationMargin)
	gen := sh.Generation

	instancesOf(t, cli, "pay").leave("i-b")
	want = map[string]int64{"i-a": 50, "i-c": 50}
	sh = waitShares(t, cli, "pay", "the even split of 2 instances", func(s schema.Shares) bool { return maps.Equal(s.Shares, want) })
	if sh.Instances != 2 || sh.Generation <= gen {
		t.Fatalf("after revoke: %+v, want %v and generation > %d", sh, want, gen)
	}
	gen = sh.Generation

	// A shorter window, at a higher rate: until both instances enforce the
	// new length, the record keeps the old per-second grants (Before), and
	// shares grow only where they fit beside them, in windows of either
	// length. Here the split fits at once: 16 per 100 ms beside the other's
	// old 50 per second stays within the new limit counted into a second.
	cliOK(t, "set", "pay", "--limit", "31", "--window", "100ms", "--server", r.url())
	sh = waitShares(t, cli, "pay", "retune", func(s schema.Shares) bool { return s.Total == 31 })
	if want := map[string]int64{"i-a": 16, "i-c": 15}; !maps.Equal(sh.Shares, want) || sh.Generation != gen+1 || sh.Window.D() != 100*time.Millisecond ||
		sh.Before == nil || sh.Before.Window.D() != time.Second || sh.Before.Since != gen+1 ||
		!maps.Equal(sh.Before.Granted, map[string]int64{"i-a": 50, "i-c": 50}) {
		t.Fatalf("after retune: %+v (before: %+v)", sh, sh.Before)
	}
	checkTiming(t, sh, DefaultPropagationMargin, time.Second)
	// Once both apply 100 ms windows (the test's instances acknowledge at
	// once), the change is over, but it is not republished for that
	// alone: every instance would apply and acknowledge a record that
	// changes nothing it enforces.
	retuned := sh
	waitFor(t, 10*time.Second, "the retune's boundary", func() bool { return time.Now().After(time.Unix(0, retuned.EffectiveFrom).Add(200 * time.Millisecond)) })
	if sh2, _ := readShares(t, cli, "pay"); sh2.Generation != retuned.Generation {
		t.Errorf("republished only to drop the old grants: generation %d → %d", retuned.Generation, sh2.Generation)
	}

	// An instance record rewritten with new demand (by the same process:
	// on its lease; another lease is another process) does not change
	// the even split, so nothing is published.
	putDemand(t, cli, "pay", "i-a", leases["i-a"], 20)
	out := cliOK(t, "status", "pay", "--server", r.url())
	for _, want := range []string{"INSTANCE", "i-a", "test-host", "16", "unknown", "generation " + itoa(gen+1)} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if sh2, _ := readShares(t, cli, "pay"); sh2.Generation != sh.Generation {
		t.Errorf("republished (generation %d → %d) though the split did not change", sh.Generation, sh2.Generation)
	}

	// The next publish drops the old grants.
	leases["i-d"] = addInstance(t, cli, "pay", "i-d")
	want = map[string]int64{"i-a": 11, "i-c": 10, "i-d": 10}
	sh = waitShares(t, cli, "pay", "the even split of 3 instances", func(s schema.Shares) bool { return maps.Equal(s.Shares, want) })
	if sh.Before != nil {
		t.Errorf("after a join: the old grants are kept: %+v", sh.Before)
	}

	// Deleted, the provider's shares stay while its instances are live:
	// one that has not seen the deletion yet still enforces its grant. Once
	// they have left, the record goes.
	cliOK(t, "delete", "pay", "--server", r.url())
	if _, ok := readShares(t, cli, "pay"); !ok {
		t.Errorf("the shares record went with the config, while instances it names are live")
	}
	for _, id := range []string{"i-a", "i-c", "i-d"} {
		instancesOf(t, cli, "pay").leave(id)
	}
	waitFor(t, 10*time.Second, "shares deleted", func() bool { _, ok := readShares(t, cli, "pay"); return !ok })
}

// checkTiming: EffectiveFrom is a window start at least margin after the
// publish time.
// A publish that changes the window length takes effect at a boundary of
// both lengths: step is then the longer one (their common multiple here).
func checkTiming(t *testing.T, sh schema.Shares, margin time.Duration, step ...time.Duration) {
	t.Helper()
	w := sh.Window.D()
	if len(step) > 0 {
		w = step[0]
	}
	if sh.EffectiveFrom%int64(w) != 0 {
		t.Errorf("effective_from %d is not a multiple of %v", sh.EffectiveFrom, w)
	}
	if lead := sh.EffectiveTime().Sub(sh.Published); lead < margin || lead >= margin+w {
		t.Errorf("effective %v after publishing, want in [%v, %v)", lead, margin, margin+w)
	}
}

// TestLeaderFailover: two replicas, one leader publishes; cancelling the
// leader's ctx (a graceful stop) hands leadership to the other, which
// publishes higher generations; the old leader's run returns nil.
func TestLeaderFailover(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	a := startReplica(t, srv, "replica-a")
	b := startReplica(t, srv, "replica-b")
	waitFor(t, 10*time.Second, "exactly one leader", func() bool { return a.leading() != b.leading() })
	leader, standby := a, b
	if b.leading() {
		leader, standby = b, a
	}
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", "60", "--server", standby.url())
	addInstance(t, cli, "pay", "i-1")
	addInstance(t, cli, "pay", "i-2")
	sh := waitShares(t, cli, "pay", "first leader publishes the even split", func(s schema.Shares) bool {
		return maps.Equal(s.Shares, map[string]int64{"i-1": 30, "i-2": 30})
	})
	if sh.Leader != leader.id {
		t.Fatalf("published by %q, want the leader %q", sh.Leader, leader.id)
	}
	if err := leader.stop(); err != nil {
		t.Fatalf("leader's serve returned %v", err)
	}
	waitFor(t, 10*time.Second, "the standby to lead", standby.leading)
	addInstance(t, cli, "pay", "i-3")
	// The new leader resumes from the published shares and grants: i-1 and
	// i-2 shrink, acknowledge, and i-3 grows to the even split.
	sh2 := waitShares(t, cli, "pay", "new leader publishes the even split", func(s schema.Shares) bool {
		return maps.Equal(s.Shares, map[string]int64{"i-1": 20, "i-2": 20, "i-3": 20})
	})
	if sh2.Leader != standby.id || sh2.Generation <= sh.Generation || sum(sh2.Shares) != 60 {
		t.Fatalf("after failover: %+v (before: generation %d)", sh2, sh.Generation)
	}
	cliOK(t, "set", "pay", "--limit", "90", "--server", standby.url())
	sh3 := waitShares(t, cli, "pay", "retune after failover", func(s schema.Shares) bool { return s.Total == 90 })
	if sh3.Generation != sh2.Generation+1 {
		t.Errorf("generation %d after %d", sh3.Generation, sh2.Generation)
	}
	// Nothing was published between the first leader's last generation and
	// the new leader's first: it resumed from what etcd held.
	instancesOf(t, cli, "pay").seen(t, sh3.Generation)
	for _, p := range instancesOf(t, cli, "pay").publications() {
		if p.Generation == sh.Generation+1 && (p.Leader != standby.id || p.Instances != 3) {
			t.Errorf("the generation after the failover: %+v", p)
		}
	}
	instancesOf(t, cli, "pay").checkHandover(t)
}

// TestFencedPublish: a publisher whose election key is gone (a deposed
// leader) cannot write shares nor prune history: the transactions compare
// the key's create revision, and publishing stops with errNotLeader.
func TestFencedPublish(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := ctxT(t)
	cfg, _ := schema.Encode(schema.ProviderConfig{Name: "pay", Limit: 10}.WithDefaults())
	if _, err := cli.Put(ctx, keys.Config("pay"), string(cfg)); err != nil {
		t.Fatal(err)
	}
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	ownerKey := keys.Owner("pay")
	put, err := cli.Put(ctx, ownerKey, "old-leader", clientv3.WithLease(lease.ID))
	if err != nil {
		t.Fatal(err)
	}
	f := fence{key: ownerKey, rev: put.Header.Revision}
	writeHistory(t, cli, "pay", 1, 3)
	addInstance(t, cli, "pay", "i-1") // share records are written for live instances only
	// Deposed: the session's lease is gone, so is the owner key; another
	// replica may have created one of its own.
	if _, err := cli.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	p := &publisher{
		cli: cli, keys: keys, log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(prometheus.NewRegistry()),
		margin: DefaultPropagationMargin, replica: "old-leader", historyKeep: 2, now: time.Now,
	}
	if _, err := p.load(ctx); err != nil {
		t.Fatal(err)
	}
	p.fences = map[string]fence{"pay": f}
	if err := p.publishAll(ctx); err != nil {
		t.Fatalf("publishAll = %v", err)
	}
	if _, ok := readShares(t, cli, "pay"); ok {
		t.Fatal("a deposed leader published shares")
	}
	if _, led := p.fences["pay"]; led {
		t.Fatal("the deposed leader still counts itself the provider's leader")
	}
	if err := p.prune(ctx, f, "pay"); !errors.Is(err, errNotLeader) {
		t.Fatalf("prune = %v, want errNotLeader", err)
	}
	if n := len(historyKeys(t, cli, "pay")); n != 3 {
		t.Fatalf("a deposed leader pruned history: %d entries left of 3", n)
	}
	// The same publisher on a live session takes the provider over and
	// publishes.
	live, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, keys.ElectionKey(int64(live.ID)), "leader", clientv3.WithLease(live.ID)); err != nil {
		t.Fatal(err)
	}
	p.replica = "leader"
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.run(rctx, int64(live.ID)) }()
	waitShares(t, cli, "pay", "publish under a valid fence", func(s schema.Shares) bool { return s.Total == 10 && s.Leader == "leader" })
	waitFor(t, 10*time.Second, "history pruned under a valid fence", func() bool { return len(historyKeys(t, cli, "pay")) == 2 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("run after cancel = %v", err)
	}
}

// TestMalformedRecords: records broken by hand in etcd are ignored and
// logged, the last good config stays in force for publishing, and status,
// list and get show the problem; set repairs it.
//
// An instance whose record is malformed cannot acknowledge a generation,
// so a share it gives up is not handed on (the safe handover): i-2's record
// is broken only once the three-way split is reached.
func TestMalformedRecords(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	r := startReplica(t, srv, "r1")
	ctx := ctxT(t)
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", "100", "--server", r.url())
	addInstance(t, cli, "pay", "i-1")
	addInstance(t, cli, "pay", "i-2")
	sh := waitShares(t, cli, "pay", "the even split of 2 instances", func(s schema.Shares) bool {
		return maps.Equal(s.Shares, map[string]int64{"i-1": 50, "i-2": 50})
	})

	putBad := func(key, value string) {
		t.Helper()
		opts := []clientv3.OpOption{}
		if strings.Contains(key, "/instances/") {
			lease, err := cli.Grant(ctx, 60)
			if err != nil {
				t.Fatal(err)
			}
			opts = append(opts, clientv3.WithLease(lease.ID))
		}
		if _, err := cli.Put(ctx, key, value, opts...); err != nil {
			t.Fatal(err)
		}
	}
	putBad(keys.Config("pay"), `{"name":"pay","limit":-5,"window":"1s","mode":"enforce","algorithm":"even"}`)
	putBad(keys.Instance("pay", "i-9"), `not json`)
	// i-9 is live (its key exists) though its record is malformed: it is
	// counted, and the last good limit (100) is split three ways.
	sh2 := waitShares(t, cli, "pay", "3 instances under the last good config", func(s schema.Shares) bool {
		return s.Instances == 3 && sum(s.Shares) == 100
	})
	if sh2.Total != 100 || sh2.ConfigRevision != sh.ConfigRevision || sh2.Shares["i-9"] != 33 {
		t.Fatalf("shares under a malformed config: %+v", sh2)
	}
	// i-2's record breaks (it stops acknowledging first, or its next
	// acknowledgement would repair it); the last good one stays in force.
	instancesOf(t, cli, "pay").silence("i-2")
	putBad(keys.Instance("pay", "i-2"), `{"id":"i-2","demand":"lots"}`)
	waitFor(t, 5*time.Second, "the malformed records to be logged", func() bool {
		return strings.Count(r.log.String(), "ignoring malformed record") >= 3
	})

	for mode, conn := range map[string][]string{"api": {"--server", r.url()}, "etcd": {"--etcd-endpoints", srv.Endpoints()[0]}} {
		out := cliOK(t, append([]string{"status", "pay"}, conn...)...)
		for _, want := range []string{"config:    none or malformed", "malformed records", keys.Config("pay"), "limit must be a positive integer", keys.Instance("pay", "i-9"), "(malformed record)", "demand"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: status lacks %q:\n%s", mode, want, out)
			}
		}
		_, err := cliRun(t, append([]string{"get", "pay"}, conn...)...)
		if err == nil || !strings.Contains(err.Error(), "malformed") || exitCode(err) != 1 {
			t.Errorf("%s: get of a malformed config: %v (exit %d)", mode, err, exitCode(err))
		}
		out = cliOK(t, append([]string{"list"}, conn...)...)
		if !strings.Contains(out, "malformed records") || !strings.Contains(out, keys.Config("pay")) {
			t.Errorf("%s: list does not show the malformed config:\n%s", mode, out)
		}
	}
	// Repair: set overwrites the malformed config (its old value shows as
	// missing), and publishing follows the new one.
	out := cliOK(t, "set", "pay", "--limit", "90", "--server", r.url())
	if !strings.Contains(out, "create limit=90") {
		t.Errorf("set over a malformed config printed %q", out)
	}
	waitShares(t, cli, "pay", "repaired config", func(s schema.Shares) bool { return s.Total == 90 && sum(s.Shares) == 90 })

	// Malformed shares written by hand are replaced by the leader with a
	// higher generation.
	before, _ := readShares(t, cli, "pay")
	if _, err := cli.Put(ctx, keys.Share("pay", slices.Min(slices.Collect(maps.Keys(before.Shares)))), `{"provider":"pay","total":1}`); err != nil {
		t.Fatal(err)
	}
	after := waitShares(t, cli, "pay", "shares repaired", func(s schema.Shares) bool { return s.Total == 90 && s.Generation > before.Generation })
	if sum(after.Shares) != 90 {
		t.Errorf("repaired shares: %+v", after)
	}
}

// TestServeEmbedded: with no --etcd-endpoints, serve runs its own etcd
// under --data-dir; configs survive a restart on the same directory.
func TestServeEmbedded(t *testing.T) {
	dir := t.TempDir()
	clientURL, peerURL := "http://"+freeAddr(t), "http://"+freeAddr(t)
	args := []string{"--data-dir", dir, "--embedded-client-url", clientURL, "--embedded-peer-url", peerURL}
	r := startReplica(t, nil, "solo", args...)
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", "42", "--server", r.url())
	addInstance(t, embeddedClient(t, clientURL, dir, rootUser), "pay", "i-1") // share records are written for live instances only
	waitFor(t, 10*time.Second, "shares from the embedded leader", func() bool {
		out, err := cliRun(t, "status", "pay", "--etcd-endpoints", clientURL,
			"--etcd-username", readerUser, "--etcd-password-file", credentialsFile(dir, readerUser))
		return err == nil && strings.Contains(out, "generation 1, total 42")
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	r2 := startReplica(t, nil, "solo-again", args...)
	if out := cliOK(t, "get", "pay", "--server", r2.url()); !strings.Contains(out, "42") {
		t.Errorf("after restart: %s", out)
	}
}

// metricValue reads one series from the replica's /metrics: a metric name,
// with its labels as exposed if it has any
// (`configd_shares_damped_total{provider="pay",reason="hysteresis"}`). It
// returns "" when the series is not there.
func (r *replica) metricValue(t *testing.T, name string) string {
	resp, err := http.Get(r.url() + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

// TestEtcdOutage: when etcd goes away for longer than the session TTL, the
// leader gives up leadership (its session is gone, so it stops publishing);
// when etcd is back it campaigns again, leads, and publishes from the
// generation it left.
func TestEtcdOutage(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	r := startReplica(t, srv, "r1")
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", "10", "--server", r.url())
	addInstance(t, cli, "pay", "i-1")
	sh := waitShares(t, cli, "pay", "first publish", func(s schema.Shares) bool { return s.Instances == 1 })
	waitFor(t, 5*time.Second, "leader", func() bool { return r.metricValue(t, "configd_leader") == "1" })
	// The simulated instance acknowledges before etcd goes: an
	// acknowledgement still being written when it stops fails the sim.
	instancesOf(t, cli, "pay").seen(t, sh.Generation)

	srv.Stop()
	waitFor(t, 20*time.Second, "leadership given up during the outage", func() bool { return r.metricValue(t, "configd_leader") == "0" })
	if status, _ := do(t, "GET", r.url()+"/readyz", nil, ""); status != http.StatusServiceUnavailable {
		t.Errorf("/readyz during the outage: %d, want 503", status)
	}
	srv.Restart()
	waitFor(t, 30*time.Second, "leader again", func() bool { return r.metricValue(t, "configd_leader") == "1" })
	addInstance(t, cli, "pay", "i-2")
	sh2 := waitShares(t, cli, "pay", "publish after the outage", func(s schema.Shares) bool { return s.Instances == 2 })
	if sh2.Generation <= sh.Generation {
		t.Errorf("generation %d after the outage, %d before", sh2.Generation, sh.Generation)
	}
}

// TestPublishInParallelTransactions: a publish larger than one transaction
// is written in several, sent together, each fenced: every record lands,
// with the publisher's books in step, and a transaction whose config
// revision no longer holds writes nothing.
func TestPublishInParallelTransactions(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := ctxT(t)
	const n = 3*recordsPerTxn + 17
	cfg, _ := schema.Encode(schema.ProviderConfig{Name: "wide", Limit: 100 * n}.WithDefaults())
	if _, err := cli.Put(ctx, keys.Config("wide"), string(cfg)); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("i-%03d", i)
	}
	for _, id := range ids {
		addInstance(t, cli, "wide", id)
	}
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	put, err := cli.Put(ctx, keys.Owner("wide"), "r1", clientv3.WithLease(lease.ID))
	if err != nil {
		t.Fatal(err)
	}
	p := &publisher{
		cli: cli, keys: keys, log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(prometheus.NewRegistry()),
		margin: DefaultPropagationMargin, replica: "r1", now: time.Now,
	}
	if _, err := p.load(ctx); err != nil {
		t.Fatal(err)
	}
	p.fences = map[string]fence{"wide": {key: keys.Owner("wide"), rev: put.Header.Revision}}
	if err := p.publishAll(ctx); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, keys.Provider("wide")+"shares/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	revs := map[int64]int{}
	for _, kv := range resp.Kvs {
		revs[kv.ModRevision]++
	}
	// Equal shares: the common record, in a transaction of its own, then
	// n records that say Common.
	st := p.providers["wide"]
	if txns := 1 + (n+recordsPerTxn-1)/recordsPerTxn; len(resp.Kvs) != n+1 || len(revs) != txns || len(st.shares.records) != n || len(st.shares.pointers) != n {
		t.Fatalf("%d keys in %d transactions, %d records and %d pointers in the books; want %d in %d", len(resp.Kvs), len(revs), len(st.shares.records), len(st.shares.pointers), n+1, txns)
	}
	for _, kv := range resp.Kvs {
		id := strings.TrimPrefix(string(kv.Key), keys.Provider("wide")+"shares/")
		if id == schema.CommonInstance {
			if st.shares.common == nil || st.shares.common.rev != kv.ModRevision || kv.ModRevision != slices.Min(slices.Collect(maps.Keys(revs))) {
				t.Fatalf("common record written at revision %d (revisions %v), the books say %+v; want it first", kv.ModRevision, revs, st.shares.common)
			}
			continue
		}
		if st.shares.records[id].rev != kv.ModRevision {
			t.Fatalf("%s written at revision %d, the books say %d", id, kv.ModRevision, st.shares.records[id].rev)
		}
	}
	// A config changed under the publish: no transaction writes.
	f := p.fences["wide"]
	ops := make([]clientv3.Op, n)
	for i := range ops {
		ops[i] = clientv3.OpPut(keys.Share("wide", ids[i]), "x")
	}
	revsAfter, err := p.commitChunks(ctx, f, clientv3.Compare(clientv3.ModRevision(keys.Config("wide")), "=", 1), ops)
	if err != nil || slices.ContainsFunc(revsAfter, func(r int64) bool { return r != 0 }) {
		t.Fatalf("commitChunks under a stale config revision = %v, %v; want nothing written", revsAfter, err)
	}
}
