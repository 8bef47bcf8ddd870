package cluster

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// commonRecords writes, in configd's order, the common record c (share
// and generation) and then records that say Common for ids.
func commonRecords(t *testing.T, cli *clientv3.Client, w time.Duration, gen, share, from int64, ids ...string) {
	t.Helper()
	c := schema.ShareRecord{Version: 1, Provider: "api", Instance: schema.CommonInstance, Generation: gen, EffectiveFrom: from,
		Window: schema.Duration(w), Total: 100, Share: share, Granted: share}
	put(t, cli, keys.CommonShare("api"), mustEncode(t, c))
	for _, id := range ids {
		put(t, cli, keys.Share("api", id), mustEncode(t, schema.ShareRecord{Version: 1, Provider: "api", Instance: id, Generation: gen, Common: true}))
	}
}

// followingA returns Member a of provider "api" (limit 100 per second),
// which reads through mcli, loaded into the view it returns after
// configd's common record of share (generation 1, from the boundary it
// returns, two windows ahead) for a and b. Tests drive the view with
// shareEvent, in the order a watch would deliver.
func followingA(t *testing.T, cli, mcli *clientv3.Client, share int64) (*Member, *view, int64) {
	t.Helper()
	w := time.Second
	lim, err := limiter.New(0, w)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	m := &Member{provider: "api", id: "a", keys: keys, cfg: defaultOptions(), lim: lim, log: slog.New(slog.DiscardHandler), cli: mcli}
	v := newView()
	from := (time.Now().UnixNano()/int64(w) + 2) * int64(w)
	putConfig(t, cli, schema.ProviderConfig{Name: "api", Limit: 100, Window: schema.Duration(w)})
	commonRecords(t, cli, w, 1, share, from, "a", "b")
	if _, err := m.load(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	return m, v, from
}

// putCommon writes the common record (share, generation gen, from the
// boundary from, saying unmoved as told) and returns its watch event.
func putCommon(t *testing.T, cli *clientv3.Client, gen, share, from int64, unmoved bool) *clientv3.Event {
	t.Helper()
	c := schema.ShareRecord{Version: 1, Provider: "api", Instance: schema.CommonInstance, Generation: gen, EffectiveFrom: from,
		Window: schema.Duration(time.Second), Total: 100, Share: share, Granted: share, Unmoved: unmoved}
	val := mustEncode(t, c)
	resp, err := cli.Put(context.Background(), keys.CommonShare("api"), val)
	if err != nil {
		t.Fatal(err)
	}
	return &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(keys.CommonShare("api")), Value: []byte(val), ModRevision: resp.Header.Revision}}
}

// TestMembersFollowTheCommonRecord: instances whose records say Common
// enforce the common record, move with it when it alone is rewritten,
// and leave it for a record of their own.
func TestMembersFollowTheCommonRecord(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	w := 100 * time.Millisecond
	putConfig(t, cli, schema.ProviderConfig{Name: "api", Limit: 100, Window: schema.Duration(w)})
	liveLeader(t, cli)
	a := join(t, cli, "api", "a")
	b := join(t, cli, "api", "b")
	next := func() int64 { return (time.Now().UnixNano()/int64(w) + 2) * int64(w) }
	commonRecords(t, cli, w, 1, 40, next(), "a", "b")
	enforcing(t, a, 40)
	enforcing(t, b, 40)
	// One write moves both.
	commonRecords(t, cli, w, 2, 50, next())
	enforcing(t, a, 50)
	enforcing(t, b, 50)
	if st := a.Status(); st.Generation != 2 {
		t.Errorf("a follows generation %d, want the common record's 2", st.Generation)
	}
	// a leaves it for a record of its own, then the common one moves on.
	put(t, cli, keys.Share("api", "a"), mustEncode(t, schema.ShareRecord{Version: 1, Provider: "api", Instance: "a", Generation: 3,
		EffectiveFrom: next(), Window: schema.Duration(w), Total: 100, Share: 30, Granted: 50}))
	commonRecords(t, cli, w, 3, 70, next())
	enforcing(t, b, 70)
	enforcing(t, a, 30)
	// The common record gone, a record that says Common resolves to
	// nothing: the last good one stays, and the problem is listed.
	if _, err := cli.Delete(context.Background(), keys.CommonShare("api")); err != nil {
		t.Fatal(err)
	}
	put(t, cli, keys.Share("api", "b"), mustEncode(t, schema.ShareRecord{Version: 1, Provider: "api", Instance: "b", Generation: 4, Common: true}))
	waitFor(t, "b's problem listed", func() bool { return hasProblem(b, keys.Share("api", "b"), "common share record") })
	enforcing(t, b, 70)
}

