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

// crossing is a limiter whose clock passes a boundary while Enforce
// sets it: before its change when before is set, else just after it.
// What it admits meanwhile counts, as other goroutines would take it.
type crossing struct {
	*limiter.Limiter
	clk      *fakeClock
	to       int64
	before   bool
	admitted int
}

func (c *crossing) SetSchedule(steps []limiter.Step, expiry time.Time) error {
	if c.before {
		c.clk.t = c.to
	}
	err := c.Limiter.SetSchedule(steps, expiry)
	c.clk.t = c.to
	c.admitted += admit(c.Limiter, 1000)
	return err
}

// A holder lowers its grant from window 11 by a release and the room goes
// to another holder; it enforces its schedule at the very end of window
// 10, and the boundary passes during the call. Window 11 must get 30, not
// window 10's 60.
func TestEnforceLetsTheLimiterPickThePieceByItsClock(t *testing.T) {
	for _, before := range []bool{true, false} {
		t.Run(map[bool]string{true: "boundary before the change", false: "boundary after it"}[before], func(t *testing.T) {
			const k Keys = "/l/"
			s := NewState()
			p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 3}
			a := NewHolder(k, "a")
			store(t, k, NewState(), plan(t, s, p, map[string]int64{"a": 60, "b": 40}, 10), a)
			old := s.Clone()
			store(t, k, old, plan(t, s, p, map[string]int64{"a": 30, "b": 70}, 10), a)

			clk := &fakeClock{StartOf(10, w) + int64(w)/2}
			lim, err := limiter.New(0, w, limiter.WithClock(clk))
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			next, rels := a.Next(clk.t, 0)
			if err := Enforce(lim, next, "a", clk.t, clk.t, w); err != nil {
				t.Fatal(err)
			}
			if kept := a.Commit(next, rels, clk.t); len(kept) == 0 {
				t.Fatal("a released nothing of its 60")
			}
			for _, r := range rels {
				s.Apply(r)
			}
			plan(t, s, p, map[string]int64{"a": 30, "b": 70}, 10)
			if got := s.Allowance("b", 1, 11); got != 70 {
				t.Fatalf("b holds %d in window 11, want 70", got)
			}

			clk.t = StartOf(11, w) - 1
			c := &crossing{Limiter: lim, clk: clk, to: StartOf(11, w) + 1, before: before}
			next, _ = a.Next(clk.t, 0)
			if err := Enforce(c, next, "a", clk.t, clk.t, w); err != nil {
				t.Fatal(err)
			}
			c.admitted += admit(lim, 1000)
			if c.admitted != 30 {
				t.Errorf("a admitted %d in window 11, where the ledger gives it 30 (and b 70 of the limit of 100)", c.admitted)
			}
		})
	}
}
