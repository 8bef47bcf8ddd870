package main

import (
	"context"
	"errors"
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
// watches its own record and the provider's common record, and nothing
// else, so what it receives does not grow with the fleet.
//
// Instances whose records would be alike (all but the instance: a fleet
// of equal shares) share one: the common record, at Keys.CommonShare, and
// each of their own records says only Common. A publish that moves all
// their shares alike writes the common record alone, not one record per
// instance: at N = 2,000 a retune that rewrote 2,000 records took 0.4-1 s
// of etcd on 2 cores, and most of a window (BENCHMARKS.md, section 12).
// A publish writes in three steps (layout), each in transactions of at
// most recordsPerTxn operations (under etcd's default --max-txn-ops of
// 128), up to txnsInFlight at once, each fenced on leadership and on the
// config's revision:
//
//  1. the instances' own full records, and deletions: among them every
//     instance that followed the common record and will not follow the new
//     one, so that it never reads a common record meant for others;
//  2. the common record, only once every write of step 1 landed;
//  3. the records that say Common, only to a common record written in the
//     same publish and once it landed, then the deletions of the records
//     of instances gone.
//
// An instance reads its own record and the common record in one snapshot
// (schema.ShareRecord.Resolve), so every mix it can see of records old and
// new is one this order allows. A publish cut short (the leader lost, a
// config change) leaves some records new and the others as they were.
// That is safe: a share grows only out of what no instance may enforce
// before the publish (plan, the handover), so any mix of old and new
// records stays within the grants; and a new leader resumes from the
// records as they are.

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
	// records holds, by instance ID, the last good record of each,
	// resolved (one that says Common as the common record it follows), at
	// the revision of the instance's own key.
	records map[string]shareEntry
	// pointers holds the instances whose own record says Common, and the
	// revision it was written at.
	pointers map[string]int64
	// common is the provider's common record (nil: none), and ownCommon
	// the revision this replica last wrote it at; rewriteCommon says it is
	// to be written again (malformed, or someone else's).
	common        *shareEntry
	ownCommon     int64
	rewriteCommon bool
	// unknown holds the live instances whose record this replica could
	// not read when it took the provider over (malformed, or saying
	// Common with no common record to resolve it): each may enforce a last
	// good record this replica never saw. Until one acknowledges a record
	// of this replica's, its grant is the whole limit (unknownGrant),
	// which keeps every other share from growing, and its own target is 0
	// (holdUnknown): a grant of the whole limit must not become its share.
	unknown map[string]bool
	legacy  bool // an older configd's single shares record is there (it is deleted)
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
	// leases is, per live instance ID, the lease its key was last written
	// on: another lease is another process (register).
	leases map[string]int64
	// unmoved says that since the common record this replica last wrote
	// landed, every instance record written (by anyone, as far as the
	// watch has told) said Common, and none was deleted: the next common
	// record says so (schema.ShareRecord.Unmoved), and its followers take
	// it from the watch event alone. false until this replica writes a
	// common record: what others wrote before it is not known.
	unmoved bool
	// seen is the newest revision of a share record write this replica
	// knows of (its own that landed, and the watch's): a common record
	// says Unmoved only if no key under shares/ was written after it (a
	// write whose answer was lost, landing late; a foreign write the
	// watch has yet to bring).
	seen int64
	// lateDelete says a deletion of an instance's record was sent and its
	// answer lost: it may land at any time, and leaves no key for the
	// check of seen to find. No common record says Unmoved again while
	// this replica leads the provider.
	lateDelete bool
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
	delete(s.unknown, id)
	s.assembled = nil
}

func newShareState() shareState {
	return shareState{records: map[string]shareEntry{}, pointers: map[string]int64{}, own: map[string]int64{}, registered: map[string]int64{},
		rewrite: map[string]bool{}, unknown: map[string]bool{}, leases: map[string]int64{}}
}

