package main

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestTakeoverWithoutCommonRecordNorConfig: as
// TestTakeoverWithoutTheCommonRecord, but the config does not decode
// either when r2 takes over (a hand edit). unknownGrant needs a config,
// so a, b, c get no record in r2's books at all; once the config is
// fixed, r2 counts them at 0 and grows the newcomer d into their room
// while they still admit 30 each.
func TestTakeoverWithoutCommonRecordNorConfig(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	name := "gone-common-cfg"
	cfg, cfgRev := reviewConfig(t, cli, name, 100)
	ids := []string{"a", "b", "c"}
	putInst := func(id string, gen int64) {
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
	for _, id := range ids {
		putInst(id, 0)
	}
	p1 := reviewPublisher(t, cli, name, "r1")
	st1 := p1.state(name)
	st1.cfg, st1.cfgRev, st1.keyRev = &cfg, cfgRev, cfgRev
	want := map[string]schema.ShareRecord{}
	for _, id := range ids {
		st1.instances[id] = schema.InstanceRecord{ID: id, ReadsCommon: true}
		want[id] = reviewRec(name, id, 1, 30, cfgRev)
	}
	cond := clientv3.Compare(clientv3.ModRevision(keys.Config(name)), "=", cfgRev)
	if _, _, ok, err := p1.writeRecords(ctxT(t), p1.fences[name], name, st1, cond, want); err != nil || !ok {
		t.Fatalf("publish: %v %v", err, ok)
	}
	for _, id := range ids {
		putInst(id, 1)
	}
	if _, err := cli.Delete(ctxT(t), keys.CommonShare(name)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctxT(t), keys.Config(name), "{not json"); err != nil {
		t.Fatal(err)
	}
	putInst("d", 0)
	if _, err := cli.Delete(ctxT(t), keys.Owner(name)); err != nil {
		t.Fatal(err)
	}
	p2 := reviewPublisher(t, cli, name, "r2")
	if err := p2.readProvider(ctxT(t), name); err != nil {
		t.Fatal(err)
	}
	st := p2.providers[name]
	f := p2.fences[name]
	if err := p2.publish(ctxT(t), f, name, st); err != nil {
		t.Fatal(err)
	}
	// The operator fixes the config; r2 sees it through its watch.
	_, _ = reviewConfig(t, cli, name, 100)
	p2.applyKV(0, mustGet(t, cli, keys.Config(name)), false)
	if err := p2.publish(ctxT(t), f, name, st); err != nil {
		t.Fatal(err)
	}
	v := st.shares.view(name)
	t.Logf("gen %d shares %v granted %v", v.Generation, v.Shares, v.Granted)
	if got := v.Shares["d"]; got+90 > 100 {
		t.Errorf("r2 gives d %d while a, b, c may admit 30 each until they read r2's records: %d of 100", got, got+90)
	}
}
