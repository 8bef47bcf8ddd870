package ledger

import (
	"testing"

	"github.com/sluice-go/sluice/limiter"
)

// reservedRig: a holds 60, b 40 of 100 from window 10. a admits its 60
// in window 10 and promises 60 more in window 11 with Reserve (as
// sluice-agent's /v1/reserve does for a remote caller, who calls in
// window 11 whatever its reservation becomes in the process). Then
// configd publishes a 30, b 70: a is asked to release 30 from window 11.
func reservedRig(t *testing.T) (k Keys, s *State, p Policy, a *Holder, clk *fakeClock, lim *limiter.Limiter, r *limiter.Reservation, sync func() []Release) {
	k = "/l/"
	s = NewState()
	p = Policy{Limit: 100, Window: w, Horizon: 4, Keep: 3}
	a = NewHolder(k, "a")
	store(t, k, NewState(), plan(t, s, p, map[string]int64{"a": 60, "b": 40}, 10), a)
	clk = &fakeClock{StartOf(10, w) + int64(w)/2}
	var err error
	lim, err = limiter.New(0, w, limiter.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	// sync is Follower.sync without the I/O.
	sync = func() []Release {
		now := lim.Now().UnixNano()
		next, rels := a.Next(now, 0)
		from, err := Enforce(lim, next, "a", now, now, w)
		if err != nil {
			t.Fatal(err)
		}
		return a.Commit(next, rels, from)
	}
	sync()
	if n := admit(lim, 1000); n != 60 {
		t.Fatalf("admitted %d in window 10, want 60", n)
	}
	r, err = lim.Reserve(60, 2*w)
	if err != nil {
		t.Fatal(err)
	}
	if win := WindowOf(clk.t+int64(r.Delay()), w); win != 11 {
		t.Fatalf("reservation valid in window %d, want 11", win)
	}
	before := s.Clone()
	store(t, k, before, plan(t, s, p, map[string]int64{"a": 30, "b": 70}, 10), a)
	return
}

// TestAReservedWindowIsNotReleasedBySecondSync: the first sync after the
// lowering sees the promise in window 11 and drops the release from 11.
// But its schedule failed the promise, so the next sync (still in window
// 10: Follower syncs on every watch event and tick) sees no promise, keeps
// the release from window 11, and configd hands window 11 to b, where the
// remote caller still calls with its 60.
func TestAReservedWindowIsNotReleasedBySecondSync(t *testing.T) {
	k, s, p, a, clk, lim, r, sync := reservedRig(t)
	era := s.Head.Eras[len(s.Head.Eras)-1].Seq
	if kept := sync(); len(kept) != 0 {
		t.Fatalf("first sync kept %v: the fix should drop the release from window 11", kept)
	}
	if r.Err() == nil {
		t.Logf("reservation still holds: %v", r.Delay())
	}
	clk.t += int64(w) / 10 // still window 10
	kept := sync()
	for _, rel := range kept {
		t.Logf("second sync keeps release %+v", rel)
	}
	_, ops, _ := a.Unsent()
	for _, o := range ops {
		if err := k.Decode(s, o.Key, o.Value); err != nil {
			t.Fatal(err)
		}
	}
	plan(t, s, p, map[string]int64{"a": 30, "b": 70}, 10)
	clk.t = StartOf(11, w) + int64(w)/2
	aLim := int64(admit(lim, 1000))
	remote := int64(60) // the caller told window 11 calls anyway
	b := s.Allowance("b", era, 11)
	t.Logf("window 11: a's limiter admits %d, a's remote caller %d, b's grant %d; reservation err %v", aLim, remote, b, r.Err())
	if total := aLim + remote + b; total > p.Limit {
		t.Errorf("window 11: %d of %d", total, p.Limit)
	}
}

// TestALoweringDoesNotReadmitAReservedWindow: even with one sync, the
// release from window 11 is dropped (so a keeps its grant of 60 there),
// but the schedule a's limiter enforces is the one with the release
// applied: window 11 admits 30 in the process, beside the 60 the failed
// promise's remote caller uses. a uses 90 of a grant of 60.
func TestALoweringDoesNotReadmitAReservedWindow(t *testing.T) {
	_, s, p, _, clk, lim, r, sync := reservedRig(t)
	era := s.Head.Eras[len(s.Head.Eras)-1].Seq
	if kept := sync(); len(kept) != 0 {
		t.Fatalf("first sync kept %v", kept)
	}
	clk.t = StartOf(11, w) + int64(w)/2
	aLim := int64(admit(lim, 1000))
	remote := int64(60)
	grantA := s.Allowance("a", era, 11)
	b := s.Allowance("b", era, 11)
	t.Logf("window 11: a's grant %d, a's limiter admits %d + remote %d; b's grant %d; reservation err %v", grantA, aLim, remote, b, r.Err())
	if aLim+remote > grantA {
		t.Errorf("window 11: a uses %d of its grant of %d; with b's %d: %d of %d", aLim+remote, grantA, b, aLim+remote+b, p.Limit)
	}
}
