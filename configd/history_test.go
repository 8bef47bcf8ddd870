package main

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// writeHistory writes history entries seq from..to of provider straight to
// etcd, as set does (key = sequence number), 100 per transaction.
func writeHistory(t testing.TB, cli *clientv3.Client, provider string, from, to int64) {
	t.Helper()
	var ops []clientv3.Op
	flush := func() {
		if _, err := cli.Txn(ctxT(t)).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
		ops = ops[:0]
	}
	for seq := from; seq <= to; seq++ {
		cfg := schema.ProviderConfig{Name: provider, Limit: seq}.WithDefaults()
		b, err := schema.Encode(schema.HistoryEntry{Provider: provider, Who: "test@host", When: time.Unix(0, seq).UTC(), New: &cfg})
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, clientv3.OpPut(keys.HistoryEntry(provider, seq), string(b)))
		if len(ops) == 100 {
			flush()
		}
	}
	if len(ops) > 0 {
		flush()
	}
}

// historyKeys returns the provider's history keys, oldest first.
func historyKeys(t testing.TB, cli *clientv3.Client, provider string) []string {
	t.Helper()
	resp, err := cli.Get(ctxT(t), keys.History(provider), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		out[i] = string(kv.Key)
	}
	return out
}

// TestListAndLoadWithLongHistory: list (through etcd and through the API)
// and the leader's initial load skip provider history, and are still
// exact with 5000 history entries in the way, providers whose names are
// prefixes of one another (their keys interleave), a deleted provider that
// only has history, and keys that belong to no provider.
func TestListAndLoadWithLongHistory(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := ctxT(t)
	direct := []string{"--etcd-endpoints", srv.Endpoints()[0]}
	limits := map[string]int64{"a": 1, "pay": 7, "pay-x": 8, "pay.x": 9, "pay0": 10}
	for name, limit := range limits {
		cliOK(t, append([]string{"set", name, "--coordination", "shares", "--limit", itoa(limit)}, direct...)...)
	}
	writeHistory(t, cli, "pay", 1, 5000)
	writeHistory(t, cli, "gone", 1, 20)
	addInstance(t, cli, "pay", "i-1")
	addInstance(t, cli, "pay", "i-2")
	for name := range limits {
		if name != "pay" {
			addInstance(t, cli, name, "i-1") // share records are written for live instances only
		}
	}
	for _, k := range []string{keys.Providers() + "stray", keys.Providers() + "BAD/config"} {
		if _, err := cli.Put(ctx, k, `{}`); err != nil {
			t.Fatal(err)
		}
	}
	check := func(mode string, conn []string) {
		t.Helper()
		var v listView
		if err := json.Unmarshal([]byte(cliOK(t, append([]string{"list", "--json"}, conn...)...)), &v); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range v.Providers {
			names = append(names, p.Config.Name)
			resp, err := cli.Get(ctx, keys.Config(p.Config.Name))
			if err != nil {
				t.Fatal(err)
			}
			if p.Config.Limit != limits[p.Config.Name] || len(resp.Kvs) == 0 || p.Revision != resp.Kvs[0].ModRevision {
				t.Errorf("%s: list shows %+v", mode, p)
			}
		}
		if want := []string{"a", "pay", "pay-x", "pay.x", "pay0"}; !slices.Equal(names, want) || len(v.Malformed) != 0 {
			t.Errorf("%s: list shows %v, malformed %v; want %v", mode, names, v.Malformed, want)
		}
	}
	check("etcd", direct)

	// The leader loads with the history in place: every provider's config
	// and pay's instances are seen.
	r := startReplica(t, srv, "r1")
	check("api", []string{"--server", r.url()})
	sh := waitShares(t, cli, "pay", "shares from the leader's load", func(s schema.Shares) bool { return s.Instances == 2 })
	if want := map[string]int64{"i-1": 4, "i-2": 3}; !maps.Equal(sh.Shares, want) || sh.Total != 7 {
		t.Errorf("pay's shares %v of %d, want %v of 7", sh.Shares, sh.Total, want)
	}
	for name, limit := range limits {
		waitShares(t, cli, name, name+"'s shares", func(s schema.Shares) bool { return s.Total == limit })
	}
}

// TestHistoryRetention: the leader keeps exactly the newest --history-keep
// entries of a provider: at its first load (5001 entries → 10) and as set
// adds more.
func TestHistoryRetention(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	const keep = 10
	cliOK(t, "set", "pay", "--coordination", "shares", "--limit", "100", "--etcd-endpoints", srv.Endpoints()[0])
	writeHistory(t, cli, "pay", 1, 5000) // older than set's entry, keyed by the time now
	addInstance(t, cli, "pay", "i-1")
	all := historyKeys(t, cli, "pay")
	if len(all) != 5001 {
		t.Fatalf("%d history entries written", len(all))
	}
	want := all[len(all)-keep:]

	r := startReplica(t, srv, "r1", "--history-keep", strconv.Itoa(keep))
	waitFor(t, 15*time.Second, "history pruned to the newest 10", func() bool { return slices.Equal(historyKeys(t, cli, "pay"), want) })
	waitShares(t, cli, "pay", "shares", func(s schema.Shares) bool { return s.Instances == 1 && s.Total == 100 })

	// Three more changes: three more entries, and the three oldest go.
	for limit := 101; limit <= 103; limit++ {
		cliOK(t, "set", "pay", "--limit", strconv.Itoa(limit), "--server", r.url())
	}
	var got []string
	waitFor(t, 15*time.Second, "history pruned to 10 again", func() bool {
		got = historyKeys(t, cli, "pay")
		return len(got) == keep && !slices.Contains(got, want[2])
	})
	if !slices.Equal(got[:keep-3], want[3:]) {
		t.Fatalf("kept %v, want %v and three new entries", got, want[3:])
	}
	var hist []schema.HistoryEntry
	if err := json.Unmarshal([]byte(cliOK(t, "history", "pay", "--json", "--server", r.url())), &hist); err != nil || len(hist) != keep {
		t.Fatalf("history: %d entries, %v", len(hist), err)
	}
	for i, h := range hist[keep-3:] {
		if h.New == nil || h.New.Limit != int64(101+i) {
			t.Errorf("history entry %d: %+v, want limit %d", keep-3+i, h.New, 101+i)
		}
	}
	// Still exactly 10 once the leader has seen every change, and each
	// deletion counted once.
	waitFor(t, 10*time.Second, "every deletion counted", func() bool {
		return r.metricValue(t, "configd_history_pruned_total") == strconv.Itoa(5001+3-keep)
	})
	if n := len(historyKeys(t, cli, "pay")); n != keep {
		t.Errorf("%d history entries, want %d", n, keep)
	}
}
