package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/ledger"
	ledgerstore "github.com/sluice-go/sluice/internal/ledger/store"
	"github.com/sluice-go/sluice/internal/schema"
)

// ledgerRounds is the most rounds one publish of a ledger provider runs:
// a publish to more holders than a transaction holds is staged over
// several, and each round reads the ledger afresh.
const ledgerRounds = 8

// ledgerKeep is how many windows behind the current one a publish is
// kept before it may be collected.
const ledgerKeep = 3

// ledgerTick is how often the leader looks at a ledger provider with
// nothing changed: grants end at their publish's end, which a round
// extends once fewer than half the horizon's windows remain ahead.
func ledgerTick(w time.Duration) time.Duration {
	return min(max(w/4, 50*time.Millisecond), time.Second)
}

// ledgerHorizon is how many windows past the current one a publish
// grants: the provider's fail_static, the budget of an instance cut off
// from etcd, and at least 4.
func ledgerHorizon(cfg schema.ProviderConfig) int64 {
	w := cfg.Window.D()
	return max(4, int64((cfg.FailStaticOrDefault()+w-1)/w))
}

// ledgerPolicy is what the leader asks of a ledger provider's ledger.
func ledgerPolicy(cfg schema.ProviderConfig) ledger.Policy {
	return ledger.Policy{
		Limit:   cfg.Limit,
		Window:  cfg.Window.D(),
		Horizon: ledgerHorizon(cfg),
		Keep:    ledgerKeep,
		Slack:   cfg.Limit / 50,
	}
}

// ledgerTarget maps the split, by instance, to the holders the
// instances' records name. An instance that names none (a member that
// does not follow the ledger) is granted nothing; one that is leaving
// neither.
func ledgerTarget(split map[string]int64, live map[string]schema.InstanceRecord) map[string]int64 {
	t := make(map[string]int64, len(split))
	for _, id := range slices.Sorted(maps.Keys(split)) {
		r := live[id]
		if r.Holder == "" || r.Leaving {
			continue
		}
		t[r.Holder] = split[id]
	}
	return t
}

// publishLedger runs rounds of the provider's ledger toward the split of
// its live instances, each conditioned on leadership and the config's
// revision besides the ledger's head, until one has nothing to write.
// The ledger keeps the guarantee; the leader's books decide nothing.
func (p *publisher) publishLedger(ctx context.Context, f fence, name string, st *providerState, cfg schema.ProviderConfig) error {
	st.due = p.wall().Add(ledgerTick(cfg.Window.D()))
	live := make(map[string]schema.InstanceRecord, len(st.instances))
	var recs []schema.InstanceRecord
	for _, id := range slices.Sorted(maps.Keys(st.instances)) {
		if r := st.instances[id]; r.Holder != "" && !r.Leaving {
			live[id] = r
			recs = append(recs, r)
		}
	}
	p.metrics.liveInstances.WithLabelValues(name).Set(float64(len(st.instances)))
	p.metrics.total.WithLabelValues(name).Set(float64(cfg.Limit))
	var target map[string]int64
	if len(recs) > 0 {
		split, err := allocate(cfg, recs)
		if err != nil {
			return fmt.Errorf("allocation failed: %w", err)
		}
		target = ledgerTarget(split, live)
	}
	pb := ledgerstore.NewPublisher(p.cli, ledger.Keys(p.keys.Ledger(name)), p.wall)
	conds := []clientv3.Cmp{f.cmp(), clientv3.Compare(clientv3.ModRevision(p.keys.Config(name)), "=", st.keyRev)}
	for range ledgerRounds {
		ch, err := pb.Round(ctx, ledgerPolicy(cfg), target, conds...)
		switch {
		case errors.Is(err, ledgerstore.ErrMoved):
			// Another write came first (an instance's release, or the
			// config or leadership moved): the next round decides again
			// from what etcd holds.
			continue
		case err != nil:
			return err
		case ch.Empty():
			return nil
		}
		p.metrics.publishes.WithLabelValues(name).Inc()
		p.log.Debug("ledger written", "provider", name, "why", ch.Why)
	}
	st.due = p.wall() // more to write: at once
	return nil
}
