package sim

import (
	"flag"
	"math/rand/v2"
	"testing"
)

var (
	searchN    = flag.Int("sim.n", 300, "TestSearch: random scenarios to run (a tenth of them with -short or -race, unless set)")
	searchSeed = flag.Uint64("sim.seed", 0, "TestSearch: run this seed only")
)

// TestSearch draws random scenarios and checks each against the oracle. A
// failure prints the scenario, which `go run ./bench/sim FILE` replays.
func TestSearch(t *testing.T) {
	from, n := rand.Uint64()>>1, *searchN
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "sim.n" })
	switch {
	case *searchSeed != 0:
		from, n = *searchSeed, 1
	case set:
	case testing.Short() || raceEnabled:
		n = max(1, n/10)
	}
	f, tally, err := Search(from, n)
	if err != nil {
		t.Fatal(err)
	}
	if f != nil {
		t.Fatalf("seed %d: %d windows over, by up to %d: %v\nreplay: save this as FILE and run make sim SCENARIO=FILE (or go run ./bench/sim -trace FILE), or go test ./internal/sim -run TestSearch -sim.seed=%d\n%s",
			f.Scenario.Seed, f.Report.Over, f.Report.OverBy, f.Report.Violations, f.Scenario.Seed, f.JSON())
	}
	t.Logf("seeds %d to %d, none over: %v", from, from+uint64(tally.Scenarios)-1, tally)
}

// Every drawn scenario is valid, and drawing is deterministic.
func TestDraw(t *testing.T) {
	for seed := uint64(1); seed <= 2000; seed++ {
		sc := Draw(seed)
		if err := sc.Validate(); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if Draw(seed).JSONEqual(sc) == false {
			t.Fatalf("seed %d drew two different scenarios", seed)
		}
	}
}
