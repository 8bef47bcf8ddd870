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

// TestSharesRecreatedAsLedgerInTheSameWindow: no partition. A provider of
// 100/1s coordinated by shares has a and b at 50 each, and both spend
// their 50 at the start of window k. b's link is slow (what etcd sends
// reaches it 300ms late). 150ms into window k the provider is deleted and
// created again, coordinated by the ledger. a switches first and is the
// only holder configd sees: the fresh ledger's era starts at window k, so
// a is granted the whole 100 for the window under way, of which its
// limiter has counted only its own 50. b's 50 of window k count nowhere.
// 150 in window k of 100. (The "shares" subtest is the control.)
func TestSharesRecreatedAsLedgerInTheSameWindow(t *testing.T) {
	for _, coord := range []string{"ledger", "shares"} {
		t.Run(coord, func(t *testing.T) {
			const w = time.Second
			srv := etcdtest.Start(t)
			r := itServe(t, srv, "solo")
			itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
			server := "--server=" + r.url()
			itCLI(t, "set", "api", "--limit", "100", "--window", w.String(), server)

			var alog, blog logbuf.Buffer
			a := joinAPI(t, itClient(t, srv), "a", &alog, cluster.WithFallback(0, w))
			px := netcut.StartProxy(t, strings.TrimPrefix(srv.Endpoints()[0], "http://"))
			bcli, err := clientv3.New(clientv3.Config{Endpoints: []string{px.URL()}, DialTimeout: time.Second, Logger: zap.NewNop(), DialOptions: cluster.DialOptions()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { bcli.Close() })
			b := joinAPI(t, bcli, "b", &blog, cluster.WithFallback(0, w))
			itWait(t, "a and b on shares of 50", func() (bool, string) {
				sum, why := r6Quota(a, b)
				return sum == 100 && a.Limiter().Stats().Quota == 50 && a.Status().Source == "shares" && b.Status().Source == "shares", why
			})
			c := newR6Counter(t, w)
			c.take(a, nil)
			c.take(b, nil)
			// 150ms into a window, both having spent their 50.
			now := time.Now()
			time.Sleep(now.Truncate(w).Add(w + 150*time.Millisecond).Sub(now))
			px.SetDelay(300 * time.Millisecond)
			itCLI(t, "delete", "api", server)
			args := []string{"set", "api", "--limit", "100", "--window", w.String(), server}
			if coord == "ledger" {
				args = append(args, "--coordination", "ledger")
			}
			itCLI(t, args...)
			time.Sleep(3 * w)
			c.halt()
			worst := c.over(t, 100)
			sum, why := r6Quota(a, b)
			t.Logf("fullest window: %d of 100; now %d: %s", worst, sum, why)
			if t.Failed() {
				t.Logf("a's log:\n%s\nb's log:\n%s", alog.String(), blog.String())
			}
		})
	}
}
