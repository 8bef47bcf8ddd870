package ledger

import (
	"fmt"
	"strings"
	"testing"
)

// follow returns holder's side having read what a follower of s reads:
// every publish, and its own grants.
func follow(t *testing.T, keys Keys, s *State, holder string) *Holder {
	t.Helper()
	h := NewHolder(keys, holder)
	for _, v := range records(s) {
		switch r := v.(type) {
		case Head, Release:
			continue
		case Grant:
			if r.Holder != holder {
				continue
			}
		}
		b, err := Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Observe(keyOf(keys, v), b); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// mirrored returns holder's side and etcd's ledger, empty, and a put
// that stores a record in both: a holder that reads every record.
func mirrored(t *testing.T, keys Keys, holder string) (*Holder, *State, func(v any)) {
	h, etcd := NewHolder(keys, holder), NewState()
	return h, etcd, func(v any) {
		t.Helper()
		b, err := Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Observe(keyOf(keys, v), b); err != nil {
			t.Fatal(err)
		}
		if err := keys.Decode(etcd, keyOf(keys, v), b); err != nil {
			t.Fatal(err)
		}
	}
}

// deliver hands h the writes of c under prefix, as one of a follower's
// two watches (pub/, grant/<holder>/) delivers them.
func deliver(t *testing.T, keys Keys, c Change, prefix string, h *Holder) {
	t.Helper()
	ops, err := keys.Ops(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range ops {
		if strings.HasPrefix(o.Key, prefix) {
			if err := h.Observe(o.Key, o.Value); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// evenly returns a ledger of n holders granted 10 each of a limit of
// 10·n, over as many changes of maxOps operations as that takes, at
// window k, with the policy and the target.
func evenly(t *testing.T, n, maxOps int, k int64) (*State, Policy, map[string]int64) {
	t.Helper()
	s := NewState()
	p := Policy{Limit: int64(10 * n), Window: w, Horizon: 6, Keep: 2, MaxOps: maxOps}
	target := make(map[string]int64, n)
	for i := range n {
		target[fmt.Sprintf("h%04d", i)] = 10
	}
	for range n {
		if c := plan(t, s, p, target, k); c.Empty() {
			break
		}
	}
	if got := s.Sum(1, k); got != p.Limit {
		t.Fatalf("window %d holds %d, want the limit %d", k, got, p.Limit)
	}
	return s, p, target
}

// A raise that every holder of the open publish is short of alike is
// topped up by one record, not a grant each: a top-up of all its holders
// (Pub.Each). It counts for each of them in the audit, and each holder,
// reading only its own grants, enforces it.
func TestARaiseTopsUpEveryHolderInOneRecord(t *testing.T) {
	const n, k = 300, 100
	s, p, target := evenly(t, n, 128, k)
	p.Limit = 12 * n
	for h := range target {
		target[h] = 12
	}
	var each []Pub
	for range n { // the new publish is written ahead over several changes
		c := plan(t, s, p, target, k)
		if c.Empty() {
			break
		}
		for _, pb := range c.Pubs {
			if pb.Each > 0 {
				each = append(each, pb)
			}
		}
		for _, g := range c.Grants {
			if s.Pubs[g.Pub].TopUp {
				t.Errorf("a top-up grant of its own to %s besides the record: %+v", g.Holder, g)
			}
		}
	}
	if len(each) != 1 || each[0].Each != 2 {
		t.Fatalf("the raise wrote top-ups of all holders %+v; want one record of 2 each", each)
	}
	got := s.Allowances(1, k+1)
	for h := range target {
		if got[h] != 12 {
			t.Fatalf("%s may admit %d in window %d, want 12", h, got[h], k+1)
		}
	}
	if sum := s.Sum(1, k+1); sum != p.Limit {
		t.Errorf("window %d holds %d in all, want %d", k+1, sum, p.Limit)
	}
	// One holder's view: every publish, its own grants.
	view := NewState()
	view.Head = s.Head
	for seq, pb := range s.Pubs {
		view.Pubs[seq] = pb
	}
	for key, g := range s.Grants {
		if key.Holder == "h0007" {
			view.Grants[key] = g
		}
	}
	if q := view.Allowance("h0007", 1, k+1); q != 12 {
		t.Errorf("h0007's own view lets it admit %d in window %d, want 12", q, k+1)
	}
}

// A holder of the open publish that the raise does not top up (it left)
// keeps the record from counting for it: the others get a grant each.
func TestATopUpOfAllHoldersSkipsAPublishWithAHolderLeft(t *testing.T) {
	const k = 100
	s, p, target := evenly(t, 4, 0, k)
	delete(target, "h0003")
	p.Limit = 60
	for h := range target {
		target[h] = 20
	}
	c := plan(t, s, p, target, k)
	for _, pb := range c.Pubs {
		if pb.Each > 0 {
			t.Fatalf("top-up of all holders %+v, with h0003 gone from the target (%v)", pb, c.Why)
		}
	}
	if sum := s.Sum(1, k+1); sum > p.Limit {
		t.Fatalf("window %d holds %d, over %d", k+1, sum, p.Limit)
	}
}

// A top-up of all holders counts for a holder exactly while its grant of
// the publish topped up is stored: deleting the grant takes the part with
// it, in the audit's sum and in the holder's own view alike.
func TestATopUpOfAllHoldersCountsWhileTheGrantIsStored(t *testing.T) {
	const k = 100
	s, p, target := evenly(t, 3, 0, k)
	p.Limit = 45
	for h := range target {
		target[h] = 15
	}
	plan(t, s, p, target, k)
	var top Pub
	for _, pb := range s.Pubs {
		if pb.Each > 0 {
			top = pb
		}
	}
	if top.Each != 5 {
		t.Fatalf("no top-up of all holders by 5 after a raise from 30 to 45: %+v", s.Pubs)
	}
	keys := Keys("/l/")
	h := follow(t, keys, s, "h0001")
	if q := h.View().Allowance("h0001", 1, top.A); q != 15 {
		t.Fatalf("h0001 reads %d for window %d, want 15", q, top.A)
	}
	before := s.Sum(1, top.A)
	delete(s.Grants, GrantKey{top.Of, "h0001"})
	if err := h.Observe(keys.Grant("h0001", top.Of), nil); err != nil {
		t.Fatal(err)
	}
	if got := before - s.Sum(1, top.A); got != 15 {
		t.Errorf("deleting h0001's grant of publish %d took %d from window %d's sum, want its 10 and its part 5", top.Of, got, top.A)
	}
	if q := h.View().Allowance("h0001", 1, top.A); q != 0 {
		t.Errorf("h0001 still reads %d for window %d with its grant gone, want 0", q, top.A)
	}
}

// A follower's two watches answer in either order. One that reads the
// top-up of all holders before its grant of the new publish holds the
// top-up through its old grant, whose quota is still its newest: it must
// not release its part as more than that publish gives it, or the one
// record becomes a release and a grant of its own for every such holder.
func TestAHolderKeepsItsPartOfATopUpReadBeforeItsNewGrant(t *testing.T) {
	const k = 100
	const keys Keys = "/l/"
	s, p, target := evenly(t, 3, 0, k)
	h := follow(t, keys, s, "h0001")
	p.Limit = 45
	for hn := range target {
		target[hn] = 15
	}
	c := plan(t, s, p, target, k)
	var top Pub
	for _, pb := range c.Pubs {
		if pb.Each > 0 {
			top = pb
		}
	}
	if top.Each == 0 {
		t.Fatalf("no top-up of all holders: %v", c.Why)
	}
	now := StartOf(k, w) + int64(w)/2
	deliver(t, keys, c, keys.Pubs(), h) // the publishes' watch first
	_, rels := h.Next(now, 0)
	for _, r := range rels {
		if r.Pub == top.Seq {
			t.Errorf("h0001 releases its part of top-up %d (%d each of publish %d) to %d from window %d before it reads its grant of the new publish", top.Seq, top.Each, top.Of, r.Limit, r.From)
		}
	}
}

// The rest below a holder's part of the slack that one record leaves is
// skipped; a holder that joins with a small target is not such a rest,
// and is topped up at once where there is room.
func TestAHolderJoiningWithASmallTargetIsToppedUpAtOnce(t *testing.T) {
	const k = 100
	s := NewState()
	p := Policy{Limit: 300, Window: w, Horizon: 6, Keep: 2, Slack: 300 / 50}
	target := map[string]int64{"a": 100, "b": 100}
	for range 5 {
		plan(t, s, p, target, k)
	}
	target["c"] = 1
	plan(t, s, p, target, k)
	if got := s.Allowance("c", 1, k+1); got != 1 {
		t.Errorf("c may admit %d in window %d, with %d free; want its target 1", got, k+1, p.Limit-s.Sum(1, k+1))
	}
}

// A grant stored in a top-up of all holders, which Plan never writes,
// counts nothing, in the audit and on the holder alike: else it and the
// holder's part would share one key and its releases, which the holder
// drops with its grant of the publish topped up and etcd keeps.
func TestAGrantStoredInATopUpOfAllCountsNothing(t *testing.T) {
	const keys Keys = "/l/"
	const k = 100
	h, etcd, put := mirrored(t, keys, "m1")
	put(Head{Seq: 1, Pubs: 3, Eras: []Era{{Seq: 1, Window: w, Start: 0, Limits: []Step{{From: 0, Limit: 100}}}}})
	put(Pub{Seq: 1, Era: 1, Window: w, A: k, B: k + 5})
	put(Grant{Pub: 1, Holder: "m1", Quota: 10, From: k})
	put(Pub{Seq: 3, Era: 1, Window: w, A: k, B: k + 20, TopUp: true, Each: 5, Of: 1})
	put(Grant{Pub: 3, Holder: "m1", Quota: 20, From: k})
	put(Release{Pub: 3, Holder: "m1", From: k + 1, Limit: 5})
	if vs := Audit(etcd); len(vs) > 0 {
		t.Fatal(vs)
	}
	delete(etcd.Grants, GrantKey{1, "m1"})
	if err := h.Observe(keys.Grant("m1", 1), nil); err != nil {
		t.Fatal(err)
	}
	for _, kk := range []int64{k, k + 3, k + 10} {
		got, counted := h.View().Allowance("m1", 1, kk), etcd.Allowance("m1", 1, kk)
		if got != 0 || counted != 0 {
			t.Errorf("window %d: m1 may admit %d and the ledger counts %d for it; want 0 and 0", kk, got, counted)
		}
	}
}
