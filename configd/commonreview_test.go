package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/configd/plan"
	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// newLeader is a publisher of provider name leading from the owner
// key it writes now (its fence: every record written before is a
// previous leader's).
func newLeader(t *testing.T, cli *clientv3.Client, name, replica string) *publisher {
	t.Helper()
	own, err := cli.Put(ctxT(t), keys.Owner(name), replica)
	if err != nil {
		t.Fatal(err)
	}
	return &publisher{
		cli: cli, keys: keys, log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(prometheus.NewRegistry()),
		margin: DefaultPropagationMargin, replica: replica, now: time.Now,
		providers: map[string]*providerState{}, malformed: map[string]string{}, dirty: map[string]bool{},
		history: map[string]int64{}, known: map[string]int{}, readAt: map[string]int64{},
		fences: map[string]fence{name: {key: keys.Owner(name), rev: own.Header.Revision}},
	}
}

// putAcked writes instance id's record of provider name, acknowledging
// generation gen, as a member of this release does (reads_common).
func putAcked(t *testing.T, cli *clientv3.Client, name, id string, gen int64) {
	t.Helper()
	now := time.Now().UTC()
	b, err := schema.Encode(schema.InstanceRecord{Version: schema.Version, ID: id, Started: now, Updated: now,
		AppliedGeneration: gen, ReadsCommon: true, Source: schema.SourceShares})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctxT(t), keys.Instance(name, id), string(b)); err != nil {
		t.Fatal(err)
	}
}

// leadFollowers creates provider name (limit 100) with instances a, b
// and c, and publishes as replica r1 their shares through the common
// record, one publish per share given (generations 1, 2, ...), each
// acknowledged by all three.
func leadFollowers(t *testing.T, cli *clientv3.Client, name string, shares ...int64) (schema.ProviderConfig, int64) {
	t.Helper()
	cfg, cfgRev := putLimit(t, cli, name, 100)
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		putAcked(t, cli, name, id, 0)
	}
	p1 := newLeader(t, cli, name, "r1")
	st1 := p1.state(name)
	st1.cfg, st1.cfgRev, st1.keyRev = &cfg, cfgRev, cfgRev
	for _, id := range ids {
		st1.instances[id] = schema.InstanceRecord{ID: id, ReadsCommon: true}
	}
	cond := clientv3.Compare(clientv3.ModRevision(keys.Config(name)), "=", cfgRev)
	for i, sh := range shares {
		gen := int64(i + 1)
		want := map[string]schema.ShareRecord{}
		for _, id := range ids {
			want[id] = shareOf(name, id, gen, sh, cfgRev)
		}
		if _, _, ok, err := p1.writeRecords(ctxT(t), p1.fences[name], name, st1, cond, want); err != nil || !ok {
			t.Fatalf("publish %d: %v %v", gen, err, ok)
		}
		for _, id := range ids {
			putAcked(t, cli, name, id, gen)
		}
	}
	return cfg, cfgRev
}

func putLimit(t *testing.T, cli *clientv3.Client, name string, limit int64) (schema.ProviderConfig, int64) {
	t.Helper()
	cfg := schema.ProviderConfig{Name: name, Limit: limit}.WithDefaults()
	b, _ := schema.Encode(cfg)
	put, err := cli.Put(ctxT(t), keys.Config(name), string(b))
	if err != nil {
		t.Fatal(err)
	}
	return cfg, put.Header.Revision
}

func shareOf(name, id string, gen, share int64, cfgRev int64) schema.ShareRecord {
	return schema.ShareRecord{Version: schema.Version, Provider: name, Instance: id, Generation: gen,
		EffectiveFrom: gen * int64(time.Second), Window: schema.Duration(time.Second), Total: 100,
		Share: share, Granted: share, ConfigRevision: cfgRev, Published: time.Unix(gen, 0).UTC(), Leader: "r1"}
}

// putKV writes key and returns it as etcd holds it (revision, version).
func putAndGet(t *testing.T, cli *clientv3.Client, key, val string) *mvccpb.KeyValue {
	t.Helper()
	if _, err := cli.Put(ctxT(t), key, val); err != nil {
		t.Fatal(err)
	}
	g, err := cli.Get(ctxT(t), key)
	if err != nil || len(g.Kvs) != 1 {
		t.Fatalf("get %s: %v", key, err)
	}
	return g.Kvs[0]
}

