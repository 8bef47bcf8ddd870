package world

import (
	"testing"
	"time"
)

// TestAdaptiveHistoriesWithSmallTransactions: an adaptive limit over
// publishes larger than a transaction. TestHistories never plays the two
// together (adaptive when seed%3 == 1, 3 to 10 operations a transaction
// when seed%3 == 2): the controller probes every other round, each probe
// a new target, and a publish written ahead over more rounds than that
// is never written.
func TestAdaptiveHistoriesWithSmallTransactions(t *testing.T) {
	for seed := uint64(1); seed <= 60; seed++ {
		cfg := Config{Seed: seed, Loss: 0.05, Refuse: 0.03, Adaptive: true, MaxOps: 3}
		if seed%4 == 3 {
			cfg.ApplyLag = 400 * time.Millisecond // as TestHistories does
		}
		if r := Run(cfg); len(r.Violations) > 0 {
			t.Fatalf("%v\nreplay: go test -run '^TestHistories$' ./internal/world -world.n=1 -world.seed=%d -world.adaptive -world.maxops=3 -v", r, r.Seed)
		}
	}
}
