package faults

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
)

// partition is how long the instance stays cut off from etcd.
const partition = 8 * time.Second

// TestInstanceCutOffFromEtcd: one instance reaches etcd through a TCP proxy
// in the test (method: proxy — no network namespaces); the proxy drops its
// connections and refuses new ones for 8 s while the instance keeps
// serving. It must keep its share (fail-static) and say so, the others keep
// theirs, no aligned window may go over the limit, and once the proxy lets
// it through again it registers again.
func TestInstanceCutOffFromEtcd(t *testing.T) {
	r := newRig(t, "fault-partition")
	u, err := url.Parse(r.endpoint)
	if err != nil {
		t.Fatal(err)
	}
	px := etcdtest.StartProxy(t, u.Host)
	c := startConfigd(t, r.endpoint, "cd-a")
	c.cli(t, "set", r.provider, "--limit", fmt.Sprint(limit), "--algorithm", "even")
	i1 := startInstance(t, px.URL(), r.provider, r.stub.url(), 1)
	i2 := startInstance(t, r.endpoint, r.provider, r.stub.url(), 2)
	i3 := startInstance(t, r.endpoint, r.provider, r.stub.url(), 3)
	insts := []*instance{i1, i2, i3}
	before := r.settleEven(t, insts...)
	old, err := leases(r)
	if err != nil {
		t.Fatal(err)
	}
	from := startLoad(insts...)
	waitUntil(time.Unix(0, (from+2)*int64(window)).Add(100 * time.Millisecond))

	errsFrom := i1.errs.len()
	px.Cut()
	cut := time.Now()
	t.Logf("injected: inst-1 cut off from etcd for %v — method: a TCP proxy in the test between inst-1 and etcd drops its connections and refuses new ones (no network namespaces); inst-1 keeps serving; configd, inst-2 and inst-3 reach etcd directly", partition)
	l, _, err := i1.errs.wait(errsFrom, partition, func(s string) bool { return strings.Contains(s, "fail-static") })
	if err != nil {
		t.Errorf("inst-1 did not report fail-static while cut off: %v", err)
	} else {
		t.Logf("inst-1 says: %s", l)
	}
	gone, goneErr := r.w.waitDeleted("inst-1", partition-time.Since(cut))
	if goneErr == nil {
		t.Logf("inst-1's key deleted %v after the cut (lease TTL %v)", gone.Sub(cut).Round(time.Millisecond), leaseTTL)
	}
	waitUntil(cut.Add(partition - time.Second))
	for _, in := range insts {
		st := in.stats(t)
		t.Logf("during the partition: %s share %s (%s, gen %s)", in.id, st["share"], st["source"], st["gen"])
		if in == i1 && st["share"] != fmt.Sprint(before.Shares["inst-1"]) {
			t.Errorf("inst-1: share %s while cut off, want its last share %d (fail-static)", st["share"], before.Shares["inst-1"])
		}
	}
	waitUntil(cut.Add(partition))
	px.Heal()
	healed := time.Now()
	t.Logf("injected: proxy lets inst-1 through again after %v", healed.Sub(cut).Round(time.Millisecond))

	var reg time.Time
	deadline := time.Now().Add(30 * time.Second)
	for {
		cur, err := leases(r)
		if l, ok := cur["inst-1"]; err == nil && ok && l != old["inst-1"] {
			reg = time.Now()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("inst-1 not registered again within 30s after the proxy healed: leases %v, err %v", cur, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	back := r.settleEven(t, insts...)
	waitUntil(back.EffectiveTime().Add(2 * window))
	to := stopLoad(insts...)
	logPhases(t, insts...)

	evs := r.published(t)
	checkApplied(t, evs, insts...)
	tl := checkWindows(t, r, "whole run, partition included", from, to)
	for k := windowIndex(cut); k <= windowIndex(healed)+1; k++ {
		t.Logf("during the partition: %s", tl.row(k))
	}
	t.Logf("recovery: inst-1 registered again (new lease) %v after the proxy healed; even split in force (gen %d) %v after",
		reg.Sub(healed).Round(time.Millisecond), back.Generation, back.EffectiveTime().Sub(healed).Round(time.Millisecond))
}
