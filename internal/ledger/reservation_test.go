package ledger

import (
	"testing"

	"github.com/sluice-go/sluice/limiter"
)

// holderRig is a holding 60 and b 40 of 100 from window 10, a's
// limiter enforcing its grants at the middle of window 10 and filled
// there, as Follower does without the I/O.
type holderRig struct {
	k   Keys
	s   *State
	p   Policy
	a   *Holder
	era int64
	clk *fakeClock
	lim *limiter.Limiter
}

func newHolderRig(t *testing.T) *holderRig {
	t.Helper()
	g := &holderRig{k: "/l/", s: NewState(), p: Policy{Limit: 100, Window: w, Horizon: 4, Keep: 3}}
	g.a = NewHolder(g.k, "a")
	store(t, g.k, NewState(), plan(t, g.s, g.p, map[string]int64{"a": 60, "b": 40}, 10), g.a)
	g.era = g.s.Head.Eras[len(g.s.Head.Eras)-1].Seq
	g.clk = &fakeClock{StartOf(10, w) + int64(w)/2}
	var err error
	if g.lim, err = limiter.New(0, w, limiter.WithClock(g.clk)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.lim.Close() })
	g.sync(t)
	if n := admit(g.lim, 1000); n != 60 {
		t.Fatalf("admitted %d in window 10, want a's grant of 60", n)
	}
	return g
}

// sync is Follower.sync without the I/O: it returns the releases kept.
func (g *holderRig) sync(t *testing.T) []Release {
	t.Helper()
	now := g.lim.Now().UnixNano()
	next, rels := g.a.Next(now, 0)
	from, err := Enforce(g.lim, next, "a", now, now, w)
	if err != nil {
		t.Fatal(err)
	}
	return g.a.Commit(next, rels, from)
}

// stored stores what a has not yet sent.
func (g *holderRig) stored(t *testing.T) {
	t.Helper()
	_, ops, _ := g.a.Unsent()
	for _, o := range ops {
		if err := g.k.Decode(g.s, o.Key, o.Value); err != nil {
			t.Fatal(err)
		}
	}
}

// reserve60 promises 60 in window 11 with Reserve, as sluice-agent's
// /v1/reserve does for a remote caller, who calls in window 11 whatever
// the reservation becomes in the process.
func (g *holderRig) reserve60(t *testing.T) *limiter.Reservation {
	t.Helper()
	r, err := g.lim.Reserve(60, 2*w)
	if err != nil {
		t.Fatal(err)
	}
	if win := WindowOf(g.clk.t+int64(r.Delay()), w); win != 11 {
		t.Fatalf("reservation valid in window %d, want 11", win)
	}
	return r
}

// lowered: a promised 60 in window 11, then configd publishes a 30, b 70:
// a is asked to release 30 from window 11.
func lowered(t *testing.T) (*holderRig, *limiter.Reservation) {
	g := newHolderRig(t)
	r := g.reserve60(t)
	store(t, g.k, g.s.Clone(), plan(t, g.s, g.p, map[string]int64{"a": 30, "b": 70}, 10), g.a)
	return g, r
}

// TestAReservedWindowIsNotReleasedBySecondSync: every sync while the
// promise stands keeps window 11's grant, so configd never hands it to b,
// where the remote caller calls with its 60.
func TestAReservedWindowIsNotReleasedBySecondSync(t *testing.T) {
	g, r := lowered(t)
	if kept := g.sync(t); len(kept) != 0 {
		t.Fatalf("first sync kept %v: want no release from window 11", kept)
	}
	g.clk.t += int64(w) / 10 // still window 10
	if kept := g.sync(t); len(kept) != 0 {
		t.Errorf("second sync kept %v: want no release from window 11", kept)
	}
	g.stored(t)
	plan(t, g.s, g.p, map[string]int64{"a": 30, "b": 70}, 10)
	g.clk.t = StartOf(11, w) + int64(w)/2
	aLim := int64(admit(g.lim, 1000))
	const remote = 60 // the caller told window 11 calls anyway
	b := g.s.Allowance("b", g.era, 11)
	if total := aLim + remote + b; total > g.p.Limit {
		t.Errorf("window 11: a's limiter admits %d, its remote caller %d, b's grant %d: %d of %d (reservation: %v)", aLim, remote, b, total, g.p.Limit, r.Err())
	}
}

// TestALoweringDoesNotReadmitAReservedWindow: a keeps its grant of 60 in
// window 11, and its limiter admits nothing there beside the 60 promised.
func TestALoweringDoesNotReadmitAReservedWindow(t *testing.T) {
	g, r := lowered(t)
	if kept := g.sync(t); len(kept) != 0 {
		t.Fatalf("first sync kept %v", kept)
	}
	g.clk.t = StartOf(11, w) + int64(w)/2
	aLim := int64(admit(g.lim, 1000))
	const remote = 60
	if grant := g.s.Allowance("a", g.era, 11); aLim+remote > grant {
		t.Errorf("window 11: a uses %d of its grant of %d (reservation: %v)", aLim+remote, grant, r.Err())
	}
}

// TestALeaveKeepsTheWindowsOfReservations: a holder that promised 60 in
// window 11 leaves in window 10. The caller calls then whatever happens in
// the process, so Leave must release nothing in that window, or configd
// may grant it to others beside the caller's 60.
func TestALeaveKeepsTheWindowsOfReservations(t *testing.T) {
	g := newHolderRig(t)
	g.reserve60(t)
	g.clk.t += int64(w) / 4 // still window 10
	from, err := Enforce(g.lim, NewState(), "a", g.clk.t, g.clk.t, w)
	if err != nil {
		t.Fatal(err)
	}
	rels := g.a.Leave(from)
	g.stored(t)
	if held := g.s.Allowance("a", g.era, 11); held < 60 {
		t.Errorf("window 11: a keeps %d of its grant after leaving (releases %v), but its caller calls with 60 there", held, rels)
	}
}
