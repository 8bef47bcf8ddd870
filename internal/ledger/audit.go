package ledger

import (
	"fmt"
	"maps"
	"slices"
)

// Violation is one way a ledger breaks its invariant.
type Violation struct {
	Era    int64
	Window int64  // the window where it breaks
	Sum    int64  // what the grants add up to there
	Limit  int64  // the era's limit in force there
	Reason string // what is wrong, for a person
}

func (v Violation) String() string {
	return fmt.Sprintf("era %d window %d: %s", v.Era, v.Window, v.Reason)
}

// Audit checks s against the ledger invariant and returns every way it
// breaks it, in a fixed order; none means every window of every era is
// within its limit and no two eras overlap in time.
func Audit(s *State) []Violation {
	var vs []Violation
	for i, e := range s.Head.Eras {
		vs = append(vs, auditEra(s, e)...)
		for _, prev := range s.Head.Eras[:i] {
			vs = append(vs, auditSuccession(s, prev, e)...)
		}
	}
	vs = append(vs, auditPubWindows(s)...)
	var stray []Grant
	for g := range s.Counted() {
		p, ok := s.Pubs[g.Pub]
		if !ok {
			continue // no span: admits nothing
		}
		if _, ok := s.Head.Era(p.Era); !ok {
			stray = append(stray, g)
		}
	}
	slices.SortFunc(stray, compareGrants)
	for _, g := range stray {
		p := s.Pubs[g.Pub]
		vs = append(vs, Violation{Era: p.Era, Window: p.A, Reason: fmt.Sprintf("grant of %s in publish %d of an era the head does not list", g.Holder, g.Pub)})
	}
	return vs
}

// auditPubWindows checks that every publish carries its era's window
// length: Audit counts a publish's grants in its era's windows, and its
// holders enforce them per the publish's, so the two must be one.
func auditPubWindows(s *State) []Violation {
	var vs []Violation
	for _, seq := range slices.Sorted(maps.Keys(s.Pubs)) {
		p := s.Pubs[seq]
		if e, ok := s.Head.Era(p.Era); ok && p.Window != e.Window {
			vs = append(vs, Violation{Era: p.Era, Window: p.A,
				Reason: fmt.Sprintf("publish %d has windows of %v, its era's are %v: its holders would enforce its grants per %v", p.Seq, p.Window, e.Window, p.Window)})
		}
	}
	return vs
}

// auditEra checks each window of e where the sum or the limit changes.
func auditEra(s *State, e Era) []Violation {
	var vs []Violation
	prof := s.Profile(e.Seq)
	ks := make([]int64, 0, len(prof)+len(e.Limits))
	for _, st := range prof {
		ks = append(ks, st.From)
	}
	for _, st := range e.Limits {
		ks = append(ks, st.From)
	}
	slices.Sort(ks)
	i := 0
	var sum int64
	for _, k := range slices.Compact(ks) {
		for i < len(prof) && prof[i].From <= k {
			sum = prof[i].Limit
			i++
		}
		if sum == 0 {
			continue
		}
		if k < e.Start {
			vs = append(vs, Violation{Era: e.Seq, Window: k, Sum: sum, Limit: 0,
				Reason: fmt.Sprintf("grants of %d before the era starts at window %d", sum, e.Start)})
			continue
		}
		if l := e.Limit(k); sum > l {
			vs = append(vs, Violation{Era: e.Seq, Window: k, Sum: sum, Limit: l,
				Reason: fmt.Sprintf("grants add up to %d, over the limit of %d", sum, l)})
		}
	}
	return vs
}

// auditSuccession checks that every grant of an earlier era ends, net of
// releases, before a later era starts.
func auditSuccession(s *State, prev, next Era) []Violation {
	end, ok := s.End(prev.Seq)
	if !ok {
		return nil
	}
	if t, start := StartOf(end+1, prev.Window), StartOf(next.Start, next.Window); t > start {
		return []Violation{{Era: next.Seq, Window: next.Start,
			Reason: fmt.Sprintf("era %d (%v windows) still grants until %d ns, after era %d starts at %d ns", prev.Seq, prev.Window, t, next.Seq, start)}}
	}
	return nil
}

// Fullest returns, for the current era, the window from k on where the
// grants add up to the most, that sum and the limit in force there; ok is
// false without an era.
func Fullest(s *State, k int64) (window, sum, limit int64, ok bool) {
	e, ok := s.Head.Current()
	if !ok {
		return 0, 0, 0, false
	}
	window, limit = max(k, e.Start), e.Limit(max(k, e.Start))
	ks := append(s.edges(e.Seq), window)
	slices.Sort(ks)
	for _, w := range slices.Compact(ks) {
		if w < window {
			continue
		}
		if t := s.Sum(e.Seq, w); t > sum {
			window, sum, limit = w, t, e.Limit(w)
		}
	}
	return window, sum, limit, true
}
