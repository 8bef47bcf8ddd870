package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/ledger"
	ledgerstore "github.com/sluice-go/sluice/internal/ledger/store"
	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/internal/ntptest"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/cluster"
	"github.com/sluice-go/sluice/limiter/skew"
)

// ledgerSampler samples, every millisecond, what each member's limiter
// enforces and has admitted in the window under way.
type ledgerSampler struct {
	mu      sync.Mutex
	quota   map[int64]map[string]int64 // window index → member → the most quota seen
	used    map[int64]map[string]int64 // window index → member → the most admitted seen
	members map[string]*cluster.Member
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func sampleLedger(t *testing.T, members ...*cluster.Member) *ledgerSampler {
	ctx, cancel := context.WithCancel(context.Background())
	s := &ledgerSampler{quota: map[int64]map[string]int64{}, used: map[int64]map[string]int64{}, members: map[string]*cluster.Member{}, cancel: cancel}
	for _, m := range members {
		s.members[m.ID()] = m
	}
	s.wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			s.sample()
		}
	})
	t.Cleanup(s.stop)
	return s
}

func (s *ledgerSampler) stop() { s.cancel(); s.wg.Wait() }

func (s *ledgerSampler) sample() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, m := range s.members {
		st := m.Limiter().Stats()
		if st.Window != itWindow {
			continue
		}
		k := st.WindowStart.UnixNano() / int64(itWindow)
		for _, v := range []struct {
			into map[int64]map[string]int64
			n    int64
		}{{s.quota, st.Quota}, {s.used, st.Quota - st.Remaining}} {
			if v.into[k] == nil {
				v.into[k] = map[string]int64{}
			}
			v.into[k][id] = max(v.into[k][id], v.n)
		}
	}
}

// runFor waits until n more windows have been sampled.
func (s *ledgerSampler) runFor(t *testing.T, n int) {
	t.Helper()
	s.mu.Lock()
	until := len(s.quota) + n
	s.mu.Unlock()
	itWait(t, fmt.Sprintf("%d windows more sampled", n), func() (bool, string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.quota) >= until, fmt.Sprintf("%d of %d", len(s.quota), until)
	})
}

// drop stops sampling member id.
func (s *ledgerSampler) drop(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.members, id)
}

// check compares every window sampled with the limit the ledger's era
// says for it, and with ceiling.
func (s *ledgerSampler) check(t *testing.T, st *ledger.State, ceiling int64) (windows int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range slices.Sorted(maps.Keys(s.quota)) {
		limit := ceiling
		for _, e := range st.Head.Eras {
			if e.Window == itWindow && k >= e.Start {
				limit = min(ceiling, e.Limit(k))
			}
		}
		var q, u int64
		for _, n := range s.quota[k] {
			q += n
		}
		for _, n := range s.used[k] {
			u += n
		}
		if q > limit || u > limit {
			t.Errorf("window %d: quotas %v (sum %d), admitted %v (sum %d), over the ledger's limit %d", k, s.quota[k], q, s.used[k], u, limit)
		}
		windows++
	}
	return windows
}

// sumNow returns the sum of the members' quotas now and the fewest.
func (s *ledgerSampler) sumNow() (sum, least int64, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	least = -1
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(s.members)) {
		st := s.members[id].Status()
		q := s.members[id].Limiter().Stats().Quota
		sum += q
		if least < 0 || q < least {
			least = q
		}
		parts = append(parts, fmt.Sprintf("%s: %d (%s)", id, q, st.Source))
	}
	return sum, least, strings.Join(parts, ", ")
}

