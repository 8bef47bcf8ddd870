package ledger

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

// Limiter is what a holder's limiter must do to enforce a schedule:
// *limiter.Limiter does it. SetSchedule returns the start of the first
// window the schedule governs whole.
type Limiter interface {
	SetSchedule(steps []limiter.Step, expiry time.Time) (time.Time, error)
}

// Holder is one holder's side of the ledger: the records it has read and
// the releases it enforced that it has not yet seen stored. It does no
// I/O; a driver feeds it records and writes what it returns, so the
// simulation and a real member run the same decisions.
type Holder struct {
	name   string
	keys   Keys
	view   *State
	unsent map[Release]bool
}

// NewHolder returns the side of holder name, for the ledger under keys,
// having read nothing. name must name one incarnation of one process: a
// restarted process's limiter has not counted what the last one admitted
// under its grants, so it takes a name never used before.
func NewHolder(keys Keys, name string) *Holder {
	return &Holder{name: name, keys: keys, view: NewState(), unsent: map[Release]bool{}}
}

// Name returns the holder's name, as its grants carry it.
func (h *Holder) Name() string { return h.name }

// View returns what the holder has read, with its own releases. The
// caller must not change it.
func (h *Holder) View() *State { return h.view }

// Observe stores the record read at key (nil value: deleted). A
// malformed record changes nothing and is refused. A grant deleted takes
// its releases with it, as configd deletes them together, and those of
// its parts of top-ups (Pub.Each), which then cap nothing: a follower
// does not watch releases, and they would stay in its view for good.
func (h *Holder) Observe(key string, value []byte) error {
	if err := h.keys.Decode(h.view, key, value); err != nil {
		return err
	}
	if gk, ok := h.keys.grantOf(key); ok && value == nil {
		if p, ok := h.view.Pubs[gk.Pub]; !ok || p.Each == 0 {
			h.dropReleases(gk) // in a top-up of all, they are its part's, which stays
		}
		for _, p := range h.view.Pubs {
			if p.Each > 0 && p.Of == gk.Pub {
				h.dropReleases(GrantKey{p.Seq, gk.Holder}) // its part of that top-up went with it
			}
		}
	}
	return nil
}

// dropReleases forgets the releases of the grant key, sent or not.
func (h *Holder) dropReleases(gk GrantKey) {
	delete(h.view.Releases, gk)
	for r := range h.unsent {
		if r.Pub == gk.Pub && r.Holder == gk.Holder {
			delete(h.unsent, r)
		}
	}
}

// Forget drops what the holder has read, before it reads the ledger
// anew. The releases it enforced and has not seen stored stay: it keeps
// to them whatever it reads.
func (h *Holder) Forget() {
	h.view = NewState()
	for r := range h.unsent {
		h.view.Apply(r)
	}
}

// Next returns the state the holder enforces from now (its clock) on,
// and the releases its newest grant asks of it, already applied to that
// state. The driver enforces the state, then calls Commit with the start
// of the first window its limiter governs whole by then (Enforce's).
func (h *Holder) Next(now int64, margin time.Duration) (*State, []Release) {
	h.forgetEnded(now)
	next := h.view.Clone()
	rels := next.ToRelease(h.name, now, margin)
	for _, r := range rels {
		next.Apply(r)
	}
	return next, rels
}

// forgetEnded drops the publishes that grant the holder nothing and
// whose last window ended a window or more before now: configd deletes
// them, which a follower need not watch it do. A publish that grants it
// something, by a grant of its own or as a top-up of a publish it holds
// a grant in, stays until configd deletes that grant, which it watches:
// a clock that stepped ahead must not make it forget room it still holds.
// A publish extended after it was forgotten comes back as one record.
func (h *Holder) forgetEnded(now int64) {
	mine := map[int64]bool{}
	for g := range h.view.Counted() {
		if g.Holder == h.name {
			mine[g.Pub] = true
		}
	}
	for seq, p := range h.view.Pubs {
		if !mine[seq] && StartOf(p.B+2, p.Window) <= now {
			delete(h.view.Pubs, seq)
		}
	}
}

// Leave returns, and queues to be written, the releases to nothing of
// every grant the holder counts, each from its first window that starts
// at from or later: the driver has set its limiter to admit nothing, and
// from is the start of the first window that limiter governs whole
// (Enforce's). configd may then grant that room to others at once,
// instead of when the grants end.
func (h *Holder) Leave(from int64) []Release {
	var out []Release
	for _, g := range slices.SortedFunc(h.view.Counted(), compareGrants) {
		p, ok := h.view.Pubs[g.Pub]
		if !ok || g.Holder != h.name {
			continue
		}
		k := WindowOf(from-1, p.Window) + 1 // the first window starting at from or later
		if r, ok := h.view.lower(g, k, 0); ok {
			h.view.Apply(r)
			h.unsent[r] = true
			out = append(out, r)
		}
	}
	return out
}

// Commit keeps, of rels enforced by a limiter that governs whole the
// windows from from on, those whose first window starts there or later,
// and queues them to be written. A release from a window already under
// way is not true of it, since the limiter may have admitted more there,
// so it is dropped: the next Next asks for it again from a later window.
// It returns the releases kept.
func (h *Holder) Commit(next *State, rels []Release, from int64) []Release {
	var kept []Release
	for _, r := range rels {
		p, ok := next.Pubs[r.Pub]
		if !ok || StartOf(r.From, p.Window) < from {
			continue
		}
		h.view.Apply(r)
		h.unsent[r] = true
		kept = append(kept, r)
	}
	return kept
}

// Unsent returns the releases kept but not yet known stored, in key
// order, with their writes.
func (h *Holder) Unsent() ([]Release, []Op, error) {
	rels := slices.SortedFunc(maps.Keys(h.unsent), func(a, b Release) int {
		return cmp.Compare(h.keys.Release(a), h.keys.Release(b))
	})
	ops := make([]Op, 0, len(rels))
	for _, r := range rels {
		b, err := Encode(r)
		if err != nil {
			return nil, nil, err
		}
		ops = append(ops, Op{Key: h.keys.Release(r), Value: b})
	}
	return rels, ops, nil
}

// Stored records that rels are stored: they are no longer sent.
func (h *Holder) Stored(rels []Release) {
	for _, r := range rels {
		delete(h.unsent, r)
	}
}

// Enforce sets lim to the schedule of holder in view as computed at now,
// in one change: the limiter itself picks the piece in force by its own
// clock, so a boundary passing meanwhile costs nothing. Before the first
// piece nothing is enforced, in windows of length idle; the expiry is the
// end of the last grant, or t (lim's clock when last read, later than now
// when the holder was slow) when there is none. It returns the start of
// the first window lim governs whole, for Commit.
func Enforce(lim Limiter, view *State, holder string, now, t int64, idle time.Duration) (from int64, err error) {
	pieces, end := view.Schedule(holder, now)
	steps := make([]limiter.Step, 0, len(pieces)+1)
	steps = append(steps, limiter.Step{Quota: 0, Window: idle})
	for _, p := range pieces {
		steps = append(steps, limiter.Step{At: time.Unix(0, p.At), Quota: p.Quota, Window: p.Window})
	}
	expiry := time.Unix(0, t)
	if end > 0 {
		expiry = time.Unix(0, end)
	}
	f, err := lim.SetSchedule(steps, expiry)
	if err != nil {
		return 0, fmt.Errorf("ledger: enforcing %d pieces of %s's grants: %w", len(pieces), holder, err)
	}
	return f.UnixNano(), nil
}
