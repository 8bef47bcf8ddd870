package main

// The console over HTTP, without a browser: that it keeps the admin API's
// defences (Host check, 405 with Allow, no write without the token), that
// every file it serves carries its CSP and comes from the binary, that its
// preview parses and checks a change as configd set does and writes
// nothing, and that its event stream pushes a change.

import (
	"bufio"
	"context"
	"io/fs"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

func TestConsoleHTTP(t *testing.T) {
	srv := etcdtest.Start(t)
	r := itServe(t, srv, "solo")
	itCLI(t, "set", "api", "--limit", "400", "--server="+r.url())

	// Every file: 200 with the CSP that forbids inline script and any
	// other origin.
	for _, path := range []string{"/console/", "/console/app.js", "/console/app.css"} {
		code, h, body := hostRequest(t, http.MethodGet, r.url()+path, r.addr, "", "")
		if code != http.StatusOK || body == "" {
			t.Fatalf("GET %s: %d %q", path, code, body)
		}
		csp := h.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("GET %s: Content-Security-Policy %q lacks %q", path, csp, want)
			}
		}
		if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("X-Frame-Options") != "DENY" {
			t.Errorf("GET %s: headers %v", path, h)
		}
	}
	// Nothing is fetched from elsewhere, and nothing runs inline.
	err := fs.WalkDir(consoleFiles, "console", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := fs.ReadFile(consoleFiles, p)
		s := string(b)
		for _, bad := range []string{"http://", "https://", "//cdn", "innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "onclick=", "<script>"} {
			if strings.Contains(s, bad) && !(bad == "http://" && strings.Contains(s, "http://www.w3.org/2000/svg")) {
				t.Errorf("%s contains %q", p, bad)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// 405 with Allow on the console's paths, 421 for another Host (no
	// token: the Host check is on), as for the rest of the API.
	if code, h, _ := hostRequest(t, http.MethodPost, r.url()+"/console/", r.addr, "", ""); code != http.StatusMethodNotAllowed || h.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /console/: %d Allow %q, want 405 with GET, HEAD", code, h.Get("Allow"))
	}
	if code, _, _ := hostRequest(t, http.MethodPut, r.url()+"/console/preview/api?limit=5", r.addr, "", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("PUT /console/preview/api: %d, want 405", code)
	}
	for _, path := range []string{"/console/", "/console/events", "/console/preview/api?limit=5"} {
		if code, _, _ := hostRequest(t, http.MethodGet, r.url()+path, "evil.example", "", ""); code != http.StatusMisdirectedRequest {
			t.Errorf("GET %s with Host evil.example: %d, want 421", path, code)
		}
	}

	// The preview: set's parsing and checks, nothing written.
	before := itCLI(t, "get", "api", "--server="+r.url())
	code, _, body := hostRequest(t, http.MethodGet, r.url()+"/console/preview/api?limit=600&mode=shadow", r.addr, "", "")
	if code != http.StatusOK || !strings.Contains(body, `"change": "limit 400 → 600, mode enforce → shadow"`) {
		t.Errorf("preview: %d %s", code, body)
	}
	for _, q := range []string{"limit=0", "limit=x", "window=7ms", "mode=off", "algorithm=fair"} {
		if code, _, body := hostRequest(t, http.MethodGet, r.url()+"/console/preview/api?"+q, r.addr, "", ""); code != http.StatusBadRequest {
			t.Errorf("preview %s: %d %s, want 400", q, code, body)
		}
	}
	if code, _, _ := hostRequest(t, http.MethodGet, r.url()+"/console/preview/nope?limit=5", r.addr, "", ""); code != http.StatusNotFound {
		t.Errorf("preview of a missing provider: %d, want 404", code)
	}
	if out := itCLI(t, "get", "api", "--server="+r.url()); out != before {
		t.Errorf("a preview wrote: configd get said %q, then %q", before, out)
	}

	// The event stream: the state at once, a change pushed.
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.url()+"/console/events?provider=api", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("events: Content-Type %q", ct)
	}
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(nil, 1<<20)
	await := func(what string, cond func(data string) bool) {
		t.Helper()
		for lines.Scan() {
			if d, ok := strings.CutPrefix(lines.Text(), "data: "); ok && cond(d) {
				return
			}
		}
		t.Fatalf("event stream ended before %s: %v", what, lines.Err())
	}
	await("the provider's panel", func(d string) bool {
		return strings.Contains(d, `"provider":"api"`) && strings.Contains(d, `"limit":400`)
	})
	itCLI(t, "set", "api", "--limit", "500", "--server="+r.url())
	await("the change pushed", func(d string) bool {
		return strings.Contains(d, `"provider":"api"`) && strings.Contains(d, `"limit":500`)
	})
}

// TestWhyInstanceCountsAGrantOnlyUntilAcknowledged: the records keep a
// finished change's grants above the shares until the next publish, so
// the console says an instance is counted at its grant only while it has
// not acknowledged its record (it said so after every lowered limit).
func TestWhyInstanceCountsAGrantOnlyUntilAcknowledged(t *testing.T) {
	sh := &schema.Shares{Version: schema.Version, Provider: "p", Generation: 7, EffectiveFrom: 1e18, Total: 900,
		Shares: map[string]int64{"a": 450}, Granted: map[string]int64{"a": 500}}
	v := statusView{Provider: "p", Shares: sh}
	for _, tc := range []struct {
		applied int64
		want    bool
	}{{6, true}, {7, false}} {
		rec := &schema.InstanceRecord{Version: schema.Version, ID: "a", AppliedGeneration: tc.applied, Source: schema.SourceShares, Enforced: 450, ClockKnown: true}
		why, _ := whyInstance(v, instanceView{ID: "a", Record: rec, Share: 450, HasShare: true})
		if got := strings.Contains(why, "counts it at 500"); got != tc.want {
			t.Errorf("applied generation %d of 7: %q; want the grant said: %v", tc.applied, why, tc.want)
		}
	}
}
