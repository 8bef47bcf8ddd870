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

// hold is how long a gone instance's grant stays reserved: until until,
// as holdFor counted it under the config under (its fail_static, window
// and Settle). One whose lease expired may only be cut off from etcd, and
// then keeps its share for its fail_static; and what any stopped instance
// admitted must lie in windows before those the others grow a late record
// into at once (follow.Schedule). A later config lengthens the hold from
// under (configChanged): through a deletion of the provider and across a
// reload, the config before the change is not at hand.
type hold struct {
	until time.Time
	under schema.ProviderConfig
}

// holdUntil holds instance id's grant until until, counted under the
// config now.
func (st *providerState) holdUntil(id string, until time.Time) {
	st.held[id] = hold{until: until, under: st.config()}
}

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

// configChanged lengthens each hold set under a config other than the
// one now:
//
//   - by how long the held instance may admit past its horizon in a
//     window of its record's length, if the window changed (lingers; found
//     by review: a hold set while the window was 10 s ended inside the
//     held instance's 10 s window after it became 1 s, 90 in a 1 s window
//     of 60);
//   - by what Settle grew, with a longer window or a larger clock bound: a
//     late record of the new config grows at once up to a window of its
//     own length after its publish (found by review: a hold whose Settle
//     counted the 1 s window ended a second after the held instance
//     stopped, inside the others' new 60 s window, 6,363 of 6,000).
//
// Each hold is compared with the config it was counted under, not with
// the one just replaced: a second review found the change compared with
// the defaults after the provider was deleted and created again, and not
// made at all when the config changed while the watch was broken (a
// reload), each a hold that ended before the others' new window began.
func (st *providerState) configChanged() {
	if st.cfg == nil {
		return
	}
	for id, h := range st.held {
		if h.under.Window != st.cfg.Window {
			h.until = h.until.Add(st.lingers(id))
		}
		if d := st.cfg.Settle() - h.under.Settle(); d > 0 {
			h.until = h.until.Add(d)
		}
		h.under = *st.cfg
		st.held[id] = h
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
			st.holdUntil(id, now.Add(st.holdFor(id, nil, time.Time{})))
		}
	}
}

// heldGrants returns what each held instance may still be enforcing, and
// forgets the holds that ended by now; next is when the first remaining
// one ends (zero: none).
func (st *providerState) heldGrants(now time.Time) (held map[string]int64, next time.Time) {
	for id, h := range st.held {
		_, live := st.instances[id]
		if live || !now.Before(h.until) || !st.holdable(id) {
			delete(st.held, id)
			continue
		}
		if held == nil {
			held = map[string]int64{}
		}
		held[id] = st.enforcing(id)
		if next.IsZero() || h.until.Before(next) {
			next = h.until
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
	st.holdUntil(id, until)
	return until, rec.Leaving, true
}

// keepHolds carries into st, read again, what o (the state before the
// reload) knew of the holds: the fail_static values it saw replaced, and
// the holds of instances that are still gone, lengthened for a config
// that changed while the watch was broken.
func (st *providerState) keepHolds(o *providerState, now time.Time) {
	for _, r := range o.replaced {
		if !slices.Contains(st.replaced, r) { // read again from history
			st.replaced = append(st.replaced, r)
		}
	}
	st.noteFailStatic(o.cfg, now)
	for id, h := range o.held {
		if _, live := st.instances[id]; !live {
			st.held[id] = h
		}
	}
	st.configChanged()
}
