// Package ledger is sluice's coordination state as stored in etcd: grants
// of room in numbered windows, and the holders' releases of it. What an
// instance may admit is written down, not inferred, so the guarantee is
// one inequality anyone can check by reading the records (Audit):
//
//	for every era and every window k of its length:
//	    Σ over grants covering k of their quota (less what was released)
//	        ≤ the era's limit in force for k
//
// and the windows of two eras never overlap in time.
//
// A grant is immutable: holder h may admit up to q per window in windows
// from..b of its publish, where b is the publish's end. A publish's end
// only grows (Extend): one small record extends every grant of a publish,
// so keeping grants alive costs one write per publish, not one per
// instance; one top-up record (Pub.Each) raises every holder of a
// publish alike, and counts as a grant to each (State.Counted). A
// release is the holder's own record that it admits at most q
// from window k on; releases only lower. Every write that adds room
// (a grant, an extension, a raised limit, a new era) is conditioned on the
// head's revision, so it is decided from exactly what etcd holds: a lost
// answer, a paused replica or a second writer makes the condition fail,
// and the decision is made again from a fresh read. A crashed or cut-off
// holder's grants end at b: the horizon is its fail-static budget.
//
// The package is pure: records in, decisions out; no I/O, no clock. The
// member side (Holder) and configd's side (Plan) are the same functions in
// the daemon, the library and the simulator.
package ledger

import (
	"cmp"
	"errors"
	"iter"
	"maps"
	"math"
	"slices"
	"time"
)

// ErrInvalid is wrapped by every error about a malformed record.
var ErrInvalid = errors.New("ledger: invalid record")

// Step is a limit in force from window From on.
type Step struct {
	From  int64 `json:"from"`
	Limit int64 `json:"limit"`
}

// Era is a span of windows of one length. Its windows start at Start (an
// index of Window) and never overlap an earlier era's grants in time.
type Era struct {
	Seq    int64         `json:"seq"`
	Window time.Duration `json:"window"`
	Start  int64         `json:"start"`
	Floor  int64         `json:"floor"`  // no grant is written below it; publishes ended before it may go
	Limits []Step        `json:"limits"` // sorted by From; before the first, 0
	// Bound is the most a holder's clock was allowed to be off while it
	// enforced the era's grants (Policy.Bound): on true time a grant
	// may be used until Bound past its last window.
	Bound time.Duration `json:"bound,omitempty"`
}

// Limit returns the era's limit in force for window k.
func (e Era) Limit(k int64) int64 {
	var l int64
	for _, s := range e.Limits {
		if s.From > k {
			break
		}
		l = s.Limit
	}
	return l
}

// Head is the ledger's one record that every room-adding write changes.
type Head struct {
	Seq  int64 `json:"seq"`
	Pubs int64 `json:"pubs"` // the last publish number used: none is used twice
	Eras []Era `json:"eras"` // by Seq; the last is current
	// Staged is the publish whose grants are being written ahead of it,
	// when they are more than one transaction holds (0: none). A grant
	// counts only once its publish is written; only this number, of
	// those not written, ever will be.
	Staged int64 `json:"staged,omitempty"`
}

// Current returns the current era; ok is false when there is none.
func (h Head) Current() (Era, bool) {
	if len(h.Eras) == 0 {
		return Era{}, false
	}
	return h.Eras[len(h.Eras)-1], true
}

// Era returns the era numbered seq.
func (h Head) Era(seq int64) (Era, bool) {
	for _, e := range h.Eras {
		if e.Seq == seq {
			return e, true
		}
	}
	return Era{}, false
}

// Pub is one publish: windows A..B of its era's length. B only grows.
type Pub struct {
	Seq    int64         `json:"seq"`
	Era    int64         `json:"era"`
	Window time.Duration `json:"window"` // the era's, so a holder needs no other record
	A      int64         `json:"a"`
	B      int64         `json:"b"`
	TopUp  bool          `json:"top_up,omitempty"` // its grants add to others toward the target; never extended
	// Each, on a top-up, grants Each per window in A..B to every holder
	// of a grant in publish Of, as if each had a grant of its own: one
	// record tops up a publish's holders alike (State.Counted).
	Each int64 `json:"each,omitempty"`
	Of   int64 `json:"of,omitempty"`
}

