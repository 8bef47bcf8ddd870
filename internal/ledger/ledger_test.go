package ledger

import (
	"errors"
	"strings"
	"testing"
	"time"
)

const w = time.Second

func plan(t *testing.T, s *State, p Policy, target map[string]int64, k int64) Change {
	t.Helper()
	c, err := Plan(s, p, target, StartOf(k, p.Window))
	if err != nil {
		t.Fatal(err)
	}
	apply(s, c)
	if vs := Audit(s); len(vs) > 0 {
		t.Fatalf("after %v: %v", c.Why, vs)
	}
	return c
}

// apply stores c in s, as its transaction would.
func apply(s *State, c Change) { s.Commit(c) }

func TestPlanHandsOutTheLimitAndMovesItByReleases(t *testing.T) {
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 2}
	plan(t, s, p, map[string]int64{"a": 50, "b": 50}, 10)
	if got := s.Sum(1, 10); got != 100 {
		t.Fatalf("window 10 holds %d, want the limit 100", got)
	}
	// b should grow to 70: room only comes once a releases 20.
	plan(t, s, p, map[string]int64{"a": 30, "b": 70}, 10)
	if got := s.Allowance("b", 1, 11); got != 50 {
		t.Fatalf("b holds %d in window 11 before a released anything, want 50", got)
	}
	for _, r := range s.ToRelease("a", StartOf(10, w), 0) {
		s.Apply(r)
	}
	if got := s.Allowance("a", 1, 11); got != 30 {
		t.Fatalf("after its releases a holds %d in window 11, want 30", got)
	}
	plan(t, s, p, map[string]int64{"a": 30, "b": 70}, 10)
	for k := int64(11); k <= 15; k++ {
		if a, b := s.Allowance("a", 1, k), s.Allowance("b", 1, k); a != 30 || b != 70 {
			t.Errorf("window %d: a %d, b %d; want 30 and 70", k, a, b)
		}
	}
}

func TestPlanLowersTheLimitOnceTheGrantsFit(t *testing.T) {
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 2}
	plan(t, s, p, map[string]int64{"a": 100}, 10)
	p.Limit = 40
	plan(t, s, p, map[string]int64{"a": 40}, 10)
	e, _ := s.Head.Current()
	if e.Limit(10) != 100 || e.Limit(14) != 100 || e.Limit(15) != 40 {
		t.Fatalf("limits %v: want 100 while a's grant of 100 lasts (to window 14), 40 after", e.Limits)
	}
	for _, r := range s.ToRelease("a", StartOf(10, w), 0) {
		s.Apply(r)
	}
	plan(t, s, p, map[string]int64{"a": 40}, 10)
	if e, _ := s.Head.Current(); e.Limit(11) != 40 {
		t.Fatalf("limits %v: after a released to 40 from window 11, want 40 from there", e.Limits)
	}
}

func TestAuditFindsEveryWayOver(t *testing.T) {
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 2}
	plan(t, s, p, map[string]int64{"a": 60, "b": 40}, 10)
	over := s.Clone()
	over.Grants[GrantKey{1, "c"}] = Grant{Pub: 1, Holder: "c", Quota: 1, From: 12}
	if vs := Audit(over); len(vs) != 1 || vs[0].Sum != 101 || vs[0].Window != 12 {
		t.Fatalf("one more permit from window 12: audit says %v", vs)
	}
	if _, err := Plan(over, p, map[string]int64{"a": 50}, StartOf(10, w)); !errors.Is(err, ErrViolated) {
		t.Fatalf("Plan on a ledger over its limit: %v, want ErrViolated", err)
	}
	raised := s.Clone()
	raised.Apply(Release{Pub: 1, Holder: "a", From: 11, Limit: 10})
	plan(t, raised, p, map[string]int64{"a": 10, "b": 90}, 10)
	delete(raised.Releases, GrantKey{1, "a"}) // taken back by hand
	if vs := Audit(raised); len(vs) == 0 {
		t.Fatal("a release taken back after its room was granted again: audit found nothing")
	}
	era := s.Clone()
	p2 := p
	p2.Window = 2 * w
	c, err := Plan(era, p2, map[string]int64{"a": 60, "b": 40}, StartOf(10, w))
	if err != nil {
		t.Fatal(err)
	}
	apply(era, c)
	e, _ := era.Head.Current()
	if end, _ := era.End(1); StartOf(end+1, w) > StartOf(e.Start, 2*w) {
		t.Fatalf("the 2s era starts at %d while the 1s grants last to window %d", e.Start, end)
	}
	era.Head.Eras[1].Start = 5 // overlapping the first era
	if vs := Audit(era); len(vs) == 0 {
		t.Fatal("two eras overlapping in time: audit found nothing")
	}
}

