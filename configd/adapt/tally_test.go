package adapt

import (
	"testing"
	"time"
)

// TestTally: a pushback is counted once however often its record is read,
// a restarted instance counts from zero, what the fleet sends is each
// instance's quota or demand, whichever is less, and the remaining is the
// least said in the provider's last window that ended.
func TestTally(t *testing.T) {
	w := time.Second
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var ta Tally
	a := Report{ID: "a", Started: at(0), Pushbacks: 5, Enforced: 300, Demand: 500}
	b := Report{ID: "b", Started: at(0), Pushbacks: 2, Enforced: 300, Demand: 100}
	if _, ok := ta.Round(at(1000), w, []Report{a, b}); ok {
		t.Fatal("the first round counted: it only takes the baselines")
	}
	a.Pushbacks, b.Pushbacks = 12, 2
	r, ok := ta.Round(at(1500), w, []Report{a, b})
	if !ok || r.Pushbacks != 7 || r.Sent != 400 || r.HasRemaining {
		t.Fatalf("second round: %+v (ok %v), want 7 pushbacks, 400 sent, no remaining", r, ok)
	}
	r, _ = ta.Round(at(2000), w, []Report{a, b})
	if r.Pushbacks != 0 {
		t.Errorf("the same records read again: %d pushbacks, want 0", r.Pushbacks)
	}
	// b restarts: its 3 are all new. a's record says two windows' ends;
	// only the latest counts, with c's (40 ms apart) the least of it.
	b = Report{ID: "b", Started: at(2100), Pushbacks: 3, Enforced: 300, Demand: 400, RetryUntil: at(3000)}
	a.Remaining, a.RemainingAt = 80, at(3000)
	c := Report{ID: "c", Started: at(0), Remaining: 30, RemainingAt: at(3040)}
	d := Report{ID: "d", Started: at(0), Remaining: 5, RemainingAt: at(2000)}
	r, _ = ta.Round(at(3500), w, []Report{a, b, c, d})
	if r.Pushbacks != 3 || r.Sent != 600 || !r.RetryUntil.Equal(at(3000)) {
		t.Errorf("after b's restart: %+v, want 3 pushbacks, 600 sent, retry until 3 s", r)
	}
	if !r.HasRemaining || r.Remaining != 30 || !r.RemainingAt.Equal(at(3040)) {
		t.Errorf("remaining %d (%v) at %v, want 30 of the window that ended at 3.04 s", r.Remaining, r.HasRemaining, r.RemainingAt.Sub(t0))
	}
}
