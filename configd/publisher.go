package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/configd/plan"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/internal/share"
)

// errNotLeader: a fenced write found that this replica no longer holds the
// election key it campaigned with.
var errNotLeader = errors.New("configd: not the leader any more")

// DefaultPropagationMargin is how far ahead of "now" a newly published
// Shares record takes effect, at the least. Shares apply from the first
// window boundary at least this far ahead, so every instance has received
// them (one etcd watch round trip, normally a few milliseconds) before
// they apply. With 1s windows a change applies at the next boundary, or
// the one after when the next is closer than the margin; with 10ms windows
// about 20 windows ahead.
const DefaultPropagationMargin = 200 * time.Millisecond

// fence identifies the leadership a publish is valid under: the election
// key this replica created and its create revision. Every leader write
// compares it in the same transaction, so a deposed leader (its session
// lease expired and the key deleted, or a newer key in its place) can never
// publish.
type fence struct {
	key string
	rev int64
}

func (f fence) cmp() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(f.key), "=", f.rev)
}

// DefaultHistoryKeep is how many history entries the leader keeps per
// provider (serve's --history-keep); older ones are deleted.
const DefaultHistoryKeep = 1000

// maxHistoryKeep is the largest --history-keep.
const maxHistoryKeep = 1_000_000

// pruneBatch bounds how many history entries one pruning transaction
// deletes, and so how many keys it reads to find them.
const pruneBatch = 10_000

// When shares are republished, and what: see package plan. The leader
// decides again (publish) after every batch of changes to a provider's
// keys and when a decision's Due time comes; damped changes are counted in
// configd_shares_damped_total{provider,reason}.

// publisher is the leader's work: watch every provider's config and
// instance keys, publish each provider's Shares record whenever the split
// changes (see "When shares are republished"), and keep each provider's
// history to its last historyKeep entries. One goroutine (run) owns all of
// its state.
type publisher struct {
	cli         *clientv3.Client
	keys        schema.Keys
	log         *slog.Logger
	metrics     *metrics
	margin      time.Duration
	replica     string
	historyKeep int64 // history entries kept per provider; 0: all (no pruning)
	// now reads the monotonic clock: it times the holds, durations that
	// bound safety, which a correction of the wall clock must never
	// stretch. clock reads the wall clock as configd knows it, corrected by
	// its own NTP measurement (serve's --ntp-server): window boundaries,
	// publish times, and timestamps other machines wrote; nil: now, its
	// monotonic reading stripped. uncertainty is that measurement's (0
	// without one): publishes take effect that much further ahead, so that
	// they still reach every instance before their boundary.
	now         func() time.Time
	clock       func() time.Time
	uncertainty func() time.Duration

	// State, owned by run.
	providers map[string]*providerState
	malformed map[string]string // key → error, for records ignored now
	dirty     map[string]bool   // providers changed since their last publish
	// history is, per provider, the number of history entries as last
	// counted, plus one for every entry created since: never less than
	// the true count, so it says when to count again and prune.
	history map[string]int64

	// failing is, per provider, why its last publish failed; read by the
	// admin API (publishError), so guarded by failMu.
	failMu  sync.Mutex
	failing map[string]string
}

// wall reads the wall clock as configd knows it (see clock).
func (p *publisher) wall() time.Time {
	if p.clock != nil {
		return p.clock()
	}
	return p.now().Round(0)
}

// clockUncertainty is how far wall may be off, at most.
func (p *publisher) clockUncertainty() time.Duration {
	if p.uncertainty == nil {
		return 0
	}
	return max(0, p.uncertainty())
}

// onWall returns the instant t of the monotonic clock (now) on the wall
// clock, for a timer that also waits for wall-clock times; zero stays zero.
func (p *publisher) onWall(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return p.wall().Add(t.Sub(p.now()))
}