// register notes a write of instance id's key, kv: the revision its
// process registered at is the key's creation, or, when the write moved
// the key to another lease, that write's. A process that restarts under
// the same ID while its predecessor's lease lives overwrites the key,
// which keeps its creation; a record written before its own write is
// its predecessor's, which it takes nothing of (cluster.Member). Counted
// at the creation, a record that says Common was never written again for
// it (retunes write the common record alone): it stayed at 0 for good
// while configd counted it at its share (found by review).
func (s *shareState) register(id string, kv *mvccpb.KeyValue) {
	reg := kv.CreateRevision
	if was, ok := s.leases[id]; ok && was != kv.Lease {
		reg = kv.ModRevision
	}
	s.registered[id] = max(reg, s.registered[id])
	s.leases[id] = kv.Lease
}

// any reports whether a share record (or the legacy one) exists.
func (s *shareState) any() bool {
	return len(s.records) > 0 || len(s.pointers) > 0 || s.common != nil || s.legacy
}

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
// of provider name into st; id "" is an older configd's single record,
// schema.CommonInstance the common record.
func (p *publisher) applyShare(st *providerState, name, id string, put bool, kv *mvccpb.KeyValue) {
	s := &st.shares
	s.seen = max(s.seen, kv.ModRevision)
	switch id {
	case "":
		s.legacy = put
		return
	case schema.CommonInstance:
		p.applyCommon(st, name, put, kv)
		return
	}
	if !put {
		s.remove(id)
		delete(s.pointers, id)
		s.unmoved = false // ours were counted as sent (writeStep)
		return
	}
	if own := s.own[id]; own != 0 && kv.ModRevision < own {
		return // the late echo of an earlier publish of ours
	}
	if kv.ModRevision != s.own[id] {
		s.unmoved = false // someone else's write
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
	if err == nil {
		if rec.Common {
			s.pointers[id] = kv.ModRevision
		} else {
			delete(s.pointers, id)
		}
		st.maxGen = max(st.maxGen, rec.Generation)
		rec, err = rec.Resolve(s.commonRecord())
	}
	if err != nil {
		// The last good record stays: its grant still bounds what the
		// instance may enforce (it refuses this one too). Publishing
		// rewrites the bad one — unless this replica wrote it: rewriting
		// its own output would write the same again, in a loop.
		if kv.ModRevision != s.own[id] {
			s.rewrite[id] = true
		}
		if _, have := s.records[id]; !have {
			// None known (read as this replica took the provider over):
			// the instance keeps a last good record this replica never
			// saw. It may enforce anything up to the limit until it
			// acknowledges the record written over this one (found by
			// review: a takeover while the common record was missing
			// counted every follower at 0, and grew another to 80 beside
			// their 30 each, 140 of 100).
			if u, ok := unknownGrant(st.cfg, name, id); ok {
				s.set(id, shareEntry{u, kv.ModRevision})
			}
			s.unknown[id] = true // granted at the next publish without a config now
		}
		p.bad(string(kv.Key), kv.ModRevision, err)
		return
	}
	foreign := kv.ModRevision != s.own[id] && !p.loading && p.fences[name].rev != 0 && kv.ModRevision > p.fences[name].rev
	p.foldShare(st, name, id, shareEntry{rec, kv.ModRevision}, foreign)
}

// foldShare folds e, instance id's record as written at e.rev (resolved),
// into st; foreign says someone else wrote it (or the common record it
// resolves to) while this replica leads the provider.
func (p *publisher) foldShare(st *providerState, name, id string, e shareEntry, foreign bool) {
	s, rec := &st.shares, e.rec
	delete(s.unknown, id) // known now
	switch {
	case foreign:
		// Written by someone else while this replica leads the provider:
		// a forgery or a hand edit. The instance may enforce it until this replica's
		// next publish, so it counts as a grant beside ours; its
		// generation is not ours to continue from.
		p.metrics.foreignShares.WithLabelValues(name).Inc()
		p.log.Warn("share record written by someone else while this replica leads; publishing over it",
			"provider", name, "instance", id, "revision", e.rev, "generation", rec.Generation)
		s.set(id, shareEntry{withGrantOf(s.records[id], rec), e.rev})
		s.rewrite[id] = true
	case st.cfg != nil && rec.CheckAgainst(*st.cfg, st.cfgRev) != nil:
		// Inconsistent with the config: the instance refuses it, but may
		// have applied it under an earlier config. Its grant counts; it
		// is published over.
		p.bad(p.keys.Share(name, id), e.rev, rec.CheckAgainst(*st.cfg, st.cfgRev))
		s.set(id, e)
		s.rewrite[id] = true
	default:
		s.set(id, e)
		at := rec.Published
		if now := p.wall(); now.Before(at) {
			at = now // a replica whose clock is ahead must not hold publishing back
		}
		if at.After(st.published) {
			st.published = at
		}
	}
}

// applyCommon folds a write (or the deletion) of provider name's common
// record into st: every instance whose record says Common now follows it.
func (p *publisher) applyCommon(st *providerState, name string, put bool, kv *mvccpb.KeyValue) {
	s := &st.shares
	if s.ownCommon != 0 && kv.ModRevision <= s.ownCommon {
		return // the echo of a publish of ours (a drop's too): folded in when it was written
	}
	if !put {
		// The instances that followed it keep their last good records:
		// they keep them too. Each is written again at the next publish.
		s.common = nil
		for id := range s.pointers {
			s.rewrite[id] = true
		}
		return
	}
	st.maxGen = max(st.maxGen, min(kv.Version, schema.MaxGeneration))
	rec, err := schema.DecodeShareRecord(kv.Value)
	if err == nil && (rec.Provider != name || rec.Instance != schema.CommonInstance) {
		err = fmt.Errorf("common share record names provider %q, instance %q", rec.Provider, rec.Instance)
	}
	if err != nil {
		s.rewriteCommon = true
		for id := range s.pointers {
			s.rewrite[id] = true
		}
		p.bad(string(kv.Key), kv.ModRevision, err)
		return
	}
	st.maxGen = max(st.maxGen, rec.Generation)
	s.common = &shareEntry{rec, kv.ModRevision}
	foreign := !p.loading && p.fences[name].rev != 0 && kv.ModRevision > p.fences[name].rev
	if foreign {
		s.rewriteCommon = true
	}
	for _, id := range slices.Sorted(maps.Keys(s.pointers)) {
		p.foldShare(st, name, id, shareEntry{commonFor(rec, id), s.pointers[id]}, foreign)
	}
}

// holdUnknown sets to 0 the target of every instance whose record is
// unknown (see shareState.unknown), and forgets those that acknowledged a
// record of this replica's since: their grant is known again.
func (s *shareState) holdUnknown(target map[string]int64, live map[string]schema.InstanceRecord) {
	for id := range s.unknown {
		in, ok := live[id]
		if e := s.records[id]; !ok || (e.rec.Generation > 0 && in.AppliedGeneration == e.rec.Generation) {
			delete(s.unknown, id)
			continue
		}
		if _, ok := target[id]; ok {
			target[id] = 0
		}
	}
}

// grantUnknown counts every unknown instance with no record in the books
// (none could be made without a config) at unknownGrant under cfg.
func (s *shareState) grantUnknown(cfg *schema.ProviderConfig, name string) {
	for id := range s.unknown {
		if _, ok := s.records[id]; !ok {
			u, _ := unknownGrant(cfg, name, id)
			s.set(id, shareEntry{u, 0})
		}
	}
}

// unknownGrant returns the record the leader counts for instance id of
// provider name when the record in etcd cannot be read: share 0, and a
// grant of the whole limit (cfg's, false without one). Its generation is
// noAck, so the grant stays until it acknowledges the record written over
// it.
func unknownGrant(cfg *schema.ProviderConfig, name, id string) (schema.ShareRecord, bool) {
	if cfg == nil {
		return schema.ShareRecord{}, false
	}
	return schema.ShareRecord{Version: schema.Version, Provider: name, Instance: id, Generation: noAck, Window: cfg.Window, Total: cfg.Limit, Granted: cfg.Limit}, true
}

// commonFor returns the common record c as instance id's.
func commonFor(c schema.ShareRecord, id string) schema.ShareRecord {
	c.Instance, c.Unmoved = id, false
	return c
}

// commonRecord returns the common record, nil if none.
func (s *shareState) commonRecord() *schema.ShareRecord {
	if s.common == nil {
		return nil
	}
	return &s.common.rec
}

// withGrantOf returns ours (the leader's last record of an instance, if
// any) with its grant raised to cover what other, a record someone else
// wrote, may have the instance enforce. Its generation is noAck: the
// instance may follow other whatever it acknowledged of ours, so the
// grant stays until it acknowledges a record written over both.
func withGrantOf(ours shareEntry, other schema.ShareRecord) schema.ShareRecord {
	if ours.rec.Generation == 0 {
		return other
	}
	merged := ours.rec
	merged.Granted = max(merged.Enforcing(), share.In(other.Enforcing(), other.Window.D(), merged.Window.D()))
	merged.Generation = noAck
	return merged
}

// noAck is a generation no instance acknowledges (0 is the
// acknowledgement of none): a record of it counts at its grant until the
// instance acknowledges one written over it.
const noAck = -1

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
	a.Generation, a.EffectiveFrom, a.Published, a.Leader, a.Version, a.Unmoved = 0, 0, time.Time{}, "", 0, false
	b.Generation, b.EffectiveFrom, b.Published, b.Leader, b.Version, b.Unmoved = 0, 0, time.Time{}, "", 0, false
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

// writeTime is how long writing n keys is expected to take, from the
// last publish that wrote at least a transaction's worth; 0 for fewer
// (one transaction's latency is within the margin) or with nothing
// measured yet.
func (s *shareState) writeTime(n int) time.Duration {
	if n < recordsPerTxn || s.perRecord <= 0 {
		return 0
	}
	return time.Duration(n) * s.perRecord
}

// wrote notes that n keys took d to write.
func (s *shareState) wrote(n int, d time.Duration) {
	if n >= recordsPerTxn {
		s.perRecord = d / time.Duration(n)
	}
}

// minCommon is the fewest instances whose records are alike that a
// common record is written for.
const minCommon = 2

// shareWrite is one write of a publish: instance id's own record as rec,
// or, with rec nil, its deletion; id "" is the legacy record's deletion.
type shareWrite struct {
	id  string
	rec *schema.ShareRecord
}

// writes is a publish's writes in the order they must land (see the top
// of this file): first, then the common record (if not nil), then then,
// then the common record's deletion (if dropCommon). A step is sent only
// once every write of the steps before it landed.
type writes struct {
	first      []shareWrite
	common     *schema.ShareRecord
	then       []shareWrite
	dropCommon bool
}

// ops is how many keys w writes or deletes.
func (w writes) ops() int {
	n := len(w.first) + len(w.then)
	if w.common != nil {
		n++
	}
	if w.dropCommon {
		n++
	}
	return n
}

// alike reports whether a and b hand out the same thing to their
// instances (sameRecord, whatever instance each names).
func alike(a, b schema.ShareRecord) bool {
	a.Instance, b.Instance = "", ""
	return sameRecord(a, b)
}

// layout returns the writes that leave every instance want names with
// its record (instance ID → record, all of one publish) and delete the
// others' records. The common record is the most instances' record, if
// at least minCommon of them are alike; the one in etcd stays while no
// other is alike for more. Only instances reads says follow a record
// that says Common (schema.InstanceRecord.ReadsCommon) are given one.
func (s *shareState) layout(want map[string]schema.ShareRecord, reads func(id string) bool) writes {
	ids := slices.Sorted(maps.Keys(want))
	target, writeCommon := s.commonTarget(ids, want, reads)
	var w writes
	pointed := 0 // records that say Common after this publish
	for _, id := range ids {
		r := want[id]
		e, have := s.records[id]
		_, pointer := s.pointers[id]
		fresh := have && e.rev >= s.registered[id] && !s.rewrite[id]
		joins := target != nil && !r.Held && reads(id) && alike(r, *target)
		switch {
		case joins && pointer && fresh:
			// It resolves to the common record, which says r.
			pointed++
		case joins && !pointer && !s.needsWrite(id, r):
			// Its own record says r already.
		case joins && writeCommon:
			// Only to a common record of this publish: one written
			// before names an older boundary, which may have passed, and
			// r must not apply before its own (found by the handover
			// tests: an instance's generation went from 9 back to 8).
			p := schema.ShareRecord{Version: schema.Version, Provider: r.Provider, Instance: id, Generation: r.Generation,
				Common: true, Published: r.Published, Leader: r.Leader}
			w.then = append(w.then, shareWrite{id, &p})
			pointed++
		case pointer, s.needsWrite(id, r):
			// Before the common record changes or goes: one that followed
			// it must never read the new one, meant for others.
			w.first = append(w.first, shareWrite{id, &r})
		}
	}
	gone := map[string]bool{} // records, good or not, of instances want does not name
	for _, set := range []map[string]bool{s.rewrite, keysOf(s.records), keysOf(s.pointers)} {
		for id := range set {
			if _, keep := want[id]; !keep {
				gone[id] = true
			}
		}
	}
	// Last, as the writes of one publish: an instance whose record goes
	// enforces nothing (gone, and any hold over). One that followed the
	// common record is first written a record of nothing, in case it is
	// not as gone as it seems (found by TestShareLayoutOracle: a gone
	// instance's record resolved to the new common record).
	for _, id := range slices.Sorted(maps.Keys(gone)) {
		if _, pointer := s.pointers[id]; pointer && writeCommon {
			nothing := commonFor(*target, id)
			nothing.Share, nothing.Granted, nothing.Held, nothing.Before = 0, 0, true, nil
			w.first = append(w.first, shareWrite{id, &nothing})
		}
		w.then = append(w.then, shareWrite{id: id})
	}
	if s.legacy {
		w.then = append(w.then, shareWrite{})
	}
	if writeCommon && pointed > 0 {
		w.common = target
	}
	w.dropCommon = pointed == 0 && (s.common != nil || s.rewriteCommon)
	return w
}

// commonTarget returns the common record the instances ids (records in
// want) follow after this publish, nil for none, and whether it is to be
// written.
func (s *shareState) commonTarget(ids []string, want map[string]schema.ShareRecord, reads func(id string) bool) (*schema.ShareRecord, bool) {
	type shape struct {
		rec    schema.ShareRecord // Instance, Before and what sameRecord ignores cleared
		before schema.ShareTransition
	}
	shapeOf := func(r schema.ShareRecord) shape {
		var b schema.ShareTransition
		if r.Before != nil {
			b = *r.Before
			b.Since = 0
		}
		r.Instance, r.Before, r.Generation, r.EffectiveFrom, r.Published, r.Leader, r.Version = "", nil, 0, 0, time.Time{}, "", 0
		return shape{r, b}
	}
	counts := map[shape]int{}
	var best schema.ShareRecord
	bestN, curN := 0, 0
	cur := s.commonRecord()
	if s.rewriteCommon {
		cur = nil
	}
	for _, id := range ids {
		r := want[id]
		if r.Held || !reads(id) {
			continue
		}
		k := shapeOf(r)
		if counts[k]++; counts[k] > bestN {
			bestN, best = counts[k], r
		}
		if cur != nil && alike(r, *cur) {
			curN++
		}
	}
	switch {
	case cur != nil && curN >= bestN && curN >= minCommon:
		return cur, false
	case bestN >= minCommon:
		best.Instance = schema.CommonInstance
		return &best, true
	}
	return nil, false
}

func keysOf[V any](m map[string]V) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// writeRecords writes want (instance ID → record, all of one publish)
// where it differs from what st holds or is older than its instance's
// registration, and deletes the records of instances want no longer
// names, with the legacy record, in the steps layout orders, in
// transactions fenced on leadership and on cond. It returns how many
// instances' records it changed and how many keys it wrote, and stops
// after the first step cond refuses a transaction of (false: the watch
// brings the change) or that fails.
func (p *publisher) writeRecords(ctx context.Context, f fence, name string, st *providerState, cond clientv3.Cmp, want map[string]schema.ShareRecord) (written, ops int, ok bool, err error) {
	s := &st.shares
	w := s.layout(want, st.readsCommon)
	ops = w.ops()
	if written, ok, err = p.writeStep(ctx, f, name, st, cond, w.first); !ok || err != nil {
		return written, ops, ok, err
	}
	if c := w.common; c != nil {
		rec := *c
		rec.Unmoved = s.unmoved && !s.lateDelete && st.readsUnmoved()
		val, err := schema.Encode(rec) // validates
		if err != nil {
			return written, ops, false, fmt.Errorf("allocation refused: %w", err)
		}
		put := clientv3.OpPut(p.keys.CommonShare(name), string(val))
		if rec.Unmoved {
			// Not if a share record was written since the newest write
			// known: then it is written without Unmoved.
			rec.Unmoved = false
			plain, _ := schema.Encode(rec)
			put = clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(p.keys.Shares(name)), "<", s.seen+1).WithPrefix()},
				[]clientv3.Op{put}, []clientv3.Op{clientv3.OpPut(p.keys.CommonShare(name), string(plain))})
		}
		rev, err := p.commitRev(ctx, f, cond, put)
		if err != nil && !errors.Is(err, errNotLeader) {
			// Written or not: every instance that follows it may read
			// either, and is counted as if it were written (see
			// mayHaveLanded). All are written again.
			s.rewriteCommon = true
			st.maxGen = max(st.maxGen, c.Generation)
			for id := range s.pointers {
				s.set(id, shareEntry{commonFor(*c, id), s.records[id].rev})
				s.rewrite[id] = true
			}
		}
		if err != nil || rev == 0 {
			return written, ops, false, err
		}
		written += s.commonLanded(*c, rev)
		s.unmoved, s.seen = true, max(s.seen, rev)
	}
	n, ok, err := p.writeStep(ctx, f, name, st, cond, w.then)
	if written += n; !ok || err != nil {
		return written, ops, ok, err
	}
	if w.dropCommon {
		rev, err := p.commitRev(ctx, f, cond, clientv3.OpDelete(p.keys.CommonShare(name)))
		if err != nil && !errors.Is(err, errNotLeader) {
			s.rewriteCommon = true // deleted or not: deleted again
		}
		if err != nil || rev == 0 {
			return written, ops, false, err
		}
		s.common, s.ownCommon, s.rewriteCommon = nil, rev, false
		s.seen = max(s.seen, rev)
	}
	return written, ops, true, nil
}

