package main

// Tests of the admin API's HTTP hardening (issue 16, findings 5 and 6): the
// Host check against DNS rebinding, 405 with Allow, 412 per RFC 9110,
// refused requests logged with a bounded path, and the permissions of the
// admin token file.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/logbuf"
)

// hostRequest sends one request with the given Host header (and bearer
// token, if any) and returns status, header and body.
func hostRequest(t *testing.T, method, url, host, token, body string) (int, http.Header, string) {
	t.Helper()
	hdr := http.Header{}
	if token != "" {
		hdr.Set("Authorization", "Bearer "+token)
	}
	req, err := http.NewRequestWithContext(ctxT(t), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = hdr
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// TestAdminAPIHostCheck: without an admin token, the API answers only
// requests whose Host names loopback (localhost, an IP address) or a name
// given with --allowed-host; any other name — what a browser sends after a
// DNS-rebinding attack — gets 421 Misdirected Request, for reads and writes,
// and a refused write writes nothing. With a token the Host is not checked
// (the token guards writes), unless --allowed-host asks for the check.
func TestAdminAPIHostCheck(t *testing.T) {
	const token = "host-check-token-0123456789"
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	tokenFile := writeFile(t, "token", token)
	open := startReplica(t, srv, "open", "--allowed-host", "configd.test")
	tok := startReplica(t, srv, "tok", "--admin-token-file", tokenFile)
	tokHosts := startReplica(t, srv, "tok-hosts", "--admin-token-file", tokenFile, "--allowed-host", "Configd.Test")
	port := func(r *replica) string { return r.addr[strings.LastIndex(r.addr, ":"):] }

	cases := []struct {
		name         string
		r            *replica
		method, path string
		host         string // with the replica's port appended when it ends in ":"
		token        string
		want         int
	}{
		{"listen address", open, "GET", "/v1/providers", "127.0.0.1:", "", 200},
		{"localhost", open, "GET", "/v1/providers", "localhost:", "", 200},
		{"localhost, any case", open, "GET", "/v1/providers", "LocalHost:", "", 200},
		{"localhost without a port", open, "GET", "/healthz", "localhost", "", 200},
		{"IPv6 loopback", open, "GET", "/healthz", "[::1]:", "", 200},
		{"another IP address", open, "GET", "/healthz", "10.1.2.3:7070", "", 200},
		{"--allowed-host", open, "GET", "/v1/providers", "configd.test:", "", 200},
		{"--allowed-host, any case", open, "PUT", "/v1/providers/allowed", "CONFIGD.TEST:", "", 200},
		{"rebinding name", open, "GET", "/v1/providers", "evil.example:", "", 421},
		{"rebinding name, no port", open, "GET", "/v1/providers", "evil.example", "", 421},
		{"rebinding name, PUT", open, "PUT", "/v1/providers/rebound", "evil.example:", "", 421},
		{"rebinding name, DELETE", open, "DELETE", "/v1/providers/allowed", "evil.example:", "", 421},
		{"rebinding name, metrics", open, "GET", "/metrics", "evil.example:", "", 421},
		{"rebinding name, unknown path", open, "GET", "/nothing", "evil.example:", "", 421},
		{"name ending in localhost", open, "GET", "/healthz", "evil.localhost.example:", "", 421},
		{"subdomain of an allowed name", open, "GET", "/healthz", "x.configd.test:", "", 421},
		{"name that looks like an IP", open, "GET", "/healthz", "127.0.0.1.nip.io:", "", 421},
		{"token: any host reads", tok, "GET", "/v1/providers", "evil.example:", "", 200},
		{"token: any host writes with the token", tok, "PUT", "/v1/providers/tokened", "evil.example:", token, 200},
		{"token: no token, no write", tok, "PUT", "/v1/providers/untokened", "evil.example:", "", 401},
		{"token and --allowed-host: checked", tokHosts, "GET", "/v1/providers", "evil.example:", "", 421},
		{"token and --allowed-host: checked, with the token", tokHosts, "PUT", "/v1/providers/rebound", "evil.example:", token, 421},
		{"token and --allowed-host: allowed", tokHosts, "GET", "/v1/providers", "configd.test:", "", 200},
		{"token and --allowed-host: localhost", tokHosts, "GET", "/v1/providers", "localhost:", "", 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			host := tc.host
			if strings.HasSuffix(host, ":") {
				host = strings.TrimSuffix(host, ":") + port(tc.r)
			}
			status, _, body := hostRequest(t, tc.method, tc.r.url()+tc.path, host, tc.token, `{"limit":5}`)
			if status != tc.want {
				t.Fatalf("%s %s with Host %q: %d %.300s, want %d", tc.method, tc.path, host, status, body, tc.want)
			}
			if status == http.StatusMisdirectedRequest {
				msg := errorOf(t, body)
				for _, want := range []string{"Host", strings.TrimSuffix(host, port(tc.r)), "--allowed-host"} {
					if !strings.Contains(msg, want) {
						t.Errorf("421 error %q does not name %q", msg, want)
					}
				}
			}
		})
	}
	for _, name := range []string{"rebound", "untokened"} {
		if configKeyExists(t, cli, name) {
			t.Errorf("a refused write created %q", name)
		}
	}
	if !configKeyExists(t, cli, "allowed") {
		t.Errorf("the refused DELETE of %q deleted it (or the allowed PUT did not create it)", "allowed")
	}
}

// TestHostPolicy: which Host headers the DNS-rebinding check lets
// through, for an API listening on a name with one --allowed-host.
func TestHostPolicy(t *testing.T) {
	p := newHostPolicy("configd-1.lan:7070", []string{"Configd.Internal."})
	cases := []struct {
		host string
		want bool
	}{
		{"localhost", true},
		{"localhost:7070", true},
		{"LOCALHOST:1", true},
		{"localhost.:7070", true},
		{"127.0.0.1:7070", true},
		{"127.0.0.1", true},
		{"[::1]:7070", true},
		{"[::1]", true},
		{"10.0.0.9:80", true},
		{"[fe80::1%25eth0]:7070", true},
		{"configd-1.lan:7070", true},
		{"configd-1.lan:9999", true},
		{"configd.internal", true},
		{"CONFIGD.INTERNAL.:7070", true},
		{"", false},
		{":7070", false},
		{"[]:7070", false},
		{"evil.example", false},
		{"evil.example:7070", false},
		{"localhost.evil.example", false},
		{"evil.localhost", false},
		{"configd.internal.evil.example", false},
		{"127.0.0.1.nip.io:7070", false},
		{"0x7f000001", false},
		{"127.1", false},
		{"[evil.example]:80", false},
		{"localhost:7070:80", false},
	}
	for _, tc := range cases {
		if got := p.allows(tc.host); got != tc.want {
			t.Errorf("Host %q: allowed %v, want %v", tc.host, got, tc.want)
		}
	}
}

// TestAllowedHostFlag: --allowed-host takes host names and IP addresses;
// anything else (a URL, a port, a wildcard, an empty or malformed name) is
// a usage error naming the flag.
func TestAllowedHostFlag(t *testing.T) {
	cases := []struct {
		value string
		ok    bool
	}{
		{"configd.internal", true},
		{"configd", true},
		{"Configd-1.example.", true},
		{"10.0.0.1", true},
		{"::1", true},
		{"", false},
		{"http://configd.internal", false},
		{"configd.internal:7070", false},
		{"*.example", false},
		{"a..b", false},
		{"-a.example", false},
		{"a b", false},
		{"configd/api", false},
		{strings.Repeat("a", 64) + ".example", false},
	}
	for _, tc := range cases {
		c := DefaultConfig()
		c.AllowedHosts = []string{"localhost", tc.value}
		err := c.Validate()
		var ce *ConfigError
		switch {
		case tc.ok && err != nil:
			t.Errorf("--allowed-host %q: %v", tc.value, err)
		case !tc.ok && (!errors.As(err, &ce) || ce.Field != "allowed-host" || exitCode(err) != 2):
			t.Errorf("--allowed-host %q: %v, want a usage error for --allowed-host", tc.value, err)
		}
	}
}

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
		{"POST", "/v1/providers/p/audit", 405, read},
		{"POST", "/metrics", 405, read},
		{"PUT", "/healthz", 405, read},
		{"DELETE", "/readyz", 405, read},
		{"GET", "/v1/nothing", 404, ""},
		{"POST", "/v1/nothing", 404, ""},
		{"GET", "/v1/providers/p/frobs", 404, ""},
		{"PUT", "/", 405, "GET, HEAD"}, // / redirects to the console
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

// TestAdminAPIRefusedRequestLogIsBounded: a refused request's path, method
// and Host are logged cut to a bounded length, marked as cut: 20 requests
// with 900 KB names grow the log by kilobytes, not the 18 MB of issue 16.
// The error answers are bounded too.
func TestAdminAPIRefusedRequestLogIsBounded(t *testing.T) {
	const token = "bounded-log-token-0123456789"
	srv := etcdtest.Start(t)
	open := startReplica(t, srv, "open")
	tok := startReplica(t, srv, "tok", "--admin-token-file", writeFile(t, "token", token))
	huge := strings.Repeat("a", 900<<10)
	const (
		requests  = 20
		maxGrowth = requests * 2 << 10 // 2 KiB a line is generous
	)
	cases := []struct {
		name         string
		r            *replica
		method, path string
		host         string
		want         int
	}{
		{"unauthenticated PUT", tok, "PUT", "/v1/providers/" + huge, "", 401},
		{"bad name", open, "PUT", "/v1/providers/" + huge, "", 400},
		{"wrong method", open, "POST", "/v1/providers/" + huge, "", 405},
		{"long method", open, strings.Repeat("M", 900<<10), "/v1/providers/p", "", 405},
		{"misdirected, long path", open, "GET", "/v1/providers/" + huge, "evil.example", 421},
		{"misdirected, long Host", open, "GET", "/v1/providers", huge + ".example", 421},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mark := tc.r.log.Len()
			host := tc.host
			if host == "" {
				host = tc.r.addr
			}
			for range requests {
				status, _, body := hostRequest(t, tc.method, tc.r.url()+tc.path, host, "", `{"limit":5}`)
				if status != tc.want {
					t.Fatalf("status %d, want %d: %.300s", status, tc.want, body)
				}
				if len(body) > 4<<10 {
					t.Fatalf("the %d answer is %d bytes: it echoes the input unshortened", status, len(body))
				}
			}
			logged := tc.r.log.From(mark)
			if n := len(logged); n > maxGrowth {
				t.Fatalf("%d refused requests grew the log by %d bytes, want at most %d:\n%.600s", requests, n, maxGrowth, logged)
			}
			if c := strings.Count(logged, "admin request refused"); c != requests {
				t.Errorf("%d of %d refused requests logged:\n%.600s", c, requests, logged)
			}
			if !strings.Contains(logged, "bytes, cut") {
				t.Errorf("the log does not say what it cut:\n%.600s", logged)
			}
		})
	}
}

