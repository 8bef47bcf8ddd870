package faults

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/netcut"
)

// cutFor is how long the instance stays cut off from etcd.
const cutFor = 8 * time.Second

// cutMethod is one way of cutting inst-1 off from etcd while it keeps
// reaching the provider.
type cutMethod struct {
	name, how string
	launch    func() *instance // starts inst-1 and waits until it joined
	cut, heal func() error
}

// TestInstanceCutOffFromEtcd: one instance is cut off from etcd for 8 s
// while it keeps serving, by each method this machine has: "netns" puts it
// in a network namespace whose veth link to etcd goes down (root and ip
// needed; packets vanish, as in a real partition), "proxy" puts a TCP proxy
// in the test between it and etcd that drops its connections and closes
// new ones as they come. It must keep its share (fail-static) and say so, the others
// keep theirs, no aligned window may go over the limit, and once it can
// reach etcd again it registers again.
func TestInstanceCutOffFromEtcd(t *testing.T) {
	t.Run("netns", func(t *testing.T) {
		ns, err := netcut.NewNamespaces(t)
		if err != nil {
			t.Skipf("method netns: not here (%v); the proxy subtest cuts instead", err)
		}
		r := newRig(t, "fault-partition-netns")
		ctl, err := ns.Link()
		if err != nil {
			t.Fatal(err)
		}
		data, err := ns.Link()
		if err != nil {
			t.Fatal(err)
		}
		etcdAddr, err := ctl.Forward(t, hostPort(t, r.endpoint))
		if err != nil {
			t.Fatal(err)
		}
		stubAddr, err := data.Forward(t, hostPort(t, r.stub.url()))
		if err != nil {
			t.Fatal(err)
		}
		partition(t, r, cutMethod{
			name: "netns",
			how: fmt.Sprintf("inst-1 runs in network namespace %s and reaches etcd only over a veth link (etcd via %s); "+
				"the link goes down, so packets vanish (no resets, requests time out); its calls to the provider "+
				"go over a second link (%s) that stays up", ns.Inside(), etcdAddr, stubAddr),
			launch: func() *instance {
				return launchInstanceIn(t, ns, "http://"+etcdAddr, r.provider, "http://"+stubAddr+"/call", 1).joined(t)
			},
			cut:  ctl.Cut,
			heal: ctl.Heal,
		})
	})
	t.Run("proxy", func(t *testing.T) {
		r := newRig(t, "fault-partition-proxy")
		px := netcut.StartProxy(t, hostPort(t, r.endpoint))
		partition(t, r, cutMethod{
			name: "proxy",
			how: "a TCP proxy in the test between inst-1 and etcd drops its connections and closes new ones as they come " +
				"(inst-1 sees resets at once); inst-1 reaches the provider directly",
			launch: func() *instance { return startInstance(t, px.URL(), r.provider, r.stub.url(), 1) },
			cut:    func() error { px.Cut(); return nil },
			heal:   func() error { px.Heal(); return nil },
		})
	})
}

// hostPort returns the host:port of a URL.
func hostPort(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// partition runs the scenario with inst-1 cut off by m; configd, inst-2
// and inst-3 reach etcd directly.
func partition(t *testing.T, r *rig, m cutMethod) {
	c := startConfigd(t, r.endpoint, "cd-a")
	c.cli(t, "set", r.provider, "--coordination", "shares", "--limit", fmt.Sprint(limit), "--algorithm", "even")
	i1 := m.launch()
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
	if err := m.cut(); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	t.Logf("injected: inst-1 cut off from etcd for %v — method: %s: %s; inst-1 keeps serving; configd, inst-2 and inst-3 reach etcd directly", cutFor, m.name, m.how)
	l, _, err := i1.errs.wait(errsFrom, cutFor, func(s string) bool { return strings.Contains(s, "fail-static") })
	if err != nil {
		t.Errorf("inst-1 did not report fail-static while cut off: %v", err)
	} else {
		t.Logf("inst-1 says: %s", l)
	}
	gone, goneErr := r.w.waitDeleted("inst-1", cutFor-time.Since(cut))
	if goneErr == nil {
		t.Logf("inst-1's key deleted %v after the cut (lease TTL %v)", gone.Sub(cut).Round(time.Millisecond), leaseTTL)
	}
	waitUntil(cut.Add(cutFor - time.Second))
	for _, in := range insts {
		st := in.stats(t)
		t.Logf("during the partition: %s share %s (%s, gen %s)", in.id, st["share"], st["source"], st["gen"])
		if in == i1 && st["share"] != fmt.Sprint(before.Shares["inst-1"]) {
			t.Errorf("inst-1: share %s while cut off, want its last share %d (fail-static)", st["share"], before.Shares["inst-1"])
		}
	}
	waitUntil(cut.Add(cutFor))
	if err := m.heal(); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	t.Logf("injected: %s: inst-1 reaches etcd again after %v", m.name, healed.Sub(cut).Round(time.Millisecond))

	var reg time.Time
	deadline := time.Now().Add(30 * time.Second)
	for {
		cur, err := leases(r)
		if l, ok := cur["inst-1"]; err == nil && ok && l != old["inst-1"] {
			reg = time.Now()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("inst-1 not registered again within 30s after the cut healed: leases %v, err %v", cur, err)
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
	t.Logf("recovery: inst-1 registered again (new lease) %v after the cut healed (%s); even split in force (gen %d) %v after",
		reg.Sub(healed).Round(time.Millisecond), m.name, back.Generation, back.EffectiveTime().Sub(healed).Round(time.Millisecond))
}
