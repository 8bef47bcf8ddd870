package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/ledger"
	ledgerstore "github.com/sluice-go/sluice/internal/ledger/store"
	"github.com/sluice-go/sluice/internal/schema"
)

// ErrRecordsLeft: a provider is created under one coordination while
// records of the other, from before it was deleted, may still let
// instances admit. Neither protocol counts the other's records.
var ErrRecordsLeft = errors.New("configd: the provider's records from before it was deleted may still let instances admit")

// coordinationChecks returns what writing cfg needs of the records an
// earlier provider of the same names left: the conditions its write adds
// and the deletions it makes, or ErrRecordsLeft. old is the config stored
// (nil: none, or malformed): every name cfg writes a config for that old
// did not hold is checked, the provider's own and each lane's, since a
// lane number that a provider deleted and created again does not hold
// may have been its earlier incarnation's.
//
// A ledger provider needs no share records left: configd keeps them while
// an instance they name may enforce them, and deletes them after. A shares
// provider, and a budget of a ledger provider, need every grant of a
// ledger left to have ended: then the ledger goes with the write,
// conditioned on its head.
func (s *store) coordinationChecks(ctx context.Context, old *schema.ProviderConfig, cfg schema.ProviderConfig) ([]clientv3.Cmp, []clientv3.Op, error) {
	var names []schema.ProviderConfig
	if old == nil {
		names = append(names, cfg)
	}
	for _, l := range cfg.Lanes {
		if old != nil && slices.ContainsFunc(old.Lanes, func(o schema.Lane) bool { return o.Lane == l.Lane }) {
			continue
		}
		names = append(names, l.Derive(cfg))
	}
	var conds []clientv3.Cmp
	var ops []clientv3.Op
	for _, c := range names {
		if cfg.Ledger() {
			cs, err := s.noShares(ctx, c.Name)
			if err != nil {
				return nil, nil, err
			}
			conds = append(conds, cs...)
			if !c.Budget() {
				continue
			}
		}
		// A budget, taken from its counter, and the shares count no
		// grant: the name's ledger must have ended.
		cs, o, err := s.ledgerEnded(ctx, c.Name, func(w time.Duration) time.Duration {
			c.Window = schema.Duration(w) // the bound the grants' holders kept
			return c.ClockBound()
		})
		if err != nil {
			return nil, nil, err
		}
		conds, ops = append(conds, cs...), append(ops, o...)
	}
	return conds, ops, nil
}

// noShares returns the conditions that provider n has no share record
// and no instance on the even split, or ErrRecordsLeft when it has.
func (s *store) noShares(ctx context.Context, n string) ([]clientv3.Cmp, error) {
	prefix := s.keys.Shares(n)
	resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, etcdError(err)
	}
	if resp.Count > 0 {
		return nil, fmt.Errorf("%w: %q has %d share records, which its instances may still enforce; configd deletes them once no instance of it runs and their holds end: create it with the ledger then, or under another name", ErrRecordsLeft, n, resp.Count)
	}
	// With no configd alive the instances enforce the even split, which
	// no share record holds: each says so with a mark on its lease.
	even := s.keys.Even(n)
	resp, err = s.cli.Get(ctx, even, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, etcdError(err)
	}
	if resp.Count > 0 {
		return nil, fmt.Errorf("%w: %q has %d instances on the even split, which they may still enforce until their leases end: create it with the ledger then, or under another name", ErrRecordsLeft, n, resp.Count)
	}
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(prefix), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(even), "=", 0).WithPrefix(),
	}, nil
}

// ledgerEnded returns, for provider n's ledger, the condition on its head
// and the deletion of its records once every grant in it has ended: twice
// the instances' clock bound past its last window, the larger of the one
// its era records (Era.Bound) and bound's for its windows' length. Or
// ErrRecordsLeft saying until when one runs. The head stays, emptied
// (ledger.State.Emptied): a provider back on the ledger numbers its
// publishes past the old ones and grants nothing before the old grants'
// end.
func (s *store) ledgerEnded(ctx context.Context, n string, bound func(window time.Duration) time.Duration) ([]clientv3.Cmp, []clientv3.Op, error) {
	keys := ledger.Keys(s.keys.Ledger(n))
	st, headMod, _, bad, err := ledgerstore.Read(ctx, s.cli, keys)
	if err != nil {
		return nil, nil, etcdError(err)
	}
	if headMod == 0 && len(bad) == 0 {
		return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(string(keys)), "=", 0).WithPrefix()}, nil, nil
	}
	if len(bad) > 0 {
		return nil, nil, fmt.Errorf("%w: %q's ledger has %d records that do not decode (%v): it cannot tell when its grants end; delete them", ErrRecordsLeft, n, len(bad), bad[0])
	}
	end := st.Ended(bound)
	if end > 0 && s.clock().Before(time.Unix(0, end)) {
		return nil, nil, fmt.Errorf("%w: %q's ledger grants room until %s; create it with the shares, or give it a budget, after then; or a limit of up to %v with the ledger now", ErrRecordsLeft, n, time.Unix(0, end).UTC().Format(time.RFC3339Nano), time.Duration(schema.MaxWindow))
	}
	head, err := ledger.Encode(st.Emptied(end))
	if err != nil {
		return nil, nil, err
	}
	cond := clientv3.Compare(clientv3.ModRevision(keys.Head()), "=", headMod)
	return []clientv3.Cmp{cond}, []clientv3.Op{
		clientv3.OpDelete(keys.Pubs(), clientv3.WithPrefix()),
		clientv3.OpDelete(keys.AllGrants(), clientv3.WithPrefix()),
		clientv3.OpDelete(keys.AllReleases(), clientv3.WithPrefix()),
		clientv3.OpPut(keys.Head(), string(head)),
	}, nil
}