// Grant lets Holder admit up to Quota per window in windows From..B of
// publish Pub (From ≥ the publish's A).
//
// Reserve, on a grant of a publish that is not a top-up, is the part of
// Quota each priority class keeps: the holder's limiter lets no lower
// class take it while the class has not used it. It adds nothing to any
// sum: the invariant is on quotas alone.
type Grant struct {
	Pub     int64            `json:"pub"`
	Holder  string           `json:"holder"`
	Quota   int64            `json:"quota"`
	From    int64            `json:"from"`
	Reserve map[string]int64 `json:"reserve,omitempty"`
}

// Release lowers what Holder admits under its grant of Pub to at most
// Limit per window from window From on. Each release is its own
// immutable record, and a grant's cap in window k is the least Limit of
// its releases with From ≤ k: a release written late, or twice, can only
// lower it.
type Release struct {
	Pub    int64  `json:"pub"`
	Holder string `json:"holder"`
	From   int64  `json:"from"`
	Limit  int64  `json:"limit"`
}

// Releases are a grant's releases, as steps.
type Releases struct {
	Steps []Step
}

// cap returns the most the release lets its holder admit in window k,
// and false when no step applies yet.
func (r Releases) cap(k int64) (int64, bool) {
	c, ok := int64(0), false
	for _, s := range r.Steps {
		if s.From <= k && (!ok || s.Limit < c) {
			c, ok = s.Limit, true
		}
	}
	return c, ok
}

// GrantKey identifies a grant, and its release.
type GrantKey struct {
	Pub    int64
	Holder string
}

// State is the ledger as read: the head, every publish, grant and release.
type State struct {
	Head     Head
	Pubs     map[int64]Pub
	Grants   map[GrantKey]Grant
	Releases map[GrantKey]Releases
}

// NewState returns an empty ledger.
func NewState() *State {
	return &State{Pubs: map[int64]Pub{}, Grants: map[GrantKey]Grant{}, Releases: map[GrantKey]Releases{}}
}

// Clone returns a deep copy of s.
func (s *State) Clone() *State {
	c := &State{Head: s.Head, Pubs: make(map[int64]Pub, len(s.Pubs)),
		Grants: make(map[GrantKey]Grant, len(s.Grants)), Releases: make(map[GrantKey]Releases, len(s.Releases))}
	c.Head.Eras = slices.Clone(s.Head.Eras)
	for i := range c.Head.Eras {
		c.Head.Eras[i].Limits = slices.Clone(c.Head.Eras[i].Limits)
	}
	for k, v := range s.Pubs {
		c.Pubs[k] = v
	}
	for k, v := range s.Grants {
		c.Grants[k] = v
	}
	for k, v := range s.Releases {
		v.Steps = slices.Clone(v.Steps)
		c.Releases[k] = v
	}
	return c
}

// Commit stores change c in s, as its transaction does in etcd.
func (s *State) Commit(c Change) {
	if c.Empty() {
		return
	}
	s.Head = c.Head
	for _, p := range c.Pubs {
		s.Pubs[p.Seq] = p
	}
	for _, g := range c.Grants {
		s.Grants[GrantKey{g.Pub, g.Holder}] = g
	}
	for _, r := range c.DelReleases {
		key := GrantKey{r.Pub, r.Holder}
		rs := s.Releases[key]
		rs.Steps = slices.DeleteFunc(slices.Clone(rs.Steps), func(st Step) bool { return st == Step{From: r.From, Limit: r.Limit} })
		s.Releases[key] = rs
		if len(rs.Steps) == 0 {
			delete(s.Releases, key)
		}
	}
	for _, g := range c.DelGrants {
		delete(s.Grants, GrantKey{g.Pub, g.Holder})
	}
	for _, p := range c.DelPubs {
		delete(s.Pubs, p.Seq)
	}
}

// Span returns the windows g covers: From..B of its publish, clipped to
// the publish's A; ok is false when its publish is unknown.
func (s *State) Span(g Grant) (a, b int64, ok bool) {
	p, ok := s.Pubs[g.Pub]
	if !ok {
		return 0, 0, false
	}
	return max(p.A, g.From), p.B, true
}