// TestCommonRecordReadWithTheOwnInOneSnapshot: the watches of an
// instance's own record and of the common record deliver independently.
// When the common record's event comes first, and meanwhile configd gave
// the instance a record of its own before it rewrote the common one for
// the others, the instance must follow its own record, never the common
// record meant for others. Written as it happens: the event of the
// common record delivered before the one of its own record.
func TestCommonRecordReadWithTheOwnInOneSnapshot(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	w := time.Second
	m, v, from := followingA(t, cli, cli, 40)
	if v.share == nil || v.share.Share != 40 || !v.pointer {
		t.Fatalf("after the load: %+v (pointer %v), want the common record's 40", v.share, v.pointer)
	}
	// configd: a's own record first, then the common record for b alone.
	put(t, cli, keys.Share("api", "a"), mustEncode(t, schema.ShareRecord{Version: 1, Provider: "api", Instance: "a", Generation: 2,
		EffectiveFrom: from + int64(w), Window: schema.Duration(w), Total: 100, Share: 10, Granted: 40}))
	commonRecords(t, cli, w, 2, 90, from+int64(w))
	resp, err := cli.Get(context.Background(), keys.CommonShare("api"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.shareEvent(context.Background(), v, &clientv3.Event{Type: mvccpb.PUT, Kv: resp.Kvs[0]}); err != nil {
		t.Fatal(err)
	}
	if v.share == nil || v.share.Share != 10 || v.pointer {
		t.Fatalf("after the common record's event: %+v (pointer %v), want a's own record's 10, not the common 90", v.share, v.pointer)
	}
	// The own record's event, late: in the snapshot read already.
	own, err := cli.Get(context.Background(), keys.Share("api", "a"))
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := m.shareEvent(context.Background(), v, &clientv3.Event{Type: mvccpb.PUT, Kv: own.Kvs[0]}); err != nil || changed {
		t.Fatalf("its own record's event, already read: changed %v, %v", changed, err)
	}
	if v.share.Share != 10 || v.share.Generation != 2 {
		t.Fatalf("after its own record's event: %+v", v.share)
	}
}

// TestUnmovedCommonRecordTakenFromTheEvent: a common record that says
// Unmoved (configd wrote nothing but pointers since the one before it)
// is taken from its watch event, with the instance's own record as it has
// it, without a read: the read of 2,000 instances at once took a retune
// past its boundary. One that does not say so is read with the own
// record in one snapshot.
func TestUnmovedCommonRecordTakenFromTheEvent(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	w := time.Second
	m, v, from := followingA(t, cli, cli, 40)
	common := func(gen, share int64, unmoved bool) *clientv3.Event {
		return putCommon(t, cli, gen, share, from, unmoved)
	}
	// Generation 2 says unmoved; etcd holds generation 3 by the time its
	// event is folded in: read, a would take 60.
	ev := common(2, 50, true)
	common(3, 60, false)
	if _, err := m.shareEvent(context.Background(), v, ev); err != nil {
		t.Fatal(err)
	}
	if v.share == nil || v.share.Share != 50 || v.share.Generation != 2 || !v.pointer {
		t.Fatalf("after generation 2's event: %+v (pointer %v), want the event's 50", v.share, v.pointer)
	}
	// a's own record, then a common record that does not say unmoved:
	// delivered first, it is read with the own record.
	put(t, cli, keys.Share("api", "a"), mustEncode(t, schema.ShareRecord{Version: 1, Provider: "api", Instance: "a", Generation: 4,
		EffectiveFrom: from, Window: schema.Duration(w), Total: 100, Share: 10, Granted: 60}))
	if _, err := m.shareEvent(context.Background(), v, common(4, 90, false)); err != nil {
		t.Fatal(err)
	}
	if v.share == nil || v.share.Share != 10 || v.pointer {
		t.Fatalf("after generation 4's event: %+v (pointer %v), want a's own record's 10, not the common 90", v.share, v.pointer)
	}
}
