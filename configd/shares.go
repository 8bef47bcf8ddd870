package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/configd/plan"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/internal/share"
)

// The shares the leader publishes: one schema.ShareRecord per instance, at
// Keys.Share(provider, id), each written only when it changes. An instance
// watches its own record and nothing else, so what it receives does not
// grow with the fleet; a publish writes the records that changed, in
// transactions of at most recordsPerTxn operations (under etcd's default
// --max-txn-ops of 128), up to txnsInFlight at once, each fenced on
// leadership and on the config's revision.
//
// A publish cut short (the leader lost, a config change) leaves some
// records new and the others as they were. That is safe: a share grows
// only out of what no instance may enforce before the publish (plan, the
// handover), so any mix of old and new records stays within the grants;
// and a new leader resumes from the records as they are.

// recordsPerTxn is how many share records one transaction writes.
const recordsPerTxn = 100

// txnsInFlight is how many of a publish's transactions are sent at once.
// They are independent (each fenced on its own, and any mix of old and new
// records is safe, above), and a publish that moves every share of a large
// fleet is dozens of them: sent one after the other, a retune of 2,000
// instances took 3-4 s to write on 2 cores, while the instances
// acknowledged the first records, and reached most of them after its
// boundary (BENCHMARKS.md, section 12).
const txnsInFlight = 16

// shareEntry is one instance's share record as the leader knows it, and
// the etcd revision it was written at.
type shareEntry struct {
	rec schema.ShareRecord
	rev int64
}

// shareState is what the leader knows of a provider's share records.
type shareState struct {
	records map[string]shareEntry // by instance ID: the last good record of each
	legacy  bool                  // an older configd's single shares record is there (it is deleted)
	// rewrite holds the instance IDs whose record in etcd is not the one
	// records holds: malformed, inconsistent with the config or written by
	// someone else. They are written (or deleted) at the next publish,
	// even if nothing moved.
	rewrite map[string]bool
	// own is, per instance ID, the revision this replica last wrote its
	// record at since it leads the provider: a record written after its
	// owner key, at another revision, is not this replica's.
	own map[string]int64
	// registered is, per live instance ID, the revision its key was
	// created at: a share record older than that is a previous process's,
	// which gives the new one nothing, so it is written again.
	registered map[string]int64
	// perRecord is how long one record took to write in the last publish
	// of at least a transaction's worth (see writeTime).
	perRecord time.Duration
	// assembled is view's answer until records changes (set and remove
	// clear it): every decision reads it, and assembling it again each
	// time cost a replica 9% of its CPU (BENCHMARKS.md, section 13).
	assembled *schema.Shares
}

// set records instance id's record.
func (s *shareState) set(id string, e shareEntry) {
	s.records[id] = e
	s.assembled = nil
}

// remove forgets instance id's record.
func (s *shareState) remove(id string) {
	delete(s.records, id)
	s.assembled = nil
}

func newShareState() shareState {
	return shareState{records: map[string]shareEntry{}, own: map[string]int64{}, registered: map[string]int64{}, rewrite: map[string]bool{}}
}

// any reports whether a share record (or the legacy one) exists.
func (s *shareState) any() bool { return len(s.records) > 0 || s.legacy }

// enforcing returns the most id's record leaves it enforcing.
func (s *shareState) enforcing(id string) int64 {
	e, ok := s.records[id]
	if !ok {
		return 0
	}
	return e.rec.Enforcing()
}

// view assembles the records into the provider view (schema.Shares); nil
// without records. Callers must not modify it.
func (s *shareState) view(provider string) *schema.Shares {
	if len(s.records) == 0 {
		return nil
	}
	if s.assembled != nil {
		return s.assembled
	}
	recs := make([]schema.ShareRecord, 0, len(s.records))
	for _, e := range s.records {
		recs = append(recs, e.rec)
	}
	v := schema.AssembleShares(provider, recs)
	s.assembled = &v
	return &v
}

// bad reports whether some record is to be rewritten.
func (s *shareState) bad() bool { return len(s.rewrite) > 0 }

// stale reports whether some live instance's record was written before the
// instance registered.
func (s *shareState) stale() bool {
	for id, reg := range s.registered {
		if e, ok := s.records[id]; ok && e.rev < reg {
			return true
		}
	}
	return false
}

