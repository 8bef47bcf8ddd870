package main

import (
	"strings"
	"testing"
)

// TestRefusalVerdict: refusals by a stub whose own limit is below the
// quota configd gave (a retune to 1200 over a stub of 1000) are the stub's
// configuration, and the verdict says so instead of blaming the limiter
// (issue 13, point 6).
func TestRefusalVerdict(t *testing.T) {
	if v := refusalVerdict(39, "calls", "-limit", 1000, 1200, true); strings.Contains(v, "the limiter let more through") || !strings.Contains(v, "-limit 1000 calls") {
		t.Errorf("retuned above the stub: %q", v)
	}
	if v := refusalVerdict(3, "calls", "-limit", 1000, 800, true); !strings.Contains(v, "the limiter let more through") {
		t.Errorf("within the stub's limit: %q", v)
	}
	if v := refusalVerdict(3, "tokens", "-tokens-limit", 30000, 30000, false); !strings.Contains(v, "30000 tokens per window") {
		t.Errorf("tokens: %q", v)
	}
}
