package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/configd/alloc"
	"github.com/sluice-go/sluice/configd/plan"
	ledgerstore "github.com/sluice-go/sluice/internal/ledger/store"
	"github.com/sluice-go/sluice/internal/schema"
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
	txnOps      int   // the most operations of one ledger transaction (0: ledger.DefaultMaxOps)
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
	// Who leads what (see owner.go): lease is this replica's session
	// lease, replicas the live replicas' election keys, owners every
	// provider's owner key, and fences the providers this replica leads.
	lease    int64
	replicas map[string]replicaKey
	owners   map[string]ownerKey
	fences   map[string]fence
	// known counts every provider's keys (config, instances, shares): a
	// provider with any needs a leader. A replica on a session keeps the
	// state (providers) of the providers it leads only, read when it
	// takes one over, at readAt; watch events at or before that are in
	// what it read. Without a session (tests, benchmarks) it keeps every
	// provider's.
	known   map[string]int
	readAt  map[string]int64
	loading bool // the state is being read: no share record is foreign
	// balanced says that reconcile has acted on the replicas, owner keys
	// and providers as they are: nothing it reads changed since. It runs
	// after every watch batch, and otherwise validated and sorted every
	// provider's name each time (8% of a replica's CPU leading 200
	// providers of 100 instances; BENCHMARKS.md, section 13).
	balanced bool

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
	shares    shareState       // the share records in etcd (shares.go)
	published time.Time        // when shares were last published (clamped to when this replica saw them)
	maxGen    int64            // highest generation known for this provider
	due       time.Time        // a damped change to look at again then; zero: none
	target    map[string]int64 // the split a handover is moving toward; nil: none chosen yet
	// held is, per instance whose key went, until when its grant stays
	// reserved (hold.go).
	held map[string]hold
	// written is, per live instance, when its record was written at the
	// latest: its own time, or when this replica saw it if that is earlier
	// (the instance's clock may be ahead).
	written map[string]time.Time
	// replaced lists the fail_static values this replica saw replaced in
	// the last failStaticMemory, each with when: an instance cut off
	// before it read the new value still counts with the old one.
	replaced []replacedFailStatic
	// ledger writes the provider's ledger (coordination "ledger"); nil
	// until its first round. It keeps what it last read between rounds.
	ledger     *ledgerstore.Publisher
	ledgerLast ledgerRun // what its last rounds ran for (ledger.go)
}

// readsCommon reports whether instance id follows a share record that
// says Common, as its record says.
func (st *providerState) readsCommon(id string) bool { return st.instances[id].ReadsCommon }

// readsUnmoved reports whether every live instance that reads the common
// record decodes one that says Unmoved, as its record says.
func (st *providerState) readsUnmoved() bool {
	for _, r := range st.instances {
		if r.ReadsCommon && !r.ReadsUnmoved {
			return false
		}
	}
	return true
}

func (st *providerState) empty() bool {
	return st.cfg == nil && st.keyRev == 0 && len(st.instances) == 0 && !st.shares.any()
}

// config returns the provider's config, or an empty one (every default)
// without one.
func (st *providerState) config() schema.ProviderConfig {
	if st.cfg == nil {
		return schema.ProviderConfig{}
	}
	return *st.cfg
}