// demand keeps every member asking for permits until the test ends.
func demand(t *testing.T, members ...*cluster.Member) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, m := range members {
		wg.Go(func() {
			for ctx.Err() == nil {
				err := m.Limiter().Acquire(ctx, 50*time.Millisecond)
				if errors.Is(err, limiter.ErrClosed) {
					return
				}
			}
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func readLedger(t *testing.T, cli *clientv3.Client, provider string) *ledger.State {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
	defer cancel()
	st, _, _, bad, err := ledgerstore.Read(ctx, cli, ledger.Keys(itKeys.Ledger(provider)))
	if err != nil || len(bad) > 0 {
		t.Fatalf("reading the ledger: %v %v", err, bad)
	}
	return st
}

// TestLedgerProviderEndToEnd runs configd serve and three members of a
// provider created with --coordination ledger on a real etcd: the whole
// limit is granted, a retune lowers it, a member's leave hands its room
// on, and no window sampled ever holds more than the ledger's limit for
// it, which the ledger's own audit finds within too.
func TestLedgerProviderEndToEnd(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := itClient(t, srv)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	server := "--server=" + r.url()

	itCLI(t, "set", "api", "--limit", "300", "--window", itWindow.String(), "--coordination", "ledger", server)
	members := itJoin(t, srv, "api", "a", "b", "c")
	s := sampleLedger(t, members...)
	demand(t, members...)

	itWait(t, "the whole limit granted to the three", func() (bool, string) {
		sum, least, why := s.sumNow()
		return sum == 300 && least > 0, why
	})
	s.runFor(t, 10)
	for _, m := range members {
		if st := m.Status(); st.Source != schema.SourceLedger || !st.Connected {
			t.Errorf("%s: source %q, connected %v; want ledger, connected", m.ID(), st.Source, st.Connected)
		}
	}

	out := itCLI(t, "set", "api", "--limit", "150", server)
	if !strings.Contains(out, "300") || !strings.Contains(out, "150") {
		t.Errorf("set printed %q, want the change 300 → 150", out)
	}
	itWait(t, "the members down to the new limit", func() (bool, string) {
		sum, least, why := s.sumNow()
		return sum <= 150 && sum >= 140 && least > 0, why
	})
	s.runFor(t, 10)

	s.drop("c")
	if err := members[2].Close(); err != nil {
		t.Fatal(err)
	}
	itWait(t, "the two left with the whole limit", func() (bool, string) {
		sum, _, why := s.sumNow()
		return sum == 150, why
	})
	s.runFor(t, 10)

	s.stop()
	st := readLedger(t, cli, "api")
	if v := ledger.Audit(st); len(v) > 0 {
		t.Errorf("the ledger audits over: %v", v)
	}
	n := s.check(t, st, 300)
	t.Logf("%d windows sampled, each within the ledger's limit for it", n)
	if n < 30 {
		t.Errorf("only %d windows sampled", n)
	}

	if out := itCLI(t, "audit", "api", server); !strings.Contains(out, " ok") || strings.Contains(out, "OVER") {
		t.Errorf("configd audit api printed %q, want the limit ok", out)
	}

	var errOut strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
	defer cancel()
	err := run(ctx, []string{"set", "api", "--coordination", "shares", server}, &strings.Builder{}, &errOut)
	if err == nil || !strings.Contains(err.Error()+errOut.String(), "coordination is fixed") {
		t.Errorf("changing the coordination: %v %s; want it refused as fixed", err, errOut.String())
	}
}

// admitCounter has Members take every permit they can (when allowed) and
// counts the admissions per aligned window of true time (the system
// clock), per member.
type admitCounter struct {
	w    time.Duration
	mu   sync.Mutex
	n    map[int64]map[string]int64
	done chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

func newAdmitCounter(t *testing.T, w time.Duration) *admitCounter {
	c := &admitCounter{w: w, n: map[int64]map[string]int64{}, done: make(chan struct{})}
	t.Cleanup(c.halt)
	return c
}

func (c *admitCounter) halt() { c.once.Do(func() { close(c.done) }); c.wg.Wait() }

// take has m take permits whenever when(now) says so (nil: always).
func (c *admitCounter) take(m *cluster.Member, when func(time.Time) bool) {
	c.wg.Go(func() {
		for {
			select {
			case <-c.done:
				return
			default:
			}
			if when != nil && !when(time.Now()) {
				time.Sleep(200 * time.Microsecond)
				continue
			}
			if m.Limiter().TryAcquire() {
				k := time.Now().UnixNano() / int64(c.w)
				c.mu.Lock()
				if c.n[k] == nil {
					c.n[k] = map[string]int64{}
				}
				c.n[k][m.ID()]++
				c.mu.Unlock()
			} else {
				time.Sleep(200 * time.Microsecond)
			}
		}
	})
}

// runFor waits until n more windows have admitted something.
func (c *admitCounter) runFor(t *testing.T, n int) {
	t.Helper()
	c.mu.Lock()
	until := len(c.n) + n
	c.mu.Unlock()
	itWait(t, fmt.Sprintf("%d windows more counted", n), func() (bool, string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.n) >= until, fmt.Sprintf("%d of %d", len(c.n), until)
	})
}

// over reports every window whose admissions add up to more than limit.
func (c *admitCounter) over(t *testing.T, limit int64) (worst int64) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range slices.Sorted(maps.Keys(c.n)) {
		var sum int64
		for _, n := range c.n[k] {
			sum += n
		}
		worst = max(worst, sum)
		if sum > limit {
			t.Errorf("window %s: admitted %d in a window of %d: %v", time.Unix(0, k*int64(c.w)).Format("15:04:05.000"), sum, limit, c.n[k])
		}
	}
	return worst
}

func quotas(ms ...*cluster.Member) (sum int64, why string) {
	for _, m := range ms {
		st := m.Status()
		q := m.Limiter().Stats().Quota
		sum += q
		why += fmt.Sprintf("%s: %d (%s) ", m.ID(), q, st.Source)
	}
	return sum, why
}

// behindClock is a clock running d behind the system's (true time here).
type behindClock struct{ d time.Duration }

func (c behindClock) Now() time.Time { return time.Now().Add(-c.d) }

// TestLedgerMemberAppliesItsClockMonitor: a provider of 100/100ms; a's
// clock is right, b's runs 60ms behind, and b measures it with NTP
// (cluster.WithClockMonitor, the server on true time), which under
// shares moves b's window boundaries onto true time (the "shares" subtest,
// the control). Under the ledger, apply returns before clockCut, the only
// place the measured offset and guard band reach the limiter, so b's
// windows stay 60ms late: b idles in odd windows and takes in even ones
// from 5ms to 95ms, which spans the tail of its window k-1 (unused) and
// the head of its window k, 50 each; with a's 50, 150 in a true window of
// 100.
func TestLedgerMemberAppliesItsClockMonitor(t *testing.T) {
	for _, coord := range []string{"ledger", "shares"} {
		t.Run(coord, func(t *testing.T) {
			const w = itWindow
			srv := etcdtest.Start(t)
			r := itServe(t, srv, "solo")
			itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
			server := "--server=" + r.url()
			itCLI(t, "set", "api", "--limit", "100", "--window", w.String(), "--coordination", coord, server)

			ntp, err := ntptest.Start()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ntp.Close() })
			behind := behindClock{60 * time.Millisecond}
			mon, err := skew.New(skew.WithServers(ntp.Addr()), skew.WithInterval(50*time.Millisecond),
				skew.WithTimeout(100*time.Millisecond), skew.WithStaleness(200*time.Millisecond), skew.WithClock(behind))
			if err != nil {
				t.Fatal(err)
			}
			var alog, blog logbuf.Buffer
			a := joinAPI(t, itClient(t, srv), "a", &alog)
			b := joinAPI(t, itClient(t, srv), "b", &blog, cluster.WithClockMonitor(mon),
				cluster.WithLimiterOptions(limiter.WithClock(behind)))
			itWait(t, "a and b at 50 each", func() (bool, string) {
				sum, why := quotas(a, b)
				return sum == 100 && a.Limiter().Stats().Quota == 50, why
			})
			itWait(t, "b's limiter on the measured offset", func() (bool, string) {
				off := b.Limiter().ClockOffset()
				return off > 50*time.Millisecond && off < 70*time.Millisecond, off.String()
			})
			t.Logf("b's limiter clock offset %v, uncertainty known %v", b.Limiter().ClockOffset(), b.Status().ClockKnown)

			c := newAdmitCounter(t, w)
			c.take(a, nil)
			c.take(b, func(now time.Time) bool {
				k, ph := now.UnixNano()/int64(w), time.Duration(now.UnixNano()%int64(w))
				return k%2 == 0 && ph >= 5*time.Millisecond && ph < 95*time.Millisecond
			})
			time.Sleep(2 * time.Second)
			c.halt()
			worst := c.over(t, 100)
			t.Logf("fullest window: %d of 100", worst)
		})
	}
}

