package main

import (
	"strconv"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/ntptest"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestServeMeasuresItsClock: with --ntp-server, configd measures its
// clock with real SNTP exchanges (here against a local server 3 s ahead of
// this machine: configd's clock is then 3 s behind "true" time), reports
// the offset in its metrics, and reads window boundaries on the corrected
// clock: a publish takes effect from a boundary the margin ahead of true
// time, so that it reaches instances whose clocks are right before then.
func TestServeMeasuresItsClock(t *testing.T) {
	ntp, err := ntptest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer ntp.Close()
	ntp.SetOffset(3 * time.Second)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	r := startReplica(t, srv, "r1", "--ntp-server", ntp.Addr(), "--ntp-interval", "100ms")
	waitFor(t, 10*time.Second, "the clock measured", func() bool { return r.metricValue(t, "configd_clock_known") == "1" })
	off, err := strconv.ParseFloat(r.metricValue(t, "configd_clock_offset_seconds"), 64)
	if err != nil || off < 2.9 || off > 3.1 {
		t.Fatalf("configd_clock_offset_seconds = %v (%v), want about 3", off, err)
	}
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", "100", "--server", r.url())
	addInstance(t, cli, "pay", "i-a")
	sh := waitShares(t, cli, "pay", "a publish", func(s schema.Shares) bool { return s.Shares["i-a"] == 100 })
	truth := time.Now().Add(3 * time.Second) // the server's time, which configd's corrected clock follows
	if lead := sh.EffectiveTime().Sub(truth); lead < DefaultPropagationMargin-100*time.Millisecond {
		t.Errorf("effective from %v, only %v ahead of the corrected time: configd read boundaries on its raw clock", sh.EffectiveTime(), lead)
	}
}
