package faults

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/schema"
)

// outage is how long etcd stays down, counted from the start of its stop;
// outageFailStatic is the provider's fail_static in that scenario: long
// enough to ride the outage out, and the instances' re-registration after.
const (
	outage           = 30 * time.Second
	outageFailStatic = 40 * time.Second
)

// leases returns each instance key's lease, read from etcd.
func leases(r *rig) (map[string]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := r.cli.Get(ctx, schema.DefaultKeys().Instances(r.provider), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, kv := range resp.Kvs {
		k, err := schema.DefaultKeys().Parse(string(kv.Key))
		if err == nil {
			out[k.Instance] = kv.Lease
		}
	}
	return out, nil
}

// TestEtcdOutage: every member of a three-member etcd cluster (embedded)
// is stopped for 30 s under load, then all are restarted on their data
// dirs. While it is down the instances
// must keep admitting at their last share (fail-static, and say so: the
// provider's fail_static, 40 s, covers the outage); when it
// is back they register again with new leases, configd is elected again, and
// the split is the even one; no aligned window may go over the limit.
func TestEtcdOutage(t *testing.T) {
	r, cl := newClusterRig(t, "fault-etcd")
	c := startConfigd(t, r.endpoint, "cd-a")
	c.cli(t, "set", r.provider, "--coordination", "shares", "--limit", fmt.Sprint(limit), "--algorithm", "even", "--fail-static", outageFailStatic.String())
	insts := r.startInstances(t, 3)
	before := r.settleEven(t, insts...)
	if _, _, err := c.errs.wait(0, 10*time.Second, func(s string) bool { return strings.Contains(s, `msg="became leader"`) }); err != nil {
		t.Fatal(err)
	}
	old, err := leases(r)
	if err != nil {
		t.Fatal(err)
	}
	from := startLoad(insts...)
	waitUntil(time.Unix(0, (from+2)*int64(window)))

	errsFrom := make([]int, len(insts))
	for i, in := range insts {
		errsFrom[i] = in.errs.len()
	}
	down := time.Now()
	cl.Stop()
	stopped := time.Now()
	t.Logf("injected: all 3 etcd members stopped at %s (Stop took %v: graceful, clients get no answers meanwhile), for %v from the start of the stop",
		down.UTC().Format("15:04:05.000"), stopped.Sub(down).Round(time.Millisecond), outage)

	// Fail-static: each instance says it keeps its share, and keeps it.
	for i, in := range insts {
		l, _, err := in.errs.wait(errsFrom[i], outage, func(s string) bool { return strings.Contains(s, "fail-static") })
		if err != nil {
			t.Errorf("%s did not report fail-static while etcd was down: %v", in.id, err)
			continue
		}
		t.Logf("%s says: %s", in.id, l)
	}
	waitUntil(down.Add(outage - 2*time.Second))
	for _, in := range insts {
		st := in.stats(t)
		if st["share"] != fmt.Sprint(before.Shares[in.id]) {
			t.Errorf("%s: share %s during the outage, want its last share %d (fail-static)", in.id, st["share"], before.Shares[in.id])
		}
	}
	waitUntil(down.Add(outage))
	cl.Restart()
	up := time.Now()
	t.Logf("injected: all 3 etcd members restarted on their data dirs after %v down (a quorum back, a leader elected)", up.Sub(down).Round(time.Millisecond))

	// Every instance registers again (a new lease), configd leads again.
	var reg time.Time
	deadline := time.Now().Add(30 * time.Second)
	for {
		cur, err := leases(r)
		n := 0
		for id, l := range cur {
			if l != old[id] {
				n++
			}
		}
		if err == nil && n == len(insts) {
			reg = time.Now()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("instances not registered again within 30s: leases %v (before the outage %v), err %v", cur, old, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ll, _, err := c.errs.wait(0, 30*time.Second, func() func(string) bool {
		n := 0
		return func(s string) bool {
			if strings.Contains(s, `msg="became leader"`) {
				n++
			}
			return n == 2
		}
	}())
	if err != nil {
		t.Fatalf("configd not elected again after the outage: %v", err)
	}
	elected, err := time.Parse(time.RFC3339Nano, fields(ll)["time"]) // slog's text handler
	if err != nil {
		t.Fatalf("configd's line has no time: %q", ll)
	}
	after := r.settleEven(t, insts...)
	settled := time.Now()
	waitUntil(settled.Add(2 * window))
	to := stopLoad(insts...)
	logPhases(t, insts...)

	evs := r.published(t)
	checkApplied(t, evs, insts...)
	tl := checkWindows(t, r, "whole run, outage included", from, to)
	for k := windowIndex(up) - 2; k <= windowIndex(settled); k++ {
		t.Logf("around the restart: %s", tl.row(k))
	}
	// Fail-static: the windows entirely inside the outage still admit.
	var sum, n int64
	for k := windowIndex(down) + 1; k < windowIndex(up); k++ {
		sum += tl.arrived[k-tl.first]
		n++
	}
	t.Logf("invariant: fail-static: %d windows entirely inside the outage received %.1f calls on average (%.1f%% of the limit): %s",
		n, float64(sum)/float64(n), 100*float64(sum)/float64(n*limit), tl.series(windowIndex(down)+1, windowIndex(up)-1))
	if sum < n*limit/2 {
		t.Errorf("instances did not keep admitting at their shares while etcd was down: %d calls in %d windows", sum, n)
	}
	t.Logf("recovery after the restart: every instance registered again (new leases) in %v, configd leader again in %v, even split in force (gen %d) and applied by all in %v",
		reg.Sub(up).Round(time.Millisecond), elected.Sub(up).Round(time.Millisecond), after.Generation, settled.Sub(up).Round(time.Millisecond))
}
