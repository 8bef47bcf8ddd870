package main

import (
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// owners reads every provider's owner key: provider → replica ID and
// create revision.
func owners(t *testing.T, cli *clientv3.Client) map[string]ownerKey {
	t.Helper()
	resp, err := cli.Get(ctxT(t), keys.Owners(), withPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]ownerKey{}
	for _, kv := range resp.Kvs {
		out[strings.TrimPrefix(string(kv.Key), keys.Owners())] = ownerKey{replica: string(kv.Value), lease: kv.Lease, rev: kv.CreateRevision}
	}
	return out
}

// settled reports whether every provider of names has an owner among ids
// and each leads its fair share (rounded down or up); with byOwner, also
// whether each provider's shares were last published by its owner (a
// replica that takes a provider over writes only what it changes).
func settled(t *testing.T, cli *clientv3.Client, names []string, ids []string, byOwner bool) (map[string]ownerKey, string) {
	t.Helper()
	own := owners(t, cli)
	count := map[string]int{}
	for _, name := range names {
		o, ok := own[name]
		if !ok {
			return nil, name + " has no owner"
		}
		count[o.replica]++
		sh, ok := readShares(t, cli, name)
		if !ok || byOwner && sh.Leader != o.replica {
			return nil, fmt.Sprintf("%s led by %s, last published by %q", name, o.replica, sh.Leader)
		}
	}
	lo, hi := len(names)/len(ids), (len(names)+len(ids)-1)/len(ids)
	for _, id := range ids {
		if count[id] < lo || count[id] > hi {
			return nil, fmt.Sprintf("leads per replica %v, fair share [%d, %d]", count, lo, hi)
		}
	}
	if len(own) != len(names) {
		return nil, fmt.Sprintf("%d owner keys for %d providers", len(own), len(names))
	}
	return own, ""
}

// TestProvidersSpreadOverReplicas: three replicas lead nine providers,
// three each, each publishing only its own; a fourth replica takes
// providers from the others to itself and nothing else moves; a replica
// that stops gives up only its providers.
func TestProvidersSpreadOverReplicas(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	reps := map[string]*replica{}
	for _, id := range []string{"r1", "r2", "r3"} {
		reps[id] = startReplica(t, srv, id)
	}
	var names []string
	for i := range 9 {
		name := fmt.Sprintf("api-%d", i)
		names = append(names, name)
		cliOK(t, "set", name, "--coordination", "shares", "--limit", "90", "--server", reps["r1"].url())
		addInstance(t, cli, name, "i-1")
	}
	wait := func(what string, byOwner bool, ids ...string) map[string]ownerKey {
		t.Helper()
		var own map[string]ownerKey
		var why string
		waitFor(t, 20*time.Second, what, func() bool {
			own, why = settled(t, cli, names, ids, byOwner)
			return why == ""
		})
		if own == nil {
			t.Fatalf("%s: %s", what, why)
		}
		return own
	}
	before := wait("nine providers led three per replica", true, "r1", "r2", "r3")
	if out := cliOK(t, "status", "api-0", "--server", reps["r3"].url()); !strings.Contains(out, "led by:    "+before["api-0"].replica+" ") {
		t.Errorf("status does not say api-0 is led by %s:\n%s", before["api-0"].replica, out)
	}

	reps["r4"] = startReplica(t, srv, "r4")
	after := wait("a fourth replica to take its share", false, "r1", "r2", "r3", "r4")
	for name, o := range after {
		if b := before[name]; o.rev != b.rev && o.replica != "r4" {
			t.Errorf("%s moved from %s to %s, not to the new replica", name, b.replica, o.replica)
		}
	}
	if got := metricLed(t, reps["r4"]); got == "0" {
		t.Errorf("r4 reports configd_providers_led %s", got)
	}

	if err := reps["r2"].stop(); err != nil {
		t.Fatal(err)
	}
	before = maps.Clone(after)
	after = wait("r2's providers to go to the others", false, "r1", "r3", "r4")
	for name, o := range after {
		if b := before[name]; b.replica != "r2" && o.rev != b.rev {
			t.Errorf("%s moved from %s to %s though only r2 stopped", name, b.replica, o.replica)
		}
	}
}

// metricLed reads configd_providers_led from r's metrics.
func metricLed(t *testing.T, r *replica) string {
	t.Helper()
	return r.metricValue(t, "configd_providers_led")
}

// TestForeignOwnerKeyRemoved: an owner key on no live replica's session
// (leaseless here, written by hand) would keep every replica from leading
// the provider; the replica that would lead it removes it, says so, and
// leads the provider.
func TestForeignOwnerKeyRemoved(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	putKV(t, cli, keys.Owner("pay"), "r9")
	r := startReplica(t, srv, "r1")
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", "10", "--server", r.url())
	addInstance(t, cli, "pay", "i-1")
	waitShares(t, cli, "pay", "r1 to lead pay and publish", func(s schema.Shares) bool { return s.Leader == "r1" && s.Total == 10 })
	if o := owners(t, cli)["pay"]; o.replica != "r1" || o.lease == 0 {
		t.Errorf("pay's owner key: %+v, want r1's on its lease", o)
	}
	if !strings.Contains(r.log.String(), `msg="owner key on no live replica's session; removing it"`) || !strings.Contains(r.log.String(), `provider=pay key=`+keys.Owner("pay")) {
		t.Errorf("the removal was not logged:\n%s", r.log.String())
	}
}
