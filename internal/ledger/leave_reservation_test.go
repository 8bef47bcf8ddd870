package ledger

import (
	"testing"

	"github.com/sluice-go/sluice/limiter"
)

// TestALeaveKeepsTheWindowsOfReservations: a holder's limiter has handed
// out a reservation (limiter.Reserve, as sluice-agent's /v1/reserve does,
// returning delay_ms to a remote caller) valid in the next window; the
// holder then leaves. The caller calls then whatever happens in the
// process, so Leave must release nothing in that window, or configd may
// grant it to others beside the caller's 60.
func TestALeaveKeepsTheWindowsOfReservations(t *testing.T) {
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
		t.Fatalf("admitted %d in window 10, want 60", n)
	}
	r, err := lim.Reserve(60, 2*w)
	if err != nil {
		t.Fatal(err)
	}
	ready := clk.t + int64(r.Delay())
	win := WindowOf(ready, w)
	t.Logf("reservation of 60 handed out, valid in %v (window %d)", r.Delay(), win)

	clk.t += int64(w) / 4 // still window 10
	from, err := Enforce(lim, NewState(), "a", clk.t, clk.t, w)
	if err != nil {
		t.Fatal(err)
	}
	rels := a.Leave(from)
	_, ops, _ := a.Unsent()
	for _, o := range ops {
		if err := k.Decode(s, o.Key, o.Value); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("releases %v; the reservation now: delay %v, err %v", rels, r.Delay(), r.Err())
	// The room configd counts free in window win once the releases land.
	free := p.Limit - s.Sum(era, win)
	if held := s.Allowance("a", era, win); held < 60 {
		t.Errorf("window %d: a's callers hold a reservation of 60 there, handed out before it left, but a's grants keep %d of it; configd may grant the %d it counts free to others: up to %d of %d",
			win, held, free, s.Sum(era, win)+free+60-held, p.Limit)
	}
}
