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

// TestSharesRecreatedAsLedgerBesideCutOffShare: a provider of 100/100ms
// coordinated by shares (fail_static 3s) has a and b at 50 each. b is
// cut off from etcd: it keeps its share of 50 until its lease's end and
// the fail_static past it (about 4s). The provider is deleted and created
// again, same limit, coordinated by the ledger. a switches to the ledger
// and, being the only holder, is granted the whole 100 from the window
// under way; the ledger knows nothing of the previous incarnation's
// shares, and configd's ledger rounds count no instance without a
// holder. Every window until b's share lapses admits 100 + 50.
//
// The "shares" subtest is the control: the same history, re-created as
// shares.
func TestSharesRecreatedAsLedgerBesideCutOffShare(t *testing.T) {
	for _, coord := range []string{"ledger", "shares"} {
		t.Run(coord, func(t *testing.T) {
			const w = itWindow
			srv := etcdtest.Start(t)
			r := itServe(t, srv, "solo")
			itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
			server := "--server=" + r.url()
			itCLI(t, "set", "api", "--limit", "100", "--window", w.String(), "--fail-static", "3s", server)

			var alog, blog logbuf.Buffer
			a := joinAPI(t, itClient(t, srv), "a", &alog)
			px := netcut.StartProxy(t, strings.TrimPrefix(srv.Endpoints()[0], "http://"))
			bcli, err := clientv3.New(clientv3.Config{Endpoints: []string{px.URL()}, DialTimeout: time.Second, Logger: zap.NewNop(), DialOptions: cluster.DialOptions()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { bcli.Close() })
			b := joinAPI(t, bcli, "b", &blog)
			c := newR6Counter(t, w)
			c.take(a, nil)
			c.take(b, nil)
			itWait(t, "a and b on shares of 50", func() (bool, string) {
				sum, why := r6Quota(a, b)
				return sum == 100 && a.Limiter().Stats().Quota == 50 && a.Status().Source == "shares" && b.Status().Source == "shares", why
			})

			px.Cut()
			itCLI(t, "delete", "api", server)
			args := []string{"set", "api", "--limit", "100", "--window", w.String(), "--fail-static", "3s", server}
			if coord == "ledger" {
				args = append(args, "--coordination", "ledger")
			}
			itCLI(t, args...)
			until := b.Status().AdmitsUntil
			t.Logf("b cut off on %d, admits until %s", b.Limiter().Stats().Quota, until.Format("15:04:05.000"))
			time.Sleep(time.Until(until) + 5*w)
			c.halt()
			worst := c.over(t, 100)
			sum, why := r6Quota(a, b)
			t.Logf("fullest window: %d of 100; now %d: %s", worst, sum, why)
			if t.Failed() {
				t.Logf("a: %+v\nb: %+v", a.Status(), b.Status())
			}
		})
	}
}
