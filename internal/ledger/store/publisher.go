package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/ledger"
)

// Publisher is configd's side of one limit's ledger: each Round reads the
// ledger, decides with ledger.Plan on its clock, and writes the change
// conditioned on the head it read. It keeps nothing between rounds, so
// an unknown outcome, a refusal, a failover or a second writer is
// answered by the next round's fresh read.
type Publisher struct {
	kv   clientv3.KV
	keys ledger.Keys
	now  func() time.Time
}

// NewPublisher returns a publisher of the ledger under keys, deciding on
// the clock now (configd's wall clock).
func NewPublisher(kv clientv3.KV, keys ledger.Keys, now func() time.Time) *Publisher {
	return &Publisher{kv: kv, keys: keys, now: now}
}

// Round makes one decision: it gives the holders in target their quotas
// within the room the ledger leaves, under p, and writes the change, in
// one transaction of at most p.MaxOps operations (etcd's --max-txn-ops):
// a publish to more holders than that, or more to collect, takes several
// rounds. It
// returns the change written (empty when nothing was to be written),
// ErrMoved when another writer wrote first, and an error wrapping the
// cause when the outcome is not known. extra conditions (a fence) join
// the head's.
func (pb *Publisher) Round(ctx context.Context, p ledger.Policy, target map[string]int64, extra ...clientv3.Cmp) (ledger.Change, error) {
	s, headMod, _, bad, err := Read(ctx, pb.kv, pb.keys)
	if err != nil {
		return ledger.Change{}, err
	}
	if len(bad) > 0 {
		// A record it cannot read might hold room: it adds none.
		return ledger.Change{}, fmt.Errorf("store: %d records under %q do not decode, the first: %w", len(bad), string(pb.keys), bad[0])
	}
	ch, err := ledger.Plan(s, p, target, pb.now().UnixNano())
	if err != nil || ch.Empty() {
		return ledger.Change{}, err
	}
	ops, err := pb.keys.Ops(ch)
	if err != nil {
		return ledger.Change{}, err
	}
	if err := Write(ctx, pb.kv, pb.keys, headMod, ops, extra...); err != nil {
		if errors.Is(err, ErrMoved) {
			return ledger.Change{}, err
		}
		return ch, err
	}
	return ch, nil
}

// Rounds runs up to most rounds toward target under p, until one has
// nothing to write, and returns the changes written and whether the last
// round found nothing more to write. A round that finds another write
// came first ends them with ErrMoved: what moved (the config, the
// leadership, another writer) is for the caller to read before it
// decides again.
func (pb *Publisher) Rounds(ctx context.Context, p ledger.Policy, target map[string]int64, most int, extra ...clientv3.Cmp) (written []ledger.Change, done bool, err error) {
	for range most {
		ch, err := pb.Round(ctx, p, target, extra...)
		switch {
		case err != nil:
			return written, false, err
		case ch.Empty():
			return written, true, nil
		}
		written = append(written, ch)
	}
	return written, false, nil
}