// TestForgedCommonRecordKeepsGrants: a record someone else writes while
// a replica leads counts as a grant beside the leader's own (foldShare,
// withGrantOf): the instance may still be enforcing what the leader gave
// it. For an instance's own record that holds; for the common record it
// does not when the records that point to it were written before this
// replica's term (any takeover): applyCommon passes the pointer's
// revision to foldShare, which then does not see the write as foreign and
// takes the forged record as the instance's, grant and all. A forged
// common record of share 0, in force from 2100, wipes every follower's
// grant from the books, and the next decision hands it all out at once.
func TestForgedCommonRecordKeepsGrants(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	for _, tc := range []struct {
		name      string
		readsComm bool
	}{{"own", false}, {"common", true}} {
		t.Run(tc.name, func(t *testing.T) {
			name := "forge-" + tc.name
			_, cfgRev := putLimit(t, cli, name, 100)
			ids := []string{"a", "b", "c"}
			// r1 leads and publishes 30 each (a common record if they read it).
			p1 := newLeader(t, cli, name, "r1")
			st1 := p1.state(name)
			cfg, _ := schema.DecodeProviderConfig(mustGet(t, cli, keys.Config(name)).Value)
			st1.cfg, st1.cfgRev, st1.keyRev = &cfg, cfgRev, cfgRev
			want := map[string]schema.ShareRecord{}
			for _, id := range ids {
				st1.instances[id] = schema.InstanceRecord{ID: id, ReadsCommon: tc.readsComm}
				want[id] = shareOf(name, id, 1, 30, cfgRev)
			}
			cond := clientv3.Compare(clientv3.ModRevision(keys.Config(name)), "=", cfgRev)
			if _, _, ok, err := p1.writeRecords(ctxT(t), p1.fences[name], name, st1, cond, want); err != nil || !ok {
				t.Fatalf("publish: %v %v", err, ok)
			}
			// r2 takes the provider over and reads it.
			p2 := newLeader(t, cli, name, "r2")
			if err := p2.readProvider(ctxT(t), name); err != nil {
				t.Fatal(err)
			}
			st := p2.providers[name]
			for _, id := range ids {
				if got := st.shares.enforcing(id); got != 30 {
					t.Fatalf("after takeover the books say %s may enforce %d, want 30", id, got)
				}
			}
			// Someone writes a record of nothing, in force far ahead.
			forged := shareOf(name, "a", 2, 0, cfgRev)
			forged.EffectiveFrom = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
			forged.Leader = "forger"
			key := keys.Share(name, "a")
			if tc.readsComm {
				forged.Instance, key = schema.CommonInstance, keys.CommonShare(name)
			}
			b, _ := schema.Encode(forged)
			p2.applyKV(mvccpb.PUT, putAndGet(t, cli, key, string(b)), false)
			// "a" applies the forged record only in 2100: until then it
			// admits its 30. The books must still count them.
			if got := st.shares.enforcing("a"); got < 30 {
				t.Errorf("the books say a may enforce %d after a forged record of 0 from 2100; it admits 30 until then", got)
			}
			// And the next decision (an instance joins) must neither take
			// the forged boundary as the fleet's (every later publish would
			// wait for 2100) nor hand out what a, b, c may still admit.
			now := time.Now()
			in := plan.Input{Total: 100, Window: time.Second, ConfigRevision: cfgRev, Margin: DefaultPropagationMargin,
				Target: map[string]int64{"a": 10, "b": 70, "c": 10, "d": 10}, Cur: st.shares.published(name, now.Add(-time.Minute)),
				Rewrite: st.shares.bad(), Now: now}
			d := plan.Decide(in)
			if !d.Publish {
				t.Fatalf("no publish: %+v", d)
			}
			if d.EffectiveFrom.Year() >= 2100 {
				t.Errorf("the next publish takes effect at %v: the forged boundary holds the provider back", d.EffectiveFrom)
			}
			if d.Shares["b"]+30+30 > 100 {
				t.Errorf("the next decision gives b %d from %v while a and c may still admit 30 each until they acknowledge: %d in a window of 100",
					d.Shares["b"], d.EffectiveFrom, d.Shares["b"]+60)
			}
		})
	}
}

