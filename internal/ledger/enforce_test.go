package ledger

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

type fakeClock struct{ t int64 }

func (c *fakeClock) Now() time.Time { return time.Unix(0, c.t) }

// store writes c's operations into h, as a watch would deliver them, and
// checks no key is written twice (etcd refuses such a transaction).
func store(t *testing.T, k Keys, s *State, c Change, hs ...*Holder) {
	t.Helper()
	ops, err := k.Ops(s, c)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, o := range ops {
		if seen[o.Key] {
			t.Fatalf("%s written twice in one transaction", o.Key)
		}
		seen[o.Key] = true
		for _, h := range hs {
			if err := h.Observe(o.Key, o.Value); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestAHolderEnforcesItsGrantsAndReleasesInTime(t *testing.T) {
	const k Keys = "/l/"
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 3}
	a := NewHolder(k, "a")
	c := plan(t, s, p, map[string]int64{"a": 60, "b": 40}, 10)
	store(t, k, NewState(), c, a)

	clk := &fakeClock{StartOf(10, w) + int64(w)/2}
	lim, err := limiter.New(0, w, limiter.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	next, rels := a.Next(clk.t, 0)
	if len(rels) != 0 {
		t.Fatalf("nothing to release yet, got %v", rels)
	}
	if err := Enforce(lim, next, "a", clk.t, clk.t, w); err != nil {
		t.Fatal(err)
	}
	if n := admit(lim, 1000); n != 60 {
		t.Fatalf("admitted %d in window 10, want a's grant of 60", n)
	}

	// b's share grows: configd publishes a's new 30, and a must release
	// the rest of its 60 before b may have it.
	before := s.Clone()
	c = plan(t, s, p, map[string]int64{"a": 30, "b": 70}, 11)
	store(t, k, before, c, a)
	clk.t = StartOf(11, w) + int64(w)/2
	next, rels = a.Next(clk.t, 0)
	if len(rels) == 0 {
		t.Fatal("a was not asked to release the room b needs")
	}
	if err := Enforce(lim, next, "a", clk.t, clk.t, w); err != nil {
		t.Fatal(err)
	}
	if kept := a.Commit(next, rels, clk.t); len(kept) != len(rels) {
		t.Fatalf("releases from window 12 enforced in window 11: kept %v of %v", kept, rels)
	}
	sent, ops, err := a.Unsent()
	if err != nil || len(sent) != len(rels) || len(ops) != len(rels) || !strings.HasPrefix(ops[0].Key, k.AllReleases()) {
		t.Fatalf("unsent %v, ops %v, err %v", sent, ops, err)
	}
	a.Stored(sent)
	if sent, _, _ := a.Unsent(); len(sent) != 0 {
		t.Fatalf("stored releases still unsent: %v", sent)
	}
	clk.t = StartOf(12, w)
	if n := admit(lim, 1000); n != 30 {
		t.Fatalf("admitted %d in window 12, want what a kept: 30", n)
	}

	// A release enforced only after its window began is not true of that
	// window: it is dropped, and asked for again from a later window.
	late := NewHolder(k, "a")
	store(t, k, NewState(), Change{Head: s.Head, Pubs: pubs(s), Grants: grants(s)}, late)
	next, rels = late.Next(StartOf(11, w), 0)
	if len(rels) == 0 {
		t.Fatal("no release asked")
	}
	if kept := late.Commit(next, rels, StartOf(13, w)); len(kept) != 0 {
		t.Fatalf("kept %v, enforced after its window began", kept)
	}
}

func admit(lim *limiter.Limiter, n int) int {
	got := 0
	for got < n && lim.TryAcquire() {
		got++
	}
	return got
}

func pubs(s *State) []Pub {
	var out []Pub
	for _, p := range s.Pubs {
		out = append(out, p)
	}
	return out
}

func grants(s *State) []Grant { return s.sortedGrants() }
