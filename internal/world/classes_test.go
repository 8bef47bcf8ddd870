package world

import "testing"

// TestCriticalKeepsItsReserve: histories whose provider reserves 30% of
// the limit for critical, wanted on about half the members, under the
// usual faults: once they end, the members that want critical keep, and
// are admitted, its reserve or what they want of it, the smaller.
func TestCriticalKeepsItsReserve(t *testing.T) {
	live := 0
	for seed := uint64(8001); seed <= 8060; seed++ {
		r := Run(Config{Seed: seed, Loss: 0.05, Refuse: 0.03, Critical: 3000})
		if len(r.Violations) > 0 {
			t.Fatalf("%v\nreplay: go test -run '^TestCriticalKeepsItsReserve$' -v ./internal/world (seed %d)", r, r.Seed)
		}
		if r.Live {
			live++
		}
	}
	if live < 30 {
		t.Errorf("the liveness check, and with it the classes', ran in %d of 60 histories", live)
	}
}
