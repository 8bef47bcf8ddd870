package main

import (
	"maps"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/sluice-go/sluice/internal/schema"
)

// The holds: how long the leader keeps the grant of an instance whose key
// went from the others. One whose lease expired may only be cut off from
// etcd and still enforce its share until its fail_static past its lease's
// end, by the value it last read; and what any instance that stopped
// admitted must lie in windows before those another instance grows a
// late record into at once (schema.ProviderConfig.Settle,
// follow.Schedule).

// replacedFailStatic is a fail_static (the default applied) that was in
// force until until.
type replacedFailStatic struct {
	d     time.Duration
	until time.Time
}

// failStaticMemory is how long a replaced fail_static is remembered. An
// instance writes its record within a report interval of reading a new
// value, and its key goes a lease TTL after its last renewal: both far
// shorter.
const failStaticMemory = 2 * time.Hour

// recordSkew is the slack allowed when an instance's record time is
// compared with this replica's.
const recordSkew = time.Minute

// replacedScan is how many of a provider's newest history entries a
// replica that loads reads for the fail_static values they replaced.
const replacedScan = 64

// noteFailStatic remembers the fail_static prev had if the config now has
// another; now is when the change was seen.
func (st *providerState) noteFailStatic(prev *schema.ProviderConfig, now time.Time) {
	if d := st.config().FailStaticOrDefault(); prev != nil && prev.FailStaticOrDefault() != d {
		st.replaced = append(st.replaced, replacedFailStatic{d: prev.FailStaticOrDefault(), until: now})
	}
	st.replaced = slices.DeleteFunc(st.replaced, func(r replacedFailStatic) bool {
		return now.Sub(r.until) > failStaticMemory
	})
}

// replacedFrom remembers the fail_static values the history entries kvs
// record replaced in the last failStaticMemory: a replica that starts
// knows of changes made before it did. Malformed entries are skipped.
func (st *providerState) replacedFrom(kvs []*mvccpb.KeyValue, now time.Time) {
	for _, kv := range kvs {
		h, err := schema.DecodeHistoryEntry(kv.Value)
		if err != nil || h.Old == nil || now.Sub(h.When) > failStaticMemory {
			continue
		}
		if d := h.Old.FailStaticOrDefault(); h.New == nil || h.New.FailStaticOrDefault() != d {
			st.replaced = append(st.replaced, replacedFailStatic{d: d, until: h.When})
		}
	}
}

// holdFor is how long after instance id's key went its grant is held
// (schema.ProviderConfig.HoldAfter): for the longest fail_static it may be
// counting with — the provider's, the one its last record (rec, written at
// written; nil when unknown) says, and any this replica knows was replaced
// since that record was written, which it may have read after (with no
// record: any remembered) — plus the clock bound, plus how long it may
// admit past its horizon (lingers), plus Settle. An instance that said it
// was leaving stopped admitting before its key went: Settle alone, past
// any linger.
func (st *providerState) holdFor(id string, rec *schema.InstanceRecord, written time.Time) time.Duration {
	settle := st.config().Settle() + st.lingers(id)
	if rec != nil && rec.Leaving {
		return settle
	}
	var d time.Duration
	if rec != nil {
		d = rec.FailStatic.D()
	}
	for _, r := range st.replaced {
		if rec == nil || !r.until.Before(written.Add(-recordSkew)) {
			d = max(d, r.d)
		}
	}
	return st.config().HoldAfter(d) + settle
}

// configChanged lengthens the holds set before the config changed from
// prev's (nil: the provider was deleted meanwhile, or is new):
//
//   - by how long each held instance may admit past its horizon in a
//     window of its record's length, if the window changed (lingers; found
//     by review: a hold set while the window was 10 s ended inside the
//     held instance's 10 s window after it became 1 s, 90 in a 1 s window
//     of 60);
//   - by what Settle grew, with a longer window or a larger clock bound: a
//     late record of the new config grows at once up to a window of its
//     own length after its publish (found by review: a hold whose Settle
//     counted the 1 s window ended a second after the held instance
//     stopped, inside the others' new 60 s window, 6,363 of 6,000). A
//     provider created again is compared with the defaults, which errs
//     toward holding longer.
func (st *providerState) configChanged(prev *schema.ProviderConfig) {
	if st.cfg == nil {
		return
	}
	if prev != nil && prev.Window != st.cfg.Window {
		for id, until := range st.held {
			st.held[id] = until.Add(st.lingers(id))
		}
	}
	was := schema.ProviderConfig{}.Settle()
	if prev != nil {
		was = prev.Settle()
	}
	if d := st.cfg.Settle() - was; d > 0 {
		for id, until := range st.held {
			st.held[id] = until.Add(d)
		}
	}
}

