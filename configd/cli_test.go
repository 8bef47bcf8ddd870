package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestCRUDSameThroughAPIAndEtcd runs the same set/get/list/history/status/
// delete sequence through the admin API and straight to etcd, on two
// providers, and checks that both paths print the same things.
func TestCRUDSameThroughAPIAndEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	modes := map[string][]string{
		"api":  {"--server", r.url()},
		"etcd": {"--etcd-endpoints", srv.Endpoints()[0]},
	}
	outputs := map[string][]string{}
	for mode, conn := range modes {
		name := "prov-" + mode
		c := func(args ...string) string {
			t.Helper()
			return cliOK(t, append(args, conn...)...)
		}
		var outs []string
		outs = append(outs, c("set", name, "--limit", "100"))
		outs = append(outs, c("set", name, "--limit", "200", "--window", "500ms", "--pacing"))
		outs = append(outs, c("set", name, "--limit", "200")) // unchanged
		outs = append(outs, c("set", name, "--limit", "300", "--mode", "shadow", "--dry-run"))
		outs = append(outs, c("get", name))
		outs = append(outs, c("get", name, "--json"))
		outs = append(outs, c("history", name))
		outs = append(outs, c("status", name))
		outs = append(outs, c("delete", name))
		_, err := cliRun(t, append([]string{"get", name}, conn...)...)
		if !errors.Is(err, ErrNotFound) || exitCode(err) != 1 {
			t.Errorf("%s: get after delete: %v (exit %d), want not found, exit 1", mode, err, exitCode(err))
		}
		outs = append(outs, c("history", name, "--json"))
		outputs[mode] = outs
	}
	// Normalise what legitimately differs: the name, revisions, times,
	// who (the API adds "via api@127.0.0.1"), the published shares line,
	// the ledger line, and which replica leads the provider: a replica
	// takes a new provider over a moment after it is created, and writes
	// its ledger's first era a moment after that, so status may be read
	// before either.
	norm := func(mode, s string) string {
		for _, r := range []struct{ re, with string }{
			{`prov-` + mode, "NAME"},
			{`\d{4}-\d\d-\d\dT[0-9:.]+Z`, "TIME"},
			{`(?m)^shares: .*$`, "shares: X"},
			{`(?m)^ledger: .*$`, "ledger: X"},
			{`(?m)^led by: .*$`, "led by: X"},
			{`"who": "[^"]*"`, `"who": WHO`},
			{`\S+@\S+( via api@127\.0\.0\.1)?`, "WHO"},
			{`\s+`, " "},
			{`("?revision"?:? ?)\d+`, "${1}N"},
			{`TIME WHO \d+`, "TIME WHO N"},
		} {
			s = regexp.MustCompile(r.re).ReplaceAllString(s, r.with)
		}
		return s
	}
	api, direct := outputs["api"], outputs["etcd"]
	for i := range api {
		a, d := norm("api", api[i]), norm("etcd", direct[i])
		if a != d {
			t.Errorf("step %d differs:\napi:  %s\netcd: %s", i, api[i], direct[i])
		}
	}
	if want := "NAME: limit 100 → 200, window 1s → 500ms, pacing false → true (revision N)"; !strings.Contains(norm("api", api[1]), want) {
		t.Errorf("set prints %q, want it to contain %q", api[1], want)
	}
	if !strings.Contains(api[2], "unchanged") {
		t.Errorf("repeated set prints %q, want unchanged", api[2])
	}
	if want := "dry run, nothing written: limit 200 → 300, mode enforce → shadow"; !strings.Contains(api[3], want) || !strings.Contains(api[4], "limit:            200") {
		t.Errorf("dry run printed %q and then get %q", api[3], api[4])
	}
	var hist []schema.HistoryEntry
	if err := json.Unmarshal([]byte(api[len(api)-1]), &hist); err != nil || len(hist) != 3 {
		t.Fatalf("history: %v, %d entries: %s", err, len(hist), api[len(api)-1])
	}
	if hist[0].Old != nil || hist[0].New.Limit != 100 || hist[1].New.Limit != 200 || hist[2].New != nil || hist[2].Old.Limit != 200 {
		t.Errorf("history entries: %+v", hist)
	}
	if !strings.Contains(hist[0].Who, " via api@127.0.0.1") {
		t.Errorf("history who = %q, want the caller recorded", hist[0].Who)
	}
	list := cliOK(t, "list", "--server", r.url())
	if strings.Contains(list, "prov-") {
		t.Errorf("list after deletes: %s", list)
	}
}

