package cluster

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/schema"
)

// errLeaseTooLong: a key under configd's election prefix on a lease no
// configd replica's session has.
var errLeaseTooLong = fmt.Errorf("cluster: configd election key's lease was granted for longer than a replica's session (%v at most)", schema.MaxSessionTTL)

// leaderKey applies a key under configd's election prefix (its put, or
// deleted) to the view. Only a key a configd replica can hold makes
// configd alive: one that cannot be (schema.Keys.CheckElectionKey: no
// lease, not named after its lease, no replica ID; or on a lease granted
// for longer than any replica's session) is ignored, logged once and
// listed in Status.Problems. Otherwise such a key — which configd removes
// when it runs — would keep the instances, with configd gone, on the last
// shares (or on nothing, for one that joined since) for as long as it
// stays: for good if it has no lease. A replica's key passes every check,
// so an instance never takes a live configd for gone; a key that imitates
// one exactly counts as configd's until its lease ends.
func (m *Member) leaderKey(ctx context.Context, v *view, kv *mvccpb.KeyValue, deleted bool) error {
	key := string(kv.Key)
	defer m.listProblems(v)
	if deleted {
		delete(v.problems, key)
		delete(v.leaders, key)
		return nil
	}
	why := m.keys.CheckElectionKey(key, kv.Lease, kv.Value)
	if why == nil {
		octx, cancel := m.opCtx(ctx)
		resp, err := m.cli.TimeToLive(octx, clientv3.LeaseID(kv.Lease))
		cancel()
		if err != nil {
			return fmt.Errorf("configd leader key %s: lease: %w", key, err)
		}
		switch {
		case resp.TTL < 0:
			// Its lease is gone, and the key with it (the deletion is on
			// its way): configd is not alive through it.
			if v.leaders[key] {
				delete(v.leaders, key)
			}
			return nil
		case time.Duration(resp.GrantedTTL)*time.Second > schema.MaxSessionTTL:
			why = fmt.Errorf("%w: granted %ds", errLeaseTooLong, resp.GrantedTTL)
		}
	}
	if why == nil {
		delete(v.problems, key)
		v.leaders[key] = true
		return nil
	}
	if v.leaders[key] {
		delete(v.leaders, key) // rewritten: no longer a replica's
	}
	if v.problems[key] != why.Error() {
		m.log.Warn("ignoring a foreign key in configd's election: it does not make configd alive", "key", key, "err", why)
	}
	v.problems[key] = why.Error()
	return nil
}
