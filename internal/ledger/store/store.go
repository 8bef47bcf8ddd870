// Package store keeps a ledger (package ledger) in etcd: it reads the
// ledger at one revision, writes a change in one transaction conditioned
// on the head it was decided from, and runs the two loops that drive the
// ledger's decisions over a real etcd: Publisher, configd's, and
// Follower, a member's. The decisions are ledger's own: this package only
// moves records, so the simulation (internal/world), which runs the same
// decisions, checks what runs here.
//
// A holder name names one incarnation of a process: a Follower draws a
// new incarnation id for it, so a process that restarts never enforces
// grants its last incarnation may already have used up.
package store

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/ledger"
)

// ErrMoved is returned by Write when a condition of the write failed:
// the head is no longer the one the change was decided from (another
// writer wrote first), or an extra condition (a fence, the config's
// revision) no longer holds. Nothing was written; the next round decides
// again from what etcd holds.
var ErrMoved = errors.New("store: the ledger's head moved since it was read, or a condition of the write no longer holds")

// Read returns the ledger under keys as etcd holds it at one revision,
// the head's mod revision (0: no head yet) and that revision. A record
// that does not decode is skipped and reported in bad, as a *RecordError
// that names its key: it adds no room to the state returned.
func Read(ctx context.Context, kv clientv3.KV, keys ledger.Keys) (s *ledger.State, headMod, rev int64, bad []error, err error) {
	resp, err := kv.Get(ctx, string(keys), clientv3.WithPrefix())
	if err != nil {
		return nil, 0, 0, nil, fmt.Errorf("store: reading the ledger under %q: %w", string(keys), err)
	}
	s = ledger.NewState()
	for _, kv := range resp.Kvs {
		if string(kv.Key) == keys.Head() {
			headMod = kv.ModRevision
		}
		if err := keys.Decode(s, string(kv.Key), kv.Value); err != nil {
			bad = append(bad, &RecordError{Key: string(kv.Key), Rev: kv.ModRevision, Err: err})
		}
	}
	return s, headMod, resp.Header.Revision, bad, nil
}

// RecordError is a record Read could not decode: its key, the revision
// it was last written at, and why. It wraps the decoder's error, which
// wraps ledger.ErrInvalid.
type RecordError struct {
	Key string
	Rev int64
	Err error
}

func (e *RecordError) Error() string { return e.Key + ": " + e.Err.Error() }
func (e *RecordError) Unwrap() error { return e.Err }

// Write writes ops in one transaction, if the head's mod revision is
// still headMod (0: no head) and every extra condition holds. It returns
// ErrMoved when a condition failed, and another error when the outcome is
// not known: the transaction may or may not have been applied, which the
// next read tells.
func Write(ctx context.Context, kv clientv3.KV, keys ledger.Keys, headMod int64, ops []ledger.Op, extra ...clientv3.Cmp) error {
	_, _, err := write(ctx, kv, keys, headMod, ops, extra...)
	return err
}

// write is Write, and returns the revision it wrote at; on ErrMoved,
// headKept reports that the head was still the one read, so that only
// an extra condition failed and nothing of the ledger moved.
func write(ctx context.Context, kv clientv3.KV, keys ledger.Keys, headMod int64, ops []ledger.Op, extra ...clientv3.Cmp) (rev int64, headKept bool, err error) {
	conds := append([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(keys.Head()), "=", headMod)}, extra...)
	resp, err := kv.Txn(ctx).If(conds...).Then(etcdOps(ops)...).Else(clientv3.OpGet(keys.Head(), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return 0, false, fmt.Errorf("store: writing %d records: %w", len(ops), err)
	}
	if !resp.Succeeded {
		var mod int64
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
			mod = kvs[0].ModRevision
		}
		return 0, mod == headMod, ErrMoved
	}
	return resp.Header.Revision, false, nil
}

// Put writes ops in one transaction with no condition: a holder's
// releases, which only lower what it may admit.
func Put(ctx context.Context, kv clientv3.KV, ops []ledger.Op) error {
	if _, err := kv.Txn(ctx).Then(etcdOps(ops)...).Commit(); err != nil {
		return fmt.Errorf("store: writing %d records: %w", len(ops), err)
	}
	return nil
}

func etcdOps(ops []ledger.Op) []clientv3.Op {
	out := make([]clientv3.Op, 0, len(ops))
	for _, o := range ops {
		if o.Value == nil {
			out = append(out, clientv3.OpDelete(o.Key))
		} else {
			out = append(out, clientv3.OpPut(o.Key, string(o.Value)))
		}
	}
	return out
}
