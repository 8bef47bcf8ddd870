package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"
	"testing"
)

// TestGrantsCarryTheClassesReserves: a publish's grants carry the
// policy's reserves, cut in proportion where they add up to more than
// the quota; a move of a reserve past the slack is a new publish, as a
// move of a quota is; top-ups reserve nothing.
func TestGrantsCarryTheClassesReserves(t *testing.T) {
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 3, Slack: 2,
		Reserves: map[string]map[string]int64{"a": {"critical": 30}, "b": {"critical": 60, "default": 20}}}
	plan(t, s, p, map[string]int64{"a": 50, "b": 40}, 10)
	for h, want := range map[string]map[string]int64{"a": {"critical": 30}, "b": {"critical": 30, "default": 10}} {
		if g, _, _ := s.targetGrant(h); !maps.Equal(g.Reserve, want) {
			t.Errorf("%s's grant of %d reserves %v, want %v", h, g.Quota, g.Reserve, want)
		}
	}
	// A reserve split differently within the slack: the open publish
	// stays.
	p.Reserves["a"] = map[string]int64{"critical": 31}
	p.Reserves["b"] = map[string]int64{"critical": 59, "default": 20}
	if c := plan(t, s, p, map[string]int64{"a": 50, "b": 40}, 10); len(c.Pubs) > 0 {
		t.Errorf("a reserve moved by 1 from b to a, within the slack of 2, made a publish: %v", c.Why)
	}
	// A class's reserve grown by 1 in all: the next publish has it.
	p.Reserves["b"] = map[string]int64{"critical": 60, "default": 20}
	if c := plan(t, s, p, map[string]int64{"a": 50, "b": 40}, 10); !strings.Contains(fmt.Sprint(c.Why), "publish 2:") {
		t.Fatalf("critical's reserve grown from 60 to 61 in all made no publish: %v", c.Why)
	}
	// Past it: the next publish carries the new reserve.
	p.Reserves["a"] = map[string]int64{"critical": 10}
	c := plan(t, s, p, map[string]int64{"a": 50, "b": 40}, 15)
	if !strings.Contains(fmt.Sprint(c.Why), "publish 3:") {
		t.Fatalf("a reserve moved from 31 to 10 made no publish: %v", c.Why)
	}
	if g, _, _ := s.targetGrant("a"); g.Reserve["critical"] != 10 {
		t.Errorf("after the publish a reserves %v, want critical 10", g.Reserve)
	}
	// A raise is topped up before the new publish: the top-up reserves
	// nothing of its own.
	plan(t, s, p, map[string]int64{"a": 60, "b": 40}, 16)
	topUps := 0
	for _, g := range s.Grants {
		if s.Pubs[g.Pub].TopUp {
			topUps++
			if len(g.Reserve) > 0 {
				t.Errorf("top-up grant %+v reserves", g)
			}
		}
	}
	if topUps == 0 {
		t.Errorf("a raise of a from 50 to 60 was not topped up")
	}
}

// TestABadReserveDoesNotDecode: reserves that add up to more than the
// quota, are negative, name an empty class or too many classes are not
// a grant.
func TestABadReserveDoesNotDecode(t *testing.T) {
	k := Keys("L/")
	many := map[string]int64{}
	for i := range MaxReserveClasses + 1 {
		many[fmt.Sprintf("c%d", i)] = 1
	}
	for name, r := range map[string]map[string]int64{
		"over the quota": {"critical": 40, "batch": 20},
		"negative":       {"critical": -1},
		"no name":        {"": 1},
		"too many":       many,
	} {
		g := Grant{Pub: 2, Holder: "a.1", Quota: 50, From: 5, Reserve: r}
		if _, err := Encode(g); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Encode(%v) = %v, want ErrInvalid", name, r, err)
		}
		b := fmt.Appendf(nil, `{"pub":2,"holder":"a.1","quota":50,"from":5,"reserve":%s}`, jsonOf(t, r))
		if err := k.Decode(NewState(), k.Grant("a.1", 2), b); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: decoding %s: %v, want ErrInvalid", name, b, err)
		}
	}
}

func jsonOf(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAHolderKeepsTheLargerReserveWhileAPublishTakesOver: a holder keeps
// for a class the largest part any of its grants not ended gives it, so
// the class keeps its whole reserve across the holders while a publish
// that moves it from one holder to another takes over.
func TestAHolderKeepsTheLargerReserveWhileAPublishTakesOver(t *testing.T) {
	s := NewState()
	p := Policy{Limit: 200, Window: w, Horizon: 4, Keep: 3, Slack: 4,
		Reserves: map[string]map[string]int64{"a": {"critical": 60}, "b": {"critical": 40}}}
	plan(t, s, p, map[string]int64{"a": 100, "b": 100}, 10) // publish 1: windows 10..14
	p.Reserves = map[string]map[string]int64{"a": {"critical": 40}, "b": {"critical": 60}}
	plan(t, s, p, map[string]int64{"a": 100, "b": 100}, 10) // publish 2: from window 15
	for _, c := range []struct {
		k    int64
		a, b Kept
	}{
		{12, Kept{60, 100}, Kept{60, 100}}, // both publishes ahead: the larger of each
		{15, Kept{40, 100}, Kept{60, 100}}, // publish 1 ended
	} {
		for h, want := range map[string]Kept{"a": c.a, "b": c.b} {
			got, ok := s.Reserves(h, StartOf(c.k, w))
			if !ok || got["critical"] != want {
				t.Errorf("window %d: %s keeps %v (ok %v), want critical %v", c.k, h, got, ok, want)
			}
		}
	}
	if _, ok := s.Reserves("c", StartOf(12, w)); ok {
		t.Errorf("a holder with no grant keeps a reserve")
	}
}

// TestReservesThatOverflowDoNotDecode: a quota is bounded by MaxInt64
// alone, so the reserves of a grant are summed without overflow: two
// reserves of MaxInt64 on a quota of MaxInt64 are twice the quota.
func TestReservesThatOverflowDoNotDecode(t *testing.T) {
	k := Keys("L/")
	b := []byte(`{"pub":2,"holder":"a.1","quota":9223372036854775807,"from":5,"reserve":{"critical":9223372036854775807,"batch":9223372036854775807}}`)
	s := NewState()
	err := k.Decode(s, k.Grant("a.1", 2), b)
	if !errors.Is(err, ErrInvalid) {
		g := s.Grants[GrantKey{2, "a.1"}]
		var sum float64
		for _, r := range g.Reserve {
			sum += float64(r)
		}
		t.Errorf("grant of quota %d reserving %v (%.3g in all, %.1f× its quota) decoded: %v, want ErrInvalid",
			g.Quota, g.Reserve, sum, sum/math.MaxInt64, err)
	}
	if _, err := Encode(Grant{Pub: 2, Holder: "a.1", Quota: math.MaxInt64, From: 5,
		Reserve: map[string]int64{"critical": math.MaxInt64, "batch": math.MaxInt64}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Encode of such a grant: %v, want ErrInvalid", err)
	}
}
