package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/schema"
)

// Errors of the store operations, shared by the admin API (which maps them
// to HTTP statuses) and the CLI.
var (
	// ErrNotFound: no such provider.
	ErrNotFound = errors.New("configd: provider not found")
	// ErrConflict: the provider changed since the revision the caller read.
	ErrConflict = errors.New("configd: conflict: the provider was changed by someone else since it was read")
	// ErrPreconditionFailed: a conditional write (If-Match, If-None-Match,
	// --if-revision) found the provider in a state its condition excludes;
	// nothing was written. The API answers it with 412. A stale revision
	// is also an ErrConflict, as the CLI has always reported it.
	ErrPreconditionFailed = errors.New("configd: precondition failed")
	// ErrUnauthorized: a write without a bearer token.
	ErrUnauthorized = errors.New("configd: a bearer token is required for writes (--token-file)")
	// ErrForbidden: a write with a wrong bearer token.
	ErrForbidden = errors.New("configd: the bearer token is not valid")
	// ErrMalformedStored: a record in etcd fails to decode or validate (it
	// was written by hand or by a newer version). Overwrite it with set, or
	// delete it.
	ErrMalformedStored = errors.New("configd: malformed record in etcd")
	// ErrEtcd: an etcd request failed (unreachable, timed out, refused).
	ErrEtcd = errors.New("configd: etcd request failed")
)

// etcdError wraps an etcd client error with ErrEtcd.
func etcdError(err error) error { return fmt.Errorf("%w: %w", ErrEtcd, err) }

// What a write requires of the provider's config revision (ifRev): a
// revision R > 0 means "exactly R", 0 means "must not exist yet", and:
const (
	// anyRevision: whatever is there now (last writer wins, though still
	// without losing a concurrent write between our read and our write).
	anyRevision = -1
	// mustExist: any revision, but the provider must exist (If-Match: *).
	mustExist = -2
	// neverMatches: a condition no state satisfies, such as an If-Match
	// with only weak entity tags; a write with it writes nothing.
	neverMatches = -3
)

// satisfied reports whether a config at revision cur (0: none) meets ifRev.
func satisfied(ifRev, cur int64) bool {
	switch ifRev {
	case anyRevision:
		return true
	case mustExist:
		return cur != 0
	case neverMatches:
		return false
	}
	return ifRev == cur
}

// maxPutAttempts bounds the read-modify-write retries of an unconditional
// write that keeps losing races.
const maxPutAttempts = 10

// historyShown is how many history entries history returns (the newest).
const historyShown = 100

// backend is what the CLI subcommands need; *store implements it over etcd
// and *apiClient over the admin API, with identical results.
type backend interface {
	list(ctx context.Context) (listView, error)
	get(ctx context.Context, name string) (providerView, error)
	put(ctx context.Context, cfg schema.ProviderConfig, ifRev int64, who string) (changeView, error)
	remove(ctx context.Context, name string, ifRev int64, who string) (changeView, error)
	status(ctx context.Context, name string) (statusView, error)
	history(ctx context.Context, name string) ([]schema.HistoryEntry, error)
	audit(ctx context.Context, name string) (auditView, error)
}

// providerView is one provider's config and the etcd revision it was read
// at (the value to pass as --if-revision / If-Match).
type providerView struct {
	Config   schema.ProviderConfig `json:"config"`
	Revision int64                 `json:"revision"`
}

// malformedView is a record found in etcd that failed to decode or validate.
type malformedView struct {
	Key      string `json:"key"`
	Revision int64  `json:"revision"`
	Error    string `json:"error"`
}

// listView is the answer of list.
type listView struct {
	Providers []providerView  `json:"providers"`
	Malformed []malformedView `json:"malformed,omitempty"`
}

// changeView describes a write: the config before (nil: created) and after
// (nil: deleted), and the revision of the write (the current one when
// nothing changed).
type changeView struct {
	Old      *schema.ProviderConfig `json:"old"`
	New      *schema.ProviderConfig `json:"new"`
	Revision int64                  `json:"revision"`
	Changed  bool                   `json:"changed"`
}

// instanceView is one live instance as status shows it.
type instanceView struct {
	ID       string                 `json:"id"`
	Record   *schema.InstanceRecord `json:"record,omitempty"` // nil when malformed
	Share    int64                  `json:"share"`
	HasShare bool                   `json:"has_share"` // a share is published for it
	LeaseID  int64                  `json:"lease_id"`
	Error    string                 `json:"error,omitempty"` // why the record is malformed
}

