package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/logbuf"
)

// TestLedgerMembersStayOnLedgerAfterRecreateAsShares: after the
// provider above is created again as shares, a and b never leave the
// ledger's Follower: once their grants end they admit nothing for good,
// while configd's shares name them.
func TestLedgerMembersStayOnLedgerAfterRecreateAsShares(t *testing.T) {
	const w = itWindow
	srv := etcdtest.Start(t)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	server := "--server=" + r.url()

	itCLI(t, "set", "api", "--limit", "100", "--window", w.String(), "--fail-static", "1s", "--coordination", "ledger", server)
	var alog logbuf.Buffer
	a := joinAPI(t, itClient(t, srv), "a", &alog)
	itWait(t, "a at 100 from the ledger", func() (bool, string) {
		return a.Limiter().Stats().Quota == 100, fmt.Sprintf("%+v", a.Status())
	})
	itCLI(t, "delete", "api", server)
	itCLI(t, "set", "api", "--limit", "100", "--window", w.String(), "--fail-static", "1s", server)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if st := a.Status(); st.Source == "shares" && a.Limiter().Stats().Quota > 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("5s after the provider came back as shares of 100, a still %+v, its limiter at %d", a.Status(), a.Limiter().Stats().Quota)
}
