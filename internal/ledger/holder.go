package ledger

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

// Piece is what a holder may admit per window of length Window, in the
// windows from At (ns, on its corrected clock) until the next piece.
type Piece struct {
	At     int64
	Window time.Duration
	Quota  int64
}

// Schedule returns what holder may admit from the window holding now
// on, by the grants and releases in s, as pieces in time order, and when
// the last grant ends (0 with none). A holder enforces exactly this: its
// state is what it has read, which is never more than etcd holds, since
// publishes only grow and it writes its releases itself.
func (s *State) Schedule(holder string, now int64) (pieces []Piece, end int64) {
	type cut struct {
		at  int64
		era int64
		w   time.Duration
		k   int64
	}
	var cuts []cut
	eras := s.holderEras(holder)
	for i, era := range eras {
		p := s.Pubs[era.pub]
		ks := s.holderEdges(holder, era.seq)
		until := s.laterStart(holder, eras[i+1:])
		for j, k := range ks {
			// The piece from k lasts until the next edge; the last edge
			// starts the nothing after every grant.
			at := StartOf(k, p.Window)
			if at < until && (j+1 == len(ks) || StartOf(ks[j+1], p.Window) > now) {
				cuts = append(cuts, cut{at, era.seq, p.Window, k})
			}
		}
	}
	slices.SortFunc(cuts, func(a, b cut) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.era, b.era)) })
	for _, c := range cuts {
		q := s.Allowance(holder, c.era, c.k)
		if n := len(pieces); n == 0 || pieces[n-1].Quota != q || pieces[n-1].Window != c.w {
			pieces = append(pieces, Piece{c.at, c.w, q})
		}
	}
	for _, era := range s.holderEras(holder) {
		ks := s.holderEdges(holder, era.seq)
		for i := len(ks) - 2; i >= 0; i-- {
			if s.Allowance(holder, era.seq, ks[i]) > 0 {
				end = max(end, StartOf(ks[i+1], s.Pubs[era.pub].Window))
				break
			}
		}
	}
	for len(pieces) > 0 && pieces[0].Quota == 0 && pieces[0].At < now {
		pieces = pieces[1:]
	}
	return pieces, end
}

type holderEra struct{ seq, pub int64 }

// laterStart returns when holder's first grant in any of the later eras
// begins (ns), the end of time with none. From then on the later eras
// govern: the ledger ends every grant of an earlier era before a later
// era starts, so what an earlier era's records say there, the end of a
// publish or a release, is 0 and must not replace the later era's
// pieces with a piece of its own window length.
func (s *State) laterStart(holder string, later []holderEra) int64 {
	until := int64(math.MaxInt64)
	for _, era := range later {
		if ks := s.holderEdges(holder, era.seq); len(ks) > 0 {
			until = min(until, StartOf(ks[0], s.Pubs[era.pub].Window))
		}
	}
	return until
}

// holderEras returns the eras holder has grants in, each with one of its
// publishes.
func (s *State) holderEras(holder string) []holderEra {
	m := map[int64]int64{}
	for g := range s.Counted() {
		if p, ok := s.Pubs[g.Pub]; ok && g.Holder == holder {
			m[p.Era] = p.Seq
		}
	}
	var out []holderEra
	for _, e := range slices.Sorted(maps.Keys(m)) {
		out = append(out, holderEra{e, m[e]})
	}
	return out
}

// holderEdges returns, sorted, the windows of era where holder's
// allowance may change.
func (s *State) holderEdges(holder string, era int64) []int64 {
	var ks []int64
	for g := range s.Counted() {
		key := GrantKey{g.Pub, g.Holder}
		a, b, ok := s.Span(g)
		if !ok || g.Holder != holder || s.Pubs[g.Pub].Era != era || a > b {
			continue
		}
		ks = append(ks, a, b+1)
		for _, st := range s.Releases[key].Steps {
			if st.From > a && st.From <= b {
				ks = append(ks, st.From)
			}
		}
	}
	slices.Sort(ks)
	return slices.Compact(ks)
}

// Target returns the quota of holder's grant in its last publish that is
// not a top-up, with that publish; ok is false without one.
func (s *State) Target(holder string) (q int64, p Pub, ok bool) {
	g, p, ok := s.targetGrant(holder)
	return g.Quota, p, ok
}

// Reserves returns what holder's newest grant of a publish, not a
// top-up, of the newest era begun at now (ns, on its clock) reserves for
// each class (Grant.Reserve), in permits per window of that era; ok is
// false when it holds none. The newest is configd's last decision: a
// holder keeps it from the moment it reads it, before that publish
// begins, so a reserve that moves between holders moves at once, and a
// holder never keeps one publish's part for one class and another's for
// another. Where its quota in force is smaller, its limiter cuts the
// reserves in proportion until a top-up brings it to the new quota. A
// later era's grants count from that era's start: their permits are of
// another window length.
func (s *State) Reserves(holder string, now int64) (reserve map[string]int64, ok bool) {
	era, begun := int64(0), false
	for _, e := range s.Head.Eras {
		if StartOf(e.Start, e.Window) <= now {
			era, begun = e.Seq, true
		}
	}
	var best Grant
	for _, g := range s.Grants {
		p, have := s.Pubs[g.Pub]
		if !have || g.Holder != holder || p.TopUp || begun && p.Era > era {
			continue
		}
		if !ok || g.Pub > best.Pub {
			best, ok = g, true
		}
	}
	return best.Reserve, ok
}

