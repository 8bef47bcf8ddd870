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
// move of a quota is, and so is any part missing of a class owed its
// whole reserve; top-ups reserve nothing.
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
	// A class owed its whole reserve, grown by 1 in all to it (b's part
	// cut to fit its quota of 40: 30): the next publish has it. Short of
	// the whole, the slack forgives it.
	p.Reserves["b"] = map[string]int64{"critical": 60, "default": 20}
	p.ClassReserves = map[string]int64{"critical": 61}
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

// TestAHolderKeepsItsNewestReserve: a holder keeps for each class what
// its newest grant reserves, from the moment it reads it: two classes
// that swap holders keep their whole reserves while the publish that
// swaps them waits to begin. Taking, class by class, the largest part
// of any grant not ended kept 1.6 of b's quota, cut in proportion to
// 250 each; taking the grant in force kept critical's reserve on the
// holder it left until the new publish began.
func TestAHolderKeepsItsNewestReserve(t *testing.T) {
	s := NewState()
	p := Policy{Limit: 1000, Window: w, Horizon: 4, Keep: 3, Slack: 4,
		Reserves: map[string]map[string]int64{"a": {"critical": 400}, "b": {"high": 400}}}
	plan(t, s, p, map[string]int64{"a": 500, "b": 500}, 10) // publish 1: windows 10..14
	p.Reserves = map[string]map[string]int64{"a": {"high": 400}, "b": {"critical": 400}}
	plan(t, s, p, map[string]int64{"a": 500, "b": 500}, 10) // publish 2: from window 15
	for h, want := range map[string]map[string]int64{"a": {"high": 400}, "b": {"critical": 400}} {
		if got, ok := s.Reserves(h, StartOf(12, w)); !ok || !maps.Equal(got, want) {
			t.Errorf("%s keeps %v (ok %v), want %v", h, got, ok, want)
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
