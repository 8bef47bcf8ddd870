package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/schema"
)

// Who leads which provider.
//
// Every replica keeps a session and a key in the election (its candidacy:
// schema.Keys.ElectionKey); the live replicas are the keys there, the
// oldest first. Each provider is led by one replica at a time, the one
// whose owner key (schema.Keys.Owner) it is: created only where none
// exists, on the replica's session lease, so that it goes with the
// session, and compared by its create revision in every write for the
// provider (the fence). A replica's failure frees only its providers,
// once its session has expired.
//
// Every replica computes the same assignment from what it reads (balance):
// a free provider goes to the live replica leading the fewest, the oldest
// first among equals, so a lone provider goes to the election's leader; a
// replica leading more than its fair share (the providers over the live
// replicas, rounded up) gives up the excess, and while a replica leads
// fewer than the fair share rounded down (a new one), the replicas leading
// most give up just enough for it, which then goes to it as the one that
// leads fewest. Nothing else moves. Only the
// replica an assignment names acquires, and the owner key's create-if-
// absent settles any race between two views.
//
// A replica keeps the state of the providers it leads only: it decodes
// and plans nothing of the others, so adding replicas divides that work.
// It reads a provider's keys afresh when it takes it over, after its
// owner key is created: every write of the previous owner, fenced on the
// key it replaces, is in what it reads. It still receives every key's
// changes, through one watch of the whole prefix, and counts each
// provider's keys: a provider with any needs a leader.

// replicaKey is a live replica as its election key shows it.
type replicaKey struct {
	id    string
	lease int64
	rev   int64 // the key's create revision: the oldest key leads the election
}

// ownerKey is a provider's owner key.
type ownerKey struct {
	replica string
	lease   int64 // the owner's session lease: it identifies the owner
	rev     int64 // create revision: the fence of every write for the provider
	mod     int64 // mod revision
}

// releases returns how many providers the replica of session lease self
// is to give up, given how many each live replica leads (count), the
// number of providers and how many are free: what it leads above the fair
// share rounded up, and, while replicas lead fewer than it rounded down
// (a new one) and the free ones do not make up for it, one at a time from
// the replicas leading most (the oldest first among equals) until they do.
func releases(self int64, replicas []int64, count map[int64]int, providers, free int) int {
	lo := providers / len(replicas)
	hi := (providers + len(replicas) - 1) / len(replicas)
	left := make(map[int64]int, len(count)) // what each leads after its releases
	deficit := -free
	for _, r := range replicas {
		left[r] = min(count[r], hi)
		deficit += max(0, lo-count[r]) - (count[r] - left[r])
	}
	for ; deficit > 0; deficit-- {
		most := replicas[0]
		for _, r := range replicas[1:] {
			if left[r] > left[most] {
				most = r
			}
		}
		if left[most] <= lo {
			break
		}
		left[most]--
	}
	return count[self] - left[self]
}

// balance returns the providers the replica of session lease self is to
// acquire and to release, given the live replicas' leases (the oldest
// first), every provider, and each provider's owner (its owner key's
// lease; none: free). A replica that is not live acquires nothing.
func balance(self int64, replicas []int64, providers []string, owners map[string]int64) (acquire, release []string) {
	if !slices.Contains(replicas, self) || len(providers) == 0 {
		return nil, nil
	}
	count := make(map[int64]int, len(replicas)) // providers led, per live replica
	for _, r := range replicas {
		count[r] = 0
	}
	var mine, free []string
	for _, p := range slices.Sorted(slices.Values(providers)) {
		o, owned := owners[p]
		if !owned {
			free = append(free, p)
			continue
		}
		if o == self {
			mine = append(mine, p)
		}
		if _, live := count[o]; live {
			count[o]++
		}
	}
	n := releases(self, replicas, count, len(providers), len(free))
	release = mine[len(mine)-n:]
	for _, p := range free {
		pick := replicas[0]
		for _, r := range replicas[1:] {
			if count[r] < count[pick] {
				pick = r
			}
		}
		count[pick]++
		if pick == self {
			acquire = append(acquire, p)
		}
	}
	return acquire, release
}

// applyOwnership folds a change of a key under the election or the owners
// prefix into the publisher's view; it reports whether the key was one.
func (p *publisher) applyOwnership(typ mvccpb.Event_EventType, kv *mvccpb.KeyValue) bool {
	key := string(kv.Key)
	put := typ == mvccpb.PUT
	if strings.HasPrefix(key, p.keys.Election()+"/") {
		p.balanced = false
		delete(p.replicas, key)
		// A foreign key is no replica: the guard removes it.
		if put && p.keys.CheckElectionKey(key, kv.Lease, kv.Value) == nil {
			p.replicas[key] = replicaKey{id: string(kv.Value), lease: kv.Lease, rev: kv.CreateRevision}
		}
		return true
	}
	name, ok := strings.CutPrefix(key, p.keys.Owners())
	if !ok {
		return false
	}
	p.balanced = false
	delete(p.owners, name)
	if put {
		p.owners[name] = ownerKey{replica: string(kv.Value), lease: kv.Lease, rev: kv.CreateRevision, mod: kv.ModRevision}
	}
	if f, led := p.fences[name]; led && (!put || kv.CreateRevision != f.rev) {
		p.lost(name)
	}
	return true
}

