package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/sluice-go/sluice/internal/schema"
)

// elector runs this replica's part in the leader election and the
// publisher, which leads the providers assigned to this replica.
type elector struct {
	cli     *clientv3.Client
	keys    schema.Keys   // the election's prefix is keys.Election()
	id      string        // this replica's ID, the election value
	ttl     time.Duration // session TTL (whole seconds)
	pub     *publisher
	log     *slog.Logger
	metrics *metrics
	leading atomic.Bool
}

// run campaigns and publishes until ctx ends. After losing a session (etcd
// unreachable longer than the TTL) or leadership it campaigns again.
// Meanwhile the guard removes foreign keys from the election; it ends
// with ctx too, and run returns once it has.
func (e *elector) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { e.guard(ctx) })
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := e.term(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		e.log.Warn("leader election: retrying", "error", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// term is one session: campaign, lead until the session or ctx ends, then
// resign and revoke the session's lease.
func (e *elector) term(ctx context.Context) error {
	// Grant with ctx so shutdown is not held up by an unreachable etcd; the
	// session then keeps the lease alive on the client's own context, and
	// Close below revokes it with a bounded wait.
	lease, err := e.cli.Grant(ctx, int64(e.ttl/time.Second))
	if err != nil {
		return err
	}
	sess, err := concurrency.NewSession(e.cli, concurrency.WithLease(lease.ID), concurrency.WithTTL(int(e.ttl/time.Second)))
	if err != nil {
		return err
	}
	defer func() {
		sess.Orphan()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_, _ = e.cli.Revoke(rctx, lease.ID) // deletes our election key: a standby takes over at once
	}()

	// tctx ends with ctx or with the session, whichever is first: a replica
	// that loses its session stops publishing at once.
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-sess.Done():
			cancel()
		case <-tctx.Done():
		}
	}()

	// The campaign puts this replica's key in the election at once, which
	// makes it a live replica that leads providers (see owner.go), and
	// returns once it is the oldest: the election's leader, to which a
	// lone provider goes.
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	el := concurrency.NewElection(sess, e.keys.Election())
	wg.Go(func() { e.campaign(tctx, cancel, el) })
	err = e.pub.run(tctx, int64(lease.ID))
	select {
	case <-sess.Done():
		return errors.New("session lost (etcd unreachable for longer than the session TTL?)")
	default:
	}
	return err
}

// campaign runs for the election's leadership until ctx ends; it ends the
// term (cancel) if the campaign fails.
func (e *elector) campaign(ctx context.Context, cancel context.CancelFunc, el *concurrency.Election) {
	if err := el.Campaign(ctx, e.id); err != nil {
		if ctx.Err() == nil {
			e.log.Warn("leader election: campaign failed", "error", err)
			cancel()
		}
		return
	}
	e.leading.Store(true)
	e.metrics.leader.Set(1)
	e.metrics.leaderChanges.Inc()
	e.log.Info("became leader", "replica", e.id, "key", el.Key(), "revision", el.Rev())
	<-ctx.Done()
	e.leading.Store(false)
	e.metrics.leader.Set(0)
	e.log.Info("no longer leader", "replica", e.id)
}

// Foreign election keys.
//
// The election's leader is the key with the lowest create revision under
// the prefix, and Campaign waits until every older key is deleted. A key
// that no replica's session holds is therefore deleted by nobody: a
// leaseless one stops every replica from leading for good, one on a lease
// something else keeps alive (an instance's) for as long as that lives,
// and instances take any of them for a live configd (limiter/cluster).
//
// A key is foreign when it cannot be a live replica's: what the key shows
// (schema.Keys.CheckElectionKey: no lease, a name other than its lease's,
// a value that is no replica ID), or what its lease shows (leaseProblem).
// A replica campaigns on a session lease of its own, granted for
// --session-ttl (at most schema.MaxSessionTTL), that holds its election
// key and the owner keys of the providers it leads, nothing else. A live replica's key — a slow standby's, or a
// stuck leader's whose session is still alive — passes every check; so
// does a key that imitates one exactly, which only the end of its lease
// removes (etcd must not be writable by others: docs/operations.md).
//
// Every replica, leading or not, removes the foreign keys it finds (the
// guard): they block the election whoever leads now, and waiting for an
// operator would leave the provider without a publisher, and instances on
// stale shares, for as long as nobody looks. Removing one deposes no live
// replica (none holds it), and whoever could write it could as well have
// deleted the replicas' keys. Each is logged once with why, before it is
// removed, so nothing about it is lost.

