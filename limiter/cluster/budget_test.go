package cluster

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// budgetProvider writes provider api of 1,000 requests per second and,
// as its lane 1, a budget of limit requests per day, as configd does.
func budgetProvider(t *testing.T, cli *clientv3.Client, limit int64) schema.ProviderConfig {
	t.Helper()
	sec := schema.Duration(time.Second)
	api := schema.ProviderConfig{Name: "api", Limit: 1000, Window: sec, FailStatic: sec,
		Lanes: []schema.Lane{{Lane: 1, Limit: limit, Window: schema.Duration(24 * time.Hour)}}}
	putConfig(t, cli, api)
	putConfig(t, cli, api.Lanes[0].Derive(api.WithDefaults()))
	return api
}

// counter reads the budget's counter for the window that starts at start.
func counter(t *testing.T, cli *clientv3.Client, start time.Time) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, keys.Budget("api~1", 24*time.Hour, start.UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return 0
	}
	r, err := schema.DecodeBudgetRecord(resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return r.Taken
}

// spender acquires from a Group's Multi until stopped, counting what it
// was granted in the budget's window.
type spender struct {
	granted atomic.Int64
	stop    chan struct{}
	wg      sync.WaitGroup
}

func spend(g *Group, try bool) *spender {
	s := &spender{stop: make(chan struct{})}
	s.wg.Go(func() {
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			var err error
			if try {
				if _, ok := g.Multi().TryAcquire(); !ok {
					err = limiter.ErrTimeout
					time.Sleep(time.Millisecond) // a caller that comes back later
				}
			} else {
				_, err = g.Multi().Acquire(context.Background(), 50*time.Millisecond)
			}
			if err == nil {
				s.granted.Add(1)
			} else if errors.Is(err, limiter.ErrClosed) {
				return
			}
		}
	})
	return s
}

func (s *spender) halt() int64 {
	close(s.stop)
	s.wg.Wait()
	return s.granted.Load()
}