// publishError returns why this replica's last attempt to publish the
// provider's shares failed; "" when it did not, or this replica does not
// lead.
func (p *publisher) publishError(name string) string {
	p.failMu.Lock()
	defer p.failMu.Unlock()
	return p.failing[name]
}

// noteFailure records the outcome of a publish of name (err nil: it
// succeeded), in the metric and for publishError; a new reason is logged.
func (p *publisher) noteFailure(name string, err error) {
	p.failMu.Lock()
	defer p.failMu.Unlock()
	if p.failing == nil {
		p.failing = map[string]string{}
	}
	if err == nil {
		if _, was := p.failing[name]; was {
			p.log.Info("publishing works again", "provider", name)
			delete(p.failing, name)
			p.metrics.publishFailing.WithLabelValues(name).Set(0)
		}
		return
	}
	p.metrics.publishFailures.Inc()
	p.metrics.publishFailing.WithLabelValues(name).Set(1)
	if p.failing[name] != err.Error() {
		p.log.Error("publish failed", "provider", name, "error", err)
	}
	p.failing[name] = err.Error()
}

// providerState is what the leader knows of one provider.
type providerState struct {
	cfg    *schema.ProviderConfig // last good config; nil: none
	cfgRev int64                  // ModRevision of cfg
	keyRev int64                  // ModRevision of the config key now (even if malformed); 0: absent
	// instances by ID; a malformed record keeps the last good one, or an
	// empty record: the key (the lease) alone makes an instance live.
	instances map[string]schema.InstanceRecord
	shares    *schema.Shares   // the shares record in etcd, decoded; nil: none or malformed
	published time.Time        // when shares were published (clamped to when this replica saw them)
	sharesKey bool             // a shares key exists (maybe malformed)
	sharesBad bool             // the shares key holds a malformed record; shares is the last good one
	ownRev    int64            // the revision this replica last wrote the shares key at
	maxGen    int64            // highest generation known for this provider
	due       time.Time        // a damped change to look at again then; zero: none
	target    map[string]int64 // the split a handover is moving toward; nil: none chosen yet
	// held is, per instance whose lease expired (it did not say it was
	// leaving), until when its grant stays reserved: it may only be cut off
	// from etcd, and then keeps its share for the provider's fail_static.
	held map[string]time.Time
	// written is, per live instance, when its record was written at the
	// latest: its own time, or when this replica saw it if that is earlier
	// (the instance's clock may be ahead).
	written map[string]time.Time
	// replaced lists the fail_static values this replica saw replaced in
	// the last failStaticMemory, each with when: an instance cut off
	// before it read the new value still counts with the old one.
	replaced []replacedFailStatic
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

func (st *providerState) empty() bool {
	return st.cfg == nil && st.keyRev == 0 && len(st.instances) == 0 && !st.sharesKey
}

// config returns the provider's config, or an empty one (every default)
// without one.
func (st *providerState) config() schema.ProviderConfig {
	if st.cfg == nil {
		return schema.ProviderConfig{}
	}
	return *st.cfg
}

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

// holdFor is how long after an instance's key went its grant is held
// (schema.ProviderConfig.HoldAfter): for the longest fail_static it may be
// counting with — the provider's, the one its last record (rec, written at
// written; nil when unknown) says, and any this replica knows was replaced
// since that record was written, which it may have read after (with no
// record: any remembered) — plus the clock bound.
func (st *providerState) holdFor(rec *schema.InstanceRecord, written time.Time) time.Duration {
	var d time.Duration
	if rec != nil {
		d = rec.FailStatic.D()
	}
	for _, r := range st.replaced {
		if rec == nil || !r.until.Before(written.Add(-recordSkew)) {
			d = max(d, r.d)
		}
	}
	return st.config().HoldAfter(d)
}

// enforcing returns the most the published shares leave id enforcing
// (schema.Shares.Enforcing); 0 without shares.
func (st *providerState) enforcing(id string) int64 {
	if st.shares == nil {
		return 0
	}
	return st.shares.Enforcing(id)
}

// holdable reports whether the published shares leave id permits it may
// still be enforcing.
func (st *providerState) holdable(id string) bool { return st.enforcing(id) > 0 }

// holdMissing holds, for holdFor without a record, every instance the published
// shares leave permits to that is neither live nor held already: a leader
// that starts (or reloads) cannot know when they left, nor whether they
// left gracefully.
func (st *providerState) holdMissing(now time.Time) {
	if st.shares == nil {
		return
	}
	for _, id := range st.shares.Named() {
		if _, live := st.instances[id]; live || !st.holdable(id) {
			continue
		}
		if _, ok := st.held[id]; !ok {
			st.held[id] = now.Add(st.holdFor(nil, time.Time{}))
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

// run publishes until ctx ends or leadership is lost (errNotLeader). It
// reloads everything after a broken watch.
func (p *publisher) run(ctx context.Context, f fence) error {
	for _, st := range p.providers {
		st.ownRev = 0 // another replica may have published since this one last led
	}
	for {
		rev, err := p.load(ctx)
		if err == nil {
			if err = p.publishAll(ctx, f); err == nil {
				err = p.watch(ctx, f, rev)
			}
		}
		if errors.Is(err, errNotLeader) || ctx.Err() != nil {
			return err
		}
		p.log.Warn("publisher: reloading state from etcd", "error", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// load reads every provider's keys except its history entries (counted,
// and the newest replacedScan read for the fail_static values they
// replaced) and rebuilds the state; it returns the revision read at.
func (p *publisher) load(ctx context.Context) (int64, error) {
	old, oldMalformed, oldDirty, oldHistory := p.providers, p.malformed, p.dirty, p.history
	p.providers = map[string]*providerState{}
	p.malformed = map[string]string{}
	p.dirty = map[string]bool{}
	p.history = map[string]int64{}
	// Per provider, two key ranges around history/ (config before it;
	// instances and shares after it) and the newest replacedScan entries of
	// history/, whose response counts them all.
	ops := func(name string, rev int64) []clientv3.Op {
		prov, hist := p.keys.Provider(name), p.keys.History(name)
		return []clientv3.Op{
			clientv3.OpGet(prov, clientv3.WithRange(hist), clientv3.WithRev(rev)),
			clientv3.OpGet(clientv3.GetPrefixRangeEnd(hist), clientv3.WithRange(clientv3.GetPrefixRangeEnd(prov)), clientv3.WithRev(rev)),
			clientv3.OpGet(hist, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend),
				clientv3.WithLimit(replacedScan), clientv3.WithRev(rev)),
		}
	}
	visit := func(name string, resps []*etcdserverpb.ResponseOp) {
		for _, r := range resps[:2] {
			for _, kv := range r.GetResponseRange().Kvs {
				p.apply(mvccpb.PUT, kv)
			}
		}
		hist := resps[2].GetResponseRange()
		if hist.Count > 0 && schema.ValidateName(name) == nil {
			p.history[name] = hist.Count
		}
		if st := p.providers[name]; st != nil {
			st.replacedFrom(hist.Kvs, p.wall())
		}
	}
	stray := func(kv *mvccpb.KeyValue) { p.apply(mvccpb.PUT, kv) }
	rev, err := scanProviders(ctx, p.cli, p.keys, ops, visit, stray)
	if err != nil {
		p.providers, p.malformed, p.dirty, p.history = old, oldMalformed, oldDirty, oldHistory
		return 0, err
	}
	// Keep last good configs and instance records across a reload.
	for name, st := range p.providers {
		if o := old[name]; o != nil {
			if st.cfg == nil && st.keyRev != 0 && o.cfg != nil {
				st.cfg, st.cfgRev = o.cfg, o.cfgRev
			}
			if o.maxGen > st.maxGen {
				st.maxGen = o.maxGen
			}
			st.ownRev = o.ownRev // this term's own writes stay its own
			for _, r := range o.replaced {
				if !slices.Contains(st.replaced, r) { // read again from history
					st.replaced = append(st.replaced, r)
				}
			}
			st.noteFailStatic(o.cfg, p.wall())
			if st.shares == nil && st.sharesBad && o.shares != nil {
				// Its grants still bound what the instances may enforce.
				st.shares, st.published = o.shares, o.published
			}
			for id, until := range o.held {
				if _, live := st.instances[id]; !live {
					st.held[id] = until
				}
			}
		}
		st.holdMissing(p.now())
	}
	for name := range p.providers {
		p.dirty[name] = true
	}
	p.metrics.malformed.Set(float64(len(p.malformed)))
	return rev, nil
}

// watch applies changes from rev+1 on and publishes after each batch, and
// when a damped change is due.
func (p *publisher) watch(ctx context.Context, f fence, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := p.cli.Watch(clientv3.WithRequireLeader(wctx), p.keys.Providers(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if due, ok := p.nextDue(); ok {
			timer.Reset(due.Sub(p.wall()))
		} else {
			timer.Stop()
		}
		select {
		case wr, ok := <-wch:
			if !ok {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return errors.New("watch closed")
			}
			if err := wr.Err(); err != nil {
				return fmt.Errorf("watch: %w", err)
			}
			for _, ev := range wr.Events {
				p.apply(ev.Type, ev.Kv)
			}
			p.metrics.malformed.Set(float64(len(p.malformed)))
		case <-timer.C:
		}
		if err := p.publishAll(ctx, f); err != nil {
			return err
		}
	}
}

// nextDue returns the earliest time a damped change is to be looked at
// again.
func (p *publisher) nextDue() (time.Time, bool) {
	var next time.Time
	for _, st := range p.providers {
		if !st.due.IsZero() && (next.IsZero() || st.due.Before(next)) {
			next = st.due
		}
	}
	return next, !next.IsZero()
}

func (p *publisher) state(name string) *providerState {
	st := p.providers[name]
	if st == nil {
		st = &providerState{instances: map[string]schema.InstanceRecord{}, held: map[string]time.Time{}, written: map[string]time.Time{}}
		p.providers[name] = st
	}
	return st
}

// apply folds one key change into the state. Malformed records are logged
// once, listed in p.malformed, and otherwise ignored: the last good value
// stays.
func (p *publisher) apply(typ mvccpb.Event_EventType, kv *mvccpb.KeyValue) {
	key := string(kv.Key)
	k, err := p.keys.Parse(key)
	if err != nil {
		p.bad(key, kv.ModRevision, err)
		return
	}
	put := typ == mvccpb.PUT
	if k.Kind == schema.KindHistory {
		if put && kv.Version == 1 { // created
			p.history[k.Provider]++
		}
		return
	}
	delete(p.malformed, key)
	st := p.state(k.Provider)
	p.dirty[k.Provider] = true
	switch k.Kind {
	case schema.KindConfig:
		if !put {
			prev := st.cfg
			st.cfg, st.cfgRev, st.keyRev = nil, 0, 0
			st.noteFailStatic(prev, p.wall())
			break
		}
		st.keyRev = kv.ModRevision
		cfg, err := schema.DecodeProviderConfig(kv.Value)
		if err == nil && cfg.Name != k.Provider {
			err = fmt.Errorf("config names provider %q", cfg.Name)
		}
		if err != nil {
			p.bad(key, kv.ModRevision, err)
			return
		}
		prev := st.cfg
		st.cfg, st.cfgRev = &cfg, kv.ModRevision
		st.noteFailStatic(prev, p.wall())
	case schema.KindInstance:
		if !put {
			rec, was := st.instances[k.Instance]
			written := st.written[k.Instance]
			delete(st.instances, k.Instance)
			delete(st.written, k.Instance)
			if was && !rec.Leaving && st.holdable(k.Instance) {
				hold := st.holdFor(&rec, written)
				until := p.now().Add(hold)
				st.held[k.Instance] = until
				p.log.Info("instance lease expired; its share stays reserved as long as it may enforce it (the fail_static it may count with, plus the clock bound)",
					"provider", k.Provider, "instance", k.Instance, "hold", hold, "until", until.UTC())
			}
			break
		}
		delete(st.held, k.Instance)
		rec, err := schema.DecodeInstanceRecord(kv.Value)
		if err == nil && rec.ID != k.Instance {
			err = fmt.Errorf("record id %q does not match its key", rec.ID)
		}
		if err != nil {
			p.bad(key, kv.ModRevision, err)
			// The last good record stays (its demand, its acknowledgement),
			// but not a leaving mark: only a record that says so now may
			// spare its share the hold (an id reused by a newer instance).
			last := st.instances[k.Instance]
			if last.ID == "" {
				last = schema.InstanceRecord{ID: k.Instance}
			}
			last.Leaving = false
			st.instances[k.Instance] = last
			// Nor when it was written: it may have read any value since.
			st.written[k.Instance] = time.Time{}
			return
		}
		st.instances[k.Instance] = rec
		st.written[k.Instance] = rec.Updated
		if now := p.wall(); now.Before(rec.Updated) {
			st.written[k.Instance] = now
		}
	case schema.KindShares:
		p.applyShares(st, k.Provider, key, put, kv)
	}
	if st.empty() {
		delete(p.providers, k.Provider)
		p.metrics.forget(k.Provider)
	}
}

// applyShares folds a write (or the deletion) of provider name's shares
// key into st. Only this replica writes the key while it leads, and etcd
// orders the writes: one at a revision no later than its own last write is
// the echo of a publish of its own. Any other record is checked like an
// instance checks it, and one that is not this replica's own, once it has
// published, was written by someone else: all are counted as records the
// instances may enforce, and published over.
func (p *publisher) applyShares(st *providerState, name, key string, put bool, kv *mvccpb.KeyValue) {
	st.sharesKey = put
	if !put {
		st.shares, st.sharesBad = nil, false
		return
	}
	if st.shares != nil && st.ownRev != 0 && kv.ModRevision <= st.ownRev {
		return // the echo of a publish of ours
	}
	st.maxGen = max(st.maxGen, min(kv.Version, schema.MaxGeneration)) // survives a malformed record
	sh, err := schema.DecodeShares(kv.Value)
	if err == nil && sh.Provider != name {
		err = fmt.Errorf("shares record names provider %q", sh.Provider)
	}
	if err != nil {
		// Keep the last good record: its grants still bound what the
		// instances may enforce (they refuse this one too). Publishing
		// rewrites the bad one — unless this replica wrote it: rewriting
		// its own output would write the same again, in a loop.
		st.sharesBad = kv.ModRevision != st.ownRev
		p.bad(key, kv.ModRevision, err)
		return
	}
	published := sh.Published
	if now := p.wall(); now.Before(published) {
		published = now // a replica whose clock is ahead must not hold publishing back
	}
	switch {
	case st.ownRev != 0 && kv.ModRevision != st.ownRev:
		// Written by someone else while this replica leads: a forgery,
		// or a hand edit. Instances that accept it may enforce it until
		// this replica's next publish, so its shares count as grants
		// beside ours; its generation is not ours to continue from.
		p.metrics.foreignShares.WithLabelValues(name).Inc()
		p.log.Warn("shares record written by someone else while this replica leads; publishing over it",
			"provider", name, "revision", kv.ModRevision, "generation", sh.Generation)
		st.shares, st.sharesBad = withGrantsOf(st.shares, &sh), true
	case st.cfg != nil && sh.CheckAgainst(*st.cfg, st.cfgRev) != nil:
		// Inconsistent with the config: instances refuse it, but may
		// have applied it under an earlier config. Its grants count;
		// it is published over.
		p.bad(key, kv.ModRevision, sh.CheckAgainst(*st.cfg, st.cfgRev))
		st.shares, st.published, st.sharesBad = &sh, published, true
		st.maxGen = max(st.maxGen, sh.Generation)
	default:
		st.shares, st.published, st.sharesBad = &sh, published, false
		st.maxGen = max(st.maxGen, sh.Generation)
	}
}

// withGrantsOf returns a copy of ours whose grants also cover what other may
// have each instance enforce, counted into ours' window; other itself when
// there is no ours.
func withGrantsOf(ours, other *schema.Shares) *schema.Shares {
	if ours == nil {
		return other
	}
	merged := *ours
	merged.Granted = make(map[string]int64, len(ours.Granted))
	for _, id := range ours.Named() {
		merged.Granted[id] = ours.Enforcing(id)
	}
	for _, id := range other.Named() {
		merged.Granted[id] = max(merged.Granted[id], share.In(other.Enforcing(id), other.Window.D(), ours.Window.D()))
	}
	return &merged
}

func (p *publisher) bad(key string, rev int64, err error) {
	if _, seen := p.malformed[key]; !seen {
		p.log.Warn("ignoring malformed record; keeping the last good value", "key", key, "revision", rev, "error", err)
	}
	p.malformed[key] = err.Error()
}

// publishAll publishes, in name order, every provider that changed since
// it was last published or whose damped change is due, and prunes the
// history of every provider that has more than historyKeep entries. A
// provider whose publish failed stays to be retried with the next change.
func (p *publisher) publishAll(ctx context.Context, f fence) error {
	now := p.wall()
	for name, st := range p.providers {
		if !st.due.IsZero() && !now.Before(st.due) {
			p.dirty[name] = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(p.dirty)) {
		st := p.providers[name]
		if st == nil {
			delete(p.dirty, name)
			continue
		}
		err := p.publish(ctx, f, name, st)
		if err == nil {
			p.noteFailure(name, nil)
			delete(p.dirty, name)
			continue
		}
		if errors.Is(err, errNotLeader) || ctx.Err() != nil {
			return err
		}
		p.noteFailure(name, err)
	}
	if p.historyKeep <= 0 {
		return nil
	}
	for _, name := range slices.Sorted(maps.Keys(p.history)) {
		if p.history[name] <= p.historyKeep {
			continue
		}
		if err := p.prune(ctx, f, name); err != nil {
			if errors.Is(err, errNotLeader) || ctx.Err() != nil {
				return err
			}
			p.log.Error("pruning history failed", "provider", name, "error", err)
		}
	}
	return nil
}

// publish writes the provider's Shares record if the split changed and is
// not damped, fenced on leadership and on the config revision it was
// computed from.
func (p *publisher) publish(ctx context.Context, f fence, name string, st *providerState) error {
	st.due = time.Time{}
	cfgKey, sharesKey := p.keys.Config(name), p.keys.Shares(name)
	if st.cfg == nil {
		if st.keyRev != 0 || !st.sharesKey {
			return nil // malformed config and nothing good known: keep what is published
		}
		// Provider deleted. Its shares record stays while an instance it
		// names may still enforce its grant — live (it may not have seen
		// the deletion yet) or held after its lease went — so that a
		// provider created again starts from those grants, not from
		// nothing; then it goes.
		held, holdEnds := st.heldGrants(p.now())
		if len(st.instances) > 0 || len(held) > 0 {
			st.due = p.onWall(holdEnds)
			return nil
		}
		return p.commit(ctx, f, clientv3.Compare(clientv3.ModRevision(cfgKey), "=", 0), clientv3.OpDelete(sharesKey))
	}
	cfg := *st.cfg
	ids := slices.Sorted(maps.Keys(st.instances))
	recs := make([]schema.InstanceRecord, len(ids))
	for i, id := range ids {
		recs[i] = st.instances[id]
	}
	split, err := allocate(cfg, recs)
	if err != nil {
		return fmt.Errorf("allocation failed: %w", err)
	}
	p.metrics.liveInstances.WithLabelValues(name).Set(float64(len(ids)))
	p.metrics.total.WithLabelValues(name).Set(float64(cfg.Limit))
	now := p.wall()
	held, holdEnds := st.heldGrants(p.now())
	d := plan.Decide(plan.Input{
		Total:          cfg.Limit,
		Window:         cfg.Window.D(),
		ConfigRevision: st.cfgRev,
		Margin:         p.margin + p.clockUncertainty(),
		Target:         split,
		Acked:          acked(st.instances),
		Cur:            published(st.shares, st.published),
		Rewrite:        st.sharesBad,
		Moving:         st.target,
		Held:           held,
		Now:            now,
	})
	st.target, st.due = d.Target, d.Due
	if end := p.onWall(holdEnds); !end.IsZero() && (st.due.IsZero() || end.Before(st.due)) {
		st.due = end
	}
	if d.Damped != "" {
		p.metrics.damped.WithLabelValues(name, d.Damped).Inc()
		p.log.Debug("shares not republished", "provider", name, "reason", d.Damped, "retry", d.Due)
	}
	if !d.Publish {
		return nil // unchanged, damped, or waiting for acknowledgements
	}
	gen := st.maxGen + 1
	if gen > schema.MaxGeneration {
		// Only a forged record can have brought the count here. Instances
		// follow the newest record whatever its generation, and an
		// acknowledgement counts only for the very generation published.
		p.log.Warn("shares generations used up (a forged record?); counting again from 1", "provider", name)
		gen = 1
	}
	sh := schema.Shares{
		Version:        schema.Version,
		Provider:       name,
		Generation:     gen,
		EffectiveFrom:  d.EffectiveFrom.UnixNano(),
		Window:         cfg.Window,
		Total:          cfg.Limit,
		Instances:      len(d.Shares),
		Shares:         d.Shares,
		Granted:        d.Granted,
		Before:         transitionRecord(d.Before, gen),
		ConfigRevision: st.cfgRev,
		Published:      now.UTC(),
		Leader:         p.replica,
	}
	val, err := schema.Encode(sh) // validates: the shares add up to at most the limit
	if err != nil {
		return fmt.Errorf("allocation refused: %w", err)
	}
	rev, err := p.commitRev(ctx, f, clientv3.Compare(clientv3.ModRevision(cfgKey), "=", st.keyRev), clientv3.OpPut(sharesKey, string(val)))
	if err != nil {
		return err
	}
	if rev == 0 {
		return nil // the config changed meanwhile: the watch brings it
	}
	st.ownRev = rev
	st.shares, st.published, st.sharesKey, st.sharesBad, st.maxGen = &sh, now, true, false, sh.Generation
	p.metrics.publishes.WithLabelValues(name).Inc()
	p.metrics.generation.WithLabelValues(name).Set(float64(sh.Generation))
	p.log.Info("shares published", "provider", name, "generation", sh.Generation, "total", sh.Total,
		"instances", sh.Instances, "effective_from", sh.EffectiveTime().UTC())
	return nil
}

// prune deletes the oldest history entries of provider name beyond
// p.historyKeep (history keys sort by time), in transactions fenced on
// leadership, at most pruneBatch at a time. Each deletes a key range up to
// the newest entry it means to delete, and only if no entry in that range
// changed since the entries were read, so that an entry written meanwhile
// with an older key (a writer whose clock is behind) is never deleted
// unread: exactly historyKeep entries remain.
func (p *publisher) prune(ctx context.Context, f fence, name string) error {
	prefix := p.keys.History(name)
	for conflicts := 0; ; {
		cnt, err := p.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return etcdError(err)
		}
		excess := cnt.Count - p.historyKeep
		if excess <= 0 {
			p.history[name] = cnt.Count
			return nil
		}
		rev := cnt.Header.Revision
		oldest, err := p.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithLimit(min(excess, pruneBatch)), clientv3.WithRev(rev))
		if err != nil {
			return etcdError(err)
		}
		if len(oldest.Kvs) == 0 {
			return nil // deleted meanwhile
		}
		end := string(oldest.Kvs[len(oldest.Kvs)-1].Key) + "\x00"
		resp, err := p.cli.Txn(ctx).
			If(f.cmp(), clientv3.Compare(clientv3.ModRevision(prefix), "<", rev+1).WithRange(end)).
			Then(clientv3.OpDelete(prefix, clientv3.WithRange(end))).
			Else(clientv3.OpGet(f.key)).
			Commit()
		if err != nil {
			return etcdError(err)
		}
		if !resp.Succeeded {
			if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 0 || kvs[0].CreateRevision != f.rev {
				return errNotLeader
			}
			if conflicts++; conflicts == 3 {
				return errors.New("history changed under the pruning three times in a row")
			}
			continue
		}
		deleted := resp.Responses[0].GetResponseDeleteRange().Deleted
		p.metrics.historyPruned.Add(float64(deleted))
		p.log.Info("history pruned", "provider", name, "deleted", deleted, "keep", p.historyKeep)
	}
}

// commit runs op if this replica still leads and cond holds. A failed
// condition on the config is not an error: the watch brings the change and
// the next publish uses it.
func (p *publisher) commit(ctx context.Context, f fence, cond clientv3.Cmp, op clientv3.Op) error {
	_, err := p.commitRev(ctx, f, cond, op)
	return err
}

// commitRev is commit, and returns the revision op was written at (0 when
// cond did not hold).
func (p *publisher) commitRev(ctx context.Context, f fence, cond clientv3.Cmp, op clientv3.Op) (int64, error) {
	resp, err := p.cli.Txn(ctx).If(f.cmp(), cond).Then(op).Else(clientv3.OpGet(f.key)).Commit()
	if err != nil {
		return 0, etcdError(err)
	}
	if resp.Succeeded {
		return resp.Header.Revision, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 || kvs[0].CreateRevision != f.rev {
		return 0, errNotLeader
	}
	return 0, nil
}

// transitionRecord is the record of a shortening of the window; one that
// starts now starts with generation gen.
func transitionRecord(t *plan.Transition, gen int64) *schema.Transition {
	if t == nil {
		return nil
	}
	since := t.Since
	if since == 0 {
		since = gen
	}
	return &schema.Transition{Window: schema.Duration(t.Window), Since: since, Granted: t.Granted}
}

// published is the last publish as package plan sees it; nil for none.
// at is when it was published (clamped to this replica's clock).
func published(sh *schema.Shares, at time.Time) *plan.Published {
	if sh == nil {
		return nil
	}
	var before *plan.Transition
	if b := sh.Before; b != nil {
		before = &plan.Transition{Window: b.Window.D(), Since: b.Since, Granted: b.Granted}
	}
	return &plan.Published{
		Before:         before,
		Generation:     sh.Generation,
		EffectiveFrom:  sh.EffectiveTime(),
		Total:          sh.Total,
		Window:         sh.Window.D(),
		ConfigRevision: sh.ConfigRevision,
		Shares:         sh.Shares,
		Granted:        sh.Granted,
		At:             at,
	}
}

// acked returns what each live instance acknowledged.
func acked(live map[string]schema.InstanceRecord) map[string]plan.Ack {
	a := make(map[string]plan.Ack, len(live))
	for id, rec := range live {
		a[id] = plan.Ack{Generation: rec.AppliedGeneration, From: rec.AppliedFrom}
	}
	return a
}
