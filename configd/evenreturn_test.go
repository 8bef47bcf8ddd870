package main

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/internal/netcut"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// evenCounter has Members take every permit they can and counts the
// admissions per aligned window of w.
type evenCounter struct {
	w     time.Duration
	mu    sync.Mutex
	count map[int64]int64
	done  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
}

func newEvenCounter(t *testing.T, w time.Duration) *evenCounter {
	c := &evenCounter{w: w, count: map[int64]int64{}, done: make(chan struct{})}
	t.Cleanup(c.halt)
	return c
}

func (c *evenCounter) halt() { c.once.Do(func() { close(c.done) }); c.wg.Wait() }

func (c *evenCounter) take(m *cluster.Member) {
	c.wg.Go(func() {
		for {
			select {
			case <-c.done:
				return
			default:
			}
			if m.Limiter().TryAcquire() {
				c.mu.Lock()
				c.count[time.Now().UnixNano()/int64(c.w)]++
				c.mu.Unlock()
			} else {
				time.Sleep(time.Millisecond)
			}
		}
	})
}

func joinAPI(t *testing.T, cli *clientv3.Client, id string, log *logbuf.Buffer, opts ...cluster.Option) *cluster.Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
	defer cancel()
	opts = append([]cluster.Option{cluster.WithID(id), cluster.WithLeaseTTL(time.Second), cluster.WithReportInterval(100 * time.Millisecond),
		cluster.WithFallback(0, 100*time.Millisecond), cluster.WithLogger(slog.New(slog.NewTextHandler(log, nil)))}, opts...)
	m, err := cluster.Join(ctx, cli, "api", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestConfigdReturnsBesideACutOffEvenShare: a real configd gives
// a, alone, the whole limit (40). configd goes; e joins during the outage
// and, after its hold, a and e split the limit evenly (20 each). e is then
// cut off from etcd — it keeps its even share until min(lease end,
// CountsValid + fail_static past its last count). configd comes back: a
// switches back to configd's last record for it, 40, from a boundary a
// change margin ahead (follow.Schedule's switch assumes every instance
// switches within the margin; e cannot). The new leader counts e at 0 (no
// record names it), and only shrinks a at the next publish's boundary.
// Found by review: 60 in windows of 40; a growth on the way back from the
// even split now waits the even split's hold (follow.Returned).
func TestConfigdReturnsBesideACutOffEvenShare(t *testing.T) {
	const w = 100 * time.Millisecond
	srv := etcdtest.Start(t)
	r1 := itServe(t, srv, "r1", "--propagation-margin", "200ms")
	itWait(t, "r1 leads", func() (bool, string) { return r1.leading(), "not yet" })
	itCLI(t, "set", "api", "--coordination", "shares", "--limit", "40", "--window", w.String(), "--fail-static", "1s", "--server="+r1.url())

	var alog, elog logbuf.Buffer
	acli := itClient(t, srv)
	a := joinAPI(t, acli, "a", &alog)
	itWait(t, "a on configd's 40", func() (bool, string) {
		st := a.Status()
		return st.Source == "shares" && st.Share == 40 && a.Limiter().Stats().Quota == 40, ""
	})

	if err := r1.stop(); err != nil { // configd gone
		t.Fatal(err)
	}
	itWait(t, "a on the even split", func() (bool, string) { st := a.Status(); return st.Source == "even" && st.Share == 40, "" })

	px := netcut.StartProxy(t, strings.TrimPrefix(srv.Endpoints()[0], "http://"))
	ecli, err := clientv3.New(clientv3.Config{Endpoints: []string{px.URL()}, DialTimeout: time.Second, Logger: zap.NewNop(), DialOptions: cluster.DialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ecli.Close() })
	e := joinAPI(t, ecli, "e", &elog, cluster.WithLeaseTTL(10*time.Second))
	itWait(t, "a and e at half each", func() (bool, string) {
		return a.Status().Share == 20 && a.Limiter().Stats().Quota == 20 && e.Status().Share == 20 && e.Limiter().Stats().Quota == 20, ""
	})

	c := newEvenCounter(t, w)
	c.take(a)
	c.take(e)
	time.Sleep(5 * w)
	px.Cut() // e partitioned, on its even share
	t.Logf("e cut off; admits until %s", e.Status().AdmitsUntil.Format("15:04:05.000"))
	itServe(t, srv, "r2", "--propagation-margin", "200ms") // configd back
	itWait(t, "a on configd's shares", func() (bool, string) { return a.Status().Source == "shares", "" })
	// Watched until e admits no more, and some windows after.
	time.Sleep(time.Until(e.Status().AdmitsUntil) + 5*w)
	c.halt()
	for k, n := range c.count {
		if n > 40 {
			t.Errorf("window %s admitted %d of 40", time.Unix(0, k*int64(w)).Format("15:04:05.000"), n)
		}
	}
	if t.Failed() {
		t.Logf("a: %+v\ne: %+v", a.Status(), e.Status())
		t.Logf("a's log:\n%s\ne's log:\n%s", alog.String(), elog.String())
	}
}

// TestFirstLimitKeepsItsDimension: a provider with requests
// first and a tokens lane (api~1). An instance joined with JoinProvider
// enforces both. An operator PUTs the same two limits with tokens first:
// NumberLanes gives the requests limit a new lane and retires lane 1 (the
// tokens lane the instance enforces), whose config becomes "the largest
// limit there is"; the primary config now counts tokens, which the
// instance's first lane (requests) refuses, keeping its last good config.
// Nothing the running instance enforces binds tokens any more (found by
// review: 1,000 tokens in windows of 100; the first limit now keeps its
// dimension, schema.ProviderConfig.NumberLanes).
func TestFirstLimitKeepsItsDimension(t *testing.T) {
	const w = 100 * time.Millisecond
	srv := etcdtest.Start(t)
	r1 := itServe(t, srv, "r1", "--propagation-margin", "200ms")
	itWait(t, "r1 leads", func() (bool, string) { return r1.leading(), "not yet" })
	put := func(body string) {
		code, _, out := hostRequest(t, "PUT", r1.url()+"/v1/providers/api", r1.addr, "", body)
		if code != 200 {
			t.Fatalf("PUT %s: %d %s", body, code, out)
		}
	}
	put(`{"limit": 1000, "window": "100ms", "lanes": [{"dimension": "tokens", "limit": 100, "window": "100ms"}]}`)

	var log logbuf.Buffer
	cli := itClient(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
	defer cancel()
	g, err := cluster.JoinProvider(ctx, cli, "api", cluster.WithID("a"), cluster.WithLeaseTTL(time.Second), cluster.WithReportInterval(100*time.Millisecond),
		cluster.WithFallback(0, w), cluster.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	itWait(t, "a enforcing 100 tokens", func() (bool, string) {
		ms := g.Members()
		return len(ms) == 2 && ms[1].Limiter().Stats().Quota == 100, ""
	})

	var mu sync.Mutex
	tokens := map[int64]int64{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, ok := g.Multi().TryAcquire(limiter.Cost("tokens", 1)); ok {
				mu.Lock()
				tokens[time.Now().UnixNano()/int64(w)]++
				mu.Unlock()
			} else {
				time.Sleep(time.Millisecond)
			}
		}
	})
	time.Sleep(5 * w)
	put(`{"dimension": "tokens", "limit": 100, "window": "100ms", "lanes": [{"limit": 1000, "window": "100ms"}]}`)
	time.Sleep(3 * time.Second)
	close(done)
	wg.Wait()
	for k, n := range tokens {
		if n > 100 {
			t.Errorf("window %s admitted %d tokens of 100", time.Unix(0, k*int64(w)).Format("15:04:05.000"), n)
		}
	}
	if t.Failed() {
		for _, m := range g.Members() {
			t.Logf("%s: %+v quota %d", m.Provider(), m.Status(), m.Limiter().Stats().Quota)
		}
	}
}
