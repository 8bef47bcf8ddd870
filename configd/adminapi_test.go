package main

// Tests of the admin API's HTTP hardening (issue 16, findings 5 and 6): the
// Host check against DNS rebinding, 405 with Allow, 412 per RFC 9110,
// refused requests logged with a bounded path, and the permissions of the
// admin token file.

import (
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
