package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/ledger"
	ledgerstore "github.com/sluice-go/sluice/internal/ledger/store"
	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/internal/netcut"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// setUntilAccepted runs configd set with args until it is no longer
// refused with ErrRecordsLeft, and returns when it was accepted. The first
// attempt must be refused: refused says why it was.
func setUntilAccepted(t *testing.T, refused string, args ...string) time.Time {
	t.Helper()
	first := true
	deadline := time.Now().Add(itTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
		var out, errOut strings.Builder
		err := run(ctx, args, &out, &errOut)
		cancel()
		msg := errOut.String()
		if err != nil {
			msg += err.Error()
		}
		switch {
		case first && (err == nil || !strings.Contains(msg, refused)):
			t.Fatalf("configd %s: %v %s; want it refused: %s", strings.Join(args, " "), err, errOut.String(), refused)
		case err == nil:
			return time.Now()
		case !strings.Contains(msg, "may still let instances admit"):
			t.Fatalf("configd %s: %v %s", strings.Join(args, " "), err, errOut.String())
		case time.Now().After(deadline):
			t.Fatalf("configd %s still refused after %v: %s", strings.Join(args, " "), itTimeout, msg)
		}
		first = false
		time.Sleep(100 * time.Millisecond) // polling interval, not synchronisation
	}
}

// TestLedgerRecreatedAsSharesBesideLiveGrants: a provider of 100/100ms on
// the ledger has a and b at 50 each, both taking all they can. It is
// deleted and created again on the shares, and c joins. The grants a and
// b hold run to their publish's end, which the shares count nowhere:
// before the fix c's share came on top of them, 133 in a window of 100.
// The shares' config is now refused until the ledger's grants have ended;
// then a and b leave the ledger for the shares, and the three split the
// limit with no window over.
//
// The ledger is emptied with the shares' config: its head stays, with
// its publish numbers and its eras' floors past the old grants.
func TestLedgerRecreatedAsSharesBesideLiveGrants(t *testing.T) {
	const w = itWindow
	srv := etcdtest.Start(t)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	server := "--server=" + r.url()
	set := []string{"set", "api", "--limit", "100", "--window", w.String(), "--fail-static", "1s", server}

	itCLI(t, append(set, "--coordination", "ledger")...)
	var alog, blog, clog logbuf.Buffer
	a := joinAPI(t, itClient(t, srv), "a", &alog)
	b := joinAPI(t, itClient(t, srv), "b", &blog)
	c := newAdmitCounter(t, w)
	c.take(a, nil)
	c.take(b, nil)
	itWait(t, "a and b at 50 each from the ledger", func() (bool, string) {
		sum, why := quotas(a, b)
		return sum == 100 && a.Limiter().Stats().Quota == 50, why
	})

	itCLI(t, "delete", "api", server)
	deleted := time.Now()
	accepted := setUntilAccepted(t, "grants room until", append(set, "--coordination", "shares")...)
	t.Logf("the shares' config accepted once the ledger's grants ended, at %s", accepted.Format("15:04:05.000"))
	st, headMod, _, bad, err := ledgerstore.Read(ctxT(t), itClient(t, srv), ledger.Keys(itKeys.Ledger("api")))
	if err != nil || len(bad) > 0 {
		t.Fatalf("reading the ledger: %v %v", err, bad)
	}
	if headMod == 0 || st.Head.Pubs == 0 || len(st.Pubs)+len(st.Grants)+len(st.Releases) > 0 {
		t.Errorf("the ledger after the shares' config: head at revision %d numbering %d publishes, %d publishes, %d grants, %d releases; want only the head, its numbers kept", headMod, st.Head.Pubs, len(st.Pubs), len(st.Grants), len(st.Releases))
	}
	for _, e := range st.Head.Eras {
		// The grants ran past the deletion (a round extends them before
		// they end), so the floors, raised past their end, are too.
		if at := time.Unix(0, ledger.StartOf(e.Floor, e.Window)); at.Before(deleted) {
			t.Errorf("era %d's floor at %s, before the provider was deleted at %s: back on the ledger it may grant where the old grants were used", e.Seq, at.Format("15:04:05.000"), deleted.Format("15:04:05.000"))
		}
	}
	cm := joinAPI(t, itClient(t, srv), "c", &clog)
	c.take(cm, nil)
	itWait(t, "a, b and c on the shares' split", func() (bool, string) {
		sum, why := quotas(a, b, cm)
		ok := sum == 100
		for _, m := range []*cluster.Member{a, b, cm} {
			ok = ok && m.Status().Source == "shares" && m.Limiter().Stats().Quota > 0
		}
		return ok, why
	})
	c.runFor(t, 10)
	c.halt()
	t.Logf("fullest window: %d of 100", c.over(t, 100))
}

