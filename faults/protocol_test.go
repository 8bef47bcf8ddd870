package faults

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/netcut"
	"github.com/sluice-go/sluice/internal/ntptest"
)

// Fault scenarios of the protocol's holes (issue 12): configd's clock off,
// and window-length changes reaching an instance late. Both move shares
// under load with real processes; no aligned window may go over.

// moveLoad makes insts offer rates in turn: every period, the heavy load
// moves to the next instance, so that configd's fair split keeps shrinking
// one instance and growing another. It returns when rounds are done.
func moveLoad(insts []*instance, rounds int, period time.Duration) {
	for r := range rounds {
		for i, in := range insts {
			rate := 40
			if i == r%len(insts) {
				rate = 260
			}
			in.load(rate)
		}
		time.Sleep(period) // the load's own rhythm, not synchronisation
	}
}

// TestConfigdClockOff: configd measures its clock against an NTP server
// that is 2 s wrong — first behind, then ahead — while the instances'
// clocks are right; the heavy load moves from instance to instance so that
// shares keep moving through the handover. A configd behind publishes
// shrinks whose boundary has already passed; once it trusted its clock to
// judge them in force and grew others into the same window, 41.5% over
// the limit. No aligned window may go over.
func TestConfigdClockOff(t *testing.T) {
	ntp, err := ntptest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer ntp.Close()
	ntp.SetOffset(-2 * time.Second)
	r := newRig(t, "fault-clock")
	c := startConfigd(t, r.endpoint, "cd-a", "--ntp-server", ntp.Addr(), "--ntp-interval", "500ms")
	measured := func(want time.Duration) {
		t.Helper()
		if _, _, err := c.errs.wait(0, 20*time.Second, func(s string) bool {
			f := fields(s)
			off, err := time.ParseDuration(f["offset"])
			return strings.Contains(s, `msg="configd's clock measured"`) && f["known"] == "true" && err == nil &&
				off > want-200*time.Millisecond && off < want+200*time.Millisecond
		}); err != nil {
			t.Fatalf("configd did not measure its clock %v off: %v", want, err)
		}
	}
	measured(-2 * time.Second)
	c.cli(t, "set", r.provider, "--coordination", "shares", "--limit", fmt.Sprint(limit), "--algorithm", "fair")
	insts := r.startInstances(t, 3)
	r.settle(t, 3, 30*time.Second, nil, insts...)
	from := windowIndex(time.Now()) + 1
	t.Logf("injected: configd's clock 2 s behind (its NTP server is); load moving every 3 s")
	moveLoad(insts, 6, 3*time.Second)
	ntp.SetOffset(2 * time.Second)
	measured(2 * time.Second)
	t.Logf("injected: configd's clock 2 s ahead")
	moveLoad(insts, 6, 3*time.Second)
	to := stopLoad(insts...)
	logPhases(t, insts...)
	evs := r.published(t)
	checkApplied(t, evs, insts...)
	checkWindows(t, r, "configd's clock 2 s behind, then ahead", from, to)
	if len(evs) < 6 {
		t.Errorf("only %d publishes: the load moves did not move the shares", len(evs))
	}
}

