package faults

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/schema"
)

// startLoad makes every instance offer load and returns the first window
// fully under load.
func startLoad(insts ...*instance) int64 {
	for _, in := range insts {
		in.load(offered)
	}
	return windowIndex(time.Now()) + 1
}

// stopLoad stops every instance's load, waits until the calls in flight
// have arrived (the next boundary plus a margin), and returns the last
// window under load.
func stopLoad(insts ...*instance) int64 {
	for _, in := range insts {
		if !in.exited() {
			in.load(0)
		}
	}
	last := windowIndex(time.Now())
	waitUntil(time.Unix(0, (last+1)*int64(window)).Add(300 * time.Millisecond))
	return last
}

// logPhases logs each running instance's counts of its load phases:
// offered/admitted/refused/other/callerr/overload (see
// bench/accuracy/instance).
func logPhases(t *testing.T, insts ...*instance) {
	t.Helper()
	for _, in := range insts {
		if !in.exited() {
			st := in.stats(t)
			t.Logf("%s: share %s (%s, gen %s); load phases offered/admitted/refused/other/callerr/overload: %s",
				in.id, st["share"], st["source"], st["gen"], st["phases"])
		}
	}
}

// checkWindows logs the calls per aligned window in [from, to] and fails
// the test for every window in which more than the limit were granted. It
// returns the tally.
func checkWindows(t *testing.T, r *rig, name string, from, to int64) tally {
	t.Helper()
	tl := count(r.stub.calls(), from, to)
	logWindows(t, tl, name)
	for _, k := range tl.over(limit) {
		t.Errorf("window over the limit: %s", tl.row(k))
	}
	return tl
}

// logWindows logs the invariant's figures.
func logWindows(t *testing.T, tl tally, name string) {
	t.Helper()
	most, at, byGrant := tl.max()
	t.Logf("invariant: no aligned window gets more than the limit (%s): %d windows; most calls received in one window %d of %d (%.1f%%) at %s; most granted in one window %d; windows over the limit: %d by grant time, %d more by arrival only",
		name, len(tl.arrived), most, limit, 100*float64(most)/limit, time.Unix(0, at*int64(window)).UTC().Format("15:04:05"),
		byGrant, len(tl.over(limit)), len(tl.spill(limit)))
	t.Logf("calls received per window: %s", tl.series(tl.first, tl.first+int64(len(tl.arrived))-1))
	for _, k := range tl.spill(limit) {
		t.Logf("received over the limit, granted within it (calls granted at the end of the window before arrived late: a stall of this shared machine, not of sluice): %s; the window before: %s", tl.row(k), tl.row(k-1))
	}
}