func mustGet(t *testing.T, cli *clientv3.Client, key string) *mvccpb.KeyValue {
	t.Helper()
	g, err := cli.Get(ctxT(t), key)
	if err != nil || len(g.Kvs) != 1 {
		t.Fatalf("get %s: %v", key, err)
	}
	return g.Kvs[0]
}

// ambiguousKV fails, once armed, the first transaction that puts a
// record that says Common (or, with match, one match picks) — after etcd
// applied it (a deadline that expired on the way back, a connection cut
// after the commit).
type ambiguousKV struct {
	clientv3.KV
	armed bool
	match func(op clientv3.Op) bool // nil: a put of a record that says Common
}

func (k *ambiguousKV) Txn(ctx context.Context) clientv3.Txn {
	return &ambiguousTxn{Txn: k.KV.Txn(ctx), kv: k}
}

type ambiguousTxn struct {
	clientv3.Txn
	kv  *ambiguousKV
	ops []clientv3.Op
}

func (t *ambiguousTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *ambiguousTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.ops = append(t.ops, ops...)
	t.Txn = t.Txn.Then(ops...)
	return t
}
func (t *ambiguousTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }
func (t *ambiguousTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err == nil && t.kv.armed {
		for _, op := range t.ops {
			if t.kv.match != nil && t.kv.match(op) || t.kv.match == nil && op.IsPut() && strings.Contains(string(op.ValueBytes()), `"common":true`) {
				t.kv.armed = false
				return nil, context.DeadlineExceeded
			}
		}
	}
	return resp, err
}

// leadABCX makes a leader of provider name (its config at cfgRev) with
// live instances a, b, c and x, each with rec as its record, and returns
// the provider's state and a function that publishes shares as
// generation gen through writeRecords ("refused": the config changed).
func leadABCX(t *testing.T, cli *clientv3.Client, name string, cfgRev int64, rec schema.InstanceRecord) (*providerState, func(gen int64, shares map[string]int64) error) {
	t.Helper()
	p := newLeader(t, cli, name, "r1")
	st := p.state(name)
	cfg, _ := schema.DecodeProviderConfig(mustGet(t, cli, keys.Config(name)).Value)
	st.cfg, st.cfgRev, st.keyRev = &cfg, cfgRev, cfgRev
	for _, id := range []string{"a", "b", "c", "x"} {
		rec.ID = id
		st.instances[id] = rec
	}
	f := p.fences[name]
	cond := clientv3.Compare(clientv3.ModRevision(keys.Config(name)), "=", cfgRev)
	publish := func(gen int64, shares map[string]int64) error {
		want := map[string]schema.ShareRecord{}
		for id, sh := range shares {
			want[id] = shareOf(name, id, gen, sh, cfgRev)
		}
		_, _, ok, err := p.writeRecords(ctxT(t), f, name, st, cond, want)
		if err == nil && !ok {
			err = errors.New("refused")
		}
		return err
	}
	return st, publish
}

// TestPointerWriteOfUnknownOutcome: a transaction of step 3 that etcd
// applied but whose answer was lost leaves a record that says Common in
// etcd and the instance's old own record in the books. The next publish
// (decided before the echo comes back: the watch of a loaded etcd lags
// like its answers) leaves the instance's "unchanged" own record alone,
// and writes a new common record for the others — which the instance
// then follows. The books say 10; it admits 30.
func TestPointerWriteOfUnknownOutcome(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	amb := &ambiguousKV{KV: cli.KV}
	cli.KV = amb
	name := "ambiguous"
	_, cfgRev := putLimit(t, cli, name, 100)
	st, publish := leadABCX(t, cli, name, cfgRev, schema.InstanceRecord{ReadsCommon: true})
	// Generation 1: a, b, c follow a common record of 30; x has 10 of its own.
	if err := publish(1, map[string]int64{"a": 30, "b": 30, "c": 30, "x": 10}); err != nil {
		t.Fatal(err)
	}
	// Generation 2: all 25 alike; x joins the common record, and the
	// answer to its pointer's write is lost.
	amb.armed = true
	if err := publish(2, map[string]int64{"a": 25, "b": 25, "c": 25, "x": 25}); err == nil {
		t.Fatal("the injected failure did not happen")
	}
	// Generation 3: x back to 10 (what the books say it has), the others 30.
	if err := publish(3, map[string]int64{"a": 30, "b": 30, "c": 30, "x": 10}); err != nil {
		t.Fatal(err)
	}
	after, _, err := layoutRead(ctxT(t), cli, name)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, id := range []string{"a", "b", "c", "x"} {
		got := after.resolved[id].rec
		sum += got.Share
		if books := st.shares.records[id].rec; got.Share != books.Share {
			t.Errorf("%s resolves in etcd to share %d (generation %d), the books say %d (generation %d)",
				id, got.Share, got.Generation, books.Share, books.Generation)
		}
	}
	if sum > 100 {
		t.Errorf("the records in etcd add up to %d, over the limit of 100", sum)
	}
}