// electionKeyView is one key under the election prefix as status shows
// it. The oldest leads; if it is foreign, nobody can.
type electionKeyView struct {
	Key            string `json:"key"`
	Replica        string `json:"replica"`         // the key's value: a replica's ID (shortened)
	Lease          string `json:"lease,omitempty"` // hex; none: leaseless
	CreateRevision int64  `json:"create_revision"`
	// Foreign says why no live replica holds the key; empty for a
	// replica's key. configd serve removes foreign keys.
	Foreign string `json:"foreign,omitempty"`
}

// statusView is the answer of status: config, published shares, live
// instances, and every malformed record found on the way.
type statusView struct {
	Provider       string                 `json:"provider"`
	Config         *schema.ProviderConfig `json:"config"` // nil when malformed
	ConfigRevision int64                  `json:"config_revision"`
	Shares         *schema.Shares         `json:"shares"` // nil when none published or malformed
	Instances      []instanceView         `json:"instances"`
	Malformed      []malformedView        `json:"malformed,omitempty"`
	// PublishError is why the leader's last attempt to publish this
	// provider's shares failed; only the leading replica's API knows it.
	PublishError string `json:"publish_error,omitempty"`
	// Owner is the replica that leads this provider (its owner key);
	// empty: none does now.
	Owner string `json:"owner"`
	// Election lists configd's election keys, oldest first (see
	// readElection), and ElectionMore how many more there are;
	// ElectionError says why they could not be read.
	Election      []electionKeyView `json:"election"`
	ElectionMore  int64             `json:"election_more,omitempty"`
	ElectionError string            `json:"election_error,omitempty"`
	// Lanes are the status of the lane providers that keep the
	// provider's further limits in force (schema.Lane), in lane order.
	Lanes []statusView `json:"lanes,omitempty"`
	// Budget is, for a budget lane (schema.IsBudget), the counter of its
	// window under way: what the instances took of it.
	Budget *schema.BudgetRecord `json:"budget,omitempty"`
	// Ledger is, for a provider coordinated by the ledger, its ledger's
	// fullest upcoming window; its records that do not decode are in
	// Malformed.
	Ledger *ledgerView `json:"ledger,omitempty"`
}

// store is the one implementation of the provider operations over etcd,
// used by the admin API handlers and by the CLI's direct mode. It is safe
// for concurrent use.
type store struct {
	cli  *clientv3.Client
	keys schema.Keys
	log  *slog.Logger // malformed records are logged here; nil: not logged
	now  func() time.Time
	// admit lets the instances of a provider write their records (the
	// embedded etcd's access control, access.go), before its config is
	// written; nil: nothing to do (an external etcd's roles are the
	// operator's).
	admit func(ctx context.Context, name string) error
}

func (s *store) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

func (s *store) malformed(key string, rev int64, err error) malformedView {
	if s.log != nil {
		s.log.Warn("ignoring malformed record", "key", key, "revision", rev, "error", err)
	}
	return malformedView{Key: key, Revision: rev, Error: err.Error()}
}

