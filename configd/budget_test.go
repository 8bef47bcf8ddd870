package main

import (
	"context"
	"regexp"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// shiftedClock is the real clock moved by d: the instances of the test
// live at 03:00 UTC tomorrow, when a 12h window and a 24h one start
// together.
type shiftedClock struct{ d time.Duration }

func (c shiftedClock) Now() time.Time { return time.Now().Add(c.d) }

// TestBudgetProviderCreatedAgain: configd delete leaves a budget's last
// counters (a provider created again the same day, with the same window,
// counts what was taken). One created again with its lane 1 a budget of
// another window reads counters of its own window: found by review, it
// found the old counter at its window's key, refused it as malformed,
// and admitted nothing for the whole window (12 hours).
func TestBudgetProviderCreatedAgain(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	inst := srv.Client(t)
	keys := schema.DefaultKeys()
	ctx := context.Background()
	now := time.Now().UTC()
	at := time.Date(now.Year(), now.Month(), now.Day()+1, 3, 0, 0, 0, time.UTC)
	clk := shiftedClock{at.Sub(now)}
	join := func(id string) *cluster.Group {
		t.Helper()
		g, err := cluster.JoinProvider(ctx, inst, "llm", cluster.WithID(id), cluster.WithLeaseTTL(2*time.Second),
			cluster.WithReportInterval(100*time.Millisecond), cluster.WithLimiterOptions(limiter.WithClock(clk)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		return g
	}

	cliOK(t, "set", "llm", "--coordination", "shares", "--limit", "100/1s", "--limit", "50/24h", "--server", r.url())
	a := join("a")
	if _, err := a.Multi().Acquire(ctx, 20*time.Second, limiter.Cost(limiter.Requests, 7)); err != nil {
		t.Fatal(err)
	}
	a.Close()
	cliOK(t, "delete", "llm", "--server", r.url())
	resp, err := inst.Get(ctx, keys.Budgets("llm~1"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 1 {
		t.Errorf("after configd delete llm, %d counters of llm~1 (%v), want its one", resp.Count, err)
	}

	// Created again; its budget is now per 12 hours (a new provider: lane 1).
	cliOK(t, "set", "llm", "--coordination", "shares", "--limit", "100/1s", "--limit", "30/12h", "--server", r.url())
	b := join("b")
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := b.Multi().Acquire(actx, 5*time.Second, limiter.Cost(limiter.Requests, 1)); err != nil {
		st := b.Members()[1].Status()
		t.Fatalf("the provider created again admits nothing of its 12h budget: %v\nlane status: source %q, taken %d, problems %q, last error %q", err, st.Source, st.Taken, st.Problems, st.LastError)
	}
}

// TestDeletedBudgetLaneReleased: a replica that took over after a budget
// was used releases the lane provider when it is deleted. Found by review:
// its full load counted the budget's counters among the provider's keys
// (the watch does not), and they stay after a delete, so it held the
// owner key of a provider that no longer exists, for good.
func TestDeletedBudgetLaneReleased(t *testing.T) {
	for _, take := range []bool{true, false} {
		t.Run(map[bool]string{true: "with a counter", false: "without"}[take], func(t *testing.T) { deletedLane(t, take) })
	}
}

func deletedLane(t *testing.T, take bool) {
	srv := etcdtest.Start(t)
	r1 := startReplica(t, srv, "r1")
	inst := srv.Client(t)
	keys := schema.DefaultKeys()
	ctx := context.Background()
	cliOK(t, "set", "llm", "--limit", "100/1s", "--limit", "50/24h", "--server", r1.url())
	if take {
		g, err := cluster.JoinProvider(ctx, inst, "llm", cluster.WithID("a"), cluster.WithLeaseTTL(time.Second),
			cluster.WithReportInterval(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := g.Multi().Acquire(ctx, 20*time.Second, limiter.Cost(limiter.Requests, 3)); err != nil {
			t.Fatal(err)
		}
		g.Close()
	}
	if err := r1.stop(); err != nil {
		t.Fatal(err)
	}
	r2 := startReplica(t, srv, "r2")
	waitFor(t, 20*time.Second, "r2 to lead", r2.leading)
	owned := func(name string) bool {
		resp, err := inst.Get(ctx, keys.Owner(name))
		return err == nil && len(resp.Kvs) > 0
	}
	waitFor(t, 20*time.Second, "r2 to own llm~1", func() bool { return owned("llm~1") })
	cliOK(t, "delete", "llm", "--server", r2.url())
	waitFor(t, 20*time.Second, "r2 to release llm~1", func() bool { return !owned("llm~1") })
}

// TestLoneLimitChangesABudgetsWindow: a lone --limit that changes a
// budget's window makes it another limit, with a lane of its own. Found
// by review: the store refused it with an error about lane numbers, which
// a CLI user never gives.
func TestLoneLimitChangesABudgetsWindow(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	cliOK(t, "set", "llm", "--limit", "100/1s", "--limit", "tokens=50000/24h", "--server", r.url())
	if _, err := cliRun(t, "set", "llm", "--limit", "tokens=1000/1m", "--server", r.url()); err != nil {
		t.Fatalf("changing the window of the tokens budget with a lone --limit: %v", err)
	}
	get := cliOK(t, "get", "llm", "--server", r.url())
	if !regexp.MustCompile(`(?m)^more_limits:\s+tokens=1000/1m$`).MatchString(get) {
		t.Errorf("get after the change:\n%s", get)
	}
}

// TestBudgetOnTheEmbeddedEtcd: a budget taken with the instances'
// credentials on configd's embedded etcd (authentication on), and what
// status says of it.
func TestBudgetOnTheEmbeddedEtcd(t *testing.T) {
	dir := t.TempDir()
	clientURL, peerURL := "http://"+freeAddr(t), "http://"+freeAddr(t)
	// Sessions and leases far longer than the test needs: an embedded etcd
	// with authentication, under -race on 2 shared cores, stalled past a
	// 2 s session (the replica lost its lead and the take waited out the
	// test's bound). Nothing here depends on a lease running out.
	r := startReplica(t, nil, "solo", "--data-dir", dir, "--embedded-client-url", clientURL, "--embedded-peer-url", peerURL,
		"--session-ttl", "15s")
	cliOK(t, "set", "llm", "--limit", "100/1s", "--limit", "50/24h", "--server", r.url())
	ctx := ctxT(t)
	inst := embeddedClient(t, clientURL, dir, instanceUser)
	g, err := cluster.JoinProvider(ctx, inst, "llm", cluster.WithID("a"), cluster.WithLeaseTTL(15*time.Second),
		cluster.WithReportInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Multi().Acquire(ctx, 20*time.Second, limiter.Cost(limiter.Requests, 3)); err != nil {
		t.Fatalf("acquire: %v (budget lane %+v)", err, g.Members()[1].Status())
	}
	g.Close()
	if status := cliOK(t, "status", "llm", "--server", r.url()); !regexp.MustCompile(`budget:\s+[1-9]\d* of 50 taken`).MatchString(status) {
		t.Errorf("status does not say what was taken of the budget:\n%s", status)
	}
}