// TestClip: strings from a request are cut to maxLogged bytes on a UTF-8
// boundary, saying how long they were; short ones are left alone.
func TestClip(t *testing.T) {
	cases := []struct {
		in, want string
	}{
		{"", ""},
		{"/v1/providers/p", "/v1/providers/p"},
		{strings.Repeat("a", maxLogged), strings.Repeat("a", maxLogged)},
		{strings.Repeat("a", maxLogged+1), strings.Repeat("a", maxLogged) + "...[257 bytes, cut]"},
		{strings.Repeat("a", maxLogged-1) + "é", strings.Repeat("a", maxLogged-1) + "...[257 bytes, cut]"},
		{strings.Repeat("€", 1000), strings.Repeat("€", maxLogged/3) + "...[3000 bytes, cut]"},
	}
	for _, tc := range cases {
		got := clip(tc.in)
		if got != tc.want {
			t.Errorf("clip(%.20q... %d bytes) = %.40q... (%d bytes), want %.40q... (%d bytes)", tc.in, len(tc.in), got, len(got), tc.want, len(tc.want))
		}
		if !utf8.ValidString(got) {
			t.Errorf("clip(%d bytes) is not valid UTF-8", len(tc.in))
		}
	}
}

// TestModeExposure: which permission bits of the admin token file refuse
// it (others read or write, group write), and which only warn (a group
// that is not configd's can read it).
func TestModeExposure(t *testing.T) {
	cases := []struct {
		perm         os.FileMode
		groupOurs    bool
		exposed      string
		foreignGroup bool
	}{
		{0o600, false, "", false},
		{0o400, false, "", false},
		{0o700, false, "", false},
		{0o640, true, "", false},
		{0o640, false, "", true},
		{0o440, false, "", true},
		{0o650, true, "", false},
		{0o601, true, "", false},
		{0o644, true, "others can read it", false},
		{0o602, true, "others can write it", false},
		{0o620, true, "its group can write it", false},
		{0o660, false, "its group can write it", true},
		{0o666, true, "others can read it, others can write it, its group can write it", false},
		{0o777, false, "others can read it, others can write it, its group can write it", true},
	}
	for _, tc := range cases {
		exposed, foreign := modeExposure(tc.perm, tc.groupOurs)
		if got := strings.Join(exposed, ", "); got != tc.exposed || foreign != tc.foreignGroup {
			t.Errorf("mode %04o, group ours %v: exposed %q, foreign group %v; want %q, %v",
				tc.perm, tc.groupOurs, got, foreign, tc.exposed, tc.foreignGroup)
		}
	}
}