// TestBadInputCLI: every bad input gets exit code 2, one line of error,
// and writes nothing — through the API and straight to etcd alike.
func TestBadInputCLI(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	cli := srv.Client(t)
	cases := []struct {
		args []string
		want string // substring of the error
	}{
		{[]string{"set", "Bad", "--limit", "5"}, "name must match"},
		{[]string{"set", "a/b", "--limit", "5"}, "name must match"},
		{[]string{"set", "-x", "--limit", "5"}, "flag provided but not defined"},
		{[]string{"set", strings.Repeat("a", 129), "--limit", "5"}, "name must match"},
		{[]string{"set", "p", "--limit", "0"}, "limit must be a positive integer up to 1000000000000, got 0"},
		{[]string{"set", "p", "--limit", "-3"}, "limit must be a positive integer"},
		{[]string{"set", "p", "--limit", "1.5"}, `got "1.5"`},
		{[]string{"set", "p", "--limit", "abc"}, `got "abc"`},
		{[]string{"set", "p", "--limit", "10000000000000"}, "up to 1000000000000"},
		{[]string{"set", "p", "--limit", "5", "--window", "7s"}, "divides 24h (e.g. \"1s\", \"100ms\", \"1m\"; only a further limit may have one up to 24h), got 7s"},
		{[]string{"set", "p", "--limit", "5", "--window", "5ms"}, "from 10ms to 1h"},
		{[]string{"set", "p", "--limit", "5", "--window", "2h"}, "from 10ms to 1h"},
		{[]string{"set", "p", "--limit", "5", "--window", "soon"}, `got "soon"`},
		{[]string{"set", "p", "--limit", "5", "--mode", "loud"}, `mode must be "enforce" or "shadow"`},
		{[]string{"set", "p", "--limit", "5", "--algorithm", "magic"}, `algorithm must be "even" or "fair"`},
		{[]string{"set", "p", "--limit", "5", "--floor", "6"}, "floor must be"},
		{[]string{"set", "p", "--window", "1s"}, "--limit is required"},
		{[]string{"set", "p", "--limit", "5", "--class", "Critical"}, "class name must be 1 to 32 lower-case letters"},
		{[]string{"set", "p", "--limit", "5", "--class", "a=101%"}, `share of the limit from 0% to 100%`},
		{[]string{"set", "p", "--limit", "5", "--class", "a=1.5"}, `reserve must be a count of permits per window (e.g. 600) or a share`},
		{[]string{"set", "p", "--limit", "5", "--class", "a", "--class", "a"}, `"a" is listed twice`},
		{[]string{"set", "p", "--limit", "5", "--class", "a=3", "--class", "b=3"}, "reserves must add up to at most the limit"},
		{[]string{"set", "p", "--limit", "5", "--class", "a", "--no-classes"}, "--no-classes removes"},
		{[]string{"set", "p", "--limit", "5", "--class", "a", "--class", "b", "--class", "c", "--class", "d", "--class", "e", "--class", "f", "--class", "g", "--class", "h", "--class", "i"}, "at most 8 classes"},
		{[]string{"set", "p", "--limit", "5/7s"}, "divides 24h"},
		{[]string{"set", "p", "--limit", "5/"}, `window must be`},
		{[]string{"set", "p", "--limit", "/1s"}, `limit must be a positive integer`},
		{[]string{"set", "p", "--limit", "5/1s", "--window", "2s"}, "names window 1s, and --window says 2s"},
		{[]string{"set", "p", "--limit", "Tokens=200000/1m"}, "dimension must be 1 to 32 lower-case letters"},
		{[]string{"set", "p", "--limit", "100/1s", "--limit", "50000/1h", "--limit", "t=1/1s", "--limit", "u=1/1s", "--limit", "v=1/1s"}, "at most 4 limits"},
		{[]string{"set", "p", "--limit", "100/1s", "--limit", "200/1s"}, `at most one limit per dimension and window; keep the smaller, got "100/1s and 200/1s"`},
		{[]string{"set", "p~1", "--limit", "100/1s"}, "a lane configd keeps"},
		{[]string{"set", "p", "--limit", "100", "--limit", "tokens=5/1m", "--window", "2s"}, "--window applies to a lone --limit"},
		{[]string{"set", "p", "--limit", "5", "--if-revision", "-1"}, "--if-revision"},
		{[]string{"set", "p", "q", "--limit", "5"}, "exactly one provider NAME"},
		{[]string{"set", "--limit", "5"}, "exactly one provider NAME"},
		{[]string{"set", "p", "--limit", "5", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"get", "Bad"}, "name must match"},
		{[]string{"delete", "Bad"}, "name must match"},
		{[]string{"status", ""}, "name must match"},
		{[]string{"history"}, "exactly one provider NAME"},
		{[]string{"list", "extra"}, "takes no arguments"},
		{[]string{"audit", "Bad"}, "name must match"},
		{[]string{"audit", "p", "q"}, "exactly one provider NAME"},
		{[]string{"frobnicate"}, "unknown command"},
		{nil, "no command given"},
	}
	modes := map[string][]string{
		"api":  {"--server", r.url()},
		"etcd": {"--etcd-endpoints", srv.Endpoints()[0]},
	}
	for mode, conn := range modes {
		for _, tc := range cases {
			args := tc.args
			if len(args) > 0 && args[0] != "frobnicate" {
				args = append(append([]string{}, args...), conn...)
			}
			t.Run(mode+"/"+strings.Join(tc.args, "_"), func(t *testing.T) {
				_, err := cliRun(t, args...)
				if err == nil {
					t.Fatal("accepted")
				}
				if exitCode(err) != 2 {
					t.Errorf("exit code %d for %v, want 2", exitCode(err), err)
				}
				if msg := err.Error(); !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") {
					t.Errorf("error %q, want one line containing %q", msg, tc.want)
				}
			})
		}
	}
	resp, err := cli.Get(ctxT(t), keys.Providers(), withPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Errorf("bad input wrote %d keys, e.g. %s", len(resp.Kvs), resp.Kvs[0].Key)
	}
}