// applyShare folds a write (or the deletion) of instance id's share record
// of provider name into st; id "" is an older configd's single record.
func (p *publisher) applyShare(st *providerState, name, id string, put bool, kv *mvccpb.KeyValue) {
	s := &st.shares
	key := string(kv.Key)
	if id == "" {
		s.legacy = put
		return
	}
	if !put {
		s.remove(id)
		return
	}
	if own := s.own[id]; own != 0 && kv.ModRevision < own {
		return // the late echo of an earlier publish of ours
	}
	st.maxGen = max(st.maxGen, min(kv.Version, schema.MaxGeneration)) // survives a malformed record
	if e, ok := s.records[id]; ok && e.rev == kv.ModRevision && s.own[id] == kv.ModRevision {
		// The echo of our last write of it: folded in when it was written
		// (writeRecords). Decoding it again cost a replica an eighth of
		// its CPU in a retune of 10,000 instances (BENCHMARKS.md, section
		// 13).
		return
	}
	rec, err := schema.DecodeShareRecord(kv.Value)
	if err == nil && (rec.Provider != name || rec.Instance != id) {
		err = fmt.Errorf("share record names provider %q, instance %q", rec.Provider, rec.Instance)
	}
	if err != nil {
		// The last good record stays: its grant still bounds what the
		// instance may enforce (it refuses this one too). Publishing
		// rewrites the bad one — unless this replica wrote it: rewriting
		// its own output would write the same again, in a loop.
		if kv.ModRevision != s.own[id] {
			s.rewrite[id] = true
		}
		p.bad(key, kv.ModRevision, err)
		return
	}
	switch {
	case !p.loading && p.fences[name].rev != 0 && kv.ModRevision > p.fences[name].rev && kv.ModRevision != s.own[id]:
		// Written by someone else while this replica leads the provider:
		// a forgery or a hand edit. The instance may enforce it until this replica's
		// next publish, so it counts as a grant beside ours; its
		// generation is not ours to continue from.
		p.metrics.foreignShares.WithLabelValues(name).Inc()
		p.log.Warn("share record written by someone else while this replica leads; publishing over it",
			"provider", name, "instance", id, "revision", kv.ModRevision, "generation", rec.Generation)
		s.set(id, shareEntry{withGrantOf(s.records[id], rec), kv.ModRevision})
		s.rewrite[id] = true
	case st.cfg != nil && rec.CheckAgainst(*st.cfg, st.cfgRev) != nil:
		// Inconsistent with the config: the instance refuses it, but may
		// have applied it under an earlier config. Its grant counts; it
		// is published over.
		p.bad(key, kv.ModRevision, rec.CheckAgainst(*st.cfg, st.cfgRev))
		s.set(id, shareEntry{rec, kv.ModRevision})
		s.rewrite[id] = true
		st.maxGen = max(st.maxGen, rec.Generation)
	default:
		s.set(id, shareEntry{rec, kv.ModRevision})
		st.maxGen = max(st.maxGen, rec.Generation)
		at := rec.Published
		if now := p.wall(); now.Before(at) {
			at = now // a replica whose clock is ahead must not hold publishing back
		}
		if at.After(st.published) {
			st.published = at
		}
	}
}

// withGrantOf returns ours (the leader's last record of an instance, if
// any) with its grant raised to cover what other, a record someone else
// wrote, may have the instance enforce.
func withGrantOf(ours shareEntry, other schema.ShareRecord) schema.ShareRecord {
	if ours.rec.Generation == 0 {
		return other
	}
	merged := ours.rec
	merged.Granted = max(merged.Enforcing(), share.In(other.Enforcing(), other.Window.D(), merged.Window.D()))
	return merged
}

// published is the last publish as package plan sees it: every instance's
// record; nil without records. at is when it was published, clamped to
// this replica's clock.
func (s *shareState) published(provider string, at time.Time) *plan.Published {
	v := s.view(provider)
	if v == nil {
		return nil
	}
	var before *plan.Transition
	if b := v.Before; b != nil {
		before = &plan.Transition{Window: b.Window.D(), Since: b.Since, Granted: b.Granted, Total: b.Total}
	}
	return &plan.Published{
		Generation:     v.Generation,
		EffectiveFrom:  v.EffectiveTime(),
		Total:          v.Total,
		Window:         v.Window.D(),
		ConfigRevision: v.ConfigRevision,
		Shares:         v.Shares,
		Granted:        v.Granted,
		Before:         before,
		Generations:    v.Generations,
		From:           v.From,
		At:             at,
	}
}

// records returns the share records decision d asks for under cfg (at
// cfgRev), as generation gen: one per instance it gives a share or a
// grant.
func (p *publisher) records(name string, cfg schema.ProviderConfig, cfgRev int64, d plan.Decision, gen int64, now time.Time) map[string]schema.ShareRecord {
	out := make(map[string]schema.ShareRecord, len(d.Granted))
	ids := maps.Clone(d.Granted)
	if ids == nil {
		ids = map[string]int64{}
	}
	if b := d.Before; b != nil {
		// An instance held after its key went keeps only an old regime's
		// grant when the limit or the window changes: its record keeps it
		// (share 0, held), or the hold would go with the record (found by
		// review: 89 in a 1 s window of 60 after --limit 59).
		for id, g := range b.Granted {
			if _, ok := ids[id]; !ok && g > 0 {
				ids[id] = 0
			}
		}
	}
	for id, granted := range ids {
		sh, named := d.Shares[id]
		r := schema.ShareRecord{
			Version: schema.Version, Provider: name, Instance: id,
			Generation: gen, EffectiveFrom: d.EffectiveFrom.UnixNano(), Window: cfg.Window, Total: cfg.Limit,
			Share: sh, Granted: max(granted, sh), Held: !named,
			ConfigRevision: cfgRev, Published: now.UTC(), Leader: p.replica,
		}
		if b := d.Before; b != nil {
			since := b.Since
			if since == 0 {
				since = gen
			}
			r.Before = &schema.ShareTransition{Window: schema.Duration(b.Window), Since: since, Granted: b.Granted[id], Total: b.Total}
		}
		out[id] = r
	}
	return out
}