// TestBudgetNeverPassesItsLimit: three instances spend a day's budget of
// 600 as fast as their per-second limit lets them; one leaves and comes
// back as a new process, one is cut off from etcd for a while; then the
// limit is lowered below what was taken. All the instances together never
// admit more than the counter says was taken, the counter never says more
// than the limit, nobody takes more once the limit is lowered, the budget
// is spent, and each Close gives back what its instance took and did not
// spend.
func TestBudgetNeverPassesItsLimit(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	budgetProvider(t, cli, 600)
	opts := []Option{WithLeaseTTL(time.Second), WithReportInterval(50 * time.Millisecond), WithChangeMargin(10 * time.Millisecond)}
	joinAs := func(id string, c *clientv3.Client) *Group {
		g, err := JoinProvider(context.Background(), c, "api", append(opts, WithID(id))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		if lims := g.Multi().Limits(); len(lims) != 2 || lims[1].Window != 24*time.Hour {
			t.Fatalf("%s's limits %v, want a day's budget beside the second's", id, lims)
		}
		return g
	}
	px, offCli := cutOffable(t, srv)
	a, b, c := joinAs("a", cli), joinAs("b", cli), joinAs("c", offCli)
	day := a.Members()[1].Limiter().Stats().WindowStart
	sa, sb, sc := spend(a, true), spend(b, false), spend(c, true)

	// b leaves mid-window: what it took and did not spend goes back.
	waitFor(t, "b to spend", func() bool { return sb.granted.Load() >= 50 })
	bGot := sb.halt()
	if took := b.Members()[1].Status().Share; took < bGot {
		t.Fatalf("b admitted %d of the budget and took %d", bGot, took)
	}
	b.Close()
	// It comes back as a new process, which takes from what is left.
	b2 := joinAs("b2", cli)
	sb2 := spend(b2, false)
	// c is cut off from etcd for a while: it takes nothing meanwhile.
	px.Cut()
	waitFor(t, "c to see etcd gone", func() bool { return !c.Members()[1].Status().Connected })
	px.Heal()

	spent := func() int64 { return sa.granted.Load() + bGot + sb2.granted.Load() + sc.granted.Load() }
	// A take on its way when c was cut off may land with its answer lost:
	// taken for all, spent by none (under the full suite on 2 cores one
	// did, 49 of 600).
	unknown := func() int64 {
		var n int64
		for _, g := range []*Group{a, b, b2, c} {
			n += g.Members()[1].budgetUnknown.Load()
		}
		return n
	}
	deadline := time.Now().Add(20 * time.Second)
	for spent() < 600-3*4-unknown() { // each may hold a few
		if time.Now().After(deadline) {
			t.Fatalf("spent %d of 600 (a %d, b %d, b2 %d, c %d); counter %d; a %+v; b2 %+v; c %+v", spent(), sa.granted.Load(), bGot, sb2.granted.Load(), sc.granted.Load(),
				counter(t, cli, day), a.Members()[1].Status(), b2.Members()[1].Status(), c.Members()[1].Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := a.Members()[1].Status(); got.Source != "budget" || got.Total != 600 || got.Taken > 600 {
		t.Errorf("a's budget lane status %+v, want source budget, total 600, taken at most that", got)
	}
	// Lowered below what was taken: nobody takes any more, and the
	// instances spend what they took.
	budgetProvider(t, cli, 1)
	taken := counter(t, cli, day)
	waitFor(t, "the instances to spend what they took", func() bool { return spent() >= taken-unknown() })
	total := sa.halt() + bGot + sb2.halt() + sc.halt()
	if now := a.Members()[1].Limiter().Stats().WindowStart; !now.Equal(day) {
		t.Skipf("the day ended during the test (%v, then %v): its counts are of two windows", day, now)
	}
	lost := unknown()
	if total > taken || total+lost < taken || taken > 600 || counter(t, cli, day) != taken {
		t.Fatalf("admitted %d, counter %d when the limit was lowered (%d taken with an unknown outcome), %d now, limit 600", total, taken, lost, counter(t, cli, day))
	}
	// Every instance leaves: nothing to give back.
	for _, g := range []*Group{a, b2, c} {
		g.Close()
	}
	if got := counter(t, cli, day); got < total || got > total+lost {
		t.Errorf("counter %d after every instance left, want the %d admitted (and up to %d taken with an unknown outcome)", got, total, lost)
	}
}

// TestBudgetCloseGivesBack: an instance that took more than it spent
// gives the rest back when it leaves, and a new one takes it.
func TestBudgetCloseGivesBack(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	budgetProvider(t, cli, 100)
	opts := []Option{WithID("a"), WithLeaseTTL(time.Second), WithReportInterval(50 * time.Millisecond), WithChangeMargin(10 * time.Millisecond)}
	a, err := JoinProvider(context.Background(), cli, "api", opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// One waiter for 30 takes 30 and more; it spends 30.
	if _, err := a.Multi().Acquire(context.Background(), 10*time.Second, limiter.Cost(limiter.Requests, 30)); err != nil {
		t.Fatal(err)
	}
	day := a.Members()[1].Limiter().Stats().WindowStart
	// A take is counted in etcd before the member's status says so: wait
	// until the two agree.
	var took int64
	waitFor(t, "a's status and the counter to agree", func() bool {
		took = a.Members()[1].Status().Share
		return counter(t, cli, day) == took
	})
	if took < 30 {
		t.Fatalf("a took %d for 30, the counter says %d", took, counter(t, cli, day))
	}
	a.Close()
	if got := counter(t, cli, day); got != 30 {
		t.Errorf("counter %d after a left, want the 30 it spent", got)
	}
}

// TestBudgetLaneRefusesShares: a budget lane's provider joined as a
// provider of shares (Join, JoinGroup) admits nothing and says why, and
// configd's JoinProvider is named.
func TestBudgetLaneRefusesShares(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	budgetProvider(t, cli, 600)
	m := join(t, cli, "api~1", "a")
	waitFor(t, "the problem listed", func() bool {
		return slices.ContainsFunc(m.Status().Problems, func(p string) bool {
			return strings.Contains(p, "is a budget's") && strings.Contains(p, "JoinProvider")
		})
	})
	if q := m.Limiter().Stats().Quota; q != 0 {
		t.Errorf("a budget joined as shares enforces %d, want 0", q)
	}
}

// TestBudgetGrant: what a take gets of what it wants.
func TestBudgetGrant(t *testing.T) {
	for _, c := range []struct{ want, need, left, got int64 }{
		{0, 0, 100, 0},
		{10, 0, 100, 10},
		{50, 0, 100, 25},  // a quarter of what is left
		{50, 40, 100, 40}, // what waiters need now
		{50, 40, 30, 30},  // never more than left
		{10, 0, 0, 0},
		{10, 0, -5, 0},
		{3, 0, 1, 1},
	} {
		if got := budgetGrant(c.want, c.need, c.left); got != c.got {
			t.Errorf("budgetGrant(want %d, need %d, left %d) = %d, want %d", c.want, c.need, c.left, got, c.got)
		}
	}
}