// run leads providers on session lease until ctx ends or the lease is
// gone (errSessionGone). It reloads everything after a broken watch.
func (p *publisher) run(ctx context.Context, lease int64) error {
	for _, st := range p.providers {
		clear(st.shares.own) // another replica may have published since this one last led
	}
	p.lease = lease
	defer func() {
		p.lease, p.fences = 0, nil
		p.noteLed()
	}()
	for {
		rev, err := p.load(ctx)
		if err == nil {
			if err = p.step(ctx); err == nil {
				err = p.watch(ctx, rev)
			}
		}
		if errors.Is(err, errSessionGone) || ctx.Err() != nil {
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
	old, oldMalformed, oldDirty, oldHistory, oldKnown := p.providers, p.malformed, p.dirty, p.history, p.known
	p.loading = true
	defer func() { p.loading = false }()
	p.providers = map[string]*providerState{}
	p.malformed = map[string]string{}
	p.dirty = map[string]bool{}
	p.history = map[string]int64{}
	p.known = map[string]int{}
	p.readAt = map[string]int64{}
	p.balanced = false
	// Per provider, two key ranges around history/ (config before it;
	// instances and shares after it) and the newest replacedScan entries of
	// history/, whose response counts them all.
	stray := func(kv *mvccpb.KeyValue) { p.apply(mvccpb.PUT, kv) }
	rev, err := p.loadOwnership(ctx)
	if err == nil {
		visit := func(name string, resps []*etcdserverpb.ResponseOp) { p.visit(name, resps, true) }
		_, err = scanProviders(ctx, p.cli, p.keys, rev, p.readOps, visit, stray)
	}
	if err != nil {
		p.providers, p.malformed, p.dirty, p.history, p.known = old, oldMalformed, oldDirty, oldHistory, oldKnown
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
			st.shares.own = o.shares.own // this term's own writes stay its own
			st.keepHolds(o, p.wall())
			if st.shares.bad() {
				// The last good records of the ones now malformed: their
				// grants still bound what the instances may enforce.
				for id, e := range o.shares.records {
					if _, ok := st.shares.records[id]; !ok {
						st.shares.set(id, e)
					}
				}
			}
			if o.published.After(st.published) {
				st.published = o.published
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

// readOps are the reads of one provider's keys at rev (0: the current
// revision): two key ranges around history/ (config before it; instances
// and shares after it) and the newest replacedScan entries of history/,
// whose response counts them all. History entries are never read whole.
func (p *publisher) readOps(name string, rev int64) []clientv3.Op {
	prov, hist := p.keys.Provider(name), p.keys.History(name)
	return []clientv3.Op{
		clientv3.OpGet(prov, clientv3.WithRange(hist), clientv3.WithRev(rev)),
		clientv3.OpGet(clientv3.GetPrefixRangeEnd(hist), clientv3.WithRange(clientv3.GetPrefixRangeEnd(prov)), clientv3.WithRev(rev)),
		clientv3.OpGet(hist, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend),
			clientv3.WithLimit(replacedScan), clientv3.WithRev(rev)),
	}
}

// visit folds the responses of readOps into the state; count says to
// count the provider's keys too (a full load: known starts empty).
func (p *publisher) visit(name string, resps []*etcdserverpb.ResponseOp, count bool) {
	for _, r := range resps[:2] {
		for _, kv := range r.GetResponseRange().Kvs {
			// As the watch counts them (applyKV): neither confirmations
			// nor a budget's counters keep a provider known (found by
			// review: a deleted budget lane stayed owned for good after a
			// takeover, its counters left).
			if k, err := p.keys.Parse(string(kv.Key)); count && err == nil && k.Kind != schema.KindEven && k.Kind != schema.KindHistory && k.Kind != schema.KindBudget {
				p.count(k.Provider, 1)
			}
			p.applyKV(mvccpb.PUT, kv, true)
		}
	}
	if !p.keeps(name) {
		return
	}
	hist := resps[2].GetResponseRange()
	if hist.Count > 0 && schema.ValidateName(name) == nil {
		p.history[name] = hist.Count
	}
	if st := p.providers[name]; st != nil {
		st.replacedFrom(hist.Kvs, p.wall())
	}
}

// keeps reports whether the state of provider name is kept: this replica
// leads it, or runs without a session.
func (p *publisher) keeps(name string) bool {
	_, led := p.fences[name]
	return led || p.lease == 0
}

// readProvider reads provider name's state afresh, as this replica takes
// it over: what another replica led, this one did not follow.
func (p *publisher) readProvider(ctx context.Context, name string) error {
	resp, err := p.cli.Txn(ctx).Then(p.readOps(name, 0)...).Commit()
	if err != nil {
		return etcdError(err)
	}
	delete(p.providers, name)
	delete(p.history, name)
	p.readAt[name] = 0
	p.loading = true
	p.visit(name, resp.Responses, false)
	p.loading = false
	p.readAt[name] = resp.Header.Revision
	if st := p.providers[name]; st != nil {
		st.holdMissing(p.now())
	}
	p.dirty[name] = true
	return nil
}

// count adds d to the number of provider name's keys.
func (p *publisher) count(name string, d int) {
	if p.known == nil {
		p.known = map[string]int{}
	}
	was := p.known[name] > 0
	if p.known[name] += d; p.known[name] <= 0 {
		delete(p.known, name)
	}
	if was != (p.known[name] > 0) {
		p.balanced = false // a provider appeared or went
	}
}

// forgetProvider drops the state of provider name, which this replica no
// longer leads.
func (p *publisher) forgetProvider(name string) {
	if p.lease == 0 {
		return
	}
	delete(p.providers, name)
	delete(p.history, name)
	delete(p.readAt, name)
	delete(p.dirty, name)
	prefix := p.keys.Provider(name)
	for key := range p.malformed {
		if strings.HasPrefix(key, prefix) {
			delete(p.malformed, key)
		}
	}
}

// loadOwnership reads the election and the owner keys, and returns the
// revision it read them at.
func (p *publisher) loadOwnership(ctx context.Context) (int64, error) {
	resp, err := p.cli.Txn(ctx).Then(
		clientv3.OpGet(p.keys.Election()+"/", clientv3.WithPrefix()),
		clientv3.OpGet(p.keys.Owners(), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return 0, etcdError(err)
	}
	p.replicas, p.owners = map[string]replicaKey{}, map[string]ownerKey{}
	p.balanced = false
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			p.applyOwnership(mvccpb.PUT, kv)
		}
	}
	p.rebuildFences()
	return resp.Header.Revision, nil
}

// step acquires and releases providers as balance says, then publishes.
func (p *publisher) step(ctx context.Context) error {
	if err := p.reconcile(ctx); err != nil {
		return err
	}
	return p.publishAll(ctx)
}

// watch applies changes from rev+1 on and publishes after each batch, and
// when a damped change is due. One watch of configd's keys and the
// providers' keeps the changes in revision order: the writes of a
// provider's previous owner before the deletion of its owner key (see
// owner.go). The ledgers are not watched: a round reads its own.
func (p *publisher) watch(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	key, end := p.keys.Watched()
	wch := p.cli.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithRange(end), clientv3.WithRev(rev+1))
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var lastStep time.Time
	for {
		if due, ok := p.nextDue(); ok {
			timer.Reset(due.Sub(p.wall()))
		} else {
			timer.Stop()
		}
		select {
		case wr, ok := <-wch:
			if !ok && ctx.Err() != nil {
				return ctx.Err()
			}
			if err := p.applyResponse(wr, ok); err != nil {
				return err
			}
			// Fold in every response already here before deciding (a
			// retune makes every instance acknowledge at once, and one
			// decision per response cost O(N) each, O(N²) in all), and
			// those that come until stepGap after the previous decision:
			// acknowledgements trickle in, and deciding on each few of
			// them decided every provider's O(N) split again and again.
			if err := p.gather(wch, stepGap-time.Since(lastStep)); err != nil {
				return err
			}
			p.metrics.malformed.Set(float64(len(p.malformed)))
		case <-timer.C:
		}
		if err := p.step(ctx); err != nil {
			return err
		}
		lastStep = time.Now()
	}
}

// stepGap is the least time between two decisions of the watch loop
// (what comes meanwhile is gathered into the next). It only paces work:
// it is far below a window, and a decision is never made on less than
// what has arrived.
const stepGap = 20 * time.Millisecond

// gather applies the watch responses that are waiting, and those that
// arrive within d; never for longer than d, or stepGap when d is not
// positive. Draining whatever was waiting with no bound let a stream of
// acknowledgements (2,000 instances acknowledging a common record, at
// etcd's pace) hold back the next decision, a config change's included,
// for 3.5 s (bench/scale).
func (p *publisher) gather(wch clientv3.WatchChan, d time.Duration) error {
	limit := d
	if limit <= 0 {
		limit = stepGap
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	waiting := d > 0 // wait for responses until the timer fires; else only take those waiting
	for {
		select {
		case <-t.C:
			return nil
		default:
		}
		select {
		case wr, ok := <-wch:
			if err := p.applyResponse(wr, ok); err != nil {
				return err
			}
			continue
		default:
		}
		if !waiting {
			return nil
		}
		select {
		case wr, ok := <-wch:
			if err := p.applyResponse(wr, ok); err != nil {
				return err
			}
		case <-t.C:
			return nil
		}
	}
}

// applyResponse folds one watch response in; ok false is a closed watch.
func (p *publisher) applyResponse(wr clientv3.WatchResponse, ok bool) error {
	if !ok {
		return errors.New("watch closed")
	}
	if err := wr.Err(); err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	p.metrics.watchEvents.Add(float64(len(wr.Events)))
	for _, ev := range wr.Events {
		p.apply(ev.Type, ev.Kv)
	}
	return nil
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
		st = &providerState{instances: map[string]schema.InstanceRecord{}, held: map[string]hold{}, written: map[string]time.Time{},
			shares: newShareState()}
		p.providers[name] = st
	}
	return st
}

// apply folds one key change into the state. Malformed records are logged
// once, listed in p.malformed, and otherwise ignored: the last good value
// stays.
func (p *publisher) apply(typ mvccpb.Event_EventType, kv *mvccpb.KeyValue) {
	p.applyKV(typ, kv, false)
}

// applyKV is apply; loaded says kv was read, not watched.
func (p *publisher) applyKV(typ mvccpb.Event_EventType, kv *mvccpb.KeyValue, loaded bool) {
	key := string(kv.Key)
	if !strings.HasPrefix(key, p.keys.Providers()) {
		p.applyOwnership(typ, kv)
		return
	}
	k, err := p.keys.Parse(key)
	if err != nil {
		p.bad(key, kv.ModRevision, err)
		return
	}
	put := typ == mvccpb.PUT
	if k.Kind == schema.KindEven || k.Kind == schema.KindBudget {
		return // the instances' own business: confirmations while no configd leads, a budget's counters
	}
	if k.Kind != schema.KindHistory && !loaded {
		switch {
		case !put:
			p.count(k.Provider, -1)
		case kv.Version == 1: // created
			p.count(k.Provider, 1)
		}
	}
	if !p.keeps(k.Provider) || kv.ModRevision <= p.readAt[k.Provider] {
		return // another replica's, or in what was read when taken over
	}
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
		p.log.Debug("provider config seen", "provider", k.Provider, "revision", kv.ModRevision)
		prev := st.cfg
		st.cfg, st.cfgRev = &cfg, kv.ModRevision
		st.noteFailStatic(prev, p.wall())
		st.configChanged()
	case schema.KindInstance:
		if !put {
			delete(st.shares.registered, k.Instance)
			delete(st.shares.leases, k.Instance)
			now := p.now()
			switch until, leaving, held := st.gone(k.Instance, now); {
			case held && leaving:
				p.log.Debug("instance left; its share stays reserved for a window and twice the clock bound",
					"provider", k.Provider, "instance", k.Instance, "hold", until.Sub(now), "until", until.UTC())
			case held:
				p.log.Info("instance lease expired; its share stays reserved as long as it may enforce it (the fail_static it may count with, plus the clock bound, plus a window and twice the clock bound)",
					"provider", k.Provider, "instance", k.Instance, "hold", until.Sub(now), "until", until.UTC())
			}
			break
		}
		delete(st.held, k.Instance)
		st.shares.register(k.Instance, kv)
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
		// An instance may have applied a generation of a record this
		// replica cannot read (an unknown one): never publish that number
		// again, or its acknowledgement of the old record counts for ours.
		st.maxGen = max(st.maxGen, min(rec.AppliedGeneration, schema.MaxGeneration))
		st.written[k.Instance] = rec.Updated
		if now := p.wall(); now.Before(rec.Updated) {
			st.written[k.Instance] = now
		}
	case schema.KindShares:
		p.applyShare(st, k.Provider, k.Instance, put, kv)
	}
	if st.empty() {
		delete(p.providers, k.Provider)
		p.metrics.forget(k.Provider)
	}
}

func (p *publisher) bad(key string, rev int64, err error) {
	if _, seen := p.malformed[key]; !seen {
		p.log.Warn("ignoring malformed record; keeping the last good value", "key", key, "revision", rev, "error", err)
	}
	p.malformed[key] = err.Error()
}

// publishAll publishes every provider that changed since it was last
// published or whose damped change is due, several at once (publishEach),
// and prunes the history of every provider that has more than historyKeep
// entries. A provider whose publish failed stays to be retried with the
// next change.
func (p *publisher) publishAll(ctx context.Context) error {
	now := p.wall()
	for name, st := range p.providers {
		if !st.due.IsZero() && !now.Before(st.due) {
			p.dirty[name] = true
		}
	}
	var names []string
	for _, name := range slices.Sorted(maps.Keys(p.dirty)) {
		if _, led := p.fences[name]; p.providers[name] == nil || !led {
			delete(p.dirty, name)
			continue
		}
		names = append(names, name)
	}
	errs := p.publishEach(ctx, names)
	for i, name := range names {
		err := errs[i]
		switch {
		case err == nil:
			p.noteFailure(name, nil)
			delete(p.dirty, name)
			continue
		case errors.Is(err, errNotLeader):
			p.lost(name)
			continue
		case ctx.Err() != nil:
			return err
		}
		p.noteFailure(name, err)
	}
	if p.historyKeep <= 0 {
		return nil
	}
	for _, name := range slices.Sorted(maps.Keys(p.history)) {
		f, led := p.fences[name]
		if p.history[name] <= p.historyKeep || !led {
			continue
		}
		if err := p.prune(ctx, f, name); err != nil {
			switch {
			case errors.Is(err, errNotLeader):
				p.lost(name)
			case ctx.Err() != nil:
				return err
			default:
				p.log.Error("pruning history failed", "provider", name, "error", err)
			}
		}
	}
	return nil
}

// providersInFlight is how many providers publishAll publishes at once.
// A publish waits for etcd (a transaction's round trip and fsync); one
// after the other, a replica leading dozens of providers whose instances
// acknowledge continually spent its time waiting, and a provider's growth
// waited 22 s behind 2,063 publishes of the others (BENCHMARKS.md,
// section 13).
const providersInFlight = 16

// publishEach publishes the named providers, up to providersInFlight at
// once, and returns each one's error. A publish touches only its own
// provider's state, and the others' share nothing but etcd, the clock,
// the logger and the metrics (safe for concurrent use); the caller
// applies no watch event meanwhile.
func (p *publisher) publishEach(ctx context.Context, names []string) []error {
	errs := make([]error, len(names))
	sem := make(chan struct{}, providersInFlight)
	var wg sync.WaitGroup
	for i, name := range names {
		f, st := p.fences[name], p.providers[name]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = p.publish(ctx, f, name, st)
		})
	}
	wg.Wait()
	return errs
}