// writeStep writes ws, in transactions of recordsPerTxn up to
// txnsInFlight at once, and folds into st those that landed. It returns
// how many instances' records it wrote, and false when a transaction was
// refused or failed.
func (p *publisher) writeStep(ctx context.Context, f fence, name string, st *providerState, cond clientv3.Cmp, ws []shareWrite) (written int, ok bool, err error) {
	s := &st.shares
	ops := make([]clientv3.Op, len(ws))
	for i, w := range ws {
		if w.rec == nil || !w.rec.Common {
			// Before it is sent: landed or not, it may lie between two
			// common records.
			s.unmoved = false
		}
		switch {
		case w.id == "":
			ops[i] = clientv3.OpDelete(p.keys.LegacyShares(name))
		case w.rec == nil:
			ops[i] = clientv3.OpDelete(p.keys.Share(name, w.id))
		default:
			val, err := schema.Encode(*w.rec) // validates
			if err != nil {
				return written, false, fmt.Errorf("allocation refused: %w", err)
			}
			ops[i] = clientv3.OpPut(p.keys.Share(name, w.id), string(val))
		}
	}
	revs, err := p.commitChunks(ctx, f, cond, ops)
	ok = err == nil
	for c, rev := range revs {
		chunk := ws[c*recordsPerTxn : min(len(ws), (c+1)*recordsPerTxn)]
		switch rev {
		case -1:
			for _, w := range chunk {
				s.mayHaveLanded(w)
				s.lateDelete = s.lateDelete || w.rec == nil
				if w.rec != nil {
					st.maxGen = max(st.maxGen, w.rec.Generation) // it may be written: never published again
				}
			}
			ok = false
		case 0:
			ok = false // cond did not hold: the config changed meanwhile
		default:
			for _, w := range chunk {
				written += s.landed(w, rev)
			}
			s.seen = max(s.seen, rev)
		}
	}
	return written, ok, err
}