// LimiterClasses returns the limiter classes named, in order, each
// keeping its reserve, a count of permits per window: what a holder's
// limiter serves under its grants (Reserves).
func LimiterClasses(names []string, reserve map[string]int64) []limiter.Class {
	cs := make([]limiter.Class, len(names))
	for i, n := range names {
		cs[i] = limiter.Class{Name: n, Reserve: min(reserve[n], limiter.MaxQuota)}
	}
	return cs
}

func (s *State) targetGrant(holder string) (g Grant, p Pub, ok bool) {
	for _, gr := range s.Grants {
		gp, have := s.Pubs[gr.Pub]
		if !have || gr.Holder != holder || gp.TopUp {
			continue
		}
		if !ok || gp.Seq > p.Seq {
			g, p, ok = gr, gp, true
		}
	}
	return g, p, ok
}

// ToRelease returns the releases holder should write, and enforce first,
// so that from its first window starting after now+margin it admits no
// more than its last publish gives it: every grant of an earlier era
// goes to 0, and the grants of the target's era keep, longest first,
// what fits under the target in every window. A top-up written after the
// last publish is configd's later decision toward the target, which the
// last publish may not carry yet (a top-up of all its holders, Pub.Each,
// even comes on the other watch, before the holder's grant of the
// publish decided with it): it stays until a later publish is read. A
// top-up ends before the open publish begins, so what it keeps is
// within the horizon. margin is how long the
// holder may take to enforce them: a release is true only if its
// limiter enforces it before its window begins. None when nothing is to
// be lowered.
func (s *State) ToRelease(holder string, now int64, margin time.Duration) []Release {
	now += int64(margin)
	q, top, ok := s.Target(holder)
	if !ok {
		return nil
	}
	var out []Release
	var same []Grant
	for _, g := range slices.SortedFunc(s.Counted(), compareGrants) {
		p, ok := s.Pubs[g.Pub]
		if !ok || g.Holder != holder || g.Pub == top.Seq || p.TopUp && p.Seq > top.Seq {
			continue
		}
		r := WindowOf(now, p.Window) + 1
		if p.Era < top.Era {
			if rel, ok := s.lower(g, r, 0); ok {
				out = append(out, rel)
			}
		} else if p.Era == top.Era {
			same = append(same, g)
		}
	}
	r := WindowOf(now, top.Window) + 1
	ks := []int64{r}
	for _, k := range s.holderEdges(holder, top.Era) {
		if k > r {
			ks = append(ks, k)
		}
	}
	used := make([]int64, len(ks))
	for i, k := range ks {
		if k >= top.A && k <= top.B {
			used[i] = q // the target's own grant
		}
	}
	slices.SortStableFunc(same, func(a, b Grant) int {
		return cmp.Compare(s.Pubs[b.Pub].B, s.Pubs[a.Pub].B)
	})
	for _, g := range same {
		a, b, _ := s.Span(g)
		keep, any := int64(-1), false
		for i, k := range ks {
			if k < a || k > b {
				continue
			}
			left := min(s.Effective(g, k), max(0, q-used[i]))
			if !any || left < keep {
				keep, any = left, true
			}
		}
		if !any {
			continue
		}
		for i, k := range ks {
			if k >= a && k <= b {
				used[i] += keep
			}
		}
		if rel, ok := s.lower(g, max(r, a), keep); ok {
			out = append(out, rel)
		}
	}
	return out
}

// lower returns a release of g to q from window k on, and false when g
// already admits at most q in every window from k on.
func (s *State) lower(g Grant, k, q int64) (Release, bool) {
	a, b, ok := s.Span(g)
	if !ok || b < k {
		return Release{}, false
	}
	for _, w := range append(s.holderEdges(g.Holder, s.Pubs[g.Pub].Era), max(k, a)) {
		if w >= max(k, a) && w <= b && s.Effective(g, w) > q {
			return Release{Pub: g.Pub, Holder: g.Holder, From: k, Limit: q}, true
		}
	}
	return Release{}, false
}

// Apply stores r in s.
func (s *State) Apply(r Release) {
	key := GrantKey{r.Pub, r.Holder}
	rs := s.Releases[key]
	step := Step{From: r.From, Limit: r.Limit}
	if !slices.Contains(rs.Steps, step) {
		rs.Steps = append(slices.Clone(rs.Steps), step)
	}
	s.Releases[key] = rs
}
