package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/configd/round"
	"github.com/sluice-go/sluice/internal/ledger"
	ledgerstore "github.com/sluice-go/sluice/internal/ledger/store"
	"github.com/sluice-go/sluice/internal/schema"
)

// ledgerRounds is the most rounds one publish of a ledger provider runs:
// a publish to more holders than a transaction holds is staged over
// several, and each round reads the ledger afresh.
const ledgerRounds = 8

// publishLedger runs rounds of the provider's ledger toward the split of
// its live instances (package round), each conditioned on leadership and
// the config's revision besides the ledger's head, until one has nothing
// to write. The ledger keeps the guarantee; the leader keeps no books.
func (p *publisher) publishLedger(ctx context.Context, f fence, name string, st *providerState, cfg schema.ProviderConfig) error {
	st.due = p.wall().Add(round.Tick(cfg.Window.D()))
	live := make([]schema.InstanceRecord, 0, len(st.instances))
	for _, id := range slices.Sorted(maps.Keys(st.instances)) {
		live = append(live, st.instances[id])
	}
	p.metrics.liveInstances.WithLabelValues(name).Set(float64(len(live)))
	p.metrics.total.WithLabelValues(name).Set(float64(cfg.Limit))
	target, err := round.Target(cfg, live)
	if err != nil {
		return fmt.Errorf("allocation failed: %w", err)
	}
	if st.ledger == nil {
		st.ledger = ledgerstore.NewPublisher(p.cli, ledger.Keys(p.keys.Ledger(name)), p.wall)
	}
	pb := st.ledger
	conds := []clientv3.Cmp{f.cmp(), clientv3.Compare(clientv3.ModRevision(p.keys.Config(name)), "=", st.keyRev)}
	pol := round.Policy(cfg)
	pol.MaxOps = p.txnOps
	written, done, err := pb.Rounds(ctx, pol, target, ledgerRounds, conds...)
	for _, ch := range written {
		p.metrics.publishes.WithLabelValues(name).Inc()
		p.log.Debug("ledger written", "provider", name, "why", ch.Why)
	}
	switch {
	case errors.Is(err, ledgerstore.ErrMoved):
		// The config, the leadership or the head moved since: the watch
		// brings the first two, and the next round reads the third.
		return nil
	case err != nil || done:
		return err
	}
	st.due = p.wall() // more to write: at once
	return nil
}
