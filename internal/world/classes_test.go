package world

import "testing"

// TestCriticalKeepsItsReserve: histories whose provider reserves 30% of
// the limit for critical, wanted on about half the members, under the
// usual faults: in every window, a member refused critical was admitted
// the reserve its grants keep; once the faults end, the members that
// want critical keep, and are admitted, its reserve or what they want of
// it, the smaller.
func TestCriticalKeepsItsReserve(t *testing.T) {
	live, checked := 0, 0
	for seed := uint64(8001); seed <= 8060; seed++ {
		r := Run(Config{Seed: seed, Loss: 0.05, Refuse: 0.03, Critical: 3000})
		if len(r.Violations) > 0 {
			t.Fatalf("%v\nreplay: go test -run '^TestCriticalKeepsItsReserve$' -v ./internal/world (seed %d)", r, r.Seed)
		}
		if r.Live {
			live++
		}
		checked += r.ClassWindows
	}
	if live < 30 {
		t.Errorf("the liveness check, and with it the classes', ran in %d of 60 histories", live)
	}
	// About 44 a history at these seeds: critical is refused in a few
	// windows of every member that wants more of it than its part.
	if checked < 60*10 {
		t.Errorf("the class check checked %d windows in 60 histories: critical is hardly ever refused", checked)
	}
	t.Logf("60 histories: %d members' windows that refused critical checked against their grants' reserve", checked)
}
