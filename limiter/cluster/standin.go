package cluster

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/configd/round"
	"github.com/sluice-go/sluice/internal/ledger"
	ledgerstore "github.com/sluice-go/sluice/internal/ledger/store"
	"github.com/sluice-go/sluice/internal/schema"
)

// standInRounds is the most rounds one stand-in runs, as configd's leader.
const standInRounds = 8

// tryStandIn is standIn, logged; once etcd denies it the writes, it
// says so once and tries no more. alive is what it knows of configd:
// -1 unknown (it counts the election's keys, and sets it), 0 none alive,
// more: alive, when it reads nothing. The election's watch sets it back
// to unknown on any change, so with configd alive a member reads nothing.
func (m *Member) tryStandIn(ctx context.Context, alive *int64) {
	if m.noStandIn {
		return
	}
	if *alive < 0 {
		octx, cancel := m.opCtx(ctx)
		resp, err := m.cli.Get(octx, m.keys.Election()+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		if err != nil {
			return
		}
		*alive = resp.Count
	}
	if *alive > 0 {
		return
	}
	err := m.standIn(ctx)
	switch {
	case err == nil || ctx.Err() != nil:
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		m.noStandIn = true
		m.log.Info("not standing in for configd: etcd lets this instance write only its releases of the ledger; without configd its grants end at their horizon", "err", err)
	default:
		m.log.Warn("could not stand in for configd on the ledger", "err", err)
	}
}

// standIn runs configd's round of the provider's ledger while no configd
// replica is alive, if this instance is the one of the live instances to
// do it (the least ID among those following the ledger): configd's own
// policy and target (package round), each write conditioned on no
// replica being alive and on the config's revision, besides the ledger's
// head. Any number of writers keep the ledger's invariant, since every
// write that adds room is decided from the head it is conditioned on;
// choosing one only spares them the contention. A replica that comes
// back makes the condition fail, and leads again.
func (m *Member) standIn(ctx context.Context) error {
	octx, cancel := m.opCtx(ctx)
	defer cancel()
	resp, err := m.cli.Txn(octx).Then(
		clientv3.OpGet(m.keys.Election()+"/", clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(m.keys.Config(m.provider)),
		clientv3.OpGet(m.keys.Instances(m.provider), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return err
	}
	cfgs := resp.Responses[1].GetResponseRange().Kvs
	if resp.Responses[0].GetResponseRange().Count > 0 || len(cfgs) == 0 {
		return nil // configd leads, or there is nothing to grant
	}
	cfg, err := schema.DecodeProviderConfig(cfgs[0].Value)
	if err != nil || !cfg.Ledger() || cfg.Budget() {
		return nil // a budget is taken from its counter, never granted
	}
	live, first := liveHolders(resp.Responses[2].GetResponseRange().Kvs)
	if first != m.id {
		return nil
	}
	target, reserves, err := round.Target(cfg, live)
	if err != nil {
		return err
	}
	pb := ledgerstore.NewPublisher(m.cli, ledger.Keys(m.keys.Ledger(m.provider)), m.lim.Now)
	conds := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(m.keys.Election()+"/"), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.ModRevision(m.keys.Config(m.provider)), "=", cfgs[0].ModRevision),
	}
	pol := round.Policy(cfg)
	pol.Reserves = reserves
	written, _, err := pb.Rounds(octx, pol, target, standInRounds, conds...)
	for _, ch := range written {
		m.log.Debug("ledger written, standing in for configd", "why", ch.Why)
	}
	if errors.Is(err, ledgerstore.ErrMoved) {
		return nil // another writer, configd back, or the config moved: the next look reads it
	}
	return err
}

// liveHolders decodes the instance records that do, and returns the
// one of them that stands in (round.StandIn).
func liveHolders(kvs []*mvccpb.KeyValue) (live []schema.InstanceRecord, first string) {
	for _, kv := range kvs {
		r, err := schema.DecodeInstanceRecord(kv.Value)
		if err != nil {
			continue
		}
		live = append(live, r)
	}
	return live, round.StandIn(live)
}
