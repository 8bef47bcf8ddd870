package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// TestSetSeveralLimits: --limit given several times gives a provider
// several limits. Each further limit is a lane provider configd writes
// with the config, in the same transaction; a limit changed keeps its
// lane, one removed is retired (no bound, never deleted while the
// provider lives), one given again takes its lane back, and deleting the
// provider deletes its lanes.
func TestSetSeveralLimits(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	cli := srv.Client(t)
	keys := schema.DefaultKeys()
	lane := func(n int) (schema.ProviderConfig, int64, bool) {
		t.Helper()
		resp, err := cli.Get(context.Background(), keys.Config(schema.LaneName("llm", n)))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return schema.ProviderConfig{}, 0, false
		}
		c, err := schema.DecodeProviderConfig(resp.Kvs[0].Value)
		if err != nil {
			t.Fatalf("lane %d: %v", n, err)
		}
		return c, resp.Kvs[0].ModRevision, true
	}

	out := cliOK(t, "set", "llm", "--limit", "500/1m", "--limit", "tokens=200000/1m", "--limit", "50000/1h", "--server", r.url())
	if !strings.Contains(out, "more_limits=tokens=200000/1m,50000/1h") {
		t.Errorf("set: %s", out)
	}
	tokens, tokensRev, ok := lane(1)
	if !ok || tokens.Of != "llm" || tokens.Dimension != "tokens" || tokens.Limit != 200000 || tokens.Window.D().String() != "1m0s" {
		t.Fatalf("lane 1: %+v (exists %v), want tokens 200000/1m of llm", tokens, ok)
	}
	if hourly, _, ok := lane(2); !ok || hourly.Dimension != "" || hourly.Limit != 50000 {
		t.Fatalf("lane 2: %+v (exists %v), want requests 50000/1h", hourly, ok)
	}
	get := cliOK(t, "get", "llm", "--server", r.url())
	if m := regexp.MustCompile(`(?m)^more_limits:\s+(\S+)$`).FindStringSubmatch(get); m == nil || m[1] != "tokens=200000/1m,50000/1h" {
		t.Errorf("get:\n%s", get)
	}
	status := cliOK(t, "status", "llm", "--server", r.url())
	for _, want := range []string{"limit 2 of llm", "provider:  llm~1", "limit 3 of llm", "provider:  llm~2"} {
		if !strings.Contains(status, want) {
			t.Errorf("status lacks %q:\n%s", want, status)
		}
	}
	if list := cliOK(t, "list", "--server", r.url()); strings.Contains(list, "llm~") || !strings.Contains(list, "tokens=200000/1m,50000/1h") {
		t.Errorf("list shows lane providers, or not the further limits:\n%s", list)
	}

	// The hourly limit changes: its lane keeps its number; the tokens
	// lane, unchanged, is not written again (a new revision would make
	// its shares stale until the leader publishes again).
	cliOK(t, "set", "llm", "--limit", "500/1m", "--limit", "tokens=200000/1m", "--limit", "40000/1h", "--server", r.url())
	if hourly, _, _ := lane(2); hourly.Limit != 40000 {
		t.Errorf("lane 2 after the change: %+v, want 40000", hourly)
	}
	if _, rev, _ := lane(1); rev != tokensRev {
		t.Errorf("the unchanged tokens lane was written again: revision %d → %d", tokensRev, rev)
	}

	// A lone --limit changes the first limit only.
	cliOK(t, "set", "llm", "--limit", "600", "--server", r.url())
	if m := regexp.MustCompile(`(?m)^more_limits:\s+(\S+)$`).FindStringSubmatch(cliOK(t, "get", "llm", "--server", r.url())); m == nil || m[1] != "tokens=200000/1m,40000/1h" {
		t.Errorf("a lone --limit changed the further limits")
	}

	// Removed: retired, without bound, still there.
	out = cliOK(t, "set", "llm", "--limit", "600/1m", "--limit", "40000/1h", "--server", r.url())
	if !strings.Contains(out, "more_limits tokens=200000/1m,40000/1h → 40000/1h") {
		t.Errorf("set without tokens: %s", out)
	}
	if c, _, ok := lane(1); !ok || c.Limit != schema.MaxLimit || c.Dimension != "tokens" {
		t.Errorf("retired tokens lane: %+v (exists %v), want tokens without bound", c, ok)
	}
	// Given again: the same lane, bounded again; a new dimension takes a
	// number never used.
	cliOK(t, "set", "llm", "--limit", "600/1m", "--limit", "tokens=100000/1m", "--limit", "images=10/1s", "--server", r.url())
	if c, _, _ := lane(1); c.Limit != 100000 {
		t.Errorf("tokens given again: lane 1 %+v, want 100000", c)
	}
	if c, _, ok := lane(3); !ok || c.Dimension != "images" {
		t.Errorf("images: lane 3 %+v (exists %v)", c, ok)
	}
	if c, _, _ := lane(2); c.Limit != schema.MaxLimit {
		t.Errorf("the hourly limit no longer given: lane 2 %+v, want retired", c)
	}
	// --only with a lone --limit removes the others.
	cliOK(t, "set", "llm", "--limit", "600/1m", "--only", "--server", r.url())
	if get := cliOK(t, "get", "llm", "--server", r.url()); strings.Contains(get, "more_limits") {
		t.Errorf("after --only:\n%s", get)
	}
	hist := cliOK(t, "history", "llm", "--server", r.url())
	if !strings.Contains(hist, "more_limits") {
		t.Errorf("history does not show the further limits:\n%s", hist)
	}

	cliOK(t, "delete", "llm", "--server", r.url())
	for n := 1; n <= schema.MaxLanes; n++ {
		if c, _, ok := lane(n); ok {
			t.Errorf("lane %d left after the provider was deleted: %+v", n, c)
		}
	}
}