// TestLedgerJoinerDropsItsFallback: a provider of 100/100ms exists; a
// alone holds the whole 100. b joins with WithFallback(100, 1s), which
// the package says applies only while the config cannot be read or
// before the provider is configured. b reads the config at once, but
// apply returns early for a ledger config: its limiter stays on the
// fallback New gave it, and the Follower's first schedule (a step of
// 0 in windows of 100ms, another length) takes effect only at the end of
// the 1s fallback window under way. b takes its 100 beside a's 100. Under
// shares (the control) a new source takes the smaller quota at once: 0.
func TestLedgerJoinerDropsItsFallback(t *testing.T) {
	for _, coord := range []string{"ledger", "shares"} {
		t.Run(coord, func(t *testing.T) {
			const w = itWindow
			srv := etcdtest.Start(t)
			r := itServe(t, srv, "solo")
			itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
			server := "--server=" + r.url()
			itCLI(t, "set", "api", "--limit", "100", "--window", w.String(), "--coordination", coord, server)
			var alog, blog logbuf.Buffer
			a := joinAPI(t, itClient(t, srv), "a", &alog)
			itWait(t, "a at 100", func() (bool, string) {
				sum, why := quotas(a)
				return sum == 100, why
			})
			c := newAdmitCounter(t, w)
			c.take(a, nil)
			time.Sleep(3 * w)
			b := joinAPI(t, itClient(t, srv), "b", &blog, cluster.WithFallback(100, time.Second))
			c.take(b, nil)
			time.Sleep(1500 * time.Millisecond)
			c.halt()
			worst := c.over(t, 100)
			sum, why := quotas(a, b)
			t.Logf("fullest window: %d of 100; now %d: %s", worst, sum, why)
		})
	}
}