// TestServeTokenFilePermissions: an admin token file that others can read
// or write, or that its group can write, stops serve before it listens,
// with one line naming the file, its mode and the fix (exit code 2);
// --insecure-token-file accepts it with a warning. A file that its group
// — configd's — can only read (root:configd 0640, a common way to hand a
// secret to a service) starts quietly, as 0600 and 0400 do.
// TestModeExposure covers a group configd is not in.
func TestServeTokenFilePermissions(t *testing.T) {
	srv := etcdtest.Start(t)
	cases := []struct {
		name    string
		mode    os.FileMode
		extra   []string
		starts  bool
		logWant string // in the log (started) or the error (refused)
	}{
		{"owner only", 0o600, nil, true, ""},
		{"owner read only", 0o400, nil, true, ""},
		{"group read, configd's group", 0o640, nil, true, ""},
		{"others read", 0o644, nil, false, "mode 0644"},
		{"others read only", 0o604, nil, false, "others can read it"},
		{"others write", 0o602, nil, false, "others can write it"},
		{"group write", 0o620, nil, false, "its group can write it"},
		{"group read write", 0o660, nil, false, "its group can write it"},
		{"everyone", 0o666, nil, false, "chmod 600"},
		{"others read, accepted", 0o644, []string{"--insecure-token-file"}, true, "admin token file is open to other users"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			file := writeFile(t, "token", "a-token-of-sixteen-or-more\n")
			if err := os.Chmod(file, tc.mode); err != nil {
				t.Fatal(err)
			}
			var logs logbuf.Buffer
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			args := append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-token-file", file,
				"--etcd-endpoints", srv.Endpoints()[0], "--replica-id", "perm"}, tc.extra...)
			done := make(chan error, 1)
			go func() { done <- run(ctx, args, &logs, &logs) }()
			var err error
			started := false
			waitFor(t, 20*time.Second, "serve to start or stop", func() bool {
				select {
				case err = <-done:
					return true
				default:
				}
				started = strings.Contains(logs.String(), "configd serving")
				return started
			})
			if started {
				cancel()
				err = <-done
			}
			if started != tc.starts {
				t.Fatalf("mode %04o: started %v, want %v (error %v)\n%s", tc.mode, started, tc.starts, err, logs.String())
			}
			if !tc.starts {
				secOneLine(t, "serve with token file mode "+tc.mode.String(), err, 2, "--admin-token-file")
				if !errors.Is(err, ErrTokenFileExposed) {
					t.Errorf("error %v does not wrap ErrTokenFileExposed", err)
				}
				for _, want := range []string{file, tc.logWant} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not contain %q", err, want)
					}
				}
				if strings.Contains(err.Error(), "a-token-of") {
					t.Errorf("the error shows the token: %v", err)
				}
				return
			}
			if err != nil {
				t.Errorf("serve: %v", err)
			}
			warned := slices.ContainsFunc(strings.Split(logs.String(), "\n"), func(l string) bool {
				return strings.Contains(l, "level=WARN") && strings.Contains(l, "token file")
			})
			if tc.logWant == "" && warned {
				t.Errorf("mode %04o: a warning about the token file:\n%s", tc.mode, logs.String())
			}
			if tc.logWant != "" && (!warned || !strings.Contains(logs.String(), tc.logWant)) {
				t.Errorf("mode %04o: no warning %q:\n%s", tc.mode, tc.logWant, logs.String())
			}
		})
	}
}
