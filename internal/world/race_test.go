//go:build race

package world

// raceEnabled: the race detector slows the world about tenfold, so the
// race run of TestHistories plays a tenth of the histories (make test
// plays thousands more without it).
const raceEnabled = true
