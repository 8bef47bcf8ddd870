package main

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/ledger"
	ledgerstore "github.com/sluice-go/sluice/internal/ledger/store"
	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// admitLanes has each group take one request (on every lane) as fast as
// it can until stop is closed, and returns the count admitted per group.
func admitLanes(groups map[string]*cluster.Group, stop <-chan struct{}) func() map[string]int64 {
	var mu sync.Mutex
	n := map[string]int64{}
	var wg sync.WaitGroup
	for id, g := range groups {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, ok := g.Multi().TryAcquire(); ok {
					mu.Lock()
					n[id]++
					mu.Unlock()
				} else {
					time.Sleep(200 * time.Microsecond)
				}
			}
		})
	}
	return func() map[string]int64 { wg.Wait(); mu.Lock(); defer mu.Unlock(); return n }
}

// TestABudgetWaitsForTheLedgerOfItsName: api on the ledger with
// 300/100ms and 100/1s (lane api~1, granted through its ledger); a joins
// and is granted the lane's 100. api is deleted and created again on the
// ledger with 300/100ms and 40/24h: the budget takes lane number 1, whose
// ledger still grants a. The create is refused until those grants end,
// then deletes the ledger with the write; b takes the budget from the
// counter, and a admits nothing more under lane 1.
func TestABudgetWaitsForTheLedgerOfItsName(t *testing.T) {
	srv := etcdtest.Start(t)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	server := "--server=" + r.url()
	itCLI(t, "set", "api", "--limit", "300/100ms", "--limit", "100/1s", "--fail-static", "3s", "--coordination", "ledger", server)
	var alog, blog logbuf.Buffer
	a := joinGroup(t, itClient(t, srv), "a", &alog)
	itWait(t, "a's lane granted the 100/1s through the ledger", func() (bool, string) {
		sum, why := quotas(a.Members()[1])
		return sum == 100 && a.Members()[1].Status().Source == "ledger", why
	})

	itCLI(t, "delete", "api", server)
	create := []string{"set", "api", "--limit", "300/100ms", "--limit", "40/24h", "--fail-static", "3s", "--coordination", "ledger", server}
	if out, err := cliRun(t, create...); err == nil || !strings.Contains(out+err.Error(), "api~1") {
		t.Fatalf("a budget created beside api~1's live grants: %v\n%s; want it refused, naming api~1", err, out)
	}
	itWait(t, "the budget created once api~1's grants ended", func() (bool, string) {
		out, err := cliRun(t, create...)
		return err == nil, fmt.Sprint(err, out)
	})
	b := joinGroup(t, itClient(t, srv), "b", &blog)
	stop := make(chan struct{})
	counts := admitLanes(map[string]*cluster.Group{"a": a, "b": b}, stop)
	time.Sleep(3 * time.Second)
	close(stop)
	n := counts()
	t.Logf("admitted after the 40/24h budget was in force: %v; a's lane %+v; b's lane %+v", n, a.Members()[1].Status(), b.Members()[1].Status())
	if sum := n["a"] + n["b"]; sum > 40 {
		t.Errorf("admitted %d under lane api~1 in the 24h window of a 40/24h budget (a %d, b %d)", sum, n["a"], n["b"])
	}
}