// publish writes the provider's share records if the split changed and is
// not damped, fenced on leadership and on the config revision it was
// computed from.
func (p *publisher) publish(ctx context.Context, f fence, name string, st *providerState) error {
	decideBegan := time.Now()
	st.due = time.Time{}
	cfgKey := p.keys.Config(name)
	if st.cfg == nil {
		if st.keyRev != 0 || !st.shares.any() {
			return nil // malformed config and nothing good known: keep what is published
		}
		// Provider deleted. Its share records stay while an instance they
		// name may still enforce its grant — live (it may not have seen
		// the deletion yet) or held after its lease went — so that a
		// provider created again starts from those grants, not from
		// nothing; then they go.
		held, holdEnds := st.heldGrants(p.now())
		if len(st.instances) > 0 || len(held) > 0 {
			st.due = p.onWall(holdEnds)
			return nil
		}
		_, _, _, err := p.writeRecords(ctx, f, name, st, clientv3.Compare(clientv3.ModRevision(cfgKey), "=", 0), nil)
		return err
	}
	cfg := *st.cfg
	if cfg.Budget() {
		return nil // no shares: the instances take a budget from its counters (schema.BudgetRecord)
	}
	if cfg.Ledger() {
		return p.publishLedger(ctx, f, name, st, cfg)
	}
	ids := slices.Sorted(maps.Keys(st.instances))
	recs := make([]schema.InstanceRecord, len(ids))
	for i, id := range ids {
		recs[i] = st.instances[id]
	}
	split, err := alloc.Split(cfg, recs)
	if err != nil {
		return fmt.Errorf("allocation failed: %w", err)
	}
	st.shares.grantUnknown(&cfg, name)
	st.shares.holdUnknown(split, st.instances)
	p.metrics.liveInstances.WithLabelValues(name).Set(float64(len(ids)))
	p.metrics.total.WithLabelValues(name).Set(float64(cfg.Limit))
	now := p.wall()
	held, holdEnds := st.heldGrants(p.now())
	in := plan.Input{
		Total:          cfg.Limit,
		Window:         cfg.Window.D(),
		ConfigRevision: st.cfgRev,
		Margin:         p.margin + p.clockUncertainty(),
		Target:         split,
		Acked:          acked(st.instances),
		Cur:            st.shares.published(name, st.published),
		Rewrite:        st.shares.bad() || st.shares.stale() || st.shares.legacy,
		Moving:         st.target,
		Held:           held,
		Now:            now,
	}
	d := plan.Decide(in)
	if d.Publish {
		// A publish of many records (a retune moves every share) takes a
		// while to write: its boundary leaves room for that.
		if in.WriteTime = st.shares.writeTime(p.toWrite(name, cfg, st, d, now)); in.WriteTime > 0 {
			d = plan.Decide(in)
		}
	}
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
	var sum int64
	for _, v := range d.Shares {
		sum += v
	}
	if sum > cfg.Limit {
		return fmt.Errorf("allocation refused: shares add up to %d, more than the limit %d", sum, cfg.Limit)
	}
	gen := st.maxGen + 1
	if gen > schema.MaxGeneration {
		// Only a forged record can have brought the count here. Instances
		// follow their newest record whatever its generation, and an
		// acknowledgement counts only for the very generation published.
		p.log.Warn("shares generations used up (a forged record?); counting again from 1", "provider", name)
		gen = 1
	}
	want := p.records(name, cfg, st.cfgRev, d, gen, now)
	began := time.Now()
	p.log.Debug("shares decided", "provider", name, "generation", gen, "took", began.Sub(decideBegan).Round(time.Millisecond))
	written, ops, ok, err := p.writeRecords(ctx, f, name, st, clientv3.Compare(clientv3.ModRevision(cfgKey), "=", st.keyRev), want)
	if ok && err == nil {
		st.shares.wrote(ops, time.Since(began))
	}
	if written > 0 {
		st.published, st.maxGen = now, gen
		p.metrics.publishes.WithLabelValues(name).Inc()
		p.metrics.generation.WithLabelValues(name).Set(float64(gen))
		p.log.Info("shares published", "provider", name, "generation", gen, "total", cfg.Limit,
			"instances", len(d.Shares), "records_changed", written, "keys_written", ops, "effective_from", d.EffectiveFrom.UTC(),
			"took", time.Since(began).Round(time.Millisecond))
	}
	if err != nil || !ok {
		return err // !ok: the config changed meanwhile, and the watch brings it
	}
	return nil
}

// toWrite is how many keys publishing d would write.
func (p *publisher) toWrite(name string, cfg schema.ProviderConfig, st *providerState, d plan.Decision, now time.Time) int {
	return st.shares.layout(p.records(name, cfg, st.cfgRev, d, st.maxGen+1, now), st.readsCommon).ops()
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

// commitRev is commit of ops, and returns the revision they were written
// at (0 when cond did not hold).
func (p *publisher) commitRev(ctx context.Context, f fence, cond clientv3.Cmp, ops ...clientv3.Op) (int64, error) {
	resp, err := p.cli.Txn(ctx).If(f.cmp(), cond).Then(ops...).Else(clientv3.OpGet(f.key)).Commit()
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

// acked returns what each live instance acknowledged.
func acked(live map[string]schema.InstanceRecord) map[string]plan.Ack {
	a := make(map[string]plan.Ack, len(live))
	for id, rec := range live {
		ack := plan.Ack{Generation: rec.AppliedGeneration, From: rec.AppliedFrom}
		ack.Even = rec.Source == schema.SourceEven
		a[id] = ack
	}
	return a
}
