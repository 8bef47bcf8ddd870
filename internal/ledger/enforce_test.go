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
	ops, err := k.Ops(c)
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
	if _, err := Enforce(lim, next, "a", clk.t, clk.t, w); err != nil {
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
	from, err := Enforce(lim, next, "a", clk.t, clk.t, w)
	if err != nil {
		t.Fatal(err)
	}
	if kept := a.Commit(next, rels, from); len(kept) != len(rels) {
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

func (c *crossing) SetSchedule(steps []limiter.Step, expiry time.Time) (time.Time, error) {
	if c.before {
		c.clk.t = c.to
	}
	from, err := c.Limiter.SetSchedule(steps, expiry)
	c.clk.t = c.to
	c.admitted += admit(c.Limiter, 1000)
	return from, err
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
			from, err := Enforce(lim, next, "a", clk.t, clk.t, w)
			if err != nil {
				t.Fatal(err)
			}
			if kept := a.Commit(next, rels, from); len(kept) == 0 {
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
			if _, err := Enforce(c, next, "a", clk.t, clk.t, w); err != nil {
				t.Fatal(err)
			}
			c.admitted += admit(lim, 1000)
			if c.admitted != 30 {
				t.Errorf("a admitted %d in window 11, where the ledger gives it 30 (and b 70 of the limit of 100)", c.admitted)
			}
		})
	}
}

// TestALongerWindowKeepsTheNewEraEnforced: after the window grows from
// 1s to 2s, a holder releases its old era's grant (ToRelease), the
// new era's start moves earlier and its room is topped up. The holder's
// Schedule must give it what the ledger grants it in every window of the
// new era; an old-era edge (its publish's b+1) that falls inside the new
// era must not cut the new era's pieces.
func TestALongerWindowKeepsTheNewEraEnforced(t *testing.T) {
	s := NewState()
	p1 := Policy{Limit: 100, Window: w, Horizon: 6, Keep: 2}
	plan(t, s, p1, map[string]int64{"a": 50, "b": 50}, 10)
	// The window becomes 2s: era 2 can only start after era 1's grants end.
	p2 := Policy{Limit: 100, Window: 2 * w, Horizon: 6, Keep: 2}
	plan(t, s, p2, map[string]int64{"a": 50, "b": 50}, 5) // 10s: window 5 of 2s
	now := StartOf(10, w) + int64(w)/2
	for _, h := range []string{"a", "b"} {
		for _, r := range s.ToRelease(h, now, 0) {
			s.Apply(r)
		}
	}
	if vs := Audit(s); len(vs) > 0 {
		t.Fatal(vs)
	}
	// The next round moves era 2's start to just after the releases and
	// tops up the windows before its open publish.
	plan(t, s, p2, map[string]int64{"a": 50, "b": 50}, 5)
	e, _ := s.Head.Current()
	t.Logf("era %d: start %d (%v windows), limits %v", e.Seq, e.Start, e.Window, e.Limits)
	for _, p := range pubs(s) {
		t.Logf("pub %+v", p)
	}
	pieces, end := s.Schedule("a", now)
	t.Logf("schedule of a from %d: %+v end %d", now, pieces, end)
	// In every 2s window of era 2 from its start until a's grants end,
	// a's allowance by the ledger must equal what its schedule enforces.
	at := func(tt int64) Piece {
		var cur Piece
		for _, p := range pieces {
			if p.At <= tt {
				cur = p
			}
		}
		return cur
	}
	for _, p := range pieces {
		if p.At >= StartOf(e.Start, e.Window) && p.At < end && (p.Window != e.Window || p.Quota != s.Allowance("a", e.Seq, WindowOf(p.At, e.Window))) {
			t.Errorf("inside era %d, a's schedule enforces %d per %v from %v, the ledger grants it %d per %v", e.Seq, p.Quota, p.Window, time.Duration(p.At), s.Allowance("a", e.Seq, WindowOf(p.At, e.Window)), e.Window)
		}
	}
	for k := e.Start; StartOf(k, e.Window) < end; k++ {
		want := s.Allowance("a", e.Seq, k)
		got := at(StartOf(k, e.Window))
		if got.Quota != want || got.Window != e.Window {
			t.Errorf("era %d window %d (%v): the ledger grants a %d, its schedule enforces %d per %v", e.Seq, k, time.Duration(StartOf(k, e.Window)), want, got.Quota, got.Window)
		}
	}
}

