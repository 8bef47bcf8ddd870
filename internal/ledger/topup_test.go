package ledger

import (
	"fmt"
	"testing"
)

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
	h := NewHolder("/l/", "h0001")
	keys := Keys("/l/")
	for _, v := range records(s) {
		if g, ok := v.(Grant); ok && g.Holder != "h0001" {
			continue
		}
		if _, ok := v.(Release); ok {
			continue
		}
		b, err := Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Observe(keyOf(keys, v), b); err != nil {
			t.Fatal(err)
		}
	}
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
