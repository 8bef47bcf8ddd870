package ledger

import (
	"strings"
	"testing"
)

// TestAHolderForgetsTheReleasesOfItsDeletedGrants: a member's Follower
// watches its grants and the publishes' puts, never releases; configd
// deletes a grant with its releases and its publish (dropPub). The
// holder drops a grant's releases when it sees the grant go, so its view,
// which Next clones on every sync, stays as bounded as the ledger.
func TestAHolderForgetsTheReleasesOfItsDeletedGrants(t *testing.T) {
	const k Keys = "/l/"
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 2}
	a := NewHolder(k, "a")
	// What a Follower's two watches deliver: puts of publishes, and
	// puts and deletions of its own grants.
	deliver := func(c Change) {
		ops, err := k.Ops(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range ops {
			pub := strings.HasPrefix(o.Key, k.Pubs()) && o.Value != nil
			if pub || strings.HasPrefix(o.Key, k.Grants("a")) {
				if err := a.Observe(o.Key, o.Value); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	const rounds = 400
	for i := range int64(rounds) {
		win := 10 + i
		q := int64(60)
		if i%2 == 1 {
			q = 40
		}
		c := plan(t, s, p, map[string]int64{"a": q, "b": 100 - q - 10}, win)
		deliver(c)
		now := StartOf(win, w) + int64(w)/2
		next, rels := a.Next(now, 0)
		kept := a.Commit(next, rels, StartOf(win+1, w))
		for _, r := range kept {
			s.Apply(r) // written to etcd
		}
		a.Stored(kept)
	}
	var stored int
	for key, rs := range s.Releases {
		if key.Holder == "a" {
			stored += len(rs.Steps)
		}
	}
	var viewed int
	for _, rs := range a.View().Releases {
		viewed += len(rs.Steps)
	}
	t.Logf("after %d rounds: etcd holds %d of a's releases, %d grants of a; a's view %d releases, %d grants, %d publishes",
		rounds, stored, len(s.Grants), viewed, len(a.View().Grants), len(a.View().Pubs))
	if viewed > stored+4 {
		t.Errorf("a's view keeps %d releases after %d rounds, etcd %d: the releases of its deleted grants are never forgotten", viewed, rounds, stored)
	}
}