// lingers is how long past its fail-static horizon instance id may still
// admit by its share record: a window that began before its expiry keeps
// its quota to its end (limiter.SetExpiry). In the config's window length
// that end is at or before the boundary the others grow at after the
// hold; in another length (the window changed while it was cut off) it
// can be later, by up to that length. An adversarial review found a
// 10 s window running 8 s past a hold that ended when the window had
// become 1 s: 90 in a 1 s window of 60.
func (st *providerState) lingers(id string) time.Duration {
	e, ok := st.shares.records[id]
	if !ok {
		return 0
	}
	w := st.config().Window.D()
	lengths := []time.Duration{e.rec.Window.D()}
	if b := e.rec.Before; b != nil {
		lengths = append(lengths, b.Window.D())
	}
	var d time.Duration
	for _, x := range lengths {
		if x != w {
			d = max(d, x)
		}
	}
	return d
}

// enforcing returns the most id's share record leaves it enforcing
// (schema.ShareRecord.Enforcing); 0 without one.
func (st *providerState) enforcing(id string) int64 { return st.shares.enforcing(id) }

// holdable reports whether the published shares leave id permits it may
// still be enforcing.
func (st *providerState) holdable(id string) bool { return st.enforcing(id) > 0 }

// holdMissing holds, for holdFor without a record, every instance the published
// shares leave permits to that is neither live nor held already: a leader
// that starts (or reloads) cannot know when they left, nor whether they
// left gracefully.
func (st *providerState) holdMissing(now time.Time) {
	for _, id := range slices.Sorted(maps.Keys(st.shares.records)) {
		if _, live := st.instances[id]; live || !st.holdable(id) {
			continue
		}
		if _, ok := st.held[id]; !ok {
			st.held[id] = now.Add(st.holdFor(id, nil, time.Time{}))
		}
	}
}

// heldGrants returns what each held instance may still be enforcing, and
// forgets the holds that ended by now; next is when the first remaining
// one ends (zero: none).
func (st *providerState) heldGrants(now time.Time) (held map[string]int64, next time.Time) {
	for id, until := range st.held {
		_, live := st.instances[id]
		if live || !now.Before(until) || !st.holdable(id) {
			delete(st.held, id)
			continue
		}
		if held == nil {
			held = map[string]int64{}
		}
		held[id] = st.enforcing(id)
		if next.IsZero() || until.Before(next) {
			next = until
		}
	}
	return held, next
}

// gone forgets instance id, whose key went at now (the monotonic clock),
// and holds its grant for holdFor if the published shares leave it any.
// It says until when, whether the instance said it was leaving, and
// whether it is held.
func (st *providerState) gone(id string, now time.Time) (until time.Time, leaving, held bool) {
	rec, was := st.instances[id]
	written := st.written[id]
	delete(st.instances, id)
	delete(st.written, id)
	if !was || !st.holdable(id) {
		return time.Time{}, rec.Leaving, false
	}
	until = now.Add(st.holdFor(id, &rec, written))
	st.held[id] = until
	return until, rec.Leaving, true
}

// keepHolds carries into st, read again, what o (the state before the
// reload) knew of the holds: the fail_static values it saw replaced, and
// the holds of instances that are still gone.
func (st *providerState) keepHolds(o *providerState, now time.Time) {
	for _, r := range o.replaced {
		if !slices.Contains(st.replaced, r) { // read again from history
			st.replaced = append(st.replaced, r)
		}
	}
	st.noteFailStatic(o.cfg, now)
	for id, until := range o.held {
		if _, live := st.instances[id]; !live {
			st.held[id] = until
		}
	}
}
