package faults

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
)

// evenShares returns a condition: every one of ids has total/len(ids).
func evenShares(ids ...string) func(schema.Shares) bool {
	return func(sh schema.Shares) bool {
		for _, id := range ids {
			if sh.Shares[id] != limit/int64(len(ids)) {
				return false
			}
		}
		return true
	}
}

// TestZombieInstance: an instance is SIGSTOPped for longer than its lease
// TTL plus the provider's fail_static (10 s by default), so its lease
// expires, configd keeps its share reserved for the fail_static and then
// hands it to the others; then it is SIGCONTed: a zombie that wakes
// holding a stale share. While it is stopped its share must go to the
// others; after it wakes it must admit nothing on the stale share (its
// limiter expired it) and no aligned window may go over the limit.
func TestZombieInstance(t *testing.T) {
	r := newRig(t, "fault-zombie")
	c := startConfigd(t, r.endpoint, "cd-a")
	c.cli(t, "set", r.provider, "--coordination", "shares", "--limit", fmt.Sprint(limit), "--algorithm", "even")
	insts := r.startInstances(t, 3)
	i1, i2, i3 := insts[0], insts[1], insts[2]
	before := r.settleEven(t, insts...)
	from := startLoad(i1, i2, i3)
	waitUntil(time.Unix(0, (from+2)*int64(window)).Add(100 * time.Millisecond))

	if err := i1.signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Logf("injected: SIGSTOP of inst-1 (pid %d) holding share %d (gen %d), lease TTL %v", i1.pid(), before.Shares["inst-1"], before.Generation, leaseTTL)
	gone, err := r.w.waitDeleted("inst-1", 5*leaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	handed := r.settle(t, 2, 20*time.Second, evenShares("inst-2", "inst-3"), i2, i3)
	t.Logf("while stopped: inst-1's key deleted %v after SIGSTOP (lease expired); its share handed to the others: %s, in force %v after SIGSTOP",
		gone.Sub(stopped).Round(time.Millisecond), describe(handed), handed.EffectiveTime().Sub(stopped).Round(time.Millisecond))

	// Two windows at the others' grown shares, then wake the zombie 100ms
	// into a window.
	wake := time.Unix(0, (windowIndex(handed.EffectiveTime())+2)*int64(window)).Add(100 * time.Millisecond)
	waitUntil(wake)
	seen := i1.out.len()
	if err := i1.signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	woke := time.Now()
	t.Logf("injected: SIGCONT of inst-1 after %v stopped (%.1f× the lease TTL)", woke.Sub(stopped).Round(time.Millisecond), float64(woke.Sub(stopped))/float64(leaseTTL))

	// When the zombie gives up its stale share: the first share it applies
	// after waking that is smaller than the stale one.
	l, _, err := i1.out.wait(seen, 20*time.Second, func(s string) bool {
		a, ok := parseApplied(s)
		return ok && a.share < before.Shares["inst-1"]
	})
	if err != nil {
		t.Fatalf("inst-1 never gave up its stale share after waking: %v", err)
	}
	fixed, _ := parseApplied(l)
	back := r.settleEven(t, i1, i2, i3)
	waitUntil(back.EffectiveTime().Add(2 * window))
	to := stopLoad(i1, i2, i3)

	r.published(t)
	tl := count(r.stub.calls(), from, to)
	over := tl.over(limit)
	// The zombie's grants after waking (from the start of the wake window:
	// it runs before this process reads the clock after SIGCONT), before
	// it applied a smaller share.
	var zombie int64
	for _, cl := range r.stub.calls() {
		if cl.inst == 1 && cl.granted >= windowIndex(woke)*int64(window) && cl.granted < fixed.t.UnixNano() {
			zombie++
		}
	}
	t.Logf("after waking: inst-1 applied share %d (gen %d, source %s) %v after SIGCONT; it was granted %d permits with its stale share %d in between; back to three instances: %s, in force %v after SIGCONT",
		fixed.share, fixed.gen, fixed.source, fixed.t.Sub(woke).Round(time.Microsecond), zombie, before.Shares["inst-1"],
		describe(back), back.EffectiveTime().Sub(woke).Round(time.Millisecond))
	logWindows(t, tl, "whole run, the zombie's wake included")
	t.Logf("the wake window: %s", tl.row(windowIndex(woke)))
	for _, k := range over {
		t.Errorf("window over the limit: %s", tl.row(k))
	}
	// Stopped past its lease and fail_static, the zombie's limiter had
	// already expired its share when it woke: nothing admitted on it.
	if zombie != 0 {
		t.Errorf("the zombie was granted %d permits with its stale share after waking, want 0 (its fail-static horizon had passed)", zombie)
	}
	t.Logf("invariant: the zombie admitted %d permits with its stale share after waking", zombie)
}

// TestJoinLeaveFlood: three instances under load while 20 short-lived
// instance processes join and leave over 10 s (one started every 500 ms,
// each offering load and living 1.5 s; every other one leaves gracefully,
// revoking its lease, the rest are SIGKILLed and leave when their lease
// expires). No aligned window may go over the limit; generations never
// conflict; afterwards the three get the even split back.
func TestJoinLeaveFlood(t *testing.T) {
	r := newRig(t, "fault-flood")
	c := startConfigd(t, r.endpoint, "cd-a")
	c.cli(t, "set", r.provider, "--coordination", "shares", "--limit", fmt.Sprint(limit), "--algorithm", "even")
	steady := r.startInstances(t, 3)
	r.settleEven(t, steady...)
	from := startLoad(steady...)
	waitUntil(time.Unix(0, (from+2)*int64(window)))

	const n, every, life = 20, 500 * time.Millisecond, 1500 * time.Millisecond
	type shortLived struct {
		in    *instance
		start time.Time
		gone  bool
	}
	var flood []*shortLived
	began := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	graceful, killed := 0, 0
	for left := n; left > 0; <-tick.C {
		now := time.Now()
		if len(flood) < n && !now.Before(began.Add(time.Duration(len(flood))*every)) {
			in := launchInstance(t, r.endpoint, r.provider, r.stub.url(), 10+len(flood))
			in.load(offered) // read once it has joined
			flood = append(flood, &shortLived{in: in, start: now})
		}
		for i, f := range flood {
			if f.gone || now.Before(f.start.Add(life)) {
				continue
			}
			f.gone = true
			if i%2 == 0 {
				f.in.stdin.Close() // leave: Close revokes the lease
				graceful++
			} else {
				f.in.signal(syscall.SIGKILL) // crash: the lease expires
				killed++
			}
			left--
		}
	}
	ended := time.Now()
	joined := 0
	for _, f := range flood {
		for _, l := range f.in.out.snapshot() {
			if strings.HasPrefix(l, "joined ") {
				joined++
				break
			}
		}
	}
	t.Logf("injected: %d instance processes started every %v over %v, each offering %d/s and living %v; %d joined before leaving; %d left gracefully, %d SIGKILLed (lease TTL %v)",
		n, every, ended.Sub(began).Round(time.Millisecond), offered, life, joined, graceful, killed, leaseTTL)
	if joined < n/2 {
		t.Errorf("only %d of %d short-lived instances joined: the flood did not happen", joined, n)
	}

	back := r.settleEven(t, steady...)
	settled := time.Now()
	waitUntil(back.EffectiveTime().Add(2 * window))
	to := stopLoad(steady...)
	logPhases(t, steady...)

	evs := r.w.all()
	maxInst := 0
	for _, ev := range evs {
		maxInst = max(maxInst, ev.sh.Instances)
	}
	checkGenerations(t, evs)
	checkApplied(t, evs, steady...)
	t.Logf("invariant: generations strictly increase, each published once: %d shares records (gen %d to %d), up to %d instances in one",
		len(evs), evs[0].sh.Generation, evs[len(evs)-1].sh.Generation, maxInst)
	tl := checkWindows(t, r, "whole run, flood included", from, to)
	for k := windowIndex(began); k <= windowIndex(settled); k++ {
		t.Logf("during the flood: %s", tl.row(k))
	}
	t.Logf("recovery: the last short-lived instance left → even split for the three again (%s) in force %v later",
		describe(back), back.EffectiveTime().Sub(ended).Round(time.Millisecond))
}
