package cluster

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/follow"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestEvenHold: a fallen count is held up for the provider's fail_static,
// the clock bound, and follow.MaxPoll; for a fail_static the Member
// saw replaced by a shorter one, while an instance cut off before the
// change may count with it, and longer by a window of another length it
// may keep (found by review: the split took the whole limit while an
// instance cut off before fail_static was lowered from 10 s to 1 s still
// admitted its share, 150 in a window of 90).
func TestEvenHold(t *testing.T) {
	t0 := time.Now()
	c := schema.ProviderConfig{Limit: 10, Window: schema.Duration(time.Second), FailStatic: schema.Duration(30 * time.Second)}
	v := newView()
	v.config = &c
	if got, want := v.evenHold(t0), c.HoldAfter(0)+follow.CountsValid; got != want || got < 31*time.Second {
		t.Errorf("evenHold = %v, want %v (fail_static 30s, the clock bound, 1s)", got, want)
	}
	if got := newView().evenHold(t0); got < schema.DefaultFailStatic+time.Second {
		t.Errorf("evenHold without a config = %v, want at least the default fail_static and the interval", got)
	}

	lowered := c
	lowered.FailStatic = schema.Duration(time.Second)
	v.noteReplaced(v.config, &lowered, t0, 2*time.Second)
	v.config = &lowered
	if got, want := v.evenHold(t0), lowered.HoldAfter(30*time.Second)+follow.CountsValid; got != want {
		t.Errorf("after fail_static 30s became 1s: evenHold = %v, want %v", got, want)
	}
	shorter := lowered
	shorter.Window = schema.Duration(100 * time.Millisecond)
	v.noteReplaced(v.config, &shorter, t0, 2*time.Second)
	v.config = &shorter
	if got, want := v.evenHold(t0), shorter.HoldAfter(30*time.Second)+time.Second+follow.CountsValid; got != want {
		t.Errorf("after the window became 100ms: evenHold = %v, want %v (and a window of 1s)", got, want)
	}
	if got, want := v.evenHold(t0.Add(3*time.Hour)), shorter.HoldAfter(0)+follow.CountsValid; got != want {
		t.Errorf("3 hours later: evenHold = %v, want %v (the replaced values forgotten)", got, want)
	}
}
