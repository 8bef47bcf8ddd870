package main

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// TestLedgerJoinerKeepsItsFallback: a provider of 100/100ms exists; a
// alone holds the whole 100. b joins with WithFallback(100, 1s), which
// the package says applies only while the config cannot be read or
// before the provider is configured. b reads the config at once, but
// apply returns early for a ledger config: its limiter stays on the
// fallback New gave it, and the Follower's first schedule (a step of
// 0 in windows of 100ms, another length) takes effect only at the end of
// the 1s fallback window under way. b takes its 100 beside a's 100. Under
// shares (the control) a new source takes the smaller quota at once: 0.
func TestLedgerJoinerKeepsItsFallback(t *testing.T) {
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
				sum, why := r6Quota(a)
				return sum == 100, why
			})
			c := newR6Counter(t, w)
			c.take(a, nil)
			time.Sleep(3 * w)
			b := joinAPI(t, itClient(t, srv), "b", &blog, cluster.WithFallback(100, time.Second))
			c.take(b, nil)
			time.Sleep(1500 * time.Millisecond)
			c.halt()
			worst := c.over(t, 100)
			sum, why := r6Quota(a, b)
			t.Logf("fullest window: %d of 100; now %d: %s", worst, sum, why)
		})
	}
}