// TestConcurrentSetConflict: two writers that read the same revision race;
// exactly one wins and the other gets a conflict (exit code 1), through the
// API and straight to etcd.
func TestConcurrentSetConflict(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	cliOK(t, "set", "pay", "--limit", "100", "--server", r.url())
	var v providerView
	if err := json.Unmarshal([]byte(cliOK(t, "get", "pay", "--json", "--server", r.url())), &v); err != nil {
		t.Fatal(err)
	}
	rev := v.Revision
	for round := 0; round < 5; round++ {
		writers := [][]string{
			{"set", "pay", "--limit", itoa(int64(300 + round)), "--if-revision", itoa(rev), "--server", r.url()},
			{"set", "pay", "--limit", itoa(int64(400 + round)), "--if-revision", itoa(rev), "--etcd-endpoints", srv.Endpoints()[0]},
		}
		errs := make([]error, len(writers))
		var wg sync.WaitGroup
		for i, args := range writers {
			wg.Go(func() { _, errs[i] = cliRun(t, args...) })
		}
		wg.Wait()
		wins := 0
		for _, err := range errs {
			switch {
			case err == nil:
				wins++
			case errors.Is(err, ErrConflict):
				if exitCode(err) != 1 || !strings.Contains(err.Error(), "conflict") {
					t.Errorf("conflict error %q, exit %d", err, exitCode(err))
				}
			default:
				t.Errorf("unexpected error: %v", err)
			}
		}
		if wins != 1 {
			t.Fatalf("round %d: %d writers won, want exactly 1 (errors: %v)", round, wins, errs)
		}
		if err := json.Unmarshal([]byte(cliOK(t, "get", "pay", "--json", "--server", r.url())), &v); err != nil {
			t.Fatal(err)
		}
		rev = v.Revision
	}
	// A stale revision is a conflict; so is --if-revision 0 on an existing
	// provider.
	for _, args := range [][]string{
		{"set", "pay", "--limit", "5", "--if-revision", "1", "--server", r.url()},
		{"set", "pay", "--limit", "5", "--if-revision", "0", "--etcd-endpoints", srv.Endpoints()[0]},
		{"delete", "pay", "--if-revision", "1", "--server", r.url()},
	} {
		if _, err := cliRun(t, args...); !errors.Is(err, ErrConflict) {
			t.Errorf("%v: %v, want a conflict", args, err)
		}
	}
}

