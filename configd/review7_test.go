package main

import (
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
	itCLI(t, set...)

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
	time.Sleep(5 * w)

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
