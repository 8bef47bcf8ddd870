package sim

import (
	"strings"
	"testing"
)

// Regression scenarios for the protocol holes an independent review found
// (issue 12, holes 7 and 8), each run over several seeds with the real
// code: none may put any aligned window over what the oracle allows.

func runSeeds(t *testing.T, js string, seeds int) {
	t.Helper()
	sc, err := ParseScenario(strings.NewReader(js))
	if err != nil {
		t.Fatal(err)
	}
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		sc.Seed = seed
		r, err := Run(sc)
		if err != nil {
			t.Fatal(err)
		}
		if r.Over != 0 {
			t.Fatalf("seed %d: %d windows over, by up to %d: %v", seed, r.Over, r.OverBy, r.Violations)
		}
	}
}

// Hole 7: configd's clock was trusted blindly. 1.3–1.9 s behind with 1 s
// windows, it published shrinks whose boundary had already passed; an
// instance applied its shrink after admitting its old share, and configd
// then grew another from a boundary also past: 41.5% over in those
// windows.
func TestHoleConfigdClockBehind(t *testing.T) {
	runSeeds(t, `{
		"name": "configd-behind", "limit": 1000, "duration": "60s", "admissions": "bunched",
		"configd_clock": "-1900ms",
		"groups": [
			{"name": "a", "count": 1, "demand": 900},
			{"name": "b", "count": 1, "demand": 50},
			{"name": "rest", "count": 4, "demand": 10}
		],
		"events": [
			{"at": "15s", "kind": "demand", "group": "b", "demand": 900},
			{"at": "15s", "kind": "demand", "group": "a", "demand": 50},
			{"at": "30s", "kind": "demand", "group": "a", "demand": 900},
			{"at": "30s", "kind": "demand", "group": "b", "demand": 50},
			{"at": "40s", "kind": "configd-clock", "offset": "-1300ms"},
			{"at": "45s", "kind": "demand", "group": "b", "demand": 900},
			{"at": "45s", "kind": "demand", "group": "a", "demand": 50}
		]
	}`, 20)
}

// Hole 8: a longer window bypassed the acknowledgements. After the window
// went from 1 s to 10 s at the same rate, the leader counted the old per-1 s
// shares against the new per-10 s total and grew everyone at once; an
// instance that received the record late kept its per-1 s share for a
// whole 10 s window: 16,000 admitted in a 10 s window of limit 10,000.
func TestHoleLongerWindow(t *testing.T) {
	runSeeds(t, `{
		"name": "longer-window", "limit": 1000, "duration": "60s", "admissions": "bunched",
		"publish_delay": {"min": "2ms", "max": "1500ms"},
		"groups": [
			{"name": "a", "count": 2, "demand": 600},
			{"name": "b", "count": 2, "demand": 100}
		],
		"events": [
			{"at": "19750ms", "kind": "limit", "limit": 10000, "window": "10s"},
			{"at": "25s", "kind": "demand", "group": "b", "demand": 6000},
			{"at": "49750ms", "kind": "limit", "limit": 1000, "window": "1s"}
		]
	}`, 20)
}