// TestLedgerProviderOfTwoLimits: a provider of 300 requests and 3,000
// tokens per 100ms window on the ledger, joined by two instances with
// cluster.JoinProvider: each limit is a ledger of its own (the tokens' the
// lane provider api~1), each granted whole, and both audit clean.
func TestLedgerProviderOfTwoLimits(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := itClient(t, srv)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	server := "--server=" + r.url()
	itCLI(t, "set", "api", "--limit", "300/"+itWindow.String(), "--limit", "tokens=3000/"+itWindow.String(), "--coordination", "ledger", server)

	var groups []*cluster.Group
	for _, id := range []string{"a", "b"} {
		ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
		g, err := cluster.JoinProvider(ctx, itClient(t, srv), "api", cluster.WithID(id), cluster.WithLeaseTTL(time.Second),
			cluster.WithReportInterval(100*time.Millisecond), cluster.WithFallback(0, itWindow))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		groups = append(groups, g)
	}
	for lane, want := range []int64{300, 3000} {
		itWait(t, fmt.Sprintf("limit %d granted whole", want), func() (bool, string) {
			var ms []*cluster.Member
			for _, g := range groups {
				ms = append(ms, g.Members()[lane])
			}
			sum, why := quotas(ms...)
			for _, m := range ms {
				if m.Status().Source != schema.SourceLedger {
					return false, why
				}
			}
			return sum == want, why
		})
	}
	for _, name := range []string{"api", schema.LaneName("api", 1)} {
		if v := ledger.Audit(readLedger(t, cli, name)); len(v) > 0 {
			t.Errorf("%s's ledger audits over: %v", name, v)
		}
	}
	if out := itCLI(t, "audit", "api", server); strings.Count(out, " ok") != 2 {
		t.Errorf("configd audit api printed %q, want both limits ok", out)
	}
}

