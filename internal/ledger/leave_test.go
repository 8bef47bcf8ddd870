package ledger

import "testing"

// TestAHolderThatLeavesReleasesEveryGrant: a holder leaving mid-window
// sets its limiter to admit nothing and releases each of its grants to
// nothing from the next window, the first its limiter governs whole;
// the window under way keeps what it was granted, since it may have
// admitted it.
func TestAHolderThatLeavesReleasesEveryGrant(t *testing.T) {
	g := newHolderRig(t)
	k, s, a, era, clk, lim := g.k, g.s, g.a, g.era, g.clk, g.lim

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