// TestAShorterWindowKeepsTheNewEraEnforced: as above, with the
// window shrinking from 2s to 1s, and the holder's limiter enforcing its
// schedule (Enforce) every quarter window: in every window of the new
// era it should admit what the ledger grants it.
func TestAShorterWindowKeepsTheNewEraEnforced(t *testing.T) {
	const k Keys = "/l/"
	s := NewState()
	p1 := Policy{Limit: 100, Window: 2 * w, Horizon: 6, Keep: 2}
	plan(t, s, p1, map[string]int64{"a": 50, "b": 50}, 5) // 10s
	plan(t, s, p1, map[string]int64{"a": 40, "b": 60}, 6) // 12s: a second publish
	for _, h := range []string{"a", "b"} {
		for _, r := range s.ToRelease(h, StartOf(6, 2*w), 0) {
			s.Apply(r)
		}
	}
	p2 := Policy{Limit: 100, Window: w, Horizon: 6, Keep: 2}
	plan(t, s, p2, map[string]int64{"a": 50, "b": 50}, 12) // 12s: era 2
	now := StartOf(12, w) + int64(w)/2
	for _, h := range []string{"a", "b"} {
		for _, r := range s.ToRelease(h, now, 0) {
			s.Apply(r)
		}
	}
	plan(t, s, p2, map[string]int64{"a": 50, "b": 50}, 12)
	e, _ := s.Head.Current()
	for _, p := range pubs(s) {
		t.Logf("pub %+v", p)
	}
	for key, r := range s.Releases {
		t.Logf("release %v %v", key, r.Steps)
	}
	pieces, end := s.Schedule("a", now)
	t.Logf("era %d start %d; schedule of a: %+v end %d", e.Seq, e.Start, pieces, end)

	a := NewHolder(k, "a")
	for _, rec := range records(s) {
		b, err := Encode(rec)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Observe(keyOf(k, rec), b); err != nil {
			t.Fatal(err)
		}
	}
	clk := &fakeClock{now}
	lim, err := limiter.New(0, 2*w, limiter.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	got := map[int64]int64{}
	for clk.t < end {
		next, _ := a.Next(clk.t, 0) // no Commit: the releases are in the view already
		if _, err := Enforce(lim, next, "a", clk.t, clk.t, w); err != nil {
			t.Fatal(err)
		}
		got[WindowOf(clk.t, w)] += int64(admit(lim, 1000))
		clk.t += int64(w) / 4
	}
	for kk := WindowOf(now, w) + 1; StartOf(kk, w) < end; kk++ {
		if kk < e.Start {
			continue
		}
		if want := s.Allowance("a", e.Seq, kk); got[kk] != want {
			t.Errorf("window %d: a admitted %d, the ledger grants it %d", kk, got[kk], want)
		}
	}
}

// A clock set back by half a window leaves the limiter in window 10,
// where a admitted 40 under its 60 already, while it reads 9.7s. a must not
// keep a release to 30 from window 10: b would get 70 of a window where a
// may admit 60.
func TestCommitKeepsNoReleaseOfAWindowUnderWay(t *testing.T) {
	const k Keys = "/l/"
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 3}
	a := NewHolder(k, "a")
	store(t, k, NewState(), plan(t, s, p, map[string]int64{"a": 60, "b": 40}, 9), a)
	clk := &fakeClock{StartOf(9, w) + int64(w)/2}
	lim, err := limiter.New(0, w, limiter.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	sync := func() []Release {
		now := lim.Now().UnixNano()
		next, rels := a.Next(now, 0)
		from, err := Enforce(lim, next, "a", now, now, w)
		if err != nil {
			t.Fatal(err)
		}
		return a.Commit(next, rels, from)
	}
	sync()
	clk.t = StartOf(10, w) + int64(w)/5
	sync()
	got := admit(lim, 40)
	lim.SetClockOffset(-w / 2)

	old := s.Clone()
	store(t, k, old, plan(t, s, p, map[string]int64{"a": 30, "b": 70}, 9), a)
	for _, r := range sync() {
		s.Apply(r)
	}
	plan(t, s, p, map[string]int64{"a": 30, "b": 70}, 9)
	for _, at := range []int64{StartOf(10, w) + int64(w)/10, StartOf(10, w) + 9*int64(w)/10} {
		clk.t = at + int64(w)/2
		got += admit(lim, 1000)
	}
	if a, b := int64(got), s.Allowance("b", 1, 10); a+b > p.Limit {
		t.Errorf("window 10: a admitted %d and the ledger lets b hold %d: %d of %d", a, b, a+b, p.Limit)
	}
}

// TestAHolderForgetsEndedPublishes: a follower does not watch configd
// delete the publishes that ended, so the holder forgets one itself a
// window after it ends, once configd has deleted the holder's grant in
// it (which the follower watches): while the grant is there, a publish
// extended late is enforced again from the extension alone.
func TestAHolderForgetsEndedPublishes(t *testing.T) {
	const k Keys = "/l/"
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 3}
	a := NewHolder(k, "a")
	c := plan(t, s, p, map[string]int64{"a": 60, "b": 40}, 10)
	store(t, k, NewState(), c, a)
	pub := c.Pubs[0]
	at := func(win int64) int64 { return StartOf(win, w) + int64(w)/2 }

	if next, _ := a.Next(at(pub.B+5), 0); len(next.Pubs) != 1 {
		t.Fatalf("publish %d ended, a's grant in it still stored: %d publishes kept, want it kept", pub.Seq, len(next.Pubs))
	}
	late := pub
	late.B += 10
	b, err := Encode(late)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Observe(k.Pub(pub.Seq), b); err != nil {
		t.Fatal(err)
	}
	next, _ := a.Next(at(late.B-1), 0)
	if pieces, _ := next.Schedule("a", at(late.B-1)); len(pieces) == 0 || pieces[0].Quota != 60 {
		t.Errorf("publish %d extended after it ended: schedule %v, want a's 60 again", pub.Seq, pieces)
	}
	if err := a.Observe(k.Grant("a", pub.Seq), nil); err != nil {
		t.Fatal(err)
	}
	if next, _ := a.Next(at(late.B+1), 0); len(next.Pubs) != 1 {
		t.Errorf("in the window after publish %d ends: %d publishes kept, want it kept a window more", pub.Seq, len(next.Pubs))
	}
	if next, _ := a.Next(at(late.B+2), 0); len(next.Pubs) != 0 || len(a.View().Pubs) != 0 {
		t.Errorf("a window later, a's grant deleted: %d publishes kept, want none", len(a.View().Pubs))
	}
}

