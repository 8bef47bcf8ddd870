package main

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// configd's watch carries the configs and the instances' records, not the
// ledgers': at N members every publish brings N releases and the rounds'
// deletions, which held the configs back behind them for seconds.
func TestConfigdsWatchCarriesNoLedgerRecords(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	r := startReplica(t, srv, "r1")
	waitFor(t, 10*time.Second, "r1 leading", r.leading)
	events := func() float64 {
		v, err := strconv.ParseFloat(r.metricValue(t, "configd_watch_events_total"), 64)
		if err != nil {
			t.Fatalf("configd_watch_events_total: %v", err)
		}
		return v
	}
	before := events()
	keys := schema.DefaultKeys()
	const n = 200
	for i := range n / 100 {
		ops := make([]clientv3.Op, 100)
		for j := range ops {
			ops[j] = clientv3.OpPut(fmt.Sprintf("%srelease/h%d/%020d/1/0", keys.Ledger("other"), i*100+j, 1), "{}")
		}
		if _, err := cli.Txn(ctxT(t)).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// Written after the ledger's records: once configd has published
	// for them, its watch has delivered everything before.
	cliOK(t, "set", "pay", "--limit", "100", "--coordination", "shares", "--server", r.url())
	addInstance(t, cli, "pay", "i-a")
	waitShares(t, cli, "pay", "i-a's share", func(s schema.Shares) bool { return s.Shares["i-a"] == 100 })
	if got := events() - before; got >= n {
		t.Errorf("configd's watch received %.0f events for a config, an instance and %d ledger records: it carries the ledgers'", got, n)
	}
}
