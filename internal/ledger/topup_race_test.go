package ledger

import "testing"

// setupShortN returns a ledger of 3 holders with publish O (10 each,
// windows 100..106) and a short publish N after it (9 each), which every
// holder has read and released O to.
func setupShortN(t *testing.T, keys Keys, release bool) (*State, Policy, map[string]int64, Pub) {
	const k = 100
	s, p, target := evenly(t, 3, 0, k)
	for hn := range target {
		target[hn] = 9
	}
	c := plan(t, s, p, target, k)
	if len(c.Pubs) != 1 || c.Pubs[0].TopUp {
		t.Fatalf("want one new publish: %v", c.Why)
	}
	for _, hn := range []string{"h0000", "h0001", "h0002"} {
		h := follow(t, keys, s, hn)
		_, rels := h.Next(StartOf(k, w)+int64(w)/2, 0)
		for _, r := range rels {
			if release {
				s.Apply(r)
			}
		}
	}
	return s, p, target, c.Pubs[0]
}

// A raise one window after a lowering writes the new publish N2 and a
// top-up of all of O, the publish before the holder's newest, N: a
// holder that reads the top-up before its grant of N2, holding N's 9,
// keeps its part of it too.
func TestAHolderKeepsATopUpOfAnEarlierPublishReadBeforeItsNewGrant(t *testing.T) {
	const keys Keys = "/l/"
	s, p, target, n := setupShortN(t, keys, false)
	const k = 101
	h := follow(t, keys, s, "h0001")
	p.Limit = 45
	for hn := range target {
		target[hn] = 15
	}
	c := plan(t, s, p, target, k)
	t.Logf("raise: %v", c.Why)
	var n2 Pub
	var tops []Pub
	for _, pb := range c.Pubs {
		if pb.Each > 0 {
			tops = append(tops, pb)
		} else if !pb.TopUp && pb.Seq > n.Seq {
			n2 = pb
		}
	}
	if n2.Seq == 0 || len(tops) == 0 {
		t.Fatalf("want a new publish and a top-up of all: %v", c.Why)
	}
	deliver(t, keys, c, keys.Pubs(), h) // the publishes' watch first
	_, rels := h.Next(StartOf(k, w)+int64(w)/2, 0)
	for _, r := range rels {
		for _, tp := range tops {
			if r.Pub == tp.Seq {
				t.Errorf("h0001 releases its part of top-up %d (%d each of publish %d, windows %d..%d) to %d from window %d before it reads its grant of new publish %d", tp.Seq, tp.Each, tp.Of, tp.A, tp.B, r.Limit, r.From, n2.Seq)
			}
		}
	}
}

// A raise the open publish cannot carry yet (it runs to the horizon) is
// topped up in the windows before it. The holders, whose newest publish
// still says less, keep the top-ups, written after it: released, configd
// would top them up again every round, one record and n releases each,
// and the raise would never hold.
func TestTopUpsUnderALaggingPublishAreKeptNotChurned(t *testing.T) {
	const n, k = 20, 100
	s, p, target := evenly(t, n, 128, k)
	for hn := range target {
		target[hn] = 9
	}
	for range 10 {
		if c := plan(t, s, p, target, k); c.Empty() {
			break
		}
	}
	now := StartOf(k, w) + int64(w)/2
	for hn := range target {
		for _, r := range s.ToRelease(hn, now, 0) {
			s.Apply(r)
		}
	}
	p.Limit = 15 * n
	for hn := range target {
		target[hn] = 15
	}
	var eaches int
	for range 120 {
		c := plan(t, s, p, target, k)
		for _, pb := range c.Pubs {
			if pb.Each > 0 {
				eaches++
			}
		}
		for hn := range target {
			for _, r := range s.ToRelease(hn, now, 0) {
				s.Apply(r)
			}
		}
	}
	if got := s.Sum(1, k+2); eaches > 2 || got != p.Limit {
		t.Errorf("120 rounds wrote %d top-ups of all, and window %d holds %d of %d", eaches, k+2, got, p.Limit)
	}
}

// A grant stored in a top-up of all holders (a hand edit; it counts
// nothing) shares its key with the holder's part, and so do the
// releases: deleting that grant keeps the part's releases, as etcd does.
func TestDeletingAGrantStoredInATopUpOfAllKeepsThePartsReleases(t *testing.T) {
	const keys Keys = "/l/"
	const k = 100
	h, etcd, put := mirrored(t, keys, "m1")
	put(Head{Seq: 1, Pubs: 3, Eras: []Era{{Seq: 1, Window: w, Start: 0, Limits: []Step{{From: 0, Limit: 100}}}}})
	put(Pub{Seq: 1, Era: 1, Window: w, A: k, B: k + 5})
	put(Grant{Pub: 1, Holder: "m1", Quota: 10, From: k})
	put(Pub{Seq: 3, Era: 1, Window: w, A: k, B: k + 5, TopUp: true, Each: 5, Of: 1})
	put(Grant{Pub: 3, Holder: "m1", Quota: 20, From: k})      // the stray grant
	put(Release{Pub: 3, Holder: "m1", From: k + 1, Limit: 0}) // its part released
	delete(etcd.Grants, GrantKey{3, "m1"})
	if err := h.Observe(keys.Grant("m1", 3), nil); err != nil {
		t.Fatal(err)
	}
	if vs := Audit(etcd); len(vs) > 0 {
		t.Fatal(vs)
	}
	for _, kk := range []int64{k + 1, k + 3} {
		got, counted := h.View().Allowance("m1", 1, kk), etcd.Allowance("m1", 1, kk)
		if got > counted {
			t.Errorf("window %d: m1 may admit %d, the ledger counts %d for it", kk, got, counted)
		}
	}
}