// Why a key's lease says it is no replica's.
var (
	errLeaseGone    = errors.New("configd: election key's lease is gone, yet the key stayed")
	errLeaseTooLong = fmt.Errorf("configd: election key's lease was granted for longer than a replica's session (%v at most)", schema.MaxSessionTTL)
	errLeaseShared  = errors.New("configd: election key's lease holds keys outside the election (an instance's lease, or another program's)")
)

// leaseProblem returns why a key under the election prefix on the lease
// resp describes (with its attached keys) is no replica's, or nil.
func leaseProblem(keys schema.Keys, resp *clientv3.LeaseTimeToLiveResponse) error {
	if resp.TTL < 0 {
		return errLeaseGone
	}
	// GrantedTTL, not TTL: etcd extends leases when its own leader changes.
	if time.Duration(resp.GrantedTTL)*time.Second > schema.MaxSessionTTL {
		return fmt.Errorf("%w: granted %ds", errLeaseTooLong, resp.GrantedTTL)
	}
	for _, k := range resp.Keys {
		// A replica's session holds its election key and the owner keys
		// of the providers it leads.
		if !strings.HasPrefix(string(k), keys.Election()+"/") && !strings.HasPrefix(string(k), keys.Owners()) {
			return fmt.Errorf("%w: %s", errLeaseShared, schema.QuoteValue(string(k)))
		}
	}
	return nil
}

// checkElectionKey returns why kv, read under the election prefix, is no
// live replica's key (nil: it may be one), or err when etcd could not say.
func checkElectionKey(ctx context.Context, cli *clientv3.Client, keys schema.Keys, kv *mvccpb.KeyValue) (why, err error) {
	key := string(kv.Key)
	if why := keys.CheckElectionKey(key, kv.Lease, kv.Value); why != nil {
		return why, nil
	}
	resp, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease), clientv3.WithAttachedKeys())
	switch {
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		// With etcd's auth on, only when the lease holds a key this user
		// may not read: a replica's holds its election and owner keys alone.
		return fmt.Errorf("%w: (etcd denies reading them)", errLeaseShared), nil
	case err != nil:
		return nil, etcdError(err)
	}
	why = leaseProblem(keys, resp)
	if errors.Is(why, errLeaseGone) {
		// Normally the key went with its lease between the two reads.
		now, err := cli.Get(ctx, key)
		if err != nil {
			return nil, etcdError(err)
		}
		if len(now.Kvs) == 0 || now.Kvs[0].ModRevision != kv.ModRevision {
			return nil, nil
		}
	}
	return why, nil
}

// foreignKey is a key under the election prefix that no replica holds.
type foreignKey struct {
	kv     *mvccpb.KeyValue
	why    error
	oldest bool // the lowest create revision under the prefix: no replica can lead while it stays
}

// guard finds, logs and removes the foreign keys under the election
// prefix until ctx ends: all of them when it starts and every session
// TTL, and each key as it is written (through a watch). It retries after
// etcd errors, as run does.
func (e *elector) guard(ctx context.Context) {
	found := map[string]int64{} // foreign keys logged, not removed yet: key → mod revision
	backoff := 100 * time.Millisecond
	failing := false
	for ctx.Err() == nil {
		start := time.Now()
		err := e.guardWatch(ctx, found)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > 10*time.Second {
			backoff, failing = 100*time.Millisecond, false
		}
		// Warn once per outage; run reports etcd's state as well.
		if failing {
			e.log.Debug("election guard: retrying", "error", err, "in", backoff)
		} else {
			e.log.Warn("election guard: retrying", "error", err, "in", backoff)
		}
		failing = true
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// guardWatch is one run of the guard, until ctx ends or etcd fails.
func (e *elector) guardWatch(ctx context.Context, found map[string]int64) error {
	rev, err := e.sweep(ctx, found)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := e.cli.Watch(wctx, e.keys.Election()+"/", clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithFilterDelete())
	tick := time.NewTicker(e.ttl)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case wr, ok := <-wch:
			if !ok {
				return errors.New("configd: election watch closed")
			}
			if err := wr.Err(); err != nil {
				return fmt.Errorf("configd: election watch: %w", err)
			}
			for _, ev := range wr.Events {
				why, err := checkElectionKey(ctx, e.cli, e.keys, ev.Kv)
				if err != nil {
					return err
				}
				if why != nil {
					oldest, err := e.oldest(ctx, ev.Kv)
					if err != nil {
						return err
					}
					if err := e.remove(ctx, foreignKey{ev.Kv, why, oldest}, found); err != nil {
						return err
					}
				}
			}
		case <-tick.C:
			if _, err := e.sweep(ctx, found); err != nil {
				return err
			}
		}
	}
}

