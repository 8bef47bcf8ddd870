package main

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/netcut"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestPublisherReloadsAfterCompaction: a leader whose watch falls behind a
// compaction must read everything again, never publish without the
// changes it missed. The replica reaches etcd through a proxy; the proxy
// cuts it off while the limit changes, an instance joins and another
// leaves, and etcd is compacted past every revision the leader has seen.
// When the proxy lets it through again, its client resumes the watch of
// providers/ from where it stopped, which etcd no longer has: the watch
// ends with ErrCompacted, the publisher reloads, and it publishes the
// split of the new limit over the instances live now.
//
// The session TTL (30 s) outlives the cut, so the replica stays the
// leader throughout: the reload comes from the watch, which the log shows,
// not from a new term.
func TestPublisherReloadsAfterCompaction(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	px := netcut.StartProxy(t, strings.TrimPrefix(srv.Endpoints()[0], "http://"))
	r := startReplica(t, nil, "r1", "--etcd-endpoints", px.URL(), "--session-ttl", "30s")
	// i-b's leaving mark is written during the gap and lost with it: the
	// reloaded leader holds i-b's grant for the fail_static, short here.
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", "100", "--fail-static", "1s", "--server", r.url())
	addInstance(t, cli, "pay", "i-a")
	addInstance(t, cli, "pay", "i-b")
	want := map[string]int64{"i-a": 50, "i-b": 50}
	waitShares(t, cli, "pay", "the even split of 2 instances", func(s schema.Shares) bool { return maps.Equal(s.Shares, want) })
	instancesOf(t, cli, "pay").settled(t)

	px.Cut()
	// The changes, straight to etcd: the admin API's replica is cut off.
	cliOK(t, "set", "pay", "--limit", "300", "--fail-static", "1s", "--etcd-endpoints", srv.Endpoints()[0])
	addInstance(t, cli, "pay", "i-c")
	instancesOf(t, cli, "pay").leave("i-b")
	resp, err := cli.Get(ctxT(t), "/unrelated")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctxT(t), resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	mark := r.log.Len()
	px.Heal()

	want = map[string]int64{"i-a": 150, "i-c": 150}
	sh := waitShares(t, cli, "pay", "the split of the new limit over i-a and i-c", func(s schema.Shares) bool {
		return s.Total == 300 && maps.Equal(s.Shares, want)
	})
	if sh.Leader != "r1" {
		t.Errorf("published by %q, want r1", sh.Leader)
	}
	log := r.log.From(mark)
	reloaded := false
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `msg="publisher: reloading state from etcd"`) && strings.Contains(line, rpctypes.ErrCompacted.Error()) {
			reloaded = true
		}
	}
	if !reloaded {
		t.Errorf("the publisher did not reload on the compacted watch; log since the cut:\n%s", log)
	}
	if terms := r.metricValue(t, "configd_leader_terms_total"); terms != "1" {
		t.Errorf("configd_leader_terms_total %s, want 1: the reload came with a new term", terms)
	}
}

// TestEmbeddedEtcdCompacts: the embedded etcd discards revisions older
// than --embedded-compaction-retention while the leader keeps publishing.
func TestEmbeddedEtcdCompacts(t *testing.T) {
	clientURL, peerURL, dir := "http://"+freeAddr(t), "http://"+freeAddr(t), t.TempDir()
	r := startReplica(t, nil, "solo", "--data-dir", dir, "--embedded-client-url", clientURL,
		"--embedded-peer-url", peerURL, "--embedded-compaction-retention", "1s")
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", "10", "--server", r.url())
	cli := embeddedClient(t, clientURL, dir, rootUser)
	addInstance(t, cli, "pay", "i-1") // share records are written for live instances only
	first, err := cli.Get(ctxT(t), keys.Config("pay"))
	if err != nil {
		t.Fatal(err)
	}
	old := first.Header.Revision
	// The periodic compactor compacts only when the revision moved.
	waitFor(t, 20*time.Second, "revision "+itoa(old)+" compacted", func() bool {
		if _, err := cli.Put(context.Background(), "/unrelated/filler", "x"); err != nil {
			t.Fatal(err)
		}
		_, err := cli.Get(context.Background(), keys.Config("pay"), clientv3.WithRev(old))
		return errors.Is(err, rpctypes.ErrCompacted)
	})
	cliOK(t, "set", "pay", "--limit", "20", "--server", r.url())
	waitShares(t, cli, "pay", "shares of the new limit", func(s schema.Shares) bool { return s.Total == 20 })
}
