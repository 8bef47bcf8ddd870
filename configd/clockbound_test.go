package main

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/configd/round"
	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/ledger"
	ledgerstore "github.com/sluice-go/sluice/internal/ledger/store"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestABudgetWaitsForTheOldMembersClockBound: api on the ledger with
// 300/100ms and a lane of 100/1s, max_clock_offset 10s: a member of lane
// api~1 whose clock is off by up to 10s enforces its whole grant, so on
// true time it may admit under it until 10s past its last window. The
// lane's era records that bound (Era.Bound), so when api is deleted and
// created again with a 40/24h budget on lane 1 and no max_clock_offset,
// the budget waits for twice that past the grants' end, not for the new
// config's bound.
func TestABudgetWaitsForTheOldMembersClockBound(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	var mu sync.Mutex
	clk := time.Now()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clk }
	set := func(t time.Time) { mu.Lock(); clk = t; mu.Unlock() }
	s := &store{cli: cli, keys: keys, now: now}

	old := schema.ProviderConfig{Name: "api", Limit: 300, Window: schema.Duration(100 * time.Millisecond),
		Coordination: schema.CoordinationLedger, MaxClockOffset: schema.Duration(10 * time.Second),
		Lanes: []schema.Lane{{Limit: 100, Window: schema.Duration(time.Second)}}}
	if _, err := s.put(ctxT(t), old, 0, "test"); err != nil {
		t.Fatal(err)
	}
	lane := schema.LaneName("api", 1)
	if b := old.Lanes[0].Derive(old).ClockBound(); b != 10*time.Second {
		t.Fatalf("the old lane's members keep a clock bound of %v, want 10s", b)
	}
	lk := ledger.Keys(keys.Ledger(lane))
	pb := ledgerstore.NewPublisher(cli, lk, now)
	p := round.Policy(old.Lanes[0].Derive(old)) // as configd's rounds write it
	for i := 0; i < 10; i++ {
		ch, err := pb.Round(ctxT(t), p, map[string]int64{"a.1": 100})
		if err != nil && !errors.Is(err, ledgerstore.ErrMoved) {
			t.Fatal(err)
		}
		if err == nil && ch.Empty() {
			break
		}
	}
	st, _, _, _, err := ledgerstore.Read(ctxT(t), cli, lk)
	if err != nil {
		t.Fatal(err)
	}
	k, ok := st.End(1)
	if !ok {
		t.Fatal("nothing granted on api~1")
	}
	end := time.Unix(0, ledger.StartOf(k+1, time.Second))
	t.Logf("api~1 grants a.1 100/1s until %s (true time)", end.Format("15:04:05.000"))

	if _, err := s.remove(ctxT(t), "api", anyRevision, "test"); err != nil {
		t.Fatal(err)
	}
	budget := schema.ProviderConfig{Name: "api", Limit: 300, Window: schema.Duration(100 * time.Millisecond),
		Coordination: schema.CoordinationLedger,
		Lanes:        []schema.Lane{{Limit: 40, Window: schema.Duration(24 * time.Hour)}}}
	set(end.Add(-time.Second))
	if _, err := s.put(ctxT(t), budget, anyRevision, "test"); !errors.Is(err, ErrRecordsLeft) {
		t.Fatalf("the budget created before api~1's grants end: %v; want ErrRecordsLeft", err)
	}
	set(end.Add(time.Second))
	_, err = s.put(ctxT(t), budget, anyRevision, "test")
	if err == nil {
		t.Errorf("the 40/24h budget on api~1 accepted at %s, 1s past its ledger's last window: a member of the old lane with a clock 10s behind (within its max_clock_offset) admits under its grant until %s",
			now().Format("15:04:05.000"), end.Add(10*time.Second).Format("15:04:05.000"))
	} else {
		t.Logf("refused: %v", err)
	}
}