// TestNoStandInForABudget: api on the ledger with 300/100ms and 100/1s;
// a joins (its lane api~1 a ledger Follower). api is deleted and created
// again on the ledger with 300/100ms and 40/24h once api~1's grants end:
// the budget takes lane 1, and a's lane still follows api~1's ledger. b
// joins and takes the budget from the counter; configd stops. a's lane
// must not stand in for configd on api~1: a budget is taken from its
// counter, never granted. The instances' clocks are 20s before midnight
// UTC, so that the next 24h window starts within the test.
func TestNoStandInForABudget(t *testing.T) {
	srv := etcdtest.Start(t)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	server := "--server=" + r.url()
	now := time.Now().UTC()
	midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	clk := shiftedClock{midnight.Add(-20 * time.Second).Sub(now)}
	join := func(id string) *cluster.Group {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
		defer cancel()
		var log logbuf.Buffer
		g, err := cluster.JoinProvider(ctx, itClient(t, srv), "api", cluster.WithID(id), cluster.WithLeaseTTL(time.Second),
			cluster.WithReportInterval(100*time.Millisecond), cluster.WithFallback(0, 100*time.Millisecond),
			cluster.WithLimiterOptions(limiter.WithClock(clk)), cluster.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		return g
	}
	itCLI(t, "set", "api", "--limit", "300/100ms", "--limit", "100/1s", "--fail-static", "1s", "--coordination", "ledger", server)
	a := join("a")
	itWait(t, "a's lane on the ledger", func() (bool, string) {
		st := a.Members()[1].Status()
		return st.Source == "ledger", st.Source
	})
	itCLI(t, "delete", "api", server)
	itWait(t, "api created again with a budget once api~1's grants ended", func() (bool, string) {
		out, err := cliRun(t, "set", "api", "--limit", "300/100ms", "--limit", "40/24h", "--fail-static", "1s", "--coordination", "ledger", server)
		return err == nil, fmt.Sprint(err, out)
	})
	b := join("b")
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("configd stopped at %s (instances' clock)", clk.Now().UTC().Format("15:04:05.000"))

	var mu sync.Mutex
	n := map[int64]map[string]int64{} // per 24h window of the instances' clock
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for id, g := range map[string]*cluster.Group{"a": a, "b": b} {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, ok := g.Multi().TryAcquire(); ok {
					k := clk.Now().UnixNano() / int64(24*time.Hour)
					mu.Lock()
					if n[k] == nil {
						n[k] = map[string]int64{}
					}
					n[k][id]++
					mu.Unlock()
				} else {
					time.Sleep(200 * time.Microsecond)
				}
			}
		})
	}
	time.Sleep(time.Until(midnight.Add(-clk.d)) + 5*time.Second)
	close(stop)
	wg.Wait()
	t.Logf("a's lane %+v; b's lane %+v", a.Members()[1].Status(), b.Members()[1].Status())
	if led := readLedger(t, itClient(t, srv), "api~1"); led != nil {
		t.Logf("api~1's ledger eras: %+v", led.Head.Eras)
	}
	for k, m := range n {
		day := time.Unix(0, k*int64(24*time.Hour)).UTC().Format("2006-01-02")
		t.Logf("day %s: %v", day, m)
		if sum := m["a"] + m["b"]; sum > 40 {
			t.Errorf("day %s: admitted %d under api~1, a budget of 40/24h (a %d through grants the stand-in wrote, b %d from the counter)", day, sum, m["a"], m["b"])
		}
	}
}

// TestAuditShowsABudgetsLedger: a budget's name has no ledger, since its
// create waits for an earlier limit's grants to end; one written there by
// hand is shown by configd audit beside what was taken of the budget.
func TestAuditShowsABudgetsLedger(t *testing.T) {
	srv := etcdtest.Start(t)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	server := "--server=" + r.url()
	itCLI(t, "set", "api", "--limit", "300/100ms", "--limit", "40/24h", "--coordination", "ledger", server)
	cli := itClient(t, srv)
	pb := ledgerstore.NewPublisher(cli, ledger.Keys(keys.Ledger("api~1")), time.Now)
	p := ledger.Policy{Limit: 100, Window: time.Second, Horizon: 10, Keep: 2}
	if _, err := pb.Round(context.Background(), p, map[string]int64{"a.1": 100}); err != nil {
		t.Fatal(err)
	}
	out, _ := cliRun(t, "audit", "api", server)
	if !regexp.MustCompile(`(?m)^api~1 +budget: 0 of 40 taken`).MatchString(out) || !regexp.MustCompile(`(?m)^api~1 +\d+ +\S+ +100 +100 +ok$`).MatchString(out) {
		t.Errorf("configd audit api printed\n%s\nwant api~1's budget and, beside it, the 100 its ledger grants", out)
	}
}
