package round

import (
	"maps"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
)

func TestTargetGrantsHoldersOnly(t *testing.T) {
	cfg := schema.ProviderConfig{Limit: 90, Window: schema.Duration(time.Second), Algorithm: schema.AlgorithmEven}
	live := []schema.InstanceRecord{
		{ID: "a", Holder: "a.1"},
		{ID: "b", Holder: "b.2"},
		{ID: "c"},                               // follows no ledger
		{ID: "d", Holder: "d.3", Leaving: true}, // said it leaves
		{ID: "e", Holder: "e.4"},
	}
	got, err := Target(cfg, live)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int64{"a.1": 30, "b.2": 30, "e.4": 30}; !maps.Equal(got, want) {
		t.Errorf("Target = %v, want %v", got, want)
	}
	if got, err := Target(cfg, live[2:4]); err != nil || got != nil {
		t.Errorf("Target of no holder = %v, %v; want nothing", got, err)
	}
	cfg.Algorithm = "lottery"
	if _, err := Target(cfg, live); err == nil {
		t.Error("Target with an unknown algorithm: no error")
	}
}

func TestHorizonCoversTheFailStatic(t *testing.T) {
	for _, c := range []struct {
		window, failStatic time.Duration
		want               int64
	}{
		{time.Second, 0, 10},                                // the default fail_static, 10s
		{time.Second, 2500 * time.Millisecond, 4},           // at least 4
		{100 * time.Millisecond, 450 * time.Millisecond, 5}, // rounded up
		{time.Minute, time.Hour, 60},
	} {
		cfg := schema.ProviderConfig{Limit: 100, Window: schema.Duration(c.window), FailStatic: schema.Duration(c.failStatic)}
		if got := Horizon(cfg); got != c.want {
			t.Errorf("Horizon(window %v, fail_static %v) = %d, want %d", c.window, c.failStatic, got, c.want)
		}
		if p := Policy(cfg); p.Horizon != c.want || p.Limit != 100 || p.Window != c.window || p.Keep != Keep || p.Slack != 2 {
			t.Errorf("Policy = %+v", p)
		}
	}
}
