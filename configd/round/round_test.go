package round

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/schema"
)

func TestTargetGrantsHoldersOnly(t *testing.T) {
	cfg := schema.ProviderConfig{Limit: 90, Window: schema.Duration(time.Second), Algorithm: schema.AlgorithmEven}
	live := []schema.InstanceRecord{
		{ID: "a", Holder: "a.1"},
		{ID: "b", Holder: "b.2"},
		{ID: "c"},                               // follows no ledger
		{ID: "d", Holder: "d.3", Leaving: true}, // said it leaves
		{ID: "e", Holder: "e.4"},
	}
	got, _, err := Target(cfg, live)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int64{"a.1": 30, "b.2": 30, "e.4": 30}; !maps.Equal(got, want) {
		t.Errorf("Target = %v, want %v", got, want)
	}
	if got, _, err := Target(cfg, live[2:4]); err != nil || got != nil {
		t.Errorf("Target of no holder = %v, %v; want nothing", got, err)
	}
	cfg.Algorithm = "lottery"
	if _, _, err := Target(cfg, live); err == nil {
		t.Error("Target with an unknown algorithm: no error")
	}
}

func TestHorizonCoversTheFailStatic(t *testing.T) {
	for _, c := range []struct {
		window, failStatic time.Duration
		want               int64
	}{
		{time.Second, 0, 10},                                // the default fail_static, 10s
		{time.Second, 2500 * time.Millisecond, 4},           // at least 4
		{100 * time.Millisecond, 450 * time.Millisecond, 5}, // rounded up
		{time.Minute, time.Hour, 60},
	} {
		cfg := schema.ProviderConfig{Limit: 100, Window: schema.Duration(c.window), FailStatic: schema.Duration(c.failStatic)}
		if got := Horizon(cfg); got != c.want {
			t.Errorf("Horizon(window %v, fail_static %v) = %d, want %d", c.window, c.failStatic, got, c.want)
		}
		if p := Policy(cfg); p.Horizon != c.want || p.Limit != 100 || p.Window != c.window || p.Keep != Keep || p.Slack != 2 {
			t.Errorf("Policy = %+v", p)
		}
	}
}

// TestPolicyPublishesARaiseSpreadOverManyHolders: 100 holders granted
// 9,000 each of 900,000; the limit rises to 1,000,000, 10,000 each. With
// a slack of the whole limit's 2% (20,000 per holder) Plan saw every
// holder within it and wrote nothing: the raise never reached them.
func TestPolicyPublishesARaiseSpreadOverManyHolders(t *testing.T) {
	const w = time.Second
	keys := ledger.Keys("/l/")
	st := ledger.NewState()
	now := ledger.StartOf(1000, w)
	write := func(cfg schema.ProviderConfig, target map[string]int64) int {
		n := 0
		for range 20 { // a publish to many holders takes several changes
			ch, err := ledger.Plan(st, Policy(cfg), target, now)
			if err != nil {
				t.Fatal(err)
			}
			if ch.Empty() {
				return n
			}
			ops, err := keys.Ops(ch)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range ops {
				if err := keys.Decode(st, o.Key, o.Value); err != nil {
					t.Fatal(err)
				}
			}
			n++
		}
		return n
	}
	cfg := schema.ProviderConfig{Limit: 900_000, Window: schema.Duration(w), Algorithm: schema.AlgorithmEven}
	each := func(q int64) map[string]int64 {
		m := map[string]int64{}
		for i := range 100 {
			m[fmt.Sprintf("h%02d.1", i)] = q
		}
		return m
	}
	write(cfg, each(9_000))
	cfg.Limit = 1_000_000
	if n := write(cfg, each(10_000)); n == 0 {
		t.Fatal("the raise to 1,000,000 wrote nothing")
	}
	k := ledger.WindowOf(now, w) + Horizon(cfg)/2
	if got := st.Allowance("h00.1", st.Head.Eras[len(st.Head.Eras)-1].Seq, k); got != 10_000 {
		t.Errorf("h00.1's allowance in window %d after the raise: %d, want 10,000", k, got)
	}
}

// TestTargetHoldsTheClassesReserves: critical reserves 60% of 1,000 and
// wants 400 on each of two instances of four, all of which batch floods:
// the two keep 300 each for critical, and their shares are raised from
// the fair 250 to hold it.
func TestTargetHoldsTheClassesReserves(t *testing.T) {
	cfg := schema.ProviderConfig{Limit: 1000, Window: schema.Duration(time.Second), Algorithm: schema.AlgorithmFair,
		Classes: []schema.Class{{Name: "critical", Reserve: schema.Reserve{Share: 6000}}, {Name: "batch"}}}
	live := []schema.InstanceRecord{
		{ID: "a", Holder: "a.1", Demand: 1400, ClassDemand: map[string]int64{"critical": 400, "batch": 1000}},
		{ID: "b", Holder: "b.2", Demand: 1400, ClassDemand: map[string]int64{"critical": 400, "batch": 1000}},
		{ID: "c", Holder: "c.3", Demand: 1000, ClassDemand: map[string]int64{"batch": 1000}},
		{ID: "d", Holder: "d.4", Demand: 1000, ClassDemand: map[string]int64{"batch": 1000}},
	}
	target, reserves, err := Target(cfg, live)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int64{"a.1": 300, "b.2": 300, "c.3": 200, "d.4": 200}; !maps.Equal(target, want) {
		t.Errorf("Target = %v, want %v", target, want)
	}
	if got := fmt.Sprint(reserves); got != "map[a.1:map[critical:300] b.2:map[critical:300]]" {
		t.Errorf("reserves = %s, want critical 300 on a.1 and b.2", got)
	}
	// Critical goes idle: its reserve is lent, and nobody keeps any.
	for i := range live {
		live[i].ClassDemand["critical"] = 0
	}
	target, reserves, _ = Target(cfg, live)
	if want := map[string]int64{"a.1": 250, "b.2": 250, "c.3": 250, "d.4": 250}; !maps.Equal(target, want) || reserves != nil {
		t.Errorf("with critical idle: Target = %v, reserves %v; want 250 each, none kept", target, reserves)
	}
}