// lost forgets that this replica leads provider name.
func (p *publisher) lost(name string) {
	p.balanced = false
	delete(p.fences, name)
	p.forgetProvider(name)
	p.metrics.forget(name) // its owner reports them now
	p.log.Info("no longer leads provider", "provider", name)
	p.noteLed()
}

// noteLed updates the count of providers led.
func (p *publisher) noteLed() { p.metrics.providersLed.Set(float64(len(p.fences))) }

// liveReplicas returns the leases of the live replicas, the oldest first.
func (p *publisher) liveReplicas() []int64 {
	keys := slices.SortedFunc(maps.Values(p.replicas), func(a, b replicaKey) int { return int(a.rev - b.rev) })
	out := make([]int64, 0, len(keys))
	for _, k := range keys {
		if !slices.Contains(out, k.lease) {
			out = append(out, k.lease)
		}
	}
	return out
}

// rebuildFences sets the providers this replica leads from the owner keys
// on its lease.
func (p *publisher) rebuildFences() {
	p.balanced = false
	p.fences = map[string]fence{}
	for name, o := range p.owners {
		if o.lease == p.lease && p.lease != 0 {
			p.fences[name] = fence{key: p.keys.Owner(name), rev: o.rev}
		}
	}
	p.noteLed()
}

// errSessionGone: this replica's session lease is gone.
var errSessionGone = errors.New("configd: session lease gone")

// reconcile releases and acquires providers as balance says.
func (p *publisher) reconcile(ctx context.Context) error {
	if p.balanced {
		return nil
	}
	names := make([]string, 0, len(p.known))
	for name := range p.known {
		if schema.ValidateName(name) == nil {
			names = append(names, name)
		}
	}
	live := p.liveReplicas()
	owners := make(map[string]int64, len(p.owners))
	for name, o := range p.owners {
		if slices.Contains(live, o.lease) {
			owners[name] = o.lease
		}
	}
	acquire, release := balance(p.lease, live, names, owners)
	for name := range p.fences {
		if p.known[name] == 0 {
			release = append(release, name) // nothing of it is left
		}
	}
	for _, name := range release {
		if err := p.release(ctx, name); err != nil {
			return err
		}
	}
	for _, name := range acquire {
		if err := p.acquire(ctx, name); err != nil {
			return err
		}
	}
	p.balanced = true
	return nil
}

// acquire creates provider name's owner key on this replica's lease, if
// it is still free.
func (p *publisher) acquire(ctx context.Context, name string) error {
	key := p.keys.Owner(name)
	if o, ok := p.owners[name]; ok {
		return p.removeForeignOwner(ctx, name, o)
	}
	resp, err := p.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, p.replica, clientv3.WithLease(clientv3.LeaseID(p.lease)))).Commit()
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return errSessionGone
	case err != nil:
		return etcdError(err)
	case !resp.Succeeded:
		return nil // taken meanwhile: the watch brings whose it is
	}
	rev := resp.Header.Revision
	p.owners[name] = ownerKey{replica: p.replica, lease: p.lease, rev: rev}
	p.fences[name] = fence{key: key, rev: rev}
	p.noteLed()
	p.log.Info("leads provider", "provider", name, "revision", rev)
	// It followed nothing of the provider while another led it.
	return p.readProvider(ctx, name)
}

// removeForeignOwner deletes provider name's owner key o, which is on no
// live replica's session lease: without a lease, or on one that is not a
// replica's (no live replica holds a key in the election on it). A
// replica's owner keys and its election key share its session lease and
// go together, so o can only be someone else's, and it would keep every
// replica from leading the provider. The watch brings the deletion, and
// the replica balance names acquires the provider then.
func (p *publisher) removeForeignOwner(ctx context.Context, name string, o ownerKey) error {
	key := p.keys.Owner(name)
	p.log.Warn("owner key on no live replica's session; removing it", "provider", name, "key", key,
		"value", clip(o.replica), "lease", fmt.Sprintf("%x", o.lease), "revision", o.mod)
	_, err := p.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", o.mod)).Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return etcdError(err)
	}
	return nil
}

// release deletes provider name's owner key, if it is still this
// replica's, so that the replica balance names next takes it over.
func (p *publisher) release(ctx context.Context, name string) error {
	f, ok := p.fences[name]
	if !ok {
		return nil
	}
	p.lost(name)
	if _, err := p.cli.Txn(ctx).If(f.cmp()).Then(clientv3.OpDelete(f.key)).Commit(); err != nil {
		return etcdError(err)
	}
	return nil
}