// TestWindowChangeWithLateRecords: the window goes from 1 s to 10 s and
// back, each change made 300 ms before a 10 s boundary, while one instance
// receives etcd's answers 500 ms late (a slow link: its writes are not
// delayed). It gets each change after the change's boundary has passed,
// and switches a window later than the others. Once, configd counted the
// old per-1 s shares against the new per-10 s total and grew everyone at
// once, while the late instance kept its per-1 s share for a whole 10 s
// window: 16,000 in a 10 s window of 10,000. Checked: every aligned 10 s
// window holds at most the 10 s limit; every aligned 1 s window at most
// the 1 s limit, except while 10 s windows are in force (from the first
// change until every instance has switched back), when a 10 s window's
// permits may come in one second.
func TestWindowChangeWithLateRecords(t *testing.T) {
	const long = 10 * time.Second
	const longLimit = limit * 10
	r := newRig(t, "fault-window")
	c := startConfigd(t, r.endpoint, "cd-a")
	c.cli(t, "set", r.provider, "--coordination", "shares", "--limit", fmt.Sprint(limit), "--algorithm", "fair")
	px := netcut.StartProxy(t, strings.TrimPrefix(r.endpoint, "http://"))
	i1 := startInstance(t, r.endpoint, r.provider, r.stub.url(), 1)
	i2 := startInstance(t, r.endpoint, r.provider, r.stub.url(), 2)
	i3 := startInstance(t, px.URL(), r.provider, r.stub.url(), 3)
	insts := []*instance{i1, i2, i3}
	r.settle(t, 3, 30*time.Second, nil, insts...)
	px.SetDelay(500 * time.Millisecond)
	t.Logf("injected: inst-3 receives etcd's answers 500 ms late")
	for _, in := range insts {
		in.load(200)
	}
	from := windowIndex(time.Now()) + 1
	beforeLong := func() time.Time { // 300 ms before the next 10 s boundary at least 3 s away
		b := time.Now().Add(3 * time.Second).Truncate(long).Add(long)
		return b.Add(-300 * time.Millisecond)
	}
	waitUntil(beforeLong())
	changed := time.Now()
	c.cli(t, "set", r.provider, "--coordination", "shares", "--limit", fmt.Sprint(longLimit), "--window", long.String())
	t.Logf("changed: %d per %v at %s", longLimit, long, changed.UTC().Format("15:04:05.000"))
	waitUntil(changed.Add(25 * time.Second))
	waitUntil(beforeLong())
	back := time.Now()
	c.cli(t, "set", r.provider, "--coordination", "shares", "--limit", fmt.Sprint(limit), "--window", window.String())
	t.Logf("changed back: %d per %v at %s", limit, window, back.UTC().Format("15:04:05.000"))
	// Every instance on 1 s windows again, in whole windows: the last of
	// their in_force times of a 1 s share after the change back.
	var switched time.Time
	for _, in := range insts {
		l, _, err := in.out.wait(0, 40*time.Second, func(s string) bool {
			f := fields(s)
			t0, _ := strconv.ParseInt(f["t"], 10, 64)
			return strings.HasPrefix(s, "applied ") && f["window"] == window.String() && f["source"] == "shares" && t0 >= back.UnixNano()
		})
		if err != nil {
			t.Fatalf("%s did not switch back to 1 s windows: %v", in.id, err)
		}
		inForce, _ := strconv.ParseInt(fields(l)["in_force"], 10, 64)
		if at := time.Unix(0, inForce); at.After(switched) {
			switched = at
		}
	}
	t.Logf("every instance on 1 s windows, whole, from %s", switched.UTC().Format("15:04:05.000"))
	waitUntil(switched.Add(5 * time.Second))
	to := stopLoad(insts...)
	logPhases(t, insts...)
	evs := r.published(t)
	checkApplied(t, evs, insts...)

	calls := r.stub.calls()
	// 10 s windows, by grant time, over the whole run.
	per := map[int64]int64{}
	for _, cl := range calls {
		per[cl.granted/int64(long)]++
	}
	most10 := int64(0)
	for k, n := range per {
		most10 = max(most10, n)
		if n > longLimit {
			t.Errorf("aligned 10 s window at %s granted %d > %d", time.Unix(0, k*int64(long)).UTC().Format("15:04:05"), n, longLimit)
		}
	}
	// 1 s windows outside the stretch in which 10 s windows were in force.
	tl := count(calls, from, to)
	over, checked := 0, 0
	for i, n := range tl.granted {
		k := tl.first + int64(i)
		start := time.Unix(0, k*int64(window))
		if !start.Before(changed.Truncate(window)) && start.Before(switched) {
			continue
		}
		checked++
		if n > limit {
			over++
			t.Errorf("aligned 1 s window over the limit outside the 10 s stretch: %s", tl.row(k))
		}
	}
	t.Logf("invariant: most granted in an aligned 10 s window %d of %d; %d aligned 1 s windows outside the 10 s stretch, %d over %d; calls per second: %s",
		most10, longLimit, checked, over, limit, tl.series(tl.first, tl.first+int64(len(tl.arrived))-1))
}