// get returns a provider's config. A malformed stored config is an error
// wrapping schema.ErrInvalid that says so.
func (s *store) get(ctx context.Context, name string) (providerView, error) {
	if err := schema.ValidateName(name); err != nil {
		return providerView{}, err
	}
	resp, err := s.cli.Get(ctx, s.keys.Config(name))
	if err != nil {
		return providerView{}, etcdError(err)
	}
	if len(resp.Kvs) == 0 {
		return providerView{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	kv := resp.Kvs[0]
	cfg, err := schema.DecodeProviderConfig(kv.Value)
	if err != nil {
		s.malformed(string(kv.Key), kv.ModRevision, err)
		return providerView{}, fmt.Errorf("%w: config of %q at revision %d: %v (fix it with set, or delete it)", ErrMalformedStored, name, kv.ModRevision, err)
	}
	return providerView{Config: cfg, Revision: kv.ModRevision}, nil
}

// list returns every provider, sorted by name, without lane providers
// (schema.Lane), whose limits their provider's config holds. It reads each provider's
// config key and nothing else (scanProviders): instance records and history
// entries are never fetched, so a long history does not slow it.
func (s *store) list(ctx context.Context) (listView, error) {
	out := listView{Providers: []providerView{}}
	configOnly := func(name string, rev int64) []clientv3.Op {
		return []clientv3.Op{clientv3.OpGet(s.keys.Config(name), clientv3.WithRev(rev))}
	}
	visit := func(_ string, resps []*etcdserverpb.ResponseOp) {
		for _, kv := range resps[0].GetResponseRange().Kvs {
			if k, err := s.keys.Parse(string(kv.Key)); err != nil || k.Kind != schema.KindConfig {
				continue // under an invalid provider name: not a provider
			}
			cfg, err := schema.DecodeProviderConfig(kv.Value)
			if err != nil {
				out.Malformed = append(out.Malformed, s.malformed(string(kv.Key), kv.ModRevision, err))
				continue
			}
			if cfg.Of != "" {
				continue // a lane of cfg.Of, listed with it (more_limits)
			}
			out.Providers = append(out.Providers, providerView{Config: cfg, Revision: kv.ModRevision})
		}
	}
	if _, err := scanProviders(ctx, s.cli, s.keys, 0, configOnly, visit, func(*mvccpb.KeyValue) {}); err != nil {
		return listView{}, err
	}
	slices.SortFunc(out.Providers, func(a, b providerView) int { return strings.Compare(a.Config.Name, b.Config.Name) })
	return out, nil
}

// put creates or replaces a provider's config in one transaction that
// compares the config's revision and writes a history record. ifRev is the
// revision the caller read (0: must not exist), or anyRevision.
func (s *store) put(ctx context.Context, cfg schema.ProviderConfig, ifRev int64, who string) (changeView, error) {
	cfg = cfg.WithDefaults()
	if err := schema.ValidateUserName(cfg.Name); err != nil {
		return changeView{}, err
	}
	if err := cfg.Validate(); err != nil {
		return changeView{}, err
	}
	return s.write(ctx, cfg.Name, &cfg, ifRev, who)
}

// remove deletes a provider's config, with a history record. Instance keys
// stay until their leases end, and so does its shares record: it holds the
// grants that instances which have not yet seen the deletion may still
// enforce, which a provider created again under the same name must start
// from (the publisher deletes it once no instance is live or held).
func (s *store) remove(ctx context.Context, name string, ifRev int64, who string) (changeView, error) {
	if err := schema.ValidateUserName(name); err != nil {
		return changeView{}, err
	}
	return s.write(ctx, name, nil, ifRev, who)
}

// write puts (put != nil) or deletes the config of name, and its lane
// providers' configs (schema.Lane) with it.
func (s *store) write(ctx context.Context, name string, put *schema.ProviderConfig, ifRev int64, who string) (changeView, error) {
	key := s.keys.Config(name)
	if put != nil && s.admit != nil {
		names := []string{name}
		if len(put.Lanes) > 0 {
			names = append(names, laneNames(name)...)
		}
		for _, n := range names {
			if err := s.admit(ctx, n); err != nil {
				return changeView{}, etcdError(err)
			}
		}
	}
	for attempt := 1; ; attempt++ {
		resp, err := s.cli.Get(ctx, key)
		if err != nil {
			return changeView{}, etcdError(err)
		}
		var cur int64
		var old *schema.ProviderConfig
		if len(resp.Kvs) > 0 {
			kv := resp.Kvs[0]
			cur = kv.ModRevision
			c, err := schema.DecodeProviderConfig(kv.Value)
			if err == nil && c.Name != name {
				err = fmt.Errorf("config names provider %q", c.Name)
			}
			if err == nil {
				old = &c
			} else {
				// Overwriting or deleting a malformed record is how an
				// operator repairs it; history shows it as old = null.
				s.malformed(key, cur, err)
			}
		}
		// Deleting what does not exist is 404 whatever the condition (RFC
		// 9110 13.2.1: conditions are ignored when the answer without them
		// would be neither 2xx nor 412).
		if put == nil && len(resp.Kvs) == 0 {
			return changeView{}, fmt.Errorf("%w: %q", ErrNotFound, name)
		}
		if !satisfied(ifRev, cur) {
			return changeView{}, unsatisfied(name, ifRev, cur)
		}
		var newCfg *schema.ProviderConfig
		if put != nil {
			numbered, err := put.NumberLanes(old)
			if len(resp.Kvs) == 0 {
				// A new provider; a malformed one being repaired keeps
				// the coordination its records have.
				numbered = numbered.Created()
			}
			if err == nil {
				err = numbered.Validate() // what is stored decodes
			}
			if err != nil {
				return changeView{}, err
			}
			newCfg = &numbered
		}
		if newCfg != nil && old != nil && old.Equal(*newCfg) {
			return changeView{Old: old, New: newCfg, Revision: cur}, nil
		}
		now := s.clock()
		hist, err := schema.Encode(schema.HistoryEntry{Provider: name, Who: truncate(who, 256), When: now.UTC(), Old: old, New: newCfg})
		if err != nil {
			return changeView{}, err
		}
		ops := []clientv3.Op{clientv3.OpPut(s.keys.HistoryEntry(name, now.UnixNano()), string(hist))}
		lanes, err := s.laneOps(ctx, name, newCfg)
		if err != nil {
			return changeView{}, err
		}
		ops = append(ops, lanes...)
		if newCfg != nil {
			val, err := schema.Encode(*newCfg)
			if err != nil {
				return changeView{}, err
			}
			ops = append(ops, clientv3.OpPut(key, string(val)))
		} else {
			ops = append(ops, clientv3.OpDelete(key))
		}
		conds := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", cur)}
		if newCfg != nil {
			c, o, err := s.coordinationChecks(ctx, old, *newCfg)
			if err != nil {
				return changeView{}, err
			}
			conds, ops = append(conds, c...), append(ops, o...)
		}
		tresp, err := s.cli.Txn(ctx).
			If(conds...).
			Then(ops...).
			Commit()
		if err != nil {
			return changeView{}, etcdError(err)
		}
		if tresp.Succeeded {
			return changeView{Old: old, New: newCfg, Revision: tresp.Header.Revision, Changed: true}, nil
		}
		// The config changed between our read and our write. Read again,
		// unless the condition named the revision we read: then it no
		// longer holds.
		if ifRev >= 0 {
			return changeView{}, &preconditionError{conflict(name, cur, -1)}
		}
		if attempt >= maxPutAttempts {
			return changeView{}, conflict(name, cur, -1)
		}
	}
}

// laneNames returns the names of every lane provider name may have.
func laneNames(name string) []string {
	out := make([]string, schema.MaxLanes)
	for i := range out {
		out[i] = schema.LaneName(name, i+1)
	}
	return out
}

// laneOps returns the writes that bring name's lane providers' configs to
// cfg's lanes (nil: name is deleted, and its lanes with it). A lane whose
// config is unchanged is not written: a new revision of a config makes its
// shares records stale until the leader publishes again. They are written
// in the transaction that compares name's config revision, as only that
// transaction writes them.
func (s *store) laneOps(ctx context.Context, name string, cfg *schema.ProviderConfig) ([]clientv3.Op, error) {
	var ops []clientv3.Op
	if cfg == nil {
		for _, n := range laneNames(name) {
			ops = append(ops, clientv3.OpDelete(s.keys.Config(n)))
		}
		return ops, nil
	}
	for _, l := range cfg.Lanes {
		want := l.Derive(*cfg)
		key := s.keys.Config(want.Name)
		resp, err := s.cli.Get(ctx, key)
		if err != nil {
			return nil, etcdError(err)
		}
		if len(resp.Kvs) > 0 {
			if have, err := schema.DecodeProviderConfig(resp.Kvs[0].Value); err == nil && have.Equal(want) {
				continue
			}
		}
		val, err := schema.Encode(want)
		if err != nil {
			return nil, err
		}
		ops = append(ops, clientv3.OpPut(key, string(val)))
	}
	return ops, nil
}

// unsatisfied says why a config at revision cur (0: none) does not meet
// ifRev.
func unsatisfied(name string, ifRev, cur int64) error {
	switch {
	case ifRev == mustExist:
		return fmt.Errorf("%w: %q does not exist, and If-Match: * writes only a provider that exists", ErrPreconditionFailed, name)
	case ifRev == neverMatches && cur == 0:
		return fmt.Errorf("%w: %q does not exist", ErrPreconditionFailed, name)
	case ifRev == neverMatches:
		return fmt.Errorf("%w: %q is at revision %d", ErrPreconditionFailed, name, cur)
	}
	return &preconditionError{conflict(name, ifRev, cur)}
}

func conflict(name string, want, now int64) error {
	switch {
	case now < 0:
		return fmt.Errorf("%w: %q changed after revision %d; read it again and retry", ErrConflict, name, want)
	case want == 0:
		return fmt.Errorf("%w: %q was expected not to exist, but it is at revision %d", ErrConflict, name, now)
	case now == 0:
		return fmt.Errorf("%w: %q expected at revision %d, but it does not exist", ErrConflict, name, want)
	}
	return fmt.Errorf("%w: %q expected at revision %d, but it is at revision %d; read it again and retry", ErrConflict, name, want, now)
}

// preconditionError is a conditional write that found another revision
// than the one it named: an ErrConflict, as the CLI's --if-revision
// reports it, and an ErrPreconditionFailed, which the API answers with
// 412. Its message is the conflict's.
type preconditionError struct{ conflict error }

func (e *preconditionError) Error() string   { return e.conflict.Error() }
func (e *preconditionError) Unwrap() []error { return []error{e.conflict, ErrPreconditionFailed} }

// revision returns the revision of name's config, 0 when it has none.
func (s *store) revision(ctx context.Context, name string) (int64, error) {
	resp, err := s.cli.Get(ctx, s.keys.Config(name), clientv3.WithKeysOnly())
	if err != nil {
		return 0, etcdError(err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	return resp.Kvs[0].ModRevision, nil
}

// status reads a provider's config, shares and instances in one consistent
// snapshot (one transaction), and those of each lane provider that keeps
// one of its further limits in force (in a snapshot of its own).
func (s *store) status(ctx context.Context, name string) (statusView, error) {
	out, err := s.statusOne(ctx, name)
	if err != nil || out.Config == nil {
		return out, err
	}
	for _, l := range out.Config.Lanes {
		if l.Retired {
			continue
		}
		lane, err := s.statusOne(ctx, schema.LaneName(name, l.Lane))
		if errors.Is(err, ErrNotFound) {
			lane = statusView{Provider: schema.LaneName(name, l.Lane), Instances: []instanceView{}}
		} else if err != nil {
			return statusView{}, err
		}
		out.Lanes = append(out.Lanes, lane)
	}
	return out, nil
}

// readBudget reads into out the counter of the window under way of the
// budget out.Config is.
func (s *store) readBudget(ctx context.Context, out *statusView) error {
	r, bad, err := s.budgetCounter(ctx, out.Provider, out.Config.Window)
	if err != nil {
		return err
	}
	out.Budget = &r
	out.Malformed = append(out.Malformed, bad...)
	return nil
}

// budgetCounter reads the counter of the window under way of budget lane
// provider name, whose window is w: zero taken when none is written, and
// the records under its key that do not decode or name another window.
func (s *store) budgetCounter(ctx context.Context, name string, w schema.Duration) (schema.BudgetRecord, []malformedView, error) {
	now := s.clock().UnixNano()
	start := now - now%int64(w)
	resp, err := s.cli.Get(ctx, s.keys.Budget(name, w.D(), start))
	if err != nil {
		return schema.BudgetRecord{}, nil, etcdError(err)
	}
	out := schema.BudgetRecord{Version: schema.Version, Provider: name, Start: start, Window: w}
	var bad []malformedView
	for _, kv := range resp.Kvs {
		r, err := schema.DecodeBudgetRecord(kv.Value)
		if err == nil && (r.Provider != name || r.Start != start || r.Window != w) {
			err = fmt.Errorf("counter names provider %q, window %v from %d: %w", r.Provider, r.Window.D(), r.Start, schema.ErrInvalidBudget)
		}
		if err != nil {
			bad = append(bad, s.malformed(string(kv.Key), kv.ModRevision, err))
			continue
		}
		out = r
	}
	return out, bad, nil
}

// statusOne is status for one provider, its lanes apart.
func (s *store) statusOne(ctx context.Context, name string) (statusView, error) {
	if err := schema.ValidateName(name); err != nil {
		return statusView{}, err
	}
	tresp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(s.keys.Config(name)),
		clientv3.OpGet(s.keys.Shares(name), clientv3.WithPrefix()),
		clientv3.OpGet(s.keys.Instances(name), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return statusView{}, etcdError(err)
	}
	cfgKVs := tresp.Responses[0].GetResponseRange().Kvs
	sharesKVs := tresp.Responses[1].GetResponseRange().Kvs
	instKVs := tresp.Responses[2].GetResponseRange().Kvs
	if len(cfgKVs) == 0 && len(instKVs) == 0 && len(sharesKVs) == 0 {
		return statusView{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	out := statusView{Provider: name, Instances: []instanceView{}}
	if len(cfgKVs) > 0 {
		kv := cfgKVs[0]
		out.ConfigRevision = kv.ModRevision
		if c, err := schema.DecodeProviderConfig(kv.Value); err == nil {
			out.Config = &c
		} else {
			out.Malformed = append(out.Malformed, s.malformed(string(kv.Key), kv.ModRevision, err))
		}
	}
	if c := out.Config; c != nil && c.Budget() {
		if err := s.readBudget(ctx, &out); err != nil {
			return statusView{}, err
		}
	}
	if c := out.Config; c != nil && c.Ledger() && !c.Budget() {
		lv, err := s.readLedger(ctx, name)
		if err != nil {
			return statusView{}, err
		}
		out.Ledger = &lv
		out.Malformed = append(out.Malformed, lv.Bad...)
	}
	set := schema.NewShareSet(s.keys, name)
	for _, kv := range sharesKVs {
		ok, err := set.Apply(string(kv.Key), kv.Value, false)
		if !ok {
			err = fmt.Errorf("unexpected key under shares/: %w", schema.ErrInvalidKey)
		}
		if err != nil {
			out.Malformed = append(out.Malformed, s.malformed(string(kv.Key), kv.ModRevision, err))
		}
	}
	if sh, ok := set.View(); ok {
		out.Shares = &sh
	}
	for _, kv := range instKVs {
		k, err := s.keys.Parse(string(kv.Key))
		if err != nil || k.Kind != schema.KindInstance {
			out.Malformed = append(out.Malformed, s.malformed(string(kv.Key), kv.ModRevision, fmt.Errorf("unexpected key under instances/: %w", err)))
			continue
		}
		iv := instanceView{ID: k.Instance, LeaseID: kv.Lease}
		rec, err := schema.DecodeInstanceRecord(kv.Value)
		if err == nil && rec.ID != k.Instance {
			err = fmt.Errorf("record id %q does not match its key", rec.ID)
		}
		if err != nil {
			iv.Error = err.Error()
			out.Malformed = append(out.Malformed, s.malformed(string(kv.Key), kv.ModRevision, err))
		} else {
			iv.Record = &rec
		}
		if out.Shares != nil {
			iv.Share, iv.HasShare = out.Shares.Shares[k.Instance]
		}
		out.Instances = append(out.Instances, iv)
	}
	// Read apart: a user who may read the providers but not the election
	// still sees the rest.
	if out.Election, out.ElectionMore, err = readElection(ctx, s.cli, s.keys); err != nil {
		out.ElectionError = err.Error()
	}
	if own, err := s.cli.Get(ctx, s.keys.Owner(name)); err == nil && len(own.Kvs) > 0 {
		out.Owner = clip(string(own.Kvs[0].Value))
	}
	return out, nil
}

// history returns the newest historyShown changes of a provider, oldest
// first. Malformed entries are logged and skipped.
func (s *store) history(ctx context.Context, name string) ([]schema.HistoryEntry, error) {
	if err := schema.ValidateName(name); err != nil {
		return nil, err
	}
	resp, err := s.cli.Get(ctx, s.keys.History(name), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(historyShown))
	if err != nil {
		return nil, etcdError(err)
	}
	out := []schema.HistoryEntry{}
	for i := len(resp.Kvs) - 1; i >= 0; i-- {
		kv := resp.Kvs[i]
		h, err := schema.DecodeHistoryEntry(kv.Value)
		if err != nil {
			s.malformed(string(kv.Key), kv.ModRevision, err)
			continue
		}
		h.Revision = kv.ModRevision
		out = append(out, h)
	}
	if len(out) == 0 {
		if _, err := s.get(ctx, name); errors.Is(err, ErrNotFound) {
			return nil, err
		}
	}
	return out, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
