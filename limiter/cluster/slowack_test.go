package cluster

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// timeoutKV fails the next write of key, once armed, as etcd does when it
// does not answer in time: the request is not sent. With then, it arms
// that lease to fail its next renewal.
type timeoutKV struct {
	clientv3.KV
	key   string
	armed atomic.Bool
	then  *stuckLease
}

func (k *timeoutKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	if op.IsPut() && string(op.KeyBytes()) == k.key && k.armed.CompareAndSwap(true, false) {
		if k.then != nil {
			k.then.armed.Store(true)
		}
		return clientv3.OpResponse{}, context.DeadlineExceeded
	}
	return k.KV.Do(ctx, op)
}

// stuckLease fails the next lease renewal once armed, as etcd does when
// it does not answer.
type stuckLease struct {
	clientv3.Lease
	armed atomic.Bool
}

func (l *stuckLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	if l.armed.CompareAndSwap(true, false) {
		return nil, context.DeadlineExceeded
	}
	return l.Lease.KeepAliveOnce(ctx, id)
}

// TestSlowAcknowledgementKeepsTheSession: an acknowledgement that etcd
// does not take in time is written again at the next report, in the same
// session. Ending the session re-registered every instance at once when
// etcd was slow (bench/scale at 2,000 instances: 1,400 timed out together,
// each re-registered on a new lease and read everything again).
func TestSlowAcknowledgementKeepsTheSession(t *testing.T) {
	for _, renews := range []bool{true, false} {
		t.Run(fmt.Sprintf("renews=%v", renews), func(t *testing.T) { slowAcknowledgement(t, renews) })
	}
}

// slowAcknowledgement has etcd not take an acknowledgement in time, and
// renew the lease or not: the session goes on only if it does.
func slowAcknowledgement(t *testing.T, renews bool) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	mcli := srv.Client(t)
	kv := &timeoutKV{KV: mcli.KV, key: keys.Instance("api", "a")}
	mcli.KV = kv
	lease := &stuckLease{Lease: mcli.Lease}
	mcli.Lease = lease
	w := 100 * time.Millisecond
	putConfig(t, cli, schema.ProviderConfig{Name: "api", Limit: 100, Window: schema.Duration(w)})
	liveLeader(t, cli)
	a := join(t, mcli, "api", "a", WithLeaseTTL(5*time.Second))
	next := func() int64 { return (time.Now().UnixNano()/int64(w) + 2) * int64(w) }
	acked := func(gen int64) (clientv3.LeaseID, bool) {
		resp, err := cli.Get(context.Background(), keys.Instance("api", "a"))
		if err != nil || len(resp.Kvs) == 0 {
			return 0, false
		}
		r, err := schema.DecodeInstanceRecord(resp.Kvs[0].Value)
		return clientv3.LeaseID(resp.Kvs[0].Lease), err == nil && r.AppliedGeneration == gen
	}
	commonRecords(t, cli, w, 1, 40, next(), "a")
	enforcing(t, a, 40)
	waitFor(t, "a's acknowledgement of generation 1", func() bool { _, ok := acked(1); return ok })
	first, _ := acked(1)
	if !renews {
		kv.then = lease // the renewal right after the write fails too
	}
	kv.armed.Store(true)
	commonRecords(t, cli, w, 2, 50, next())
	enforcing(t, a, 50)
	waitFor(t, "a's acknowledgement of generation 2", func() bool { _, ok := acked(2); return ok })
	if kv.armed.Load() {
		t.Fatal("the acknowledgement's write never failed")
	}
	switch now, _ := acked(2); {
	case renews && now != first:
		t.Errorf("the instance key moved from lease %x to %x: the session ended on a slow write while etcd renewed the lease", first, now)
	case !renews && now == first:
		t.Errorf("the instance key stayed on lease %x: the session went on over a slow write while etcd renewed nothing", first)
	}
}
