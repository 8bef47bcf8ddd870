package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/follow"
)

// A growth that reaches an instance after its boundary applies in the
// window under way (follow.Schedule) only when what it grows into was
// free for all of that window. Each scenario has a configd whose clock is
// a minute behind from 40 s on, so that every boundary it publishes then
// has passed on the instances' clocks, and 30 s windows, in which each instance spends its
// share at the window's start. Growing every late record at once goes
// over the limit in both; the real rules do not.
func TestLateGrowth(t *testing.T) {
	base := `"seed": 3, "limit": 300, "window": "30s", "duration": "150s", "warmup": "30s",
		"algorithm": "even", "admissions": "bunched", "lease_ttl": "2s",
		"groups": [{"name": "a", "count": 3, "demand": 300}],
		"events": [{"at": "40s", "kind": "configd-clock", "offset": "-60s"}, `
	cases := []struct {
		name, events string
		// Over the limit when every late record grows at once (the
		// member's rule without Settled), and when the leader frees a gone
		// instance's grant at once, as it did before late records grew at
		// once (the leader's rule without the hold).
		naiveOver, noHoldOver bool
	}{
		// An instance crashes 5 s into a window, its key goes 2 s later,
		// and the other two are given its share: configd holds it for a
		// window and twice the clock bound first (schema.Settle).
		{"crash", `{"at": "65s", "kind": "crash", "group": "a", "count": 1}]`, false, true},
		// An instance restarts 5 s into a window and registers again
		// before its lease ends; its new process is given the share its
		// old one spent in the window: it registered after the window
		// began, so the record waits for the next boundary.
		{"restart", `{"at": "65s", "kind": "restart", "group": "a", "count": 1, "down": "1s"}]`, true, false},
	}
	naive := func(prev, next follow.Applied, cur follow.InForce, at, now int64, margin time.Duration) follow.Step {
		if next.Settled != 0 {
			next.Settled = 1 // whatever it grows into was free long ago
		}
		return follow.Schedule(prev, next, cur, at, now, margin)
	}
	wait := func(prev, next follow.Applied, cur follow.InForce, at, now int64, margin time.Duration) follow.Step {
		next.Settled = 0 // unknown: from the next boundary
		return follow.Schedule(prev, next, cur, at, now, margin)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sc, err := ParseScenario(strings.NewReader(`{"name": "late-growth-` + c.name + `", ` + base + c.events + `}`))
			if err != nil {
				t.Fatal(err)
			}
			r, err := Run(sc)
			if err != nil {
				t.Fatal(err)
			}
			if r.Over != 0 {
				t.Errorf("real rules: %d windows over the limit (most %d of %d)", r.Over, r.MaxAdmitted, r.MaxLimit)
			}
			n, err := (&Sim{Scenario: sc, Schedule: naive}).Run()
			if err != nil {
				t.Fatal(err)
			}
			if over := n.Over != 0; over != c.naiveOver {
				t.Errorf("growing every late record at once: %d windows over (most %d of %d), want over: %v", n.Over, n.MaxAdmitted, n.MaxLimit, c.naiveOver)
			}
			h, err := (&Sim{Scenario: sc, noHold: true}).Run()
			if err != nil {
				t.Fatal(err)
			}
			if over := h.Over != 0; over != c.noHoldOver {
				t.Errorf("without the leader's hold: %d windows over, want over: %v", h.Over, c.noHoldOver)
			}
			// Growing no late record at once, the hold is not needed.
			o, err := (&Sim{Scenario: sc, noHold: true, Schedule: wait}).Run()
			if err != nil {
				t.Fatal(err)
			}
			if o.Over != 0 {
				t.Errorf("growing no late record at once, without the hold: %d windows over", o.Over)
			}
			t.Logf("windows over the limit: real %d, every late growth at once %d (most %d of %d), no hold %d (most %d of %d)",
				r.Over, n.Over, n.MaxAdmitted, n.MaxLimit, h.Over, h.MaxAdmitted, h.MaxLimit)
		})
	}
}