// landed folds into s the write w of a publish, which landed at rev, and
// returns 1 if it wrote an instance's record (0: a deletion).
func (s *shareState) landed(w shareWrite, rev int64) int {
	switch {
	case w.id == "":
		s.legacy = false
		return 0
	case w.rec == nil:
		s.remove(w.id)
		delete(s.rewrite, w.id)
		delete(s.pointers, w.id)
		return 0
	case w.rec.Common:
		s.pointers[w.id] = rev
		if c := s.commonRecord(); c != nil {
			s.set(w.id, shareEntry{commonFor(*c, w.id), rev})
		}
	default:
		s.set(w.id, shareEntry{*w.rec, rev})
		delete(s.pointers, w.id)
	}
	s.own[w.id] = rev
	delete(s.rewrite, w.id)
	return 1
}

// mayHaveLanded folds into s the write w of a publish whose transaction
// failed with an error: written or not, the instance may read the old
// record or the new one, and it is written again (its own record first,
// as one that may follow the common record).
//
// The new record is counted as written, which counts both: its grant is
// at least what the old one may still have the instance enforce (the
// handover's bound), and its generation is never published again (the
// caller keeps it as the highest known), so only an instance that follows
// it can acknowledge it. Kept as the old record, it would let an
// acknowledgement of the old generation count the instance at the old
// share while it follows the new one.
func (s *shareState) mayHaveLanded(w shareWrite) {
	if w.id == "" {
		return
	}
	s.rewrite[w.id] = true
	if w.rec == nil {
		return
	}
	nr := *w.rec
	if nr.Common {
		if c := s.commonRecord(); c != nil {
			nr = commonFor(*c, w.id)
		}
		if _, ok := s.pointers[w.id]; !ok {
			s.pointers[w.id] = 0
		}
	}
	if e, have := s.records[w.id]; !have || !nr.Common {
		s.set(w.id, shareEntry{nr, e.rev})
	}
}

// commonLanded folds into s the common record c, written at rev: every
// instance whose record says Common now has it.
func (s *shareState) commonLanded(c schema.ShareRecord, rev int64) int {
	s.common, s.ownCommon, s.rewriteCommon = &shareEntry{c, rev}, rev, false
	for id, at := range s.pointers {
		s.set(id, shareEntry{commonFor(c, id), at})
	}
	return len(s.pointers)
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
	var first error
	for c, err := range errs {
		if err != nil && !errors.Is(err, errNotLeader) {
			revs[c] = -1 // it may have been written: its outcome is unknown
		}
		if err != nil && first == nil {
			first = err
		}
	}
	return revs, first
}