// TestTakeoverWithoutTheCommonRecord: the common record goes (a hand edit,
// or it no longer decodes) while instances follow it. Each instance keeps
// its last good record (limiter/cluster observeShare: Resolve fails, the
// problem is listed, the share stays). The replica leading keeps its
// books too (applyCommon). A replica that takes the provider over then
// has no record at all for them: every follower counts as enforcing
// nothing, and the first decision hands out all they still admit.
func TestTakeoverWithoutTheCommonRecord(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	for _, tc := range []struct{ name, val string }{{"deleted", ""}, {"malformed", "{not json"}} {
		t.Run(tc.name, func(t *testing.T) {
			name := "gone-common-" + tc.name
			_, cfgRev := putLimit(t, cli, name, 100)
			p1 := newLeader(t, cli, name, "r1")
			st1 := p1.state(name)
			cfg, _ := schema.DecodeProviderConfig(mustGet(t, cli, keys.Config(name)).Value)
			st1.cfg, st1.cfgRev, st1.keyRev = &cfg, cfgRev, cfgRev
			want := map[string]schema.ShareRecord{}
			for _, id := range []string{"a", "b", "c"} {
				st1.instances[id] = schema.InstanceRecord{ID: id, ReadsCommon: true}
				want[id] = shareOf(name, id, 1, 30, cfgRev)
			}
			cond := clientv3.Compare(clientv3.ModRevision(keys.Config(name)), "=", cfgRev)
			if _, _, ok, err := p1.writeRecords(ctxT(t), p1.fences[name], name, st1, cond, want); err != nil || !ok {
				t.Fatalf("publish: %v %v", err, ok)
			}
			var err error
			if tc.val == "" {
				_, err = cli.Delete(ctxT(t), keys.CommonShare(name))
			} else {
				_, err = cli.Put(ctxT(t), keys.CommonShare(name), tc.val)
			}
			if err != nil {
				t.Fatal(err)
			}
			p2 := newLeader(t, cli, name, "r2")
			if err := p2.readProvider(ctxT(t), name); err != nil {
				t.Fatal(err)
			}
			st := p2.providers[name]
			for _, id := range []string{"a", "b", "c"} {
				if got := st.shares.enforcing(id); got < 30 {
					t.Errorf("after takeover the books say %s may enforce %d; it keeps its last good record, 30", id, got)
				}
			}
			now := time.Now()
			target := map[string]int64{"a": 10, "b": 80, "c": 10}
			st.shares.holdUnknown(target, map[string]schema.InstanceRecord{"a": {ID: "a", AppliedGeneration: 1}, "b": {ID: "b", AppliedGeneration: 1}, "c": {ID: "c", AppliedGeneration: 1}})
			d := plan.Decide(plan.Input{Total: 100, Window: time.Second, ConfigRevision: cfgRev, Margin: DefaultPropagationMargin,
				Target: target, Cur: st.shares.published(name, now.Add(-time.Minute)),
				Rewrite: st.shares.bad(), Now: now})
			if d.Publish && d.Shares["b"]+30+30 > 100 {
				t.Errorf("the first decision gives b %d while a and c may still admit 30 each: %d in a window of 100", d.Shares["b"], d.Shares["b"]+60)
			}
		})
	}
}
