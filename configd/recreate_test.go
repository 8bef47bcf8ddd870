package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/internal/netcut"
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
	accepted := setUntilAccepted(t, "grants room until", set...)
	t.Logf("the shares' config accepted once the ledger's grants ended, at %s", accepted.Format("15:04:05.000"))
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
	itCLI(t, set...)

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
