package main

// Tests of the admin API's HTTP hardening (issue 16, findings 5 and 6): the
// Host check against DNS rebinding, 405 with Allow, 412 per RFC 9110,
// refused requests logged with a bounded path, and the permissions of the
// admin token file.

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-go/sluice/internal/etcdtest"
)

// TestAdminAPIMethodNotAllowed: a known path with a method it does not
// serve gets 405 with an Allow header listing the methods it does (RFC 9110
// 15.5.6), as a JSON error; an unknown path is still 404, without Allow.
func TestAdminAPIMethodNotAllowed(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	const (
		item = "DELETE, GET, HEAD, PUT"
		read = "GET, HEAD"
	)
	cases := []struct {
		method, path string
		want         int
		allow        string
	}{
		{"POST", "/v1/providers", 405, read},
		{"PUT", "/v1/providers", 405, read},
		{"DELETE", "/v1/providers", 405, read},
		{"POST", "/v1/providers/p", 405, item},
		{"PATCH", "/v1/providers/p", 405, item},
		{"OPTIONS", "/v1/providers/p", 405, item},
		{"PUT", "/v1/providers/p/instances", 405, read},
		{"DELETE", "/v1/providers/p/history", 405, read},
		{"POST", "/metrics", 405, read},
		{"PUT", "/healthz", 405, read},
		{"DELETE", "/readyz", 405, read},
		{"GET", "/v1/nothing", 404, ""},
		{"POST", "/v1/nothing", 404, ""},
		{"GET", "/v1/providers/p/frobs", 404, ""},
		{"PUT", "/", 404, ""},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			status, hdr, body := doRaw(t, tc.method, r.url()+tc.path, nil, "")
			if status != tc.want {
				t.Fatalf("status %d, want %d: %.300s", status, tc.want, body)
			}
			if got := hdr.Get("Allow"); got != tc.allow {
				t.Errorf("Allow %q, want %q", got, tc.allow)
			}
			msg := errorOf(t, body)
			if tc.want == 405 && (!strings.Contains(msg, tc.method) || !strings.Contains(msg, tc.allow)) {
				t.Errorf("405 error %q does not name the method and the allowed ones", msg)
			}
		})
	}
	// HEAD goes with GET.
	if status, _, body := doRaw(t, "HEAD", r.url()+"/healthz", nil, ""); status != 200 {
		t.Errorf("HEAD /healthz: %d %s", status, body)
	}
}

