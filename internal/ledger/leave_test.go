package ledger

import (
	"testing"

	"github.com/sluice-go/sluice/limiter"
)

// TestAHolderThatLeavesReleasesEveryGrant: a holder leaving mid-window
// sets its limiter to admit nothing and releases each of its grants to
// nothing from the next window, the first its limiter governs whole;
// the window under way keeps what it was granted, since it may have
// admitted it.
func TestAHolderThatLeavesReleasesEveryGrant(t *testing.T) {
	const k Keys = "/l/"
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 3}
	a := NewHolder(k, "a")
	store(t, k, NewState(), plan(t, s, p, map[string]int64{"a": 60, "b": 40}, 10), a)
	era := s.Head.Eras[len(s.Head.Eras)-1].Seq

	clk := &fakeClock{StartOf(10, w) + int64(w)/2}
	lim, err := limiter.New(0, w, limiter.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	next, _ := a.Next(clk.t, 0)
	if _, err := Enforce(lim, next, "a", clk.t, clk.t, w); err != nil {
		t.Fatal(err)
	}
	if n := admit(lim, 1000); n != 60 {
		t.Fatalf("admitted %d in window 10, want a's grant of 60", n)
	}

	clk.t = StartOf(11, w) + int64(w)/3
	from, err := Enforce(lim, NewState(), "a", clk.t, clk.t, w)
	if err != nil {
		t.Fatal(err)
	}
	rels := a.Leave(from)
	if len(rels) == 0 {
		t.Fatal("a leaving released nothing")
	}
	for _, r := range rels {
		if r.From != 12 || r.Limit != 0 || r.Holder != "a" {
			t.Errorf("release %+v: want a's grant to 0 from window 12", r)
		}
	}
	if n := admit(lim, 1000); n != 0 {
		t.Errorf("a's limiter admitted %d after it left", n)
	}
	sent, ops, err := a.Unsent()
	if err != nil || len(sent) != len(rels) {
		t.Fatalf("unsent %v, %v: want the %d releases", sent, err, len(rels))
	}
	for _, o := range ops {
		if err := k.Decode(s, o.Key, o.Value); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Allowance("a", era, 11); got != 60 {
		t.Errorf("a's allowance in window 11, under way when it left: %d, want 60", got)
	}
	for _, win := range []int64{12, 13, 14} {
		if got := s.Allowance("a", era, win); got != 0 {
			t.Errorf("a's allowance in window %d after it left: %d, want 0", win, got)
		}
		if got := s.Sum(era, win); got != 40 {
			t.Errorf("window %d holds %d after a left, want b's 40", win, got)
		}
	}
	if again := a.Leave(from); len(again) != 0 {
		t.Errorf("leaving twice released again: %v", again)
	}
}
