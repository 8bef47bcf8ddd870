package ledger

import (
	"testing"
	"time"
)

// TestAnEmptiedLedgerGrantsNothingBeforeItsEnd: a ledger of 500 ms
// windows is emptied once its grants have ended (configd does so when
// the provider moves to the shares or to a budget), and the provider
// comes back on it with windows of a second. Its first era of a second
// starts no sooner than the old grants' end: a second window holding
// the old grants' last half second would count them twice. Without the
// kept head it began in the current window, and a world history
// admitted 47 in a window of 31.
func TestAnEmptiedLedgerGrantsNothingBeforeItsEnd(t *testing.T) {
	const half = 500 * time.Millisecond
	s := NewState()
	old := Policy{Limit: 31, Window: half, Horizon: 4, Keep: 3}
	plan(t, s, old, map[string]int64{"a": 31}, 26) // windows 26..30 of 500 ms: 13.0 s to 15.5 s
	end := s.Ended(func(time.Duration) time.Duration { return 0 })
	if want := StartOf(31, half); end != want {
		t.Fatalf("the grants end at %d, want %d", end, want)
	}
	pubs := s.Head.Pubs

	for _, at := range []int64{end, end + int64(time.Second)} {
		e := NewState()
		e.Head = s.Emptied(end)
		if e.Head.Pubs != pubs || e.Head.Seq != s.Head.Seq+1 || e.Head.Staged != 0 {
			t.Fatalf("emptied head %+v, want publish numbers %d kept and its seq one more", e.Head, pubs)
		}
		for _, p := range []Policy{old, {Limit: 31, Window: time.Second, Horizon: 4, Keep: 3}} {
			n := e.Clone()
			c, err := Plan(n, p, map[string]int64{"b": 31}, at-int64(2*time.Second)) // configd's clock behind
			if err != nil {
				t.Fatal(err)
			}
			apply(n, c)
			for _, g := range c.Grants {
				pub := n.Pubs[g.Pub]
				if a, _, _ := n.Span(g); StartOf(a, pub.Window) < end {
					t.Errorf("windows of %v from %v: a grant from %d (%v), before the old grants' end %d", p.Window, time.Duration(at-end), StartOf(a, pub.Window), c.Why, end)
				}
				if pub.Seq <= pubs {
					t.Errorf("publish %d reuses a number of the emptied ledger (up to %d)", pub.Seq, pubs)
				}
			}
			if len(c.Grants) == 0 {
				t.Errorf("windows of %v: nothing granted (%v)", p.Window, c.Why)
			}
		}
	}
}

// TestAnEmptiedLedgerNumbersPastEveryRecord: a publish, grant or release
// numbered past the head's count (written by hand) is gone with the
// emptying, but a member that read it may keep it: the emptied head
// counts past it, so no later publish takes its number.
func TestAnEmptiedLedgerNumbersPastEveryRecord(t *testing.T) {
	for _, c := range []struct {
		name string
		seq  int64
		add  func(s *State, seq int64)
	}{
		{"publish", 40, func(s *State, seq int64) { s.Pubs[seq] = Pub{Seq: seq, Era: 1, Window: w, A: 1, B: 2} }},
		{"grant", 41, func(s *State, seq int64) { s.Grants[GrantKey{seq, "x"}] = Grant{Pub: seq, Holder: "x", Quota: 1} }},
		{"release", 42, func(s *State, seq int64) { s.Apply(Release{Pub: seq, Holder: "x", From: 1, Limit: 0}) }},
	} {
		s := NewState()
		plan(t, s, Policy{Limit: 10, Window: w, Horizon: 4, Keep: 3}, map[string]int64{"a": 10}, 10)
		c.add(s, c.seq)
		if got := s.Emptied(0).Pubs; got < c.seq {
			t.Errorf("a %s numbered %d: the emptied head counts %d publishes, want at least %d", c.name, c.seq, got, c.seq)
		}
	}
}
