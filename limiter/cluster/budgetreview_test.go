package cluster

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// TestBudgetSettleAfterCloseIsOverdrawn: a call in flight
// when its instance leaves (Group.Close during a graceful shutdown)
// settles above what it was charged. Close gave the limiter's room back
// to the counter; Settle then takes the excess from that very room (the
// closed limiter's window is still "open" for Settle), so it is neither
// counted in the counter nor in Stats.Overdrawn, and another instance
// spends the same permits again: the window admits more than the limit
// with Overdrawn 0 everywhere.
func TestBudgetSettleAfterCloseIsOverdrawn(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	budgetProvider(t, cli, 100)
	ctx := context.Background()
	opts := []Option{WithLeaseTTL(time.Second), WithReportInterval(50 * time.Millisecond), WithChangeMargin(10 * time.Millisecond)}
	a, err := JoinProvider(ctx, cli, "api", append(opts, WithID("a"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	g1, err := a.Multi().Acquire(ctx, 10*time.Second, limiter.Cost(limiter.Requests, 20))
	if err != nil {
		t.Fatal(err)
	}
	g2, err := a.Multi().Acquire(ctx, 10*time.Second, limiter.Cost(limiter.Requests, 10))
	if err != nil {
		t.Fatal(err)
	}
	day := a.Members()[1].Limiter().Stats().WindowStart
	took := a.Members()[1].Status().Share
	// The first call cost nothing: its 20 go back to the window.
	if err := g1.Settle(limiter.Cost(limiter.Requests, 0)); err != nil {
		t.Fatal(err)
	}
	a.Close() // gives back what a took and did not spend
	afterClose := counter(t, cli, day)
	// The second call, in flight during Close, answers: it cost 30.
	if err := g2.Settle(limiter.Cost(limiter.Requests, 30)); err != nil {
		t.Fatal(err)
	}
	stA := a.Members()[1].Limiter().Stats()
	t.Logf("a took %d, counter %d after a left; a's budget limiter now: admitted %d, overdrawn %d", took, afterClose, stA.Admitted, stA.Overdrawn)

	// b joins and spends what the counter has left.
	b, err := JoinProvider(ctx, cli, "api", append(opts, WithID("b"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sb := spend(b, false)
	waitFor(t, "b to spend the rest", func() bool { return sb.granted.Load() >= 100-afterClose })
	time.Sleep(300 * time.Millisecond)
	bGot := sb.halt()
	if now := b.Members()[1].Limiter().Stats().WindowStart; !now.Equal(day) {
		t.Skip("the day ended during the test")
	}
	total := stA.Admitted + bGot
	t.Logf("b admitted %d; counter %d; the window's total %d of 100, overdrawn counted: %d", bGot, counter(t, cli, day), total, stA.Overdrawn)
	if total-stA.Overdrawn > 100 {
		t.Fatalf("the day admitted %d of a budget of 100 (a %d after settling, b %d), and Overdrawn counts only %d of the excess", total, stA.Admitted, bGot, stA.Overdrawn)
	}
}

// TestBudgetLaneJoinedForSharesAdmitsNothing: the docs say a Member
// of shares (Join, JoinGroup) refuses a budget's config and admits
// nothing. The refused config is treated as malformed, so the Member
// stays on its fallback, and one with a fallback (WithFallback, or a
// JoinGroup Lane.Fallback, which the operations guide asks for) admits
// it, every window, past the day's budget.
func TestBudgetLaneJoinedForSharesAdmitsNothing(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	budgetProvider(t, cli, 5)
	m := join(t, cli, "api~1", "a", WithFallback(100, time.Second))
	waitFor(t, "the problem listed", func() bool {
		return slices.ContainsFunc(m.Status().Problems, func(p string) bool { return strings.Contains(p, "is a budget's") })
	})
	var n int64
	for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline); {
		if m.Limiter().TryAcquire() {
			n++
		} else {
			time.Sleep(time.Millisecond)
		}
	}
	if n > 0 {
		t.Fatalf("a Member of shares joined to a budget lane (limit 5 a day) admitted %d in 1.5s (status %+v); the docs say it admits nothing", n, m.Status())
	}
}

// TestBudgetInShadowMode: a provider in shadow mode
// ("admit everything; count what would have been refused") with a daily
// budget: the budget's Member never applies the lane config's mode
// (budget.go has no SetShadow), so the budget lane enforces, and
// TryAcquire refuses callers the provider's shadow mode promises to admit.
func TestBudgetInShadowMode(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	sec := schema.Duration(time.Second)
	api := schema.ProviderConfig{Name: "api", Limit: 1000, Window: sec, FailStatic: sec, Mode: schema.ModeShadow,
		Lanes: []schema.Lane{{Lane: 1, Limit: 5, Window: schema.Duration(24 * time.Hour)}}}
	putConfig(t, cli, api)
	putConfig(t, cli, api.Lanes[0].Derive(api.WithDefaults()))
	g, err := JoinProvider(context.Background(), cli, "api", WithID("a"), WithLeaseTTL(time.Second),
		WithReportInterval(50*time.Millisecond), WithChangeMargin(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	waitFor(t, "the first lane in shadow mode, at its even share", func() bool {
		st := g.Members()[0].Limiter().Stats()
		return st.Shadow && st.Quota > 0
	})
	var ok, refused int
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		if _, yes := g.Multi().TryAcquire(); yes {
			ok++
		} else {
			refused++
			time.Sleep(time.Millisecond)
		}
	}
	if refused > 0 {
		t.Fatalf("in shadow mode, %d admitted and %d refused (budget lane: %+v)", ok, refused, g.Members()[1].Limiter().Stats())
	}
}

// movedClock is the real clock moved by d.
type movedClock struct{ d time.Duration }

func (c movedClock) Now() time.Time { return time.Now().Add(c.d) }

// TestBudgetTakesNothingWithTheClockUnknown: with its clock offset unknown
// (a monitor with no NTP answer yet, or none within its staleness), an
// instance's shares are cut to half, "safe with no clock information at
// all" (skew.EnforcedShare; SluiceClockOffsetUnknown: "It enforces half
// its share"). A budget has no such cut and no guard band then: b's clock
// is right at 00:05, a's is ten minutes behind (23:55 yesterday) with its
// monitor unanswered; a takes yesterday's leftovers and spends them in
// today's window of true time, beside b, who spends today's whole budget.
func TestBudgetTakesNothingWithTheClockUnknown(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	budgetProvider(t, cli, 10)
	now := time.Now()
	trueNow := now.UTC().Truncate(24 * time.Hour).Add(24*time.Hour + 5*time.Minute)
	d := trueNow.Sub(now)
	opts := []Option{WithLeaseTTL(time.Second), WithReportInterval(50 * time.Millisecond), WithChangeMargin(10 * time.Millisecond)}
	ntpSrv, mon := startClockMonitor(t, 0)
	ntpSrv.Close() // no answer: the offset is unknown
	a, err := JoinProvider(context.Background(), cli, "api", append(opts, WithID("a"), WithClockMonitor(mon),
		WithLimiterOptions(limiter.WithClock(movedClock{d - 10*time.Minute})))...)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := JoinProvider(context.Background(), cli, "api", append(opts, WithID("b"),
		WithLimiterOptions(limiter.WithClock(movedClock{d})))...)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sa, sb := spend(a, false), spend(b, false)
	time.Sleep(4 * time.Second)
	na, nb := sa.halt(), sb.halt()
	st := a.Members()[0].Status()
	t.Logf("a (clock known %v, lane 0 share %d of total %d) admitted %d in its window from %v; b admitted %d in its window from %v",
		st.ClockKnown, st.Share, st.Total, na, a.Members()[1].Limiter().Stats().WindowStart.UTC(), nb, b.Members()[1].Limiter().Stats().WindowStart.UTC())
	if na+nb > 10 {
		t.Fatalf("one moment of true time (%v) admitted %d of a daily budget of 10 (a %d, b %d)", trueNow, na+nb, na, nb)
	}
}

// TestBudgetAcrossMidnight: two instances spend a budget of 40 as
// the day ends under them (their clocks agree); what each limiter counts
// in the day that closed and in the new one is within that day's counter.
func TestBudgetAcrossMidnight(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	budgetProvider(t, cli, 40)
	now := time.Now()
	midnight := now.UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
	d := midnight.Add(-3500 * time.Millisecond).Sub(now)
	opts := []Option{WithLeaseTTL(time.Second), WithReportInterval(50 * time.Millisecond), WithChangeMargin(10 * time.Millisecond),
		WithLimiterOptions(limiter.WithClock(movedClock{d}))}
	var gs []*Group
	for _, id := range []string{"a", "b"} {
		g, err := JoinProvider(context.Background(), cli, "api", append(opts, WithID(id))...)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		gs = append(gs, g)
	}
	sa, sb := spend(gs[0], true), spend(gs[1], false)
	time.Sleep(2500 * time.Millisecond)
	time.Sleep(3500 * time.Millisecond)
	total := sa.halt() + sb.halt()
	var inNew, inOld int64
	for _, g := range gs {
		st := g.Members()[1].Limiter().Stats()
		if !st.WindowStart.Equal(midnight) {
			t.Fatalf("window %v, want %v", st.WindowStart, midnight)
		}
		cur := st.Quota - st.Remaining
		inNew += cur
		inOld += st.Admitted - cur
	}
	old, nw := counter(t, cli, midnight.Add(-24*time.Hour)), counter(t, cli, midnight)
	t.Logf("granted %d; old day: admitted %d, counter %d; new day: admitted %d, counter %d", total, inOld, old, inNew, nw)
	if inOld > old || inNew > nw || old > 40 || nw > 40 {
		t.Fatalf("old day admitted %d (counter %d), new day %d (counter %d), limit 40", inOld, old, inNew, nw)
	}
}

// TestBudgetProblemGoesWithItsWindow: a malformed counter is
// listed among the Member's problems under its key; the next window's
// counter is another key, and noProblem clears only the key it read, so
// the old window's problem stays listed (sluice_member_malformed_records
// > 0, SluiceMalformedRecords) for the life of the process.
func TestBudgetProblemGoesWithItsWindow(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	budgetProvider(t, cli, 40)
	now := time.Now()
	midnight := now.UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
	d := midnight.Add(-2 * time.Second).Sub(now)
	old := midnight.Add(-24 * time.Hour)
	put(t, cli, keys.Budget("api~1", 24*time.Hour, old.UnixNano()), `{"version":1,"provider":"other","start":`+
		strconv.FormatInt(old.UnixNano(), 10)+`,"window":"24h","taken":1}`)
	g, err := JoinProvider(context.Background(), cli, "api", WithID("a"), WithLeaseTTL(time.Second),
		WithReportInterval(50*time.Millisecond), WithLimiterOptions(limiter.WithClock(movedClock{d})))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	m := g.Members()[1]
	waitFor(t, "the forged counter listed", func() bool { return len(m.Status().Problems) > 0 })
	waitFor(t, "the next day", func() bool { return !m.Limiter().Now().Before(midnight.Add(time.Second)) })
	s := spend(g, false)
	waitFor(t, "a take in the new day", func() bool { return m.Status().Taken > 0 })
	s.halt()
	if p := m.Status().Problems; len(p) > 0 {
		t.Errorf("a day later, with the new day's counter read fine, problems still listed: %q", p)
	}
}
