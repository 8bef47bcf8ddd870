package main

import (
	"testing"

	"github.com/sluice-go/sluice/internal/etcdtest"
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
	leadFollowers(t, cli, name, 30)
	putInst := func(id string, gen int64) { putAcked(t, cli, name, id, gen) }
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
	p2 := newLeader(t, cli, name, "r2")
	if err := p2.readProvider(ctxT(t), name); err != nil {
		t.Fatal(err)
	}
	st := p2.providers[name]
	f := p2.fences[name]
	if err := p2.publish(ctxT(t), f, name, st); err != nil {
		t.Fatal(err)
	}
	// The operator fixes the config; r2 sees it through its watch.
	_, _ = putLimit(t, cli, name, 100)
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