// TestSharesRecreatedAsLedgerBesideCutOffShare: a provider of 100/100ms on
// the shares has a and b at 50 each, both taking all they can. b is cut
// off from etcd: it keeps its 50 until its lease's end and the
// fail_static past it. The provider is deleted and created again on the
// ledger. Before the fix a, the only holder, was granted the whole 100
// beside b's 50: 150 in a window of 100 (and with b only slow, not cut
// off, the same in the window under way). The ledger's config is now
// refused while share records remain, which configd keeps until no
// instance they name may enforce them: here once a has left and b's hold
// has ended, after b's limiter stopped admitting.
func TestSharesRecreatedAsLedgerBesideCutOffShare(t *testing.T) {
	const w = itWindow
	srv := etcdtest.Start(t)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	server := "--server=" + r.url()
	set := []string{"set", "api", "--limit", "100", "--window", w.String(), "--fail-static", "1s", server}
	itCLI(t, append(set, "--coordination", "shares")...)

	var alog, blog, dlog logbuf.Buffer
	a := joinAPI(t, itClient(t, srv), "a", &alog)
	px := netcut.StartProxy(t, strings.TrimPrefix(srv.Endpoints()[0], "http://"))
	bcli, err := clientv3.New(clientv3.Config{Endpoints: []string{px.URL()}, DialTimeout: time.Second, Logger: zap.NewNop(), DialOptions: cluster.DialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bcli.Close() })
	b := joinAPI(t, bcli, "b", &blog)
	c := newAdmitCounter(t, w)
	c.take(a, nil)
	c.take(b, nil)
	itWait(t, "a and b on shares of 50", func() (bool, string) {
		sum, why := quotas(a, b)
		return sum == 100 && a.Limiter().Stats().Quota == 50 && a.Status().Source == "shares" && b.Status().Source == "shares", why
	})

	px.Cut()
	itCLI(t, "delete", "api", server)
	ledger := append(set, "--coordination", "ledger")
	ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
	err = run(ctx, ledger, &strings.Builder{}, &strings.Builder{})
	cancel()
	if !errors.Is(err, ErrRecordsLeft) && (err == nil || !strings.Contains(err.Error(), "share records")) {
		t.Fatalf("the ledger's config with a and b on their shares: %v, want it refused for the share records", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	accepted := setUntilAccepted(t, "share records", ledger...)
	until := b.Status().AdmitsUntil
	t.Logf("the ledger's config accepted at %s; cut-off b admitted until %s", accepted.Format("15:04:05.000"), until.Format("15:04:05.000"))
	if accepted.Before(until) {
		t.Errorf("the ledger's config accepted at %s, before cut-off b stopped admitting at %s", accepted.Format("15:04:05.000"), until.Format("15:04:05.000"))
	}
	d := joinAPI(t, itClient(t, srv), "d", &dlog)
	c.take(d, nil)
	itWait(t, "d on the ledger's whole limit", func() (bool, string) {
		sum, why := quotas(d)
		return sum == 100 && d.Status().Source == "ledger", why
	})
	c.runFor(t, 10)
	c.halt()
	t.Logf("fullest window: %d of 100", c.over(t, 100))
}

// TestEvenSplitRecreatedAsLedger: a provider of 100/100ms on the shares,
// written straight to etcd, while no configd runs: a and b enforce the
// even split, 50 each, which no share record holds (only their even
// marks, on their leases). b is cut off from etcd: it keeps its 50 for
// its fail_static past its last count. The provider is deleted and
// created again on the ledger: noShares found no share record and let
// it through, and configd granted a, the only holder, the whole 100
// beside b's 50: 150 in windows of 100 until b's fail_static ended. The
// ledger's config is now refused while an even mark is left, which b's
// lease holds past b's last admission.
// Created again on the shares (the control), configd's shares count b
// until its hold ends: 100.
func TestEvenSplitRecreatedAsLedger(t *testing.T) {
	for _, coord := range []string{"ledger", "shares"} {
		t.Run(coord, func(t *testing.T) { evenSplitRecreated(t, coord) })
	}
}

func evenSplitRecreated(t *testing.T, coord string) {
	const w = itWindow
	srv := etcdtest.Start(t)
	direct := "--etcd-endpoints=" + strings.Join(srv.Endpoints(), ",")
	set := []string{"set", "api", "--limit", "100", "--window", w.String(), "--fail-static", "5s", direct}
	itCLI(t, append(set, "--coordination", "shares")...)

	var alog, blog logbuf.Buffer
	a := joinAPI(t, itClient(t, srv), "a", &alog)
	px := netcut.StartProxy(t, strings.TrimPrefix(srv.Endpoints()[0], "http://"))
	bcli, err := clientv3.New(clientv3.Config{Endpoints: []string{px.URL()}, DialTimeout: time.Second, Logger: zap.NewNop(), DialOptions: cluster.DialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bcli.Close() })
	b := joinAPI(t, bcli, "b", &blog, cluster.WithLeaseTTL(10*time.Second))
	itWait(t, "a and b on the even split, 50 each", func() (bool, string) {
		sum, why := quotas(a, b)
		return sum == 100 && a.Limiter().Stats().Quota == 50 && a.Status().Source == "even" && b.Status().Source == "even", why
	})
	c := newAdmitCounter(t, w)
	c.take(a, nil)
	c.take(b, nil)
	c.runFor(t, 5)

	px.Cut()
	t.Logf("b cut off at %s; admits until %s", time.Now().Format("15:04:05.000"), b.Status().AdmitsUntil.Format("15:04:05.000"))
	itCLI(t, "delete", "api", direct)
	accepted := time.Now()
	if coord == "ledger" {
		accepted = setUntilAccepted(t, "on the even split", append(set, "--coordination", coord)...)
		if until := b.Status().AdmitsUntil; accepted.Before(until) {
			t.Errorf("the ledger's config accepted at %s, before cut-off b stopped admitting at %s", accepted.Format("15:04:05.000"), until.Format("15:04:05.000"))
		}
	} else {
		itCLI(t, append(set, "--coordination", coord)...)
	}
	t.Logf("the config accepted at %s", accepted.Format("15:04:05.000"))
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	itWait(t, "a on configd's", func() (bool, string) {
		sum, why := quotas(a)
		return sum > 0 && a.Status().Source == map[string]string{"ledger": "ledger", "shares": "shares"}[coord], why
	})
	t.Logf("a on configd's %d", a.Limiter().Stats().Quota)
	t.Logf("a on configd's at %s; b: %d (%s)", time.Now().Format("15:04:05.000"), b.Limiter().Stats().Quota, b.Status().Source)
	time.Sleep(time.Until(b.Status().AdmitsUntil) + 5*w)
	c.halt()
	t.Logf("fullest window: %d of 100", c.over(t, 100))
}

// joinGroup joins provider api with JoinProvider over cli, as joinAPI
// does a lone Member.
func joinGroup(t *testing.T, cli *clientv3.Client, id string, log *logbuf.Buffer) *cluster.Group {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
	defer cancel()
	g, err := cluster.JoinProvider(ctx, cli, "api", cluster.WithID(id), cluster.WithLeaseTTL(time.Second), cluster.WithReportInterval(100*time.Millisecond),
		cluster.WithFallback(0, 100*time.Millisecond), cluster.WithLogger(slog.New(slog.NewTextHandler(log, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// TestLaneAddedBesideItsLedgerGrants: provider api on the ledger with two
// limits, 100/100ms and 200/5s (lane api~1, whose ledger grants reach 4
// windows of 5s ahead, the first limit's 100 windows of 100ms: its
// fail_static of 10s). a and b join it with JoinProvider; b's lane holds
// 100 of the 200. api is deleted, and created again on the shares with
// the first limit alone once its ledger's grants ended (10s); api~1's
// still run for 10s more. b, now on the shares' 50 of the first limit,
// is cut off from etcd: it keeps that share its fail_static past its
// lease, and its lane's grants. The second limit is set again: lane 1
// comes back on the shares, and as the provider exists (old != nil) the
// write checked nothing of api~1's ledger: a, the only instance of api~1
// alive, took the whole 200 beside b's 100 under its grant, 300 in a
// window of 200. The write now checks every lane it brings that the
// stored config has not: refused until api~1's grants ended.
func TestLaneAddedBesideItsLedgerGrants(t *testing.T) {
	const lw = 5 * time.Second
	srv := etcdtest.Start(t)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	server := "--server=" + r.url()
	one := []string{"set", "api", "--limit", "100/100ms", "--fail-static", "10s", server}
	two := []string{"set", "api", "--limit", "100/100ms", "--limit", "200/5s", "--fail-static", "10s", server}
	itCLI(t, append(two, "--coordination", "ledger")...)

	var alog, blog logbuf.Buffer
	a := joinGroup(t, itClient(t, srv), "a", &alog)
	px := netcut.StartProxy(t, strings.TrimPrefix(srv.Endpoints()[0], "http://"))
	bcli, err := clientv3.New(clientv3.Config{Endpoints: []string{px.URL()}, DialTimeout: time.Second, Logger: zap.NewNop(), DialOptions: cluster.DialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bcli.Close() })
	b := joinGroup(t, bcli, "b", &blog)
	lane := func(g *cluster.Group) *cluster.Member { return g.Members()[1] }
	first := func(g *cluster.Group) *cluster.Member { return g.Members()[0] }
	if len(a.Members()) != 2 || len(b.Members()) != 2 {
		t.Fatalf("a has %d lanes, b %d; want 2", len(a.Members()), len(b.Members()))
	}
	itWait(t, "a and b at 100 each of the lane's ledger", func() (bool, string) {
		sum, why := quotas(lane(a), lane(b))
		return sum == 200 && lane(b).Limiter().Stats().Quota == 100 && lane(b).Status().Source == "ledger", why
	})

	// Admissions of both limits per aligned window of the lane's, true time.
	var mu sync.Mutex
	n := map[int64]map[string]int64{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, g := range []*cluster.Group{a, b} {
		id := first(g).ID()
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if _, ok := g.Multi().TryAcquire(); ok {
					k := time.Now().UnixNano() / int64(lw)
					mu.Lock()
					if n[k] == nil {
						n[k] = map[string]int64{}
					}
					n[k][id]++
					mu.Unlock()
				} else {
					time.Sleep(200 * time.Microsecond)
				}
			}
		})
	}
	halt := sync.OnceFunc(func() { close(done); wg.Wait() })
	t.Cleanup(halt)

	itCLI(t, "delete", "api", server)
	t.Logf("deleted at %s", time.Now().Format("15:04:05.000"))
	accepted := setUntilAccepted(t, "grants room until", append(one, "--coordination", "shares")...)
	t.Logf("api on the shares, first limit alone, at %s", accepted.Format("15:04:05.000"))
	itWait(t, "a's and b's first limits on the shares", func() (bool, string) {
		sum, why := quotas(first(a), first(b))
		return sum == 100 && first(a).Status().Source == "shares" && first(b).Status().Source == "shares" && first(b).Limiter().Stats().Quota > 0, why
	})
	px.Cut()
	t.Logf("b cut off at %s: first limit %d until %s, lane %d (%s) until %s", time.Now().Format("15:04:05.000"),
		first(b).Limiter().Stats().Quota, first(b).Status().AdmitsUntil.Format("15:04:05.000"),
		lane(b).Limiter().Stats().Quota, lane(b).Status().Source, lane(b).Limiter().Expiry().Format("15:04:05.000"))
	cli := itClient(t, srv)
	itWait(t, "b's instance records gone with its leases", func() (bool, string) {
		var n int64
		for _, name := range []string{"api", schema.LaneName("api", 1)} {
			resp, err := cli.Get(context.Background(), itKeys.Instance(name, "b"), clientv3.WithCountOnly())
			if err != nil {
				return false, err.Error()
			}
			n += resp.Count
		}
		return n == 0, fmt.Sprintf("%d records", n)
	})
	until := lane(b).Limiter().Expiry()
	again := setUntilAccepted(t, "grants room until", two...)
	t.Logf("the second limit set again (on the shares) at %s", again.Format("15:04:05.000"))
	if again.Before(until) {
		t.Errorf("the second limit set again at %s, before cut-off b's lane stopped admitting at %s", again.Format("15:04:05.000"), until.Format("15:04:05.000"))
	}
	itWait(t, "a's lane on the shares' 200", func() (bool, string) {
		sum, why := quotas(lane(a))
		return sum == 200 && lane(a).Status().Source == "shares", why
	})
	t.Logf("a's lane on the shares' 200 at %s", time.Now().Format("15:04:05.000"))
	time.Sleep(time.Until(until) + 2*lw)
	halt()
	mu.Lock()
	defer mu.Unlock()
	worst := int64(0)
	for _, k := range slices.Sorted(maps.Keys(n)) {
		var sum int64
		for _, v := range n[k] {
			sum += v
		}
		worst = max(worst, sum)
		if sum > 200 {
			t.Errorf("window %s: admitted %d in a window of 200: %v", time.Unix(0, k*int64(lw)).Format("15:04:05.000"), sum, n[k])
		}
	}
	t.Logf("fullest window: %d of 200", worst)
}

// TestLedgerMemberCutOffAcrossTheSharesReturns: a provider of 100/100ms on
// the ledger; a and b at 50 each. It is deleted, b is cut off from etcd,
// and the provider is created again on the shares once the ledger's
// grants ended. a sees the config and goes to the shares; b's ledger
// session ended with its lease, and the one it starts when etcd is back
// watches the config from then on: the config that names the shares was
// written before, and b stays on the Follower of a ledger configd
// deleted, admitting nothing for good while configd counts it a share.
func TestLedgerMemberCutOffAcrossTheSharesReturns(t *testing.T) {
	const w = itWindow
	srv := etcdtest.Start(t)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	server := "--server=" + r.url()
	set := []string{"set", "api", "--limit", "100", "--window", w.String(), "--fail-static", "1s", server}
	itCLI(t, append(set, "--coordination", "ledger")...)

	var alog, blog logbuf.Buffer
	a := joinAPI(t, itClient(t, srv), "a", &alog)
	px := netcut.StartProxy(t, strings.TrimPrefix(srv.Endpoints()[0], "http://"))
	bcli, err := clientv3.New(clientv3.Config{Endpoints: []string{px.URL()}, DialTimeout: time.Second, Logger: zap.NewNop(), DialOptions: cluster.DialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bcli.Close() })
	b := joinAPI(t, bcli, "b", &blog)
	itWait(t, "a and b at 50 each from the ledger", func() (bool, string) {
		sum, why := quotas(a, b)
		return sum == 100 && a.Limiter().Stats().Quota == 50, why
	})
	itCLI(t, "delete", "api", server)
	px.Cut()
	accepted := setUntilAccepted(t, "grants room until", append(set, "--coordination", "shares")...)
	t.Logf("the shares' config accepted at %s", accepted.Format("15:04:05.000"))
	itWait(t, "b's ledger session ended with its lease", func() (bool, string) {
		st := b.Status()
		return !st.Connected, st.LastError
	})
	if !strings.Contains(blog.String(), `msg="etcd unreachable; keeping its grants (fail-static)"`) {
		t.Errorf("b's log does not say it is keeping its grants:\n%s", blog.String())
	}
	px.Heal()
	t.Logf("b back at %s", time.Now().Format("15:04:05.000"))
	itWait(t, "b on the shares", func() (bool, string) {
		sum, why := quotas(a, b)
		return sum == 100 && b.Status().Source == "shares" && b.Limiter().Stats().Quota > 0, why
	})
}
