package main

import (
	"errors"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/configd/alloc"
	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

func records(demand map[string]int64) []schema.InstanceRecord {
	var out []schema.InstanceRecord
	for _, id := range slices.Sorted(maps.Keys(demand)) {
		out = append(out, schema.InstanceRecord{ID: id, Demand: demand[id]})
	}
	return out
}

// fairShares is what alloc.Fair gives on the inputs the publisher builds
// from records with these demands and the default floor.
func fairShares(t testing.TB, total int64, demand map[string]int64) map[string]int64 {
	t.Helper()
	var in []alloc.Instance
	for _, id := range slices.Sorted(maps.Keys(demand)) {
		in = append(in, alloc.Instance{ID: id, Demand: float64(demand[id])})
	}
	shares, err := alloc.Fair(total, alloc.DefaultFloor(total, len(in)), in)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for i, s := range shares {
		out[in[i].ID] = s
	}
	return out
}

// TestAllocate: the adapter picks the config's algorithm, feeds it each
// record's demand and the config's floor (or alloc's default), and keys
// the shares by instance ID.
func TestAllocate(t *testing.T) {
	even := schema.ProviderConfig{Limit: 10, Algorithm: schema.AlgorithmEven}
	demand := map[string]int64{"a": 0, "b": 500, "c": 7}
	cases := []struct {
		name   string
		cfg    schema.ProviderConfig
		demand map[string]int64
		want   map[string]int64
	}{
		// Even ignores demand; the remainder goes to the first IDs.
		{"even 10/3", even, demand, map[string]int64{"a": 4, "b": 3, "c": 3}},
		{"even 2/3", schema.ProviderConfig{Limit: 2, Algorithm: schema.AlgorithmEven}, demand, map[string]int64{"a": 1, "b": 1, "c": 0}},
		{"even, no instances", even, nil, map[string]int64{}},
		// Fair meets small demands in full and gives the rest to the one
		// that wants more; the default floor (1) is below every demand.
		{"fair 300", schema.ProviderConfig{Limit: 300, Algorithm: schema.AlgorithmFair},
			map[string]int64{"i-a": 10, "i-b": 40, "i-c": 1000}, map[string]int64{"i-a": 10, "i-b": 40, "i-c": 250}},
		// The default floor, max(1, 1% of an even share), keeps idle
		// instances at 1; a configured floor raises them.
		{"fair, default floor", schema.ProviderConfig{Limit: 100, Algorithm: schema.AlgorithmFair},
			map[string]int64{"a": 0, "b": 0, "c": 1000}, map[string]int64{"a": 1, "b": 1, "c": 98}},
		{"fair, floor 20", schema.ProviderConfig{Limit: 100, Algorithm: schema.AlgorithmFair, Floor: 20},
			map[string]int64{"a": 0, "b": 0, "c": 1000}, map[string]int64{"a": 20, "b": 20, "c": 60}},
	}
	for _, c := range cases {
		got, err := alloc.Split(c.cfg, records(c.demand))
		if err != nil || !maps.Equal(got, c.want) {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	// The same as alloc.Fair on the same inputs.
	d := map[string]int64{"i-a": 10, "i-b": 40, "i-c": 1000}
	got, _ := alloc.Split(schema.ProviderConfig{Limit: 300, Algorithm: schema.AlgorithmFair}, records(d))
	if want := fairShares(t, 300, d); !maps.Equal(got, want) {
		t.Errorf("allocate %v, alloc.Fair %v", got, want)
	}
	big := map[string]int64{}
	for i := range 97 {
		big["i-"+strconv.Itoa(i)] = int64(i) * 1e9
	}
	for _, algo := range []schema.Algorithm{schema.AlgorithmEven, schema.AlgorithmFair} {
		got, err := alloc.Split(schema.ProviderConfig{Limit: schema.MaxLimit, Algorithm: algo}, records(big))
		if err != nil || sum(got) != schema.MaxLimit || len(got) != 97 {
			t.Errorf("%s at the max limit: sum %d of %d shares, %v", algo, sum(got), len(got), err)
		}
	}
	if _, err := alloc.Split(schema.ProviderConfig{Limit: 1, Algorithm: "lottery"}, records(demand)); !errors.Is(err, alloc.ErrUnknownAlgorithm) {
		t.Errorf("unknown algorithm: %v", err)
	}
}

// TestFairSharesFollowDemand: with algorithm fair, the leader publishes
// exactly what alloc.Fair computes from the demands in the instance
// records; a change of demand publishes a higher generation, not sooner
// than a window after the previous publish; a jitter within the hysteresis
// band publishes nothing. The instances acknowledge (sim), and a move
// reaches the target through the safe handover: the shrinking shares in
// one publish, the growing ones in a later one.
func TestFairSharesFollowDemand(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	r := startReplica(t, srv, "r1")
	const total = 300
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", itoa(total), "--algorithm", "fair", "--server", r.url())
	demand := map[string]int64{"i-a": 10, "i-b": 40, "i-c": 1000}
	leases := map[string]clientv3.LeaseID{}
	for _, id := range slices.Sorted(maps.Keys(demand)) {
		leases[id] = addInstanceDemand(t, cli, "pay", id, demand[id])
	}
	want := fairShares(t, total, demand)
	// Water-filling: i-a and i-b want less than an equal share and get
	// what they want (above the floor of 1); i-c gets the rest.
	if !maps.Equal(want, map[string]int64{"i-a": 10, "i-b": 40, "i-c": 250}) {
		t.Fatalf("alloc.Fair gives %v", want)
	}
	sh := waitShares(t, cli, "pay", "fair shares of 3 instances", func(s schema.Shares) bool {
		return s.Instances == 3 && maps.Equal(s.Shares, want)
	})
	if sum(sh.Shares) > total || sh.Total != total {
		t.Fatalf("shares %v add up to %d of total %d", sh.Shares, sum(sh.Shares), sh.Total)
	}
	checkTiming(t, sh, DefaultPropagationMargin)

	// Demand moves (i-a 10 → 60): i-a's share grows by 50, well past the
	// band of 3 permits, and is published as the next generation, but not
	// sooner than one window after the previous publish (the change comes
	// within milliseconds of it).
	demand["i-a"] = 60
	putDemand(t, cli, "pay", "i-a", leases["i-a"], demand["i-a"])
	want = fairShares(t, total, demand)
	sh2 := waitShares(t, cli, "pay", "shares after the demand change", func(s schema.Shares) bool { return maps.Equal(s.Shares, want) })
	if sh2.Generation <= sh.Generation || sum(sh2.Shares) > total {
		t.Fatalf("after the demand change: generation %d (before %d), shares %v", sh2.Generation, sh.Generation, sh2.Shares)
	}
	// The first generation on the way (i-c shrinks) comes at least a window
	// after the one before (the rate for demand-only changes); the
	// handover's follow-up (i-a grows) no sooner than the shrink takes
	// effect. All take effect on time.
	prev := sh
	// The simulated instances watch etcd on their own: wait until they have
	// seen what waitShares read.
	instancesOf(t, cli, "pay").seen(t, sh2.Generation)
	for _, p := range instancesOf(t, cli, "pay").publications() {
		if p.Generation <= sh.Generation || p.Generation > sh2.Generation {
			continue
		}
		if p.Generation == sh.Generation+1 {
			if gap := p.Published.Sub(prev.Published); gap < prev.Window.D() {
				t.Errorf("generation %d published %v after the previous one, want at least one window (%v)", p.Generation, gap, prev.Window)
			}
		} else if p.Published.Before(prev.EffectiveTime()) {
			t.Errorf("follow-up generation %d published at %v, before generation %d took effect (%v)", p.Generation, p.Published, prev.Generation, prev.EffectiveTime())
		}
		checkTiming(t, p, DefaultPropagationMargin)
		prev = p
	}
	if prev.Generation != sh2.Generation {
		t.Errorf("the sim saw generations up to %d, want %d", prev.Generation, sh2.Generation)
	}

	// Jitter (i-b 40 → 42): i-b and i-c move by 2 permits, within the band
	// (max(1, 300/100) = 3): nothing is published. Let a window pass first,
	// so that only the hysteresis can hold it back.
	waitFor(t, 5*time.Second, "a window since the last publish", func() bool {
		return time.Since(sh2.Published) > sh2.Window.D()
	})
	series := `configd_shares_damped_total{provider="pay",reason="hysteresis"}`
	before, _ := strconv.Atoi(r.metricValue(t, series))
	demand["i-b"] = 42
	putDemand(t, cli, "pay", "i-b", leases["i-b"], demand["i-b"])
	var sh3 schema.Shares
	waitFor(t, 10*time.Second, "the jitter to be damped (or published)", func() bool {
		sh3, _ = readShares(t, cli, "pay")
		n, _ := strconv.Atoi(r.metricValue(t, series))
		return n > before || sh3.Generation != sh2.Generation
	})
	if sh3.Generation != sh2.Generation {
		t.Fatalf("jitter republished: generation %d → %d, shares %v", sh2.Generation, sh3.Generation, sh3.Shares)
	}
	// The next change (a join) is the very next generation: nothing was
	// published in between. The split it leads to is computed from the
	// jittered demand.
	demand["i-d"] = 5
	addInstanceDemand(t, cli, "pay", "i-d", demand["i-d"])
	want = fairShares(t, total, demand)
	sh4 := waitShares(t, cli, "pay", "shares after a join", func(s schema.Shares) bool { return s.Instances == 4 })
	if sh4.Generation != sh2.Generation+1 || sum(sh4.Shares) > total {
		t.Fatalf("after the join: generation %d (want %d), shares %v", sh4.Generation, sh2.Generation+1, sh4.Shares)
	}
	sh5 := waitShares(t, cli, "pay", "the fair split of 4 instances", func(s schema.Shares) bool { return maps.Equal(s.Shares, want) })
	if sum(sh5.Shares) > total {
		t.Fatalf("after the join: shares %v", sh5.Shares)
	}
	instancesOf(t, cli, "pay").checkHandover(t)
}
