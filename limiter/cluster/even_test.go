package cluster

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
)

// TestHoldFor: a fallen count is held up for the provider's fail_static,
// the clock bound, and a report interval.
func TestHoldFor(t *testing.T) {
	c := schema.ProviderConfig{Limit: 10, Window: schema.Duration(time.Second), FailStatic: schema.Duration(30 * time.Second)}
	if got, want := holdFor(&c, time.Second), c.HoldAfter(0)+time.Second; got != want || got < 31*time.Second {
		t.Errorf("holdFor = %v, want %v (fail_static 30s, the clock bound, 1s)", got, want)
	}
	if got := holdFor(nil, time.Second); got < schema.DefaultFailStatic+time.Second {
		t.Errorf("holdFor without a config = %v, want at least the default fail_static and the interval", got)
	}
}
