package cluster

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// TestTwoClassesThatSwapHoldersKeepTheirReserves: a provider of 1,000
// a second with critical=400 and high=400. Critical's demand is on a,
// high's on b; then they swap (critical floods b, high a, batch both).
// configd's next round moves each reserve to its new holder in a publish
// that begins a horizon later; a member's limiter keeps its newest
// grant's reserves from the moment it reads them, so in every window
// after that round b admits critical its 400 of b's 500.
func TestTwoClassesThatSwapHoldersKeepTheirReserves(t *testing.T) {
	const H = 8
	s := ledger.NewState()
	p := ledger.Policy{Limit: 1000, Window: time.Second, Horizon: H, Keep: 3,
		Reserves: map[string]map[string]int64{"a": {"critical": 400}, "b": {"high": 400}}}
	target := map[string]int64{"a": 500, "b": 500}
	k := int64(100)
	step := func(k int64) ledger.Change {
		c, err := ledger.Plan(s, p, target, ledger.StartOf(k, p.Window))
		if err != nil {
			t.Fatal(err)
		}
		s.Commit(c)
		if vs := ledger.Audit(s); len(vs) > 0 {
			t.Fatal(vs)
		}
		return c
	}
	step(k)
	// The demands swap; configd's next round moves the reserves.
	p.Reserves = map[string]map[string]int64{"a": {"high": 400}, "b": {"critical": 400}}
	k++
	c := step(k)
	t.Logf("round at window %d: %v", k, c.Why)
	for i := range 3 { // more rounds change nothing in the windows before the new publish
		c = step(k + int64(i))
	}

	cfg := &schema.ProviderConfig{Name: "api", Limit: 1000, Window: schema.Duration(time.Second),
		Classes: classesOf(t, "critical=400", "high=400", "batch")}
	critical := limiter.WithClass(context.Background(), "critical")
	batch := limiter.WithClass(context.Background(), "batch")
	var short []int64
	for kk := k + 1; kk <= k+H; kk++ {
		e, _ := s.Head.Current()
		q := s.Allowance("b", e.Seq, kk)
		kept, ok := s.Reserves("b", ledger.StartOf(kk, p.Window))
		cs := memberClasses(cfg, grantReserve{reserve: kept, set: ok})
		lim, err := limiter.New(q, time.Hour, limiter.WithClasses(cs...))
		if err != nil {
			t.Fatal(err)
		}
		// b's callers: batch floods first, then critical floods; b has
		// no high traffic any more.
		var nb int64
		for lim.Acquire(batch, 0) == nil {
			nb++
		}
		var got int64
		for lim.Acquire(critical, 0) == nil {
			got++
		}
		lim.Close()
		if got < 400 {
			short = append(short, kk)
			t.Logf("window %d: b's quota %d, kept %v: batch admitted %d, critical %d (a has no critical demand)", kk, q, kept, nb, got)
		}
	}
	if len(short) > 0 {
		t.Errorf("critical, wanting ≥ 400 across the fleet and reserved 400, is admitted less than 400 in %d windows after the round that moved it (%v), horizon %d",
			len(short), slices.Compact(short), H)
	}
}