// Effective returns what g lets its holder admit in window k of its era.
func (s *State) Effective(g Grant, k int64) int64 {
	a, b, ok := s.Span(g)
	if !ok || k < a || k > b {
		return 0
	}
	q := g.Quota
	if r, ok := s.Releases[GrantKey{g.Pub, g.Holder}]; ok {
		if c, ok := r.cap(k); ok {
			q = min(q, c)
		}
	}
	return max(q, 0)
}

// Counted yields every grant s counts, holders and audit alike: each
// grant stored, and each holder's part of a top-up of a publish's
// holders (Pub.Each): Each from the top-up's first window, to every
// holder of a grant stored in publish Of. A holder's part exists exactly
// while its grant of Of is stored, so configd counts it for as long as
// the holder may admit it. A grant stored in such a top-up counts
// nothing: the key of a holder's part is its own, and so are the
// releases under it.
func (s *State) Counted() iter.Seq[Grant] {
	return func(yield func(Grant) bool) {
		var each map[int64][]Pub
		for _, p := range s.Pubs {
			if p.Each > 0 {
				if each == nil {
					each = map[int64][]Pub{}
				}
				each[p.Of] = append(each[p.Of], p)
			}
		}
		for _, g := range s.Grants {
			if p, ok := s.Pubs[g.Pub]; ok && p.Each > 0 {
				continue
			}
			if !yield(g) {
				return
			}
			for _, t := range each[g.Pub] {
				if !yield(Grant{Pub: t.Seq, Holder: g.Holder, Quota: t.Each, From: t.A}) {
					return
				}
			}
		}
	}
}

// Sum returns what all grants of era e add up to in window k.
func (s *State) Sum(era, k int64) int64 {
	var t int64
	for g := range s.Counted() {
		if p, ok := s.Pubs[g.Pub]; ok && p.Era == era {
			t += s.Effective(g, k)
		}
	}
	return t
}

// Allowance returns what holder may admit in window k of era.
func (s *State) Allowance(holder string, era, k int64) int64 {
	var t int64
	for g := range s.Counted() {
		if p, ok := s.Pubs[g.Pub]; ok && p.Era == era && g.Holder == holder {
			t += s.Effective(g, k)
		}
	}
	return t
}

// ReleaseCount returns the number of release records in s: one per step.
func (s *State) ReleaseCount() int64 {
	var n int64
	for _, rs := range s.Releases {
		n += int64(len(rs.Steps))
	}
	return n
}

// Allowances returns what each holder may admit in window k of era: its
// Allowance, for every holder with one, in one pass over the grants.
func (s *State) Allowances(era, k int64) map[string]int64 {
	m := map[string]int64{}
	for g := range s.Counted() {
		if p, ok := s.Pubs[g.Pub]; ok && p.Era == era {
			if q := s.Effective(g, k); q != 0 {
				m[g.Holder] += q
			}
		}
	}
	return m
}

