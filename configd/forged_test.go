package main

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// TestForgedRecordsNeverAboveTheLimit (issue 16): someone with write access
// to etcd forges every kind of record a provider has — shares records with
// impossible generations, totals over the limit, shares over the total,
// generations going back; configs that do not validate; instance records
// claiming absurd demand or acknowledgements of generations never
// published; history entries; the provider deleted and created again. No
// member ever enforces more than the provider's limit, and configd takes
// the key back with a record of its own, without a restart: once, a single
// forged generation of 2^63−1 made every publish fail until configd was
// restarted, and a share of 10^12 was enforced.
func TestForgedRecordsNeverAboveTheLimit(t *testing.T) {
	const limit = 1000
	srv := etcdtest.Start(t)
	cli := itClient(t, srv)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	itCLI(t, "set", "api", "--coordination", "shares", "--limit", "1000", "--window", itWindow.String(), "--server="+r.url())
	members := itJoin(t, srv, "api", "a", "b")
	even := func(sh schema.Shares) bool {
		return sh.Leader == "solo" && sh.Shares["a"] == limit/2 && sh.Shares["b"] == limit/2
	}
	itSettle(t, cli, "api", "the even split", even, members...)

	// Every member's quota is sampled all along: none may exceed the limit.
	stop := watchQuotas(t, limit, members)
	defer stop()

	put := func(key, value string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
		defer cancel()
		if _, err := cli.Put(ctx, key, value); err != nil {
			t.Fatal(err)
		}
	}
	forged := func(id string, gen, total, share int64) string {
		b, err := json.Marshal(map[string]any{
			"version": 1, "provider": "api", "instance": id, "generation": gen, "window": itWindow.String(),
			"effective_from": time.Now().Truncate(itWindow).UnixNano(), "total": total,
			"share": share, "granted": share, "config_revision": 1,
		})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	shareA, shareB := itKeys.Share("api", "a"), itKeys.Share("api", "b")
	for _, f := range []struct{ name, key, value string }{
		{"shares: generation 2^63−1, a share of 10^12", shareA, forged("a", math.MaxInt64, 1_000_000_000_000, 1_000_000_000_000)},
		{"shares: total over the limit", shareA, forged("a", 7, 1_000_000_000_000, 1_000_000_000_000)},
		{"shares: a share over the total", shareA, forged("a", 7, limit, limit+1)},
		{"shares: within the limit, generation 2^52", shareA, forged("a", 1<<52, limit, limit)},
		{"shares: within the limit, generation 1", shareB, forged("b", 1, limit, limit)},
		{"shares: another instance's record", shareA, forged("b", 9, limit, limit)},
		{"shares: a record for an instance that is not there", itKeys.Share("api", "ghost"), forged("ghost", 9, limit, limit)},
		{"shares: not JSON", shareA, "{"},
		{"config: a limit beyond the maximum", itKeys.Config("api"), `{"version":1,"name":"api","limit":1000000000000000,"window":"100ms","mode":"enforce","algorithm":"even"}`},
		{"config: another provider's name", itKeys.Config("api"), `{"version":1,"name":"other","limit":5000,"window":"100ms","mode":"enforce","algorithm":"even"}`},
		{"instance: absurd demand, a generation never published", itKeys.Instance("api", "b"), `{"version":1,"id":"b","demand":1000000000000,"applied_generation":9000000000000000,"applied_from":1}`},
		{"history: a forged entry", itKeys.History("api") + "/99999999999999999999", `{"version":1,"provider":"api","who":"forger","when":"2026-01-01T00:00:00Z","new":{"version":1,"name":"api","limit":5000,"window":"100ms","mode":"enforce","algorithm":"even"}}`},
	} {
		put(f.key, f.value)
		// configd publishes over a forged shares record, and the members
		// come back to its split, without a restart. A forged config is
		// ignored (the last good one stays); a forged instance record is
		// replaced by the member's own within a report interval.
		itSettle(t, cli, "api", f.name+": configd's even split again", func(sh schema.Shares) bool {
			return even(sh) && sh.Total == limit
		}, members...)
	}

	// Deleted and created again with a forged record in between: the
	// members get shares again.
	itCLI(t, "delete", "api", "--server="+r.url())
	put(shareA, forged("a", 1<<40, limit, limit))
	itCLI(t, "set", "api", "--coordination", "shares", "--limit", "1000", "--window", itWindow.String(), "--server="+r.url())
	itSettle(t, cli, "api", "after delete and create: configd's even split again", even, members...)
	if !strings.Contains(r.log.String(), "share record written by someone else") {
		t.Error("configd did not say it published over a record written by someone else")
	}
}

// watchQuotas samples every member's quota every few milliseconds until the
// returned stop is called, and fails the test if any is ever above limit.
func watchQuotas(t *testing.T, limit int64, members []*cluster.Member) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, m := range members {
				if q := m.Limiter().Stats().Quota; q > limit {
					t.Errorf("%s enforces a quota of %d, over the limit %d", m.ID(), q, limit)
					return
				}
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
