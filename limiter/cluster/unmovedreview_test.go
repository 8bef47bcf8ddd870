package cluster

import (
	"context"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// laggingKV serves serializable reads as an etcd member that has applied
// the log up to *lag only (0: not behind): what readShare's first read,
// WithSerializable, gets from a follower behind the one whose watch sent
// the event. Linearizable reads are the leader's.
type laggingKV struct {
	clientv3.KV
	lag *int64
}

func (k laggingKV) Txn(ctx context.Context) clientv3.Txn {
	return &laggingTxn{Txn: k.KV.Txn(ctx), lag: *k.lag}
}

type laggingTxn struct {
	clientv3.Txn
	lag    int64
	serial bool
}

func (t *laggingTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *laggingTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}
func (t *laggingTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	out := make([]clientv3.Op, len(ops))
	for i, op := range ops {
		out[i] = op
		if op.IsGet() && op.IsSerializable() && t.lag > 0 {
			t.serial = true
			out[i] = clientv3.OpGet(string(op.KeyBytes()), clientv3.WithSerializable(), clientv3.WithRev(t.lag))
		}
	}
	t.Txn = t.Txn.Then(out...)
	return t
}
func (t *laggingTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err == nil && t.serial {
		resp.Header.Revision = t.lag // the member's applied revision
	}
	return resp, err
}

// TestUnmovedThenLateOwnPointerGoesBack: a member takes unmoved common
// records from their events (generations 2, then 3, share 50 then 30);
// its own watch then brings a pointer configd wrote between them
// (allowed: only pointers between two commons). That event is above
// shareSeen (the unmoved path does not raise it), so it is read with
// readShare(at = the pointer's revision), serializable: an etcd member
// that has applied up to that revision answers, and the member goes back
// to generation 2's common record (share 50) after it followed, and
// acknowledged, generation 3 (30). Before the change every common event
// was read at its own revision and raised shareSeen past the pointer.
func TestUnmovedThenLateOwnPointerGoesBack(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	rcli := srv.Client(t)
	var lag int64
	rcli.KV = laggingKV{KV: rcli.KV, lag: &lag}
	m, v, from := followingA(t, cli, rcli, 50)
	common := func(gen, share int64) *clientv3.Event { return putCommon(t, cli, gen, share, from, true) }
	// configd: publish 2 writes the common record (unmoved: only
	// pointers since generation 1's) and then a pointer for a (a joined
	// again under its ID: its record is written again); publish 3 the
	// common record alone (unmoved: only a's pointer since).
	c2 := common(2, 50)
	presp, err := cli.Put(context.Background(), keys.Share("api", "a"), mustEncode(t, schema.ShareRecord{Version: 1, Provider: "api", Instance: "a", Generation: 2, Common: true}))
	if err != nil {
		t.Fatal(err)
	}
	c3 := common(3, 30)
	// The common watch is ahead of a's own watch.
	for _, ev := range []*clientv3.Event{c2, c3} {
		if _, err := m.shareEvent(context.Background(), v, ev); err != nil {
			t.Fatal(err)
		}
	}
	if v.share == nil || v.share.Generation != 3 || v.share.Share != 30 {
		t.Fatalf("after the common events: %+v, want generation 3's 30", v.share)
	}
	t.Logf("followed generation %d, share %d (acknowledged)", v.share.Generation, v.share.Share)
	// a's own watch brings the pointer written at presp's revision; the
	// etcd member that serves the serializable read has applied up to it.
	lag = presp.Header.Revision
	own := &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(keys.Share("api", "a")),
		Value: []byte(mustEncode(t, schema.ShareRecord{Version: 1, Provider: "api", Instance: "a", Generation: 2, Common: true})), ModRevision: presp.Header.Revision}}
	if _, err := m.shareEvent(context.Background(), v, own); err != nil {
		t.Fatal(err)
	}
	if v.share == nil || v.share.Generation < 3 {
		t.Fatalf("after its own (older) pointer's event: generation %d, share %d; it followed generation 3 (30) already: went back to an older record", v.share.Generation, v.share.Share)
	}
}