// sameRecord reports whether a and b hand out the same thing: all but the
// generation, boundary and publish time (a record that only those would
// change is not written again).
func sameRecord(a, b schema.ShareRecord) bool {
	a.Generation, a.EffectiveFrom, a.Published, a.Leader, a.Version = 0, 0, time.Time{}, "", 0
	b.Generation, b.EffectiveFrom, b.Published, b.Leader, b.Version = 0, 0, time.Time{}, "", 0
	if a.Before != nil && b.Before != nil {
		ab, bb := *a.Before, *b.Before
		ab.Since, bb.Since = 0, 0
		if ab != bb {
			return false
		}
		a.Before, b.Before = nil, nil
	}
	return a == b
}

// needsWrite reports whether instance id's record must be written as r:
// it differs from the one held, or is older than the instance's
// registration, or is to be rewritten.
func (s *shareState) needsWrite(id string, r schema.ShareRecord) bool {
	e, have := s.records[id]
	return !have || !sameRecord(e.rec, r) || e.rev < s.registered[id] || s.rewrite[id]
}

// writeTime is how long writing n records is expected to take, from the
// last publish that wrote at least a transaction's worth; 0 for fewer
// (one transaction's latency is within the margin) or with nothing
// measured yet.
func (s *shareState) writeTime(n int) time.Duration {
	if n < recordsPerTxn || s.perRecord <= 0 {
		return 0
	}
	return time.Duration(n) * s.perRecord
}

// wrote notes that n records took d to write.
func (s *shareState) wrote(n int, d time.Duration) {
	if n >= recordsPerTxn {
		s.perRecord = d / time.Duration(n)
	}
}

// writeRecords writes want (instance ID → record) where it differs from
// what st holds or is older than its instance's registration, and deletes
// the records of instances want no longer names, with the legacy record,
// in transactions fenced on leadership and on cond. It returns how many
// records it wrote, and stops at the first transaction cond refuses
// (false: the watch brings the change).
func (p *publisher) writeRecords(ctx context.Context, f fence, name string, st *providerState, cond clientv3.Cmp, want map[string]schema.ShareRecord) (written int, ok bool, err error) {
	s := &st.shares
	var ops []clientv3.Op
	var ids []string // per op: the instance ID; "-" and the ID for a deletion, "" for the legacy record's
	for _, id := range slices.Sorted(maps.Keys(want)) {
		if !s.needsWrite(id, want[id]) {
			continue
		}
		val, err := schema.Encode(want[id]) // validates
		if err != nil {
			return written, false, fmt.Errorf("allocation refused: %w", err)
		}
		ops = append(ops, clientv3.OpPut(p.keys.Share(name, id), string(val)))
		ids = append(ids, id)
	}
	gone := map[string]bool{} // records, good or not, of instances want does not name
	for id := range s.records {
		gone[id] = true
	}
	for id := range s.rewrite {
		gone[id] = true
	}
	for _, id := range slices.Sorted(maps.Keys(gone)) {
		if _, keep := want[id]; !keep {
			ops = append(ops, clientv3.OpDelete(p.keys.Share(name, id)))
			ids = append(ids, "-"+id)
		}
	}
	if s.legacy {
		ops = append(ops, clientv3.OpDelete(p.keys.LegacyShares(name)))
		ids = append(ids, "")
	}
	revs, err := p.commitChunks(ctx, f, cond, ops)
	ok = err == nil
	for c, rev := range revs {
		if rev == 0 {
			ok = false // cond did not hold: the config changed meanwhile
			continue
		}
		for _, id := range ids[c*recordsPerTxn : min(len(ids), (c+1)*recordsPerTxn)] {
			switch {
			case id == "":
				s.legacy = false
			case id[0] == '-':
				s.remove(id[1:])
				delete(s.rewrite, id[1:])
			default:
				s.set(id, shareEntry{want[id], rev})
				s.own[id] = rev
				delete(s.rewrite, id)
				written++
			}
		}
	}
	return written, ok, err
}

// commitChunks commits ops in transactions of recordsPerTxn, up to
// txnsInFlight at once, each fenced on f and cond, and returns the
// revision each was written at (0: not written). The error is the first
// any transaction met; the others may have been written.
func (p *publisher) commitChunks(ctx context.Context, f fence, cond clientv3.Cmp, ops []clientv3.Op) ([]int64, error) {
	revs := make([]int64, (len(ops)+recordsPerTxn-1)/recordsPerTxn)
	errs := make([]error, len(revs))
	sem := make(chan struct{}, txnsInFlight)
	var wg sync.WaitGroup
	for c := range revs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			revs[c], errs[c] = p.commitRev(ctx, f, cond, ops[c*recordsPerTxn:min(len(ops), (c+1)*recordsPerTxn)]...)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return revs, err
		}
	}
	return revs, nil
}