func FuzzDecode(f *testing.F) {
	k := Keys("L/")
	for _, v := range []any{
		Head{Seq: 3, Eras: []Era{{Seq: 1, Window: w, Start: 5, Floor: 4, Limits: []Step{{5, 100}}}}},
		Pub{Seq: 2, Era: 1, Window: w, A: 5, B: 9},
		Grant{Pub: 2, Holder: "a.1", Quota: 50, From: 5},
		Grant{Pub: 2, Holder: "a.1", Quota: 50, From: 5, Reserve: map[string]int64{"critical": 30, "batch": 5}},
		Release{Pub: 2, Holder: "a.1", From: 7, Limit: 20},
	} {
		b, err := Encode(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(keyOf(k, v), b)
	}
	f.Add("L/grant/a/00000000000000000002", []byte(`{"pub":2,"holder":"b","quota":1}`))
	f.Add("L/pub/x", []byte(`{}`))
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		s := NewState()
		if err := k.Decode(s, key, value); err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		// What decodes encodes again, and that decodes to the same.
		for _, v := range records(s) {
			b, err := Encode(v)
			if err != nil {
				t.Fatalf("decoded %+v does not encode: %v", v, err)
			}
			s2 := NewState()
			if err := k.Decode(s2, keyOf(k, v), b); err != nil {
				t.Fatalf("encoded %s does not decode: %v", b, err)
			}
		}
		Audit(s)
		s.Schedule("a.1", 0)
		s.ToRelease("a.1", 0, 0)
	})
}

func records(s *State) []any {
	var out []any
	if len(s.Head.Eras) > 0 || s.Head.Seq != 0 {
		out = append(out, s.Head)
	}
	for _, p := range s.Pubs {
		out = append(out, p)
	}
	for _, g := range s.Grants {
		out = append(out, g)
	}
	for k, r := range s.Releases {
		for _, st := range r.Steps {
			out = append(out, Release{Pub: k.Pub, Holder: k.Holder, From: st.From, Limit: st.Limit})
		}
	}
	return out
}

func keyOf(k Keys, v any) string {
	switch r := v.(type) {
	case Head:
		return k.Head()
	case Pub:
		return k.Pub(r.Seq)
	case Grant:
		return k.Grant(r.Holder, r.Pub)
	case Release:
		return k.Release(r)
	}
	return ""
}

// TestAReleaseWrittenLateOnlyLowers: releases are records of their own,
// so an older, higher one landing after a lower one leaves the lower cap.
func TestAReleaseWrittenLateOnlyLowers(t *testing.T) {
	k := Keys("L/")
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 2}
	plan(t, s, p, map[string]int64{"a": 60, "b": 40}, 10)
	for _, r := range []Release{{Pub: 1, Holder: "a", From: 11, Limit: 7}, {Pub: 1, Holder: "a", From: 11, Limit: 8}} {
		b, err := Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := k.Decode(s, k.Release(r), b); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Allowance("a", 1, 12); got != 7 {
		t.Fatalf("a's cap after releases to 7 and then (late) to 8: %d, want 7", got)
	}
}

// TestAuditFlagsAPublishWhoseWindowIsNotItsEras: Audit counts a
// publish's grants in its era's windows, its holders enforce them per the
// publish's; a publish of 100 ms windows in an era of 1 s would let its
// holder admit ten times the limit in one aligned window.
func TestAuditFlagsAPublishWhoseWindowIsNotItsEras(t *testing.T) {
	s := NewState()
	s.Head = Head{Seq: 1, Pubs: 1, Eras: []Era{{Seq: 1, Window: w, Start: 10, Floor: 10, Limits: []Step{{From: 10, Limit: 100}}}}}
	s.Pubs[1] = Pub{Seq: 1, Era: 1, Window: w / 10, A: 100, B: 109}
	s.Grants[GrantKey{1, "a"}] = Grant{Pub: 1, Holder: "a", Quota: 100, From: 100}
	vs := Audit(s)
	if len(vs) != 1 || !strings.Contains(vs[0].Reason, "publish 1 has windows of 100ms, its era's are 1s") {
		t.Fatalf("a publish of 100ms windows in an era of 1s: audit says %v", vs)
	}
	s.Pubs[1] = Pub{Seq: 1, Era: 1, Window: w, A: 10, B: 10}
	if vs := Audit(s); len(vs) != 0 {
		t.Fatalf("the same publish with its era's window: audit says %v", vs)
	}
}