// TestHelp: every subcommand answers --help on stdout with its usage and
// exit code 0.
func TestHelp(t *testing.T) {
	for _, cmd := range []string{"serve", "set", "get", "list", "delete", "status", "history", "audit"} {
		out, err := cliRun(t, cmd, "--help")
		if err != nil || !strings.Contains(out, "Usage: configd "+cmd) || !strings.Contains(out, "-etcd-endpoints") {
			t.Errorf("%s --help: %v\n%s", cmd, err, out)
		}
	}
	out, err := cliRun(t, "help")
	if err != nil || !strings.Contains(out, "configd status") {
		t.Errorf("help: %v\n%s", err, out)
	}
}

// TestSetLimitPerWindow: --limit N/W sets the limit and the window at
// once, and agrees with a --window that says the same.
func TestSetLimitPerWindow(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	cliOK(t, "set", "p", "--limit", "5000/1m", "--server", r.url())
	cliOK(t, "set", "q", "--limit", "20/100ms", "--window", "100ms", "--server", r.url())
	for name, want := range map[string][2]string{"p": {"5000", "1m0s"}, "q": {"20", "100ms"}} {
		out := cliOK(t, "get", name, "--server", r.url())
		limit := regexp.MustCompile(`(?m)^limit:\s+(\S+)$`).FindStringSubmatch(out)
		window := regexp.MustCompile(`(?m)^window:\s+(\S+)$`).FindStringSubmatch(out)
		if limit == nil || window == nil || limit[1] != want[0] || window[1] != want[1] {
			t.Errorf("get %s: want limit %s, window %s:\n%s", name, want[0], want[1], out)
		}
	}
}

// TestSetDimension: --limit tokens=N/W makes a provider whose limit
// counts tokens, which get and status show; --limit N keeps it, and
// requests=N goes back to the default, which is not shown.
func TestSetDimension(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	out := cliOK(t, "set", "llm-tokens", "--limit", "tokens=200000/1m", "--server", r.url())
	if !strings.Contains(out, "dimension=tokens") {
		t.Errorf("set: %s", out)
	}
	dimension := func() string {
		m := regexp.MustCompile(`(?m)^dimension:\s+(\S+)$`).FindStringSubmatch(cliOK(t, "get", "llm-tokens", "--server", r.url()))
		if m == nil {
			return ""
		}
		return m[1]
	}
	if d := dimension(); d != "tokens" {
		t.Errorf("get: dimension %q, want tokens", d)
	}
	if out := cliOK(t, "status", "llm-tokens", "--server", r.url()); !strings.Contains(out, "dimension=tokens") {
		t.Errorf("status lacks dimension=tokens:\n%s", out)
	}
	cliOK(t, "set", "llm-tokens", "--limit", "300000", "--server", r.url())
	if d := dimension(); d != "tokens" {
		t.Errorf("after --limit 300000: dimension %q, want tokens kept", d)
	}
	out = cliOK(t, "set", "llm-tokens", "--limit", "requests=5", "--server", r.url())
	if !strings.Contains(out, "dimension tokens → requests") {
		t.Errorf("set requests=5: %s", out)
	}
	if d := dimension(); d != "" {
		t.Errorf("after requests=5: get shows dimension %q, want none (the default)", d)
	}
}

