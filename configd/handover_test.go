package main

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
)

func TestBoundsFollowAcknowledgements(t *testing.T) {
	w := time.Second
	from := time.Unix(100, 0)
	cur := &schema.Shares{
		Generation: 5, EffectiveFrom: from.UnixNano(), Window: schema.Duration(w), Total: 100,
		Shares:  map[string]int64{"a": 50, "b": 0},
		Granted: map[string]int64{"a": 100, "b": 0},
	}
	live := map[string]schema.InstanceRecord{
		"a":   {ID: "a", AppliedGeneration: 5},
		"b":   {ID: "b", AppliedGeneration: 4},
		"new": {ID: "new"},
	}
	before := bounds(cur, live, from.Add(-time.Millisecond))
	if before["a"] != 100 {
		t.Errorf("acknowledged but not yet in effect: bound %d, want the grant 100", before["a"])
	}
	after := bounds(cur, live, from)
	if after["a"] != 50 || after["b"] != 0 || after["new"] != 0 {
		t.Errorf("bounds in effect = %v, want a 50, b 0, new 0", after)
	}
	live["a"] = schema.InstanceRecord{ID: "a", AppliedGeneration: 4}
	if b := bounds(cur, live, from.Add(time.Hour)); b["a"] != 100 {
		t.Errorf("not acknowledged: bound %d, want the grant 100 however late", b["a"])
	}
}
