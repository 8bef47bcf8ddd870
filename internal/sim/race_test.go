//go:build race

package sim

// raceEnabled: the race detector slows the simulator about tenfold, so the
// race run of TestSearch draws fewer scenarios (make test runs thousands
// more without it).
const raceEnabled = true