// TestSeveralLimitsEndToEnd: configd serve on its embedded etcd, closed
// as by default, and a provider of two limits set with the CLI; two
// instances join it with cluster.JoinProvider, with the instances'
// credentials, and each gets its published share of both limits (so each
// lane provider is led, published, and open to the instances' records).
func TestSeveralLimitsEndToEnd(t *testing.T) {
	dir := t.TempDir()
	clientURL, peerURL := "http://"+freeAddr(t), "http://"+freeAddr(t)
	r := startReplica(t, nil, "solo", "--data-dir", dir, "--embedded-client-url", clientURL, "--embedded-peer-url", peerURL)
	cliOK(t, "set", "llm", "--coordination", "shares", "--limit", "40/100ms", "--limit", "tokens=2000/1s", "--server", r.url())
	ctx := ctxT(t)
	inst := embeddedClient(t, clientURL, dir, instanceUser)
	var groups []*cluster.Group
	for _, id := range []string{"a", "b"} {
		// A lease of 5 s, as in TestEmbeddedEtcdIsClosed: 2 s leases
		// kept expiring on this embedded etcd under the race detector.
		g, err := cluster.JoinProvider(ctx, inst, "llm", cluster.WithID(id), cluster.WithLeaseTTL(5*time.Second),
			cluster.WithReportInterval(100*time.Millisecond), cluster.WithFallback(0, 100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		groups = append(groups, g)
	}
	for _, g := range groups {
		waitFor(t, 60*time.Second, "each instance's published share of both limits", func() bool {
			ms := g.Members()
			r, tk := ms[0].Status(), ms[1].Status()
			return r.Source == "shares" && r.Share == 20 && tk.Source == "shares" && tk.Share == 1000
		})
		if lims, st := g.Multi().Limits(), g.Members()[1].Status(); lims[1].Dimension != "tokens" || st.Window != time.Second {
			t.Errorf("limits %v, the second one's window %v: want tokens per 1s", lims, st.Window)
		}
	}
	status := cliOK(t, "status", "llm", "--server", r.url())
	if n := strings.Count(status, "shares:    generation"); n != 2 {
		t.Errorf("status shows %d published shares, want one per limit:\n%s", n, status)
	}
}

// TestPutSeveralLimitsThroughTheAPI: the admin API takes the further
// limits unnumbered, as an operator writes them, and numbers them; a name
// with '~' is refused, and so are two limits of one dimension and window.
func TestPutSeveralLimitsThroughTheAPI(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	host := r.addr
	code, _, body := hostRequest(t, "PUT", r.url()+"/v1/providers/llm", host, "",
		`{"limit":500,"window":"1m","lanes":[{"dimension":"tokens","limit":200000,"window":"1m"}]}`)
	if code != 200 || !strings.Contains(body, `"lane": 1`) {
		t.Fatalf("PUT: %d %s", code, body)
	}
	if get := cliOK(t, "get", "llm", "--server", r.url()); !strings.Contains(get, "tokens=200000/1m") {
		t.Errorf("get after PUT:\n%s", get)
	}
	// The same limits, tokens listed first: the first limit keeps
	// counting requests (the instances' first lane does), tokens its lane.
	if code, _, body := hostRequest(t, "PUT", r.url()+"/v1/providers/llm", host, "",
		`{"dimension":"tokens","limit":200000,"window":"1m","lanes":[{"limit":500,"window":"1m"}]}`); code != 200 || !strings.Contains(body, `"lane": 1`) || !strings.Contains(body, `"limit": 500,`) {
		t.Errorf("PUT with tokens first: %d %s", code, body)
	}
	for _, c := range []struct{ path, body, want string }{
		{"/v1/providers/llm~1", `{"limit":5}`, "a lane configd keeps"},
		{"/v1/providers/llm", `{"limit":5,"window":"1s","lanes":[{"limit":6,"window":"1s"}]}`, "at most one limit per dimension and window"},
		{"/v1/providers/llm", `{"limit":5,"lanes":[{"lane":10,"limit":6,"window":"1m"}]}`, "lanes are numbered 1 to 9, each once"},
		{"/v1/providers/llm", `{"limit":5,"lanes":[{"limit":6,"window":"1m"},{"limit":7,"window":"1h"},{"dimension":"t","limit":8,"window":"1s"},{"dimension":"u","limit":9,"window":"1s"}]}`, "a provider enforces at most 4 limits together"},
	} {
		if code, _, body := hostRequest(t, "PUT", r.url()+c.path, host, "", c.body); code != 400 || !strings.Contains(body, c.want) {
			t.Errorf("PUT %s %s: %d %s, want 400 saying %q", c.path, c.body, code, body, c.want)
		}
	}
}

// TestSetOneOfSeveralLimits: a lone --limit changes the limit it names,
// by dimension and window; found by a new user, a lone --limit
// tokens=100000/1m turned the first limit, 600/1m, into tokens.
func TestSetOneOfSeveralLimits(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	more := func() string {
		t.Helper()
		m := regexp.MustCompile(`(?m)^more_limits:\s+(\S+)$`).FindStringSubmatch(cliOK(t, "get", "llm", "--server", r.url()))
		if m == nil {
			return ""
		}
		return m[1]
	}
	cliOK(t, "set", "llm", "--limit", "600/1m", "--limit", "tokens=150000/1m", "--limit", "50000/1h", "--server", r.url())
	for _, c := range []struct {
		limit, want, first string
	}{
		{"tokens=100000/1m", "tokens=100000/1m,50000/1h", "600"},
		{"tokens=90000", "tokens=90000/1m,50000/1h", "600"},
		{"40000/1h", "tokens=90000/1m,40000/1h", "600"},
		{"700", "tokens=90000/1m,40000/1h", "700"},
		{"800/1m", "tokens=90000/1m,40000/1h", "800"},
	} {
		cliOK(t, "set", "llm", "--limit", c.limit, "--server", r.url())
		m := regexp.MustCompile(`(?m)^limit:\s+(\S+)$`).FindStringSubmatch(cliOK(t, "get", "llm", "--server", r.url()))
		if got := more(); got != c.want || m == nil || m[1] != c.first {
			t.Errorf("after --limit %s: more_limits %s, first %v; want %s and %s", c.limit, got, m, c.want, c.first)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--limit", "images=5/1s"}, "the provider has no limit of images"},
		{[]string{"--only"}, "--only says the --limit flags given are all"},
	} {
		_, err := cliRun(t, append(append([]string{"set", "llm"}, c.args...), "--server", r.url())...)
		if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), c.want) {
			t.Errorf("set llm %v: %v, want exit 2 saying %q", c.args, err, c.want)
		}
	}
}

// TestSetADailyBudget: a further limit may have a window up to a day (a
// budget, which the instances take from its counter); the first limit of
// a new provider is the first one given that configd shares, and a
// provider of budgets alone is refused. A budget whose window changes is
// a new lane; status says what the instances took of it.
func TestSetADailyBudget(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	cliOK(t, "set", "llm", "--limit", "50000/24h", "--limit", "100/1s", "--server", r.url())
	get := cliOK(t, "get", "llm", "--server", r.url())
	if m := regexp.MustCompile(`(?m)^more_limits:\s+(\S+)$`).FindStringSubmatch(get); m == nil || m[1] != "50000/24h" || !strings.Contains(get, "window:") {
		t.Fatalf("get:\n%s", get)
	}
	inst := srv.Client(t)
	g, err := cluster.JoinProvider(context.Background(), inst, "llm", cluster.WithID("a"), cluster.WithLeaseTTL(2*time.Second),
		cluster.WithReportInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if lims := g.Multi().Limits(); len(lims) != 2 || lims[0].Window != time.Second || lims[1].Window != 24*time.Hour {
		t.Fatalf("limits %v, want 1s then 24h", lims)
	}
	if _, err := g.Multi().Acquire(context.Background(), 20*time.Second, limiter.Cost(limiter.Requests, 7)); err != nil {
		t.Fatal(err)
	}
	status := cliOK(t, "status", "llm", "--server", r.url())
	if m := regexp.MustCompile(`budget:\s+(\d+) of 50000 taken`).FindStringSubmatch(status); m == nil || len(m[1]) < 1 || m[1] == "0" || len(m[1]) == 1 && m[1] < "7" {
		t.Errorf("status does not say what was taken of the budget (at least 7):\n%s", status)
	}

	// Another window: another lane (the first retired), never the
	// first's, which counts a day's counter.
	cliOK(t, "set", "llm", "--limit", "100/1s", "--limit", "30000/12h", "--server", r.url())
	resp, err := inst.Get(context.Background(), schema.DefaultKeys().Config("llm"))
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("reading llm's config: %v", err)
	}
	c, err := schema.DecodeProviderConfig(resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Lanes) != 2 || !c.Lanes[0].Retired || c.Lanes[1].Lane != 2 || c.Lanes[1].Window.D() != 12*time.Hour {
		t.Errorf("lanes after the budget's window changed: %+v, want lane 1 retired and lane 2 of 12h", c.Lanes)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"set", "solo", "--limit", "50000/24h", "--limit", "tokens=9/24h"}, "a provider's first limit is shared by configd, up to 1h"},
		{[]string{"set", "solo", "--limit", "50000/24h"}, "only a further limit may have one up to 24h"},
		{[]string{"set", "solo", "--limit", "5/1s", "--limit", "50000/48h"}, "up to 24h for a further one, got 48h0m0s"},
	} {
		if _, err := cliRun(t, append(c.args, "--server", r.url())...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.args, err, c.want)
		}
	}
}