// Profile returns what the grants of era add up to, as steps: the sum
// is Limit from From until the next step's From; the last step is 0.
func (s *State) Profile(era int64) []Step {
	type delta struct{ k, d int64 }
	var ds []delta
	for g := range s.Counted() {
		key := GrantKey{g.Pub, g.Holder}
		a, b, ok := s.Span(g)
		if !ok || s.Pubs[g.Pub].Era != era || a > b {
			continue
		}
		ks := []int64{a}
		for _, st := range s.Releases[key].Steps {
			if st.From > a && st.From <= b {
				ks = append(ks, st.From)
			}
		}
		slices.Sort(ks)
		ks = slices.Compact(ks)
		for i, k := range ks {
			end := b + 1
			if i+1 < len(ks) {
				end = ks[i+1]
			}
			if q := s.Effective(g, k); q != 0 {
				ds = append(ds, delta{k, q}, delta{end, -q})
			}
		}
	}
	slices.SortFunc(ds, func(x, y delta) int { return cmp.Compare(x.k, y.k) })
	var out []Step
	var sum int64
	for i, d := range ds {
		sum += d.d
		if i+1 < len(ds) && ds[i+1].k == d.k {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Limit == sum {
			continue
		}
		out = append(out, Step{From: d.k, Limit: sum})
	}
	return out
}

// edges returns, sorted, every window of era at which some grant's
// effective quota may change: starts, ends + 1 and release steps.
func (s *State) edges(era int64) []int64 {
	var ks []int64
	for g := range s.Counted() {
		key := GrantKey{g.Pub, g.Holder}
		a, b, ok := s.Span(g)
		if !ok || s.Pubs[g.Pub].Era != era || a > b {
			continue
		}
		ks = append(ks, a, b+1)
		for _, st := range s.Releases[key].Steps {
			if st.From > a && st.From <= b {
				ks = append(ks, st.From)
			}
		}
	}
	if e, ok := s.Head.Era(era); ok {
		for _, st := range e.Limits {
			ks = append(ks, st.From)
		}
	}
	slices.Sort(ks)
	return slices.Compact(ks)
}

// End returns the last window of era in which any grant is still in
// effect (quota > 0), and false when none ever is.
func (s *State) End(era int64) (int64, bool) {
	prof := s.Profile(era)
	for i := len(prof) - 1; i >= 0; i-- {
		if prof[i].Limit > 0 {
			return prof[i+1].From - 1, true // the last step is 0
		}
	}
	return 0, false
}

// Ended returns the true time (ns) from which no grant in s lets any
// holder admit: twice the clock bound past the last window in which an
// era's grants are in effect, the larger of the bound the era records
// (Era.Bound) and bound's for its windows' length. It returns 0 when no
// grant is ever in effect. From then on the ledger may be deleted whole.
func (s *State) Ended(bound func(window time.Duration) time.Duration) int64 {
	var end int64
	for _, e := range s.Head.Eras {
		if k, ok := s.End(e.Seq); ok {
			end = max(end, StartOf(k+1, e.Window)+int64(2*max(e.Bound, bound(e.Window))))
		}
	}
	return end
}

// Emptied returns the head a ledger keeps when every other record of it
// is deleted, once no grant is in effect from end (ns) on (Ended): its
// publish numbers, past every number a record of it carries, so that
// none is used twice, and its eras, each with its floor raised to the
// first window that starts at end or later, so that no era a later Plan
// continues or starts grants a window its old grants could still be
// used in. Nothing is staged.
func (s *State) Emptied(end int64) Head {
	h := s.Head
	for seq := range s.Pubs {
		h.Pubs = max(h.Pubs, seq)
	}
	for k := range s.Grants {
		h.Pubs = max(h.Pubs, k.Pub)
	}
	for k := range s.Releases {
		h.Pubs = max(h.Pubs, k.Pub)
	}
	h.Seq++
	h.Staged = 0
	h.Eras = slices.Clone(h.Eras)
	for i, e := range h.Eras {
		h.Eras[i].Floor = max(e.Floor, ceilDiv(end, int64(e.Window)))
	}
	return h
}

// numbersPerRevision bounds the publish numbers one change takes: one
// for each publish it writes, each an operation of a transaction of at
// most MaxOps, and one for a staged publish it gives up.
const numbersPerRevision = 2 * MaxOps

// BeginAt numbers the publishes of a ledger with no head, read at etcd
// revision rev, past every number an earlier ledger under the same keys
// took: each change took at most numbersPerRevision of them, in a
// revision of its own. A follower that lived across a deletion of the
// ledger keeps the old publishes (it does not watch publishes go), so a
// new publish must not reuse an old one's number. A ledger with a head
// is left as it is. (A revision past 2^49 is centuries of writes away;
// from there on, numbers would start at the same point.)
func (s *State) BeginAt(rev int64) {
	if s.Head.Seq == 0 {
		s.Head.Pubs = max(s.Head.Pubs, min(rev, math.MaxInt64/numbersPerRevision/2)*numbersPerRevision)
	}
}

// sortedGrants returns s's stored grants in a fixed order: by publish,
// holder.
func (s *State) sortedGrants() []Grant {
	return slices.SortedFunc(maps.Values(s.Grants), compareGrants)
}

// compareGrants orders grants by publish, then holder.
func compareGrants(a, b Grant) int {
	return cmp.Or(cmp.Compare(a.Pub, b.Pub), cmp.Compare(a.Holder, b.Holder))
}

// WindowOf returns the index of the window of length w holding t (ns).
func WindowOf(t int64, w time.Duration) int64 {
	k := t / int64(w)
	if t%int64(w) < 0 {
		k--
	}
	return k
}

// StartOf returns when window k of length w begins (ns).
func StartOf(k int64, w time.Duration) int64 { return k * int64(w) }
