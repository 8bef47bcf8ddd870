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
// conditioned on the head it read.
//
// Between rounds it keeps the ledger it last read, with its own writes
// applied, while the head stays the one it wrote: only a head's writer
// writes publishes and grants, in the head's transaction, so the next
// round need read only the head and the releases written since, which
// only lower. A moved head or a write of unknown outcome drops it (a
// write refused with the head unmoved keeps it), and so does every
// fullEvery-th round, which reads the whole ledger and so sees a record
// written by hand. Safety does not rest on what is kept: every round
// checks the head before deciding from it, and every write is
// conditioned on it.
type Publisher struct {
	kv   clientv3.KV
	keys ledger.Keys
	now  func() time.Time

	kept    *ledger.State // the ledger as of readRev, with the writes since; nil: read it all
	headMod int64         // the head's mod revision in kept
	readRev int64         // the revision kept was last read at
	rounds  int           // rounds since the last whole read
}

// fullEvery is how many rounds a Publisher decides from what it kept
// before it reads the whole ledger again.
const fullEvery = 64

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
	s, headMod, err := pb.read(ctx)
	if err != nil {
		pb.kept = nil
		return ledger.Change{}, err
	}
	ch, err := ledger.Plan(s, p, target, pb.now().UnixNano())
	if err != nil || ch.Empty() {
		return ledger.Change{}, err
	}
	ops, err := pb.keys.Ops(ch)
	if err != nil {
		return ledger.Change{}, err
	}
	kept := pb.kept
	pb.kept = nil
	rev, headKept, err := write(ctx, pb.kv, pb.keys, headMod, ops, extra...)
	if err != nil {
		if errors.Is(err, ErrMoved) {
			if headKept {
				// Only an extra condition failed (the config moved, the
				// fence): what was kept is still the ledger, and a
				// fleet's worth of records need not be read again.
				pb.kept = kept
			}
			return ledger.Change{}, err
		}
		return ch, err
	}
	for _, o := range ops {
		if pb.keys.Decode(s, o.Key, o.Value) != nil {
			return ch, nil // written, not kept: the next round reads it all
		}
	}
	pb.kept, pb.headMod = s, rev
	return ch, nil
}

// read returns the ledger as etcd holds it, but for releases written
// since the last read that it may not have yet, and the head's mod
// revision: what it kept updated by the head and the releases written
// since, or the whole ledger read afresh.
func (pb *Publisher) read(ctx context.Context) (*ledger.State, int64, error) {
	if pb.kept != nil && pb.rounds < fullEvery {
		pb.rounds++
		resp, err := pb.kv.Txn(ctx).Then(
			clientv3.OpGet(pb.keys.Head()),
			clientv3.OpGet(pb.keys.AllReleases(), clientv3.WithPrefix(), clientv3.WithMinModRev(pb.readRev+1)),
			clientv3.OpGet(pb.keys.AllReleases(), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		).Commit()
		if err != nil {
			return nil, 0, fmt.Errorf("store: reading the ledger under %q: %w", string(pb.keys), err)
		}
		head := resp.Responses[0].GetResponseRange().Kvs
		if len(head) == 1 && head[0].ModRevision == pb.headMod {
			for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
				if err := pb.keys.Decode(pb.kept, string(kv.Key), kv.Value); err != nil {
					return nil, 0, fmt.Errorf("store: a release under %q does not decode: %w", string(pb.keys), &RecordError{Key: string(kv.Key), Rev: kv.ModRevision, Err: err})
				}
			}
			// A release deleted by another (an instance's credentials may)
			// is no write a read since shows, and it is room: with fewer
			// releases stored than kept, read them all.
			if resp.Responses[2].GetResponseRange().Count == pb.kept.ReleaseCount() {
				pb.readRev = resp.Header.Revision
				return pb.kept.Clone(), pb.headMod, nil
			}
		}
	}
	s, headMod, rev, bad, err := Read(ctx, pb.kv, pb.keys)
	if err != nil {
		return nil, 0, err
	}
	if len(bad) > 0 {
		// A record it cannot read might hold room: it adds none.
		return nil, 0, fmt.Errorf("store: %d records under %q do not decode, the first: %w", len(bad), string(pb.keys), bad[0])
	}
	// A ledger begun anew, perhaps where one was deleted whole, numbers
	// its publishes past the old ones, which a follower that lived across
	// may still hold.
	s.BeginAt(rev)
	pb.kept, pb.headMod, pb.readRev, pb.rounds = s.Clone(), headMod, rev, 0
	return s, headMod, nil
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