// TestSetClasses: --class gives a provider its classes in order, which
// set, get, status and history show as --class takes them, and the admin
// API takes and gives as JSON; --no-classes removes them.
func TestSetClasses(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	out := cliOK(t, "set", "api", "--limit", "1000/1s", "--class", "critical=60%", "--class", "default", "--class", "batch", "--server", r.url())
	if !strings.Contains(out, "classes=critical=60%,default,batch") {
		t.Errorf("set: %s", out)
	}
	if out := cliOK(t, "get", "api", "--server", r.url()); !regexp.MustCompile(`(?m)^classes:\s+critical=60%,default,batch$`).MatchString(out) {
		t.Errorf("get:\n%s", out)
	}
	if out := cliOK(t, "status", "api", "--server", r.url()); !strings.Contains(out, "classes=critical=60%,default,batch") {
		t.Errorf("status:\n%s", out)
	}
	out = cliOK(t, "set", "api", "--class", "critical=700", "--class", "batch", "--server", r.url())
	if !strings.Contains(out, "classes critical=60%,default,batch → critical=700,batch") {
		t.Errorf("set again: %s", out)
	}
	status, body := do(t, "GET", r.url()+"/v1/providers/api", nil, "")
	var compact bytes.Buffer
	json.Compact(&compact, []byte(body))
	if status != 200 || !strings.Contains(compact.String(), `"classes":[{"name":"critical","reserve":700},{"name":"batch"}]`) {
		t.Errorf("GET: %d %s", status, body)
	}
	status, body = do(t, "PUT", r.url()+"/v1/providers/api", nil, `{"limit":1000,"classes":[{"name":"critical","reserve":"12.5%"},{"name":"batch"}]}`)
	if status != 200 {
		t.Fatalf("PUT: %d %s", status, body)
	}
	status, body = do(t, "PUT", r.url()+"/v1/providers/api", nil, `{"limit":1000,"classes":[{"name":"critical","reserve":"60%"},{"name":"batch","reserve":"50%"}]}`)
	if status != 400 || !strings.Contains(errorOf(t, body), "reserves must add up to at most the limit") {
		t.Errorf("PUT over the limit: %d %s", status, body)
	}
	out = cliOK(t, "set", "api", "--no-classes", "--server", r.url())
	if !strings.Contains(out, "classes critical=12.5%,batch → none") {
		t.Errorf("set --no-classes: %s", out)
	}
	hist := cliOK(t, "history", "api", "--server", r.url())
	for _, want := range []string{"classes=critical=60%,default,batch", "→ critical=700,batch", "critical=700,batch → critical=12.5%,batch", "critical=12.5%,batch → none"} {
		if !strings.Contains(hist, want) {
			t.Errorf("history lacks %q:\n%s", want, hist)
		}
	}
}

// TestDescribeChange checks the old → new text set prints.
func TestDescribeChange(t *testing.T) {
	a := schema.ProviderConfig{Name: "p", Limit: 100}.WithDefaults()
	b := a
	b.Limit, b.Mode = 150, schema.ModeShadow
	if got, want := describeChange(&a, &b), "limit 100 → 150, mode enforce → shadow"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := describeChange(nil, &a); !strings.HasPrefix(got, "create limit=100 window=1s") {
		t.Errorf("create: %q", got)
	}
	if got := describeChange(&a, nil); !strings.HasPrefix(got, "delete (was limit=100") {
		t.Errorf("delete: %q", got)
	}
}

// TestListEmpty: configd list with no provider says so, and how to make
// one, instead of printing a bare header (issue 13, point 7).
func TestListEmpty(t *testing.T) {
	srv := etcdtest.Start(t)
	out := cliOK(t, "list", "--etcd-endpoints", strings.Join(srv.Endpoints(), ","))
	if out != "no providers yet: create one with configd set NAME --limit N\n" {
		t.Errorf("configd list with no provider printed %q", out)
	}
}
