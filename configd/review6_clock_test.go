package main

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/internal/ntptest"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/cluster"
	"github.com/sluice-go/sluice/limiter/skew"
)

// r6Behind is a clock running d behind the system's (true time here).
type r6Behind struct{ d time.Duration }

func (c r6Behind) Now() time.Time { return time.Now().Add(-c.d) }

// TestLedgerMemberIgnoresItsClockMonitor: a provider of 100/100ms; a's
// clock is right, b's runs 60ms behind, and b measures it with NTP
// (cluster.WithClockMonitor, the server on true time), which under
// shares moves b's window boundaries onto true time (the "shares" subtest,
// the control). Under the ledger, apply returns before clockCut, the only
// place the measured offset and guard band reach the limiter, so b's
// windows stay 60ms late: b idles in odd windows and takes in even ones
// from 5ms to 95ms, which spans the tail of its window k-1 (unused) and
// the head of its window k, 50 each; with a's 50, 150 in a true window of
// 100.
func TestLedgerMemberIgnoresItsClockMonitor(t *testing.T) {
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
			behind := r6Behind{60 * time.Millisecond}
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
				sum, why := r6Quota(a, b)
				return sum == 100 && a.Limiter().Stats().Quota == 50, why
			})
			time.Sleep(500 * time.Millisecond) // the monitor's measurements in
			t.Logf("b's limiter clock offset %v, uncertainty known %v", b.Limiter().ClockOffset(), b.Status().ClockKnown)

			c := newR6Counter(t, w)
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
