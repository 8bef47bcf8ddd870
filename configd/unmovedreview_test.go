package main

import (
	"context"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// delayedKV, once armed, holds back the first transaction that puts a
// record of instance id's that does not say Common, and fails it with
// a deadline: etcd applies it later (release), as a request proposed
// through a slow follower, or queued, does after its client gave up.
type delayedKV struct {
	clientv3.KV
	armed string
	held  clientv3.Txn
}

func (k *delayedKV) Txn(ctx context.Context) clientv3.Txn {
	return &delayedTxn{Txn: k.KV.Txn(context.Background()), kv: k}
}

type delayedTxn struct {
	clientv3.Txn
	kv  *delayedKV
	ops []clientv3.Op
}

func (t *delayedTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *delayedTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.ops = append(t.ops, ops...)
	t.Txn = t.Txn.Then(ops...)
	return t
}
func (t *delayedTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }
func (t *delayedTxn) Commit() (*clientv3.TxnResponse, error) {
	if id := t.kv.armed; id != "" {
		for _, op := range t.ops {
			if op.IsPut() && strings.HasSuffix(string(op.KeyBytes()), "/"+id) && !strings.Contains(string(op.ValueBytes()), `"common":true`) {
				t.kv.armed, t.kv.held = "", t.Txn
				return nil, context.DeadlineExceeded
			}
		}
	}
	return t.Txn.Commit()
}

// TestUnmovedAfterALateOwnWrite: a write of x's own record whose answer
// was lost (commitChunks: -1, mayHaveLanded) lands after the next common
// record (a request etcd applies after its client gave up). configd,
// whose watch has not brought it yet, calls the common record after that
// unmoved (s.unmoved went true when that common record landed): x's own
// record is then a record of its own, and x, its own watch behind, takes
// the common record from the event. The oracle of TestShareLayoutOracle
// (layoutUnmoved) says so.
func TestUnmovedAfterALateOwnWrite(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	dkv := &delayedKV{KV: cli.KV}
	cli.KV = dkv
	name := "late"
	_, cfgRev := putLimit(t, cli, name, 100)
	_, publish := leadABCX(t, cli, name, cfgRev, schema.InstanceRecord{ReadsCommon: true, ReadsUnmoved: true})
	if err := publish(1, map[string]int64{"a": 30, "b": 30, "c": 30, "x": 30}); err != nil {
		t.Fatal(err)
	}
	// Generation 2: x leaves the common record for 10 of its own; the
	// answer is lost, and etcd has not applied it yet.
	dkv.armed = "x"
	if err := publish(2, map[string]int64{"a": 30, "b": 30, "c": 30, "x": 10}); err == nil {
		t.Fatal("the injected failure did not happen")
	}
	// Generation 3: all 25 alike (a new common record; x's pointer).
	if err := publish(3, map[string]int64{"a": 25, "b": 25, "c": 25, "x": 25}); err != nil {
		t.Fatal(err)
	}
	// etcd applies generation 2's write of x now.
	resp, err := dkv.held.Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("late write: %v %v", resp, err)
	}
	t.Logf("x's generation 2 record landed late, at %d", resp.Header.Revision)
	// Generation 4, decided before the watch brings it.
	if err := publish(4, map[string]int64{"a": 20, "b": 20, "c": 20, "x": 20}); err != nil {
		t.Fatal(err)
	}
	end, err := cli.Get(ctxT(t), keys.Config(name))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := layoutUnmoved(ctxT(t), cli, name, cfgRev, end.Header.Revision, true, &n); err != nil {
		t.Fatal(err)
	}
}
