package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
)

// TestPrintStatusListsHeldShares: a grant of an instance the shares no
// longer name (its lease expired; held for the fail_static) is listed,
// and nothing is listed when there is none.
func TestPrintStatusListsHeldShares(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	cfg := schema.ProviderConfig{Name: "pay", Limit: 300}.WithDefaults()
	sh := &schema.Shares{Version: 1, Provider: "pay", Generation: 7, Window: schema.Duration(time.Second), Total: 300, Instances: 2,
		Shares:  map[string]int64{"a": 100, "b": 100},
		Granted: map[string]int64{"a": 100, "b": 100, "c": 100, "d": 0},
	}
	for _, tc := range []struct {
		name   string
		shares *schema.Shares
		want   []string
		absent []string
	}{
		{"held", sh, []string{"held:      c 100 (lease expired; reserved for the provider's fail_static)"}, []string{"held:      d", "held:      a"}},
		{"none held", &schema.Shares{Version: 1, Provider: "pay", Generation: 8, Window: schema.Duration(time.Second), Total: 300, Instances: 1,
			Shares: map[string]int64{"a": 300}, Granted: map[string]int64{"a": 300}}, nil, []string{"held:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			printStatus(&b, statusView{Provider: "pay", Config: &cfg, ConfigRevision: 3, Shares: tc.shares}, now)
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("status lacks %q:\n%s", w, b.String())
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(b.String(), a) {
					t.Errorf("status has %q:\n%s", a, b.String())
				}
			}
		})
	}
}