// TestAClockStepAheadDoesNotForgetARunningPublish: a member's corrected
// clock steps ahead past the end of its open publish for one sync (a
// wrong measurement, a wall clock stepped and set back) and comes back.
// The holder keeps a publish that grants it something, so it enforces
// its grant again at once: with deletions filtered, nothing but the next
// extension would bring a forgotten publish back.
func TestAClockStepAheadDoesNotForgetARunningPublish(t *testing.T) {
	const k Keys = "/l/"
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 10, Keep: 3}
	a := NewHolder(k, "a")
	c := plan(t, s, p, map[string]int64{"a": 60, "b": 40}, 10)
	apply(s, c)
	store(t, k, NewState(), c, a)
	pub := c.Pubs[0]
	at := func(win int64) int64 { return StartOf(win, w) + int64(w)/2 }

	a.Next(at(pub.B+5), 0) // one sync on a clock stepped ahead
	for k := int64(11); k <= pub.B; k++ {
		// configd, on the true clock, has nothing to write until the
		// open publish comes within its lead.
		if ch := plan(t, s, p, map[string]int64{"a": 60, "b": 40}, k); !ch.Empty() {
			store(t, Keys("/l/"), NewState(), ch, a)
			apply(s, ch)
			break
		}
		next, _ := a.Next(at(k), 0)
		pieces, _ := next.Schedule("a", at(k))
		if got := s.Allowance("a", pub.Era, k); got != 60 {
			t.Fatalf("window %d: the ledger grants a %d, want 60", k, got)
		}
		if len(pieces) == 0 || pieces[0].Quota != 60 {
			t.Errorf("window %d, clock back: a enforces %v while the ledger grants it 60 (publish %d runs to %d)", k, pieces, pub.Seq, pub.B)
		}
	}
}