// TestLedgerWithoutConfigd: configd's only replica stops while a and b
// hold 50 each of a ledger provider of 100/100ms (fail_static 1s: grants
// run 10 windows ahead). The instance of the least ID stands in for
// configd's rounds: a and b keep the whole limit past the horizon, c
// joins and gets its even share, and no window admits over 100.
func TestLedgerWithoutConfigd(t *testing.T) {
	const w = itWindow
	srv := etcdtest.Start(t)
	cli := itClient(t, srv)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	itCLI(t, "set", "api", "--limit", "100", "--window", w.String(), "--fail-static", "1s", "--coordination", "ledger", "--server="+r.url())
	var alog, blog, clog logbuf.Buffer
	a := joinAPI(t, itClient(t, srv), "a", &alog)
	b := joinAPI(t, itClient(t, srv), "b", &blog)
	c := newAdmitCounter(t, w)
	c.take(a, nil)
	c.take(b, nil)
	itWait(t, "a and b at 50 each", func() (bool, string) {
		sum, why := quotas(a, b)
		return sum == 100 && a.Limiter().Stats().Quota == 50, why
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	c.runFor(t, 20) // twice the horizon
	if sum, why := quotas(a, b); sum != 100 {
		t.Errorf("20 windows after configd stopped: %s, want the whole 100", why)
	}
	cm := joinAPI(t, itClient(t, srv), "c", &clog)
	c.take(cm, nil)
	itWait(t, "the three on the even split without configd", func() (bool, string) {
		sum, why := quotas(a, b, cm)
		return sum == 100 && cm.Limiter().Stats().Quota >= 33 && a.Limiter().Stats().Quota <= 34, why
	})
	c.runFor(t, 10)
	c.halt()
	t.Logf("fullest window: %d of 100", c.over(t, 100))
	if v := ledger.Audit(readLedger(t, cli, "api")); len(v) > 0 {
		t.Errorf("the ledger audits over: %v", v)
	}
}

// admittedBetween returns the windows from k0 (inclusive) to k1
// (exclusive) that admitted anything, and the permits they admitted.
func (c *admitCounter) admittedBetween(k0, k1 int64) (windows int, sum int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := k0; k < k1; k++ {
		var s int64
		for _, n := range c.n[k] {
			s += n
		}
		if s > 0 {
			windows++
		}
		sum += s
	}
	return windows, sum
}

// TestLedgerStandInAtTheDefaultReportInterval: a ledger provider of
// 100/100ms with fail_static 400ms (horizon: 4 windows, extended once
// fewer than 2 remain). configd runs its rounds every round.Tick (25 ms
// here, 50 ms at least); the stand-in runs its rounds on the member's
// report tick, 1 s by default (cluster.DefaultReportInterval). Without
// configd, each round extends the grants 4 windows ahead and the next
// comes 10 windows later: the fleet admits in about half its windows.
func TestLedgerStandInAtTheDefaultReportInterval(t *testing.T) {
	const w = itWindow
	srv := etcdtest.Start(t)
	cli := itClient(t, srv)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	itCLI(t, "set", "api", "--limit", "100", "--window", w.String(), "--fail-static", "400ms", "--coordination", "ledger", "--server="+r.url())
	var alog, blog logbuf.Buffer
	rep := cluster.WithReportInterval(cluster.DefaultReportInterval)
	a := joinAPI(t, itClient(t, srv), "a", &alog, rep)
	b := joinAPI(t, itClient(t, srv), "b", &blog, rep)
	c := newAdmitCounter(t, w)
	c.take(a, nil)
	c.take(b, nil)
	itWait(t, "a and b at 50 each", func() (bool, string) {
		sum, why := quotas(a, b)
		return sum == 100 && a.Limiter().Stats().Quota == 50, why
	})
	const n = 30
	k0 := time.Now().UnixNano()/int64(w) + 1
	time.Sleep(time.Duration(n+1) * w)
	withConfigd, sumWith := c.admittedBetween(k0, k0+n)
	t.Logf("with configd: %d of %d windows admitted, %d permits of %d", withConfigd, n, sumWith, n*100)

	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // past the grants configd wrote, and a few stand-in rounds
	k0 = time.Now().UnixNano()/int64(w) + 1
	time.Sleep(time.Duration(n+1) * w)
	without, sumWithout := c.admittedBetween(k0, k0+n)
	t.Logf("without configd: %d of %d windows admitted, %d permits of %d", without, n, sumWithout, n*100)
	c.halt()
	c.over(t, 100)
	if v := ledger.Audit(readLedger(t, cli, "api")); len(v) > 0 {
		t.Errorf("the ledger audits over: %v", v)
	}
	if without < n*9/10 {
		t.Errorf("without configd the fleet admitted in %d of %d windows (%d permits of %d); want nearly all", without, n, sumWithout, n*100)
	}
}

// TestLedgerMemberWithItsClockUnknown: a provider of 100/100ms; a's
// clock is right, b's runs 60ms behind, and b's clock monitor cannot
// reach its NTP server: the offset is unknown. Under the shares (the
// control), clockCut enforces skew.EnforcedShare, half the share while
// the offset is unknown (WithClockMonitor's doc): b takes at most 25 in
// each of its windows, 50 in any true window, beside a's 50. Under the
// ledger the session calls clockCut(0, ...) and drops what it returns:
// b enforces its whole grant of 50 per window of its own clock, idles in
// odd true windows and takes in even ones from 5ms to 95ms, which spans
// the tail of its window k-1 (unused) and the head of its window k: 100
// from b, with a's 50, 150 in a true window of 100.
func TestLedgerMemberWithItsClockUnknown(t *testing.T) {
	for _, coord := range []string{"ledger", "shares"} {
		t.Run(coord, func(t *testing.T) {
			const w = itWindow
			srv := etcdtest.Start(t)
			r := itServe(t, srv, "solo")
			itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
			server := "--server=" + r.url()
			itCLI(t, "set", "api", "--limit", "100", "--window", w.String(), "--coordination", coord, server)

			ntp, err := ntptest.Start()
			if err != nil {
				t.Fatal(err)
			}
			addr := ntp.Addr()
			ntp.Close() // unreachable: the offset is never known
			behind := behindClock{60 * time.Millisecond}
			mon, err := skew.New(skew.WithServers(addr), skew.WithInterval(50*time.Millisecond),
				skew.WithTimeout(100*time.Millisecond), skew.WithStaleness(200*time.Millisecond), skew.WithClock(behind))
			if err != nil {
				t.Fatal(err)
			}
			var alog, blog logbuf.Buffer
			a := joinAPI(t, itClient(t, srv), "a", &alog)
			b := joinAPI(t, itClient(t, srv), "b", &blog, cluster.WithClockMonitor(mon),
				cluster.WithLimiterOptions(limiter.WithClock(behind)))
			itWait(t, "a at 50", func() (bool, string) {
				_, why := quotas(a, b)
				return a.Limiter().Stats().Quota == 50 && b.Limiter().Stats().Quota > 0, why
			})
			time.Sleep(500 * time.Millisecond)
			t.Logf("b's clock known %v, quota %d (%s)", b.Status().ClockKnown, b.Limiter().Stats().Quota, b.Status().Source)

			c := newAdmitCounter(t, w)
			c.take(a, nil)
			c.take(b, func(now time.Time) bool {
				k, ph := now.UnixNano()/int64(w), time.Duration(now.UnixNano()%int64(w))
				return k%2 == 0 && ph >= 5*time.Millisecond && ph < 95*time.Millisecond
			})
			time.Sleep(2 * time.Second)
			c.halt()
			worst := c.over(t, 100)
			t.Logf("fullest window: %d of 100", worst)
		})
	}
}

// TestLedgerStandInBesideAnInstanceThatCannot: an instance of a release
// before the stand-in (a rolling upgrade), or one whose etcd user may
// write only its releases, names a holder all the same. Here "0" is such
// an instance's record, on a lease kept alive. configd stops. When the
// stand-in was the least ID of the records naming a holder, a and b saw
// that they were not it, "0" never wrote, and the grants ended at their
// horizon (10 windows): the fleet admitted nothing for good. The stand-in
// is now the least ID of the records that say they stand in.
func TestLedgerStandInBesideAnInstanceThatCannot(t *testing.T) {
	const w = itWindow
	srv := etcdtest.Start(t)
	cli := itClient(t, srv)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	itCLI(t, "set", "api", "--limit", "100", "--window", w.String(), "--fail-static", "1s", "--coordination", "ledger", "--server="+r.url())
	var alog, blog logbuf.Buffer
	a := joinAPI(t, itClient(t, srv), "a", &alog)
	b := joinAPI(t, itClient(t, srv), "b", &blog)

	// "0": the record an instance that does not stand in keeps.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var rec schema.InstanceRecord
	itWait(t, "a's record to name its holder", func() (bool, string) {
		resp, err := cli.Get(ctx, itKeys.Instance("api", "a"))
		if err != nil || len(resp.Kvs) == 0 {
			return false, fmt.Sprint(err)
		}
		rec, err = schema.DecodeInstanceRecord(resp.Kvs[0].Value)
		return err == nil && rec.Holder != "", rec.Holder
	})
	rec.ID, rec.Holder, rec.StandsIn = "0", "0.0123456789abcdef", false
	lease, err := cli.Grant(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.KeepAlive(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	val, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, itKeys.Instance("api", "0"), string(val), clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	c := newAdmitCounter(t, w)
	c.take(a, nil)
	c.take(b, nil)
	itWait(t, "a and b at 33 each beside 0", func() (bool, string) {
		sum, why := quotas(a, b)
		return sum >= 66 && a.Limiter().Stats().Quota >= 33, why
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // three times the horizon
	sum, why := quotas(a, b)
	const n = 20
	k0 := time.Now().UnixNano()/int64(w) + 1
	time.Sleep(time.Duration(n+1) * w)
	windows, permits := c.admittedBetween(k0, k0+n)
	t.Logf("3 s after configd stopped: %s; %d of %d windows admitted, %d permits", why, windows, n, permits)
	c.halt()
	if sum == 0 || windows == 0 {
		t.Errorf("without configd, beside an instance that does not stand in, a and b admit nothing: %s", why)
	}
}

// TestLedgerRoundsWaitForTheTickOnReports: every instance's report marks
// its provider changed, a thousand a second at N = 1,000, and each ran
// the ledger's rounds; they wait for the tick now, for a join a window
// (from 50 ms to 1 s), and for a new config or more to write not at all.
func TestLedgerRoundsWaitForTheTickOnReports(t *testing.T) {
	at := time.Unix(1000, 0)
	tick, w := 250*time.Millisecond, time.Second
	last := ledgerRun{at: at, keyRev: 7, holders: 1}
	cases := []struct {
		name string
		last ledgerRun
		next ledgerRun
		want time.Duration // after last.at; -1: no wait
	}{
		{"first", ledgerRun{}, ledgerRun{keyRev: 7, holders: 1}, -1},
		{"a report", last, ledgerRun{keyRev: 7, holders: 1}, tick},
		{"a join", last, ledgerRun{keyRev: 7, holders: 2}, w},
		{"a new config", last, ledgerRun{keyRev: 8, holders: 1}, -1},
		{"more to write", ledgerRun{at: at, keyRev: 7, holders: 1, more: true}, ledgerRun{keyRev: 7, holders: 1}, -1},
	}
	for _, c := range cases {
		until, ok := c.last.wait(c.next, tick, w)
		switch {
		case c.want < 0 && ok:
			t.Errorf("%s: waits until %v, want no wait", c.name, until)
		case c.want >= 0 && (!ok || until.Sub(c.last.at) != c.want):
			t.Errorf("%s: waits %v (%v), want %v", c.name, until.Sub(c.last.at), ok, c.want)
		}
	}
}

// TestLedgerProviderWithADailyBudget: a provider of 300 requests per
// 100ms on the ledger with a budget of 40 a day beside it. The rate is
// granted through the ledger; the budget is taken from its counter, as
// on the shares. configd audit checks the rate's ledger and shows what
// was taken of the budget.
func TestLedgerProviderWithADailyBudget(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := itClient(t, srv)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	server := "--server=" + r.url()
	itCLI(t, "set", "api", "--limit", "300/"+itWindow.String(), "--limit", "40/24h", "--coordination", "ledger", server)

	var groups []*cluster.Group
	for _, id := range []string{"a", "b"} {
		ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
		g, err := cluster.JoinProvider(ctx, itClient(t, srv), "api", cluster.WithID(id), cluster.WithLeaseTTL(time.Second),
			cluster.WithReportInterval(100*time.Millisecond), cluster.WithFallback(0, itWindow))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		groups = append(groups, g)
	}
	itWait(t, "the rate granted whole through the ledger", func() (bool, string) {
		sum, why := quotas(groups[0].Members()[0], groups[1].Members()[0])
		for _, g := range groups {
			if g.Members()[0].Status().Source != schema.SourceLedger {
				return false, why
			}
		}
		return sum == 300, why
	})
	ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
	defer cancel()
	for i, g := range groups {
		if _, err := g.Multi().Acquire(ctx, itTimeout, limiter.Cost(limiter.Requests, 3)); err != nil {
			t.Fatalf("instance %d: acquire 3 under the budget: %v (budget lane %+v)", i, err, g.Members()[1].Status())
		}
	}
	for i, g := range groups {
		if st := g.Members()[1].Status(); st.Source != "budget" || st.Taken < 3 || st.Taken > 40 {
			t.Errorf("instance %d's budget lane: source %q, taken %d; want the budget, 3 to 40 taken", i, st.Source, st.Taken)
		}
	}
	if v := ledger.Audit(readLedger(t, cli, "api")); len(v) > 0 {
		t.Errorf("the rate's ledger audits over: %v", v)
	}
	out := itCLI(t, "audit", "api", server)
	if !regexp.MustCompile(`(?m)^api +\d+ .* 300 +ok$`).MatchString(out) || !regexp.MustCompile(`(?m)^api~1 +budget: ([6-9]|[1-3]\d|40) of 40 taken`).MatchString(out) {
		t.Errorf("configd audit api printed\n%s\nwant the rate's ledger ok and what was taken of the budget", out)
	}
}

// TestJoinGapIsAWindowWithinBounds: joins are batched a window apart,
// no less than 50 ms and no more than a second.
func TestJoinGapIsAWindowWithinBounds(t *testing.T) {
	for _, c := range []struct{ w, want time.Duration }{
		{10 * time.Millisecond, 50 * time.Millisecond},
		{100 * time.Millisecond, 100 * time.Millisecond},
		{time.Second, time.Second},
		{time.Minute, time.Second},
	} {
		if got := joinGap(c.w); got != c.want {
			t.Errorf("joinGap(%v) = %v, want %v", c.w, got, c.want)
		}
	}
}