// TestConfigdLeaderKilledMidHandover: two configd replicas; an instance
// joins, so the leader publishes a handover whose first step shrinks the
// two running instances' shares (the newcomer waits at 0); the leader is
// SIGKILLed the moment that publish is seen, before the growth step can be
// published (growth waits for the shrink's first window, at least the
// propagation margin away). The standby must take over and finish the
// handover; no window may go over the limit; every generation is published
// once and the new leader's are higher.
func TestConfigdLeaderKilledMidHandover(t *testing.T) {
	r := newRig(t, "fault-leader")
	a := startConfigd(t, r.endpoint, "cd-a")
	if _, _, err := a.errs.wait(0, 20*time.Second, func(s string) bool { return strings.Contains(s, `msg="became leader"`) }); err != nil {
		t.Fatalf("cd-a did not become leader: %v", err)
	}
	b := startConfigd(t, r.endpoint, "cd-b")
	a.cli(t, "set", r.provider, "--coordination", "shares", "--limit", fmt.Sprint(limit), "--algorithm", "even")
	i1 := startInstance(t, r.endpoint, r.provider, r.stub.url(), 1)
	i2 := startInstance(t, r.endpoint, r.provider, r.stub.url(), 2)
	r.settle(t, 2, 30*time.Second, nil, i1, i2)
	from := startLoad(i1, i2)

	type kill struct {
		ev   sharesEvent
		at   time.Time
		acks string // the instance records read right after the kill
	}
	killed := make(chan kill, 1)
	armed := true
	r.w.setHook(func(prev *schema.Shares, ev sharesEvent) {
		if !armed || prev == nil || ev.sh.Instances != 3 || ev.sh.Leader != a.id {
			return
		}
		shrinks := false
		for id, v := range prev.Shares {
			if s, ok := ev.sh.Shares[id]; ok && s < v {
				shrinks = true
			}
		}
		if !shrinks {
			return
		}
		armed = false
		a.signal(syscall.SIGKILL)
		at := time.Now()
		killed <- kill{ev, at, acksAt(r, ev.sh.Generation)}
	})
	waitUntil(time.Unix(0, (from+2)*int64(window))) // two windows of steady load first
	i3 := startInstance(t, r.endpoint, r.provider, r.stub.url(), 3)
	i3.load(offered)

	var k kill
	select {
	case k = <-killed:
	case <-time.After(20 * time.Second):
		t.Fatalf("no shrinking publish by cd-a within 20s after inst-3 joined; records: %v", r.w.all())
	}
	<-a.done
	t.Logf("injected: SIGKILL of leader cd-a (pid %d) %v after it published %s (shrink step; total %d; in force from +%v)",
		a.pid(), k.at.Sub(k.ev.seen).Round(time.Microsecond), describe(k.ev.sh), k.ev.sh.Total, k.ev.sh.EffectiveTime().Sub(k.at).Round(time.Millisecond))

	t.Logf("acknowledgements of generation %d, read from etcd right after the kill: %s; read now: %s",
		k.ev.sh.Generation, k.acks, acksAt(r, k.ev.sh.Generation))
	if k.ev.sh.Shares["inst-3"] >= limit/3 {
		t.Fatalf("the publish seen was not mid-handover: inst-3 already has %d", k.ev.sh.Shares["inst-3"])
	}

	// The standby takes over and finishes the handover.
	if _, _, err := b.errs.wait(0, 20*time.Second, func(s string) bool { return strings.Contains(s, `msg="became leader"`) }); err != nil {
		t.Fatalf("cd-b did not become leader: %v", err)
	}
	tookOver := time.Now()
	done := r.settle(t, 3, 30*time.Second, func(sh schema.Shares) bool {
		return sh.Leader == b.id && sh.Shares["inst-1"] == limit/3 && sh.Shares["inst-2"] == limit/3 && sh.Shares["inst-3"] == limit/3
	}, i1, i2, i3)
	inForce := done.EffectiveTime()
	waitUntil(inForce.Add(2 * window)) // two windows at the final split
	to := stopLoad(i1, i2, i3)

	evs := r.w.all()
	var firstB *sharesEvent
	for i, ev := range evs {
		t.Logf("published: %s (seen %s)", describe(ev.sh), ev.seen.UTC().Format("15:04:05.000"))
		if ev.rev > k.ev.rev && ev.sh.Leader == a.id {
			t.Errorf("generation %d published by the killed leader cd-a after it was killed", ev.sh.Generation)
		}
		if ev.sh.Leader == b.id && firstB == nil {
			firstB = &evs[i]
		}
	}
	checkGenerations(t, evs)
	checkApplied(t, evs, i1, i2, i3)
	if firstB == nil || firstB.sh.Generation <= k.ev.sh.Generation {
		t.Errorf("cd-b's first generation is not above cd-a's last (%d): %v", k.ev.sh.Generation, firstB)
	}
	t.Logf("invariant: generations strictly increase across the failover, each published once (%d records); cd-a's last %d, cd-b's first %d; nothing from cd-a after the kill",
		len(evs), k.ev.sh.Generation, firstB.sh.Generation)
	checkWindows(t, r, "whole run, failover included", from, to)
	t.Logf("recovery: kill → cd-b leader %v; kill → cd-b's first publish (gen %d) %v; kill → final even split (gen %d) in force %v",
		tookOver.Sub(k.at).Round(time.Millisecond), firstB.sh.Generation, firstB.seen.Sub(k.at).Round(time.Millisecond),
		done.Generation, inForce.Sub(k.at).Round(time.Millisecond))
}

// acksAt reads every instance record of the provider and says which
// acknowledged generation gen. It may run outside the test goroutine.
func acksAt(r *rig, gen int64) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := r.cli.Get(ctx, schema.DefaultKeys().Instances(r.provider), clientv3.WithPrefix())
	if err != nil {
		return "cannot read: " + err.Error()
	}
	var parts []string
	for _, kv := range resp.Kvs {
		rec, err := schema.DecodeInstanceRecord(kv.Value)
		if err != nil {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s applied %d (acked: %t)", rec.ID, rec.AppliedGeneration, rec.AppliedGeneration >= gen))
	}
	return strings.Join(parts, ", ")
}