// TestAdminAPIPreconditions: conditional writes follow RFC 9110 13.1-13.2.
// If-Match: * holds only for a provider that exists; If-Match uses the
// strong comparison, so a weak tag W/"R" never matches; a tag that is not
// a revision never matches; If-Match with If-None-Match: * never holds; a
// failed precondition is 412 and writes nothing. A DELETE of a provider
// that does not exist stays 404 whatever its preconditions (13.2.1). What
// worked keeps working: If-None-Match: * creates only, a strong ETag from
// GET matches, a list of tags matches if one does.
func TestAdminAPIPreconditions(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	cli := srv.Client(t)
	base := r.url() + "/v1/providers/"
	if status, body := do(t, "PUT", base+"p", nil, `{"limit":5}`); status != 200 {
		t.Fatalf("creating p: %d %s", status, body)
	}
	// etag returns the provider's ETag ("" when it does not exist).
	etag := func(name string) string {
		t.Helper()
		status, hdr, _ := doRaw(t, "GET", base+name, nil, "")
		if status == http.StatusNotFound {
			return ""
		}
		return hdr.Get("ETag")
	}
	cases := []struct {
		name         string
		method, path string
		hdr          func(cur string) http.Header // cur: p's ETag now
		want         int
		wrote        bool
	}{
		{"If-Match * on a missing provider", "PUT", "ghost", func(string) http.Header { return h("If-Match", "*") }, 412, false},
		{"If-Match * on a missing provider, DELETE", "DELETE", "ghost", func(string) http.Header { return h("If-Match", "*") }, 404, false},
		{"weak tag of the current revision", "PUT", "p", func(cur string) http.Header { return h("If-Match", "W/"+cur) }, 412, false},
		{"weak tags only", "PUT", "p", func(cur string) http.Header { return h("If-Match", `W/"1", W/`+cur) }, 412, false},
		{"weak tag, DELETE", "DELETE", "p", func(cur string) http.Header { return h("If-Match", "W/"+cur) }, 412, false},
		{"weak tag on a missing provider, DELETE", "DELETE", "ghost", func(cur string) http.Header { return h("If-Match", "W/"+cur) }, 404, false},
		{"a tag that is not a revision", "PUT", "p", func(string) http.Header { return h("If-Match", `"abc"`) }, 412, false},
		{"a revision with a leading zero", "PUT", "p", func(cur string) http.Header { return h("If-Match", `"0`+strings.Trim(cur, `"`)+`"`) }, 412, false},
		{"stale revision", "PUT", "p", func(string) http.Header { return h("If-Match", `"1"`) }, 412, false},
		{"stale revision, DELETE", "DELETE", "p", func(string) http.Header { return h("If-Match", `"1"`) }, 412, false},
		{"If-None-Match * on an existing provider", "PUT", "p", func(string) http.Header { return h("If-None-Match", "*") }, 412, false},
		{"If-Match and If-None-Match *", "PUT", "p", func(cur string) http.Header { return h("If-Match", cur, "If-None-Match", "*") }, 412, false},
		{"If-Match * and If-None-Match * on a missing provider", "PUT", "ghost", func(string) http.Header { return h("If-Match", "*", "If-None-Match", "*") }, 412, false},
		{"malformed If-Match", "PUT", "p", func(string) http.Header { return h("If-Match", "yesterday") }, 400, false},
		{"* in a list", "PUT", "p", func(cur string) http.Header { return h("If-Match", "*, "+cur) }, 400, false},
		{"If-Match * on an existing provider", "PUT", "p", func(string) http.Header { return h("If-Match", "*") }, 200, true},
		{"the current strong tag", "PUT", "p", func(cur string) http.Header { return h("If-Match", cur) }, 200, true},
		{"a list with the current strong tag", "PUT", "p", func(cur string) http.Header { return h("If-Match", `W/`+cur+`, "1", `+cur) }, 200, true},
		{"two If-Match lines, one current", "PUT", "p", func(cur string) http.Header { return h("If-Match", `"1"`, "If-Match", cur) }, 200, true},
		{"If-None-Match * creates", "PUT", "fresh", func(string) http.Header { return h("If-None-Match", "*") }, 200, true},
		{"If-Match * on an existing provider, DELETE", "DELETE", "fresh", func(string) http.Header { return h("If-Match", "*") }, 200, true},
		{"the current strong tag, DELETE", "DELETE", "p", func(cur string) http.Header { return h("If-Match", cur) }, 200, true},
	}
	limit := 10
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			limit++
			before := etag(tc.path)
			body := ""
			if tc.method == "PUT" {
				body = `{"limit":` + itoa(int64(limit)) + `}`
			}
			status, _, resp := doRaw(t, tc.method, base+tc.path, tc.hdr(etag("p")), body)
			if status != tc.want {
				t.Fatalf("status %d, want %d: %.300s", status, tc.want, resp)
			}
			if status != 200 {
				msg := errorOf(t, resp)
				if status == 412 && !strings.Contains(msg, "precondition failed") && !strings.Contains(msg, "conflict") {
					t.Errorf("412 error %q says neither that the precondition failed nor that there is a conflict", msg)
				}
			}
			if wrote := etag(tc.path) != before; wrote != tc.wrote {
				t.Errorf("wrote: %v, want %v (ETag %s before, %s after)", wrote, tc.wrote, before, etag(tc.path))
			}
		})
	}
	if configKeyExists(t, cli, "ghost") {
		t.Errorf("a failed precondition created ghost")
	}
}
