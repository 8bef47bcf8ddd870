package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/netcut"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// TestLimitChangeKeepsAHold: 60 per 1 s, a and b 30 each, fail_static
// 5 s. a is cut off; its key goes and configd holds its 30. The operator
// lowers the limit to 59: the publish that starts the change of regime
// has the held instance's grant only in Before.Granted, and its record
// must keep it. Found by an adversarial review: publisher.records wrote
// no record for a, so its grant and, in heldGrants, its hold went, and b
// grew to 59 at once while a still admitted 30: 89 in a 1 s window of 60.
func TestLimitChangeKeepsAHold(t *testing.T) {
	const W = time.Second
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	r := startReplica(t, srv, "r1")
	cliOK(t, "set", "api", "--coordination", "shares", "--limit", "60", "--window", "1s", "--fail-static", "5s", "--algorithm", "even", "--server", r.url())
	px := netcut.StartProxy(t, strings.TrimPrefix(srv.Endpoints()[0], "http://"))
	pcli, err := clientv3.New(clientv3.Config{Endpoints: []string{px.URL()}, DialTimeout: time.Second, Logger: zap.NewNop(), DialOptions: cluster.DialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pcli.Close() })
	bcli := etcdClient(t, srv)
	joinM := func(c *clientv3.Client, id string) *cluster.Member {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		m, err := cluster.Join(ctx, c, "api", cluster.WithID(id), cluster.WithLeaseTTL(time.Second),
			cluster.WithReportInterval(100*time.Millisecond), cluster.WithFallback(0, W),
			cluster.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	a := joinM(pcli, "a")
	b := joinM(bcli, "b")
	waitFor(t, 20*time.Second, "a and b enforcing 30", func() bool {
		return a.Limiter().Stats().Quota == 30 && b.Limiter().Stats().Quota == 30 && a.Status().Source == "shares" && b.Status().Source == "shares"
	})
	px.Cut()
	waitFor(t, 10*time.Second, "a's key gone", func() bool {
		resp, err := cli.Get(context.Background(), keys.Instance("api", "a"))
		return err == nil && len(resp.Kvs) == 0
	})
	horizon := a.Status().AdmitsUntil
	cliOK(t, "set", "api", "--limit", "59", "--window", "1s", "--fail-static", "5s", "--algorithm", "even", "--server", r.url())
	waitFor(t, 10*time.Second, "b enforcing more than 30", func() bool { return b.Limiter().Stats().Quota > 30 })
	for {
		n := b.Limiter().Now()
		if n.Sub(n.Truncate(W)) < 100*time.Millisecond {
			break
		}
		time.Sleep(time.Millisecond)
	}
	start := b.Limiter().Now().Truncate(W)
	var got int64
	for _, m := range []*cluster.Member{a, b} {
		if q := m.Limiter().Stats().Quota; m.Limiter().TryAcquireN(q) {
			got += q
		}
	}
	end := b.Limiter().Now().Truncate(W)
	t.Logf("admitted %d in the window at %s (a admits until %s)", got, start.Format("15:04:05.000"), horizon.Format("15:04:05.000"))
	if start.Equal(end) && start.Before(horizon) && got > 60 {
		t.Errorf("admitted %d in the 1 s window at %s, bound 60; a (held, cut off) admits until %s\n%s", got, start.Format("15:04:05.000"),
			horizon.Format("15:04:05.000"), grepLines(r.log.String(), "shares published"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func etcdClient(t *testing.T, srv *etcdtest.Server) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop(), DialOptions: cluster.DialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