// sweep checks every key under the election prefix, removes the foreign
// ones and sets the gauge to those left; it returns the revision read at.
func (e *elector) sweep(ctx context.Context, found map[string]int64) (int64, error) {
	resp, err := e.cli.Get(ctx, e.keys.Election()+"/", clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return 0, etcdError(err)
	}
	present := map[string]bool{}
	for i, kv := range resp.Kvs {
		present[string(kv.Key)] = true
		why, err := checkElectionKey(ctx, e.cli, e.keys, kv)
		if err != nil {
			return 0, err
		}
		if why == nil {
			continue
		}
		if err := e.remove(ctx, foreignKey{kv, why, i == 0}, found); err != nil {
			return 0, err
		}
	}
	for k := range found {
		if !present[k] {
			delete(found, k)
		}
	}
	e.metrics.electionForeign.Set(float64(len(found)))
	return resp.Header.Revision, nil
}

// oldest reports whether no key under the election prefix is older than kv.
func (e *elector) oldest(ctx context.Context, kv *mvccpb.KeyValue) (bool, error) {
	resp, err := e.cli.Get(ctx, e.keys.Election()+"/", append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...)
	if err != nil {
		return false, etcdError(err)
	}
	return len(resp.Kvs) > 0 && string(resp.Kvs[0].Key) == string(kv.Key), nil
}

// remove logs f once (per key and mod revision), and deletes it unless it
// changed since it was read. found holds the foreign keys logged and not
// removed yet, which the gauge counts.
func (e *elector) remove(ctx context.Context, f foreignKey, found map[string]int64) error {
	key := string(f.kv.Key)
	if found[key] != f.kv.ModRevision {
		found[key] = f.kv.ModRevision
		e.metrics.electionForeign.Set(float64(len(found)))
		e.log.Warn("foreign key in the configd election", "key", key, "why", f.why.Error(),
			"lease", fmt.Sprintf("%x", f.kv.Lease), "value", clip(string(f.kv.Value)),
			"create_revision", f.kv.CreateRevision, "blocks_election", f.oldest, "action", "removing it")
	}
	resp, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", f.kv.ModRevision)).
		Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return etcdError(err) // still found: the gauge shows it until a retry removes it
	}
	// Removed, or changed or gone since it was read: a change comes back
	// through the watch and is checked again.
	delete(found, key)
	e.metrics.electionForeign.Set(float64(len(found)))
	if resp.Succeeded {
		e.metrics.electionForeignRemoved.Inc()
		e.log.Warn("foreign election key removed", "key", key)
	}
	return nil
}

// electionShown bounds how many election keys status checks and lists.
const electionShown = 16

// readElection returns the oldest electionShown keys under the election
// prefix, each checked, and how many more there are.
func readElection(ctx context.Context, cli *clientv3.Client, keys schema.Keys) ([]electionKeyView, int64, error) {
	resp, err := cli.Get(ctx, keys.Election()+"/", clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(electionShown))
	if err != nil {
		return nil, 0, etcdError(err)
	}
	out := []electionKeyView{}
	for _, kv := range resp.Kvs {
		why, err := checkElectionKey(ctx, cli, keys, kv)
		if err != nil {
			return nil, 0, err
		}
		v := electionKeyView{Key: string(kv.Key), Replica: clip(string(kv.Value)), CreateRevision: kv.CreateRevision}
		if kv.Lease != 0 {
			v.Lease = fmt.Sprintf("%x", kv.Lease)
		}
		if why != nil {
			v.Foreign = why.Error()
		}
		out = append(out, v)
	}
	return out, resp.Count - int64(len(resp.Kvs)), nil
}
