package main

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-go/sluice/internal/etcdtest"
)

// do sends one request to the admin API and returns status and body.
func do(t *testing.T, method, url string, hdr map[string]string, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctxT(t), method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// errorOf decodes a JSON error body, failing the test if it is not one.
func errorOf(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error string `json:"error"`
	}
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Error == "" {
		t.Fatalf("not a JSON error body: %q (%v)", body, err)
	}
	return e.Error
}

// TestAPIBadInput: every bad request gets its status and a JSON error that
// says what is wrong, and nothing is written.
func TestAPIBadInput(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	cli := srv.Client(t)
	base := r.url() + "/v1/providers/"
	cases := []struct {
		name, method, path, body string
		hdr                      map[string]string
		status                   int
		want                     string
	}{
		{"bad name", "PUT", "Bad", `{"limit":5}`, nil, 400, "name must match"},
		{"bad name dots", "PUT", "..x", `{"limit":5}`, nil, 400, "name must match"},
		{"name mismatch", "PUT", "p", `{"name":"q","limit":5}`, nil, 400, "must match the URL"},
		{"limit zero", "PUT", "p", `{"limit":0}`, nil, 400, "limit must be a positive integer up to 1000000000000, got 0"},
		{"limit missing", "PUT", "p", `{"window":"1s"}`, nil, 400, "got 0"},
		{"limit negative", "PUT", "p", `{"limit":-3}`, nil, 400, "got -3"},
		{"limit float", "PUT", "p", `{"limit":1.5}`, nil, 400, "got 1.5"},
		{"limit string", "PUT", "p", `{"limit":"5"}`, nil, 400, "got a JSON string"},
		{"limit absurd", "PUT", "p", `{"limit":1000000000001}`, nil, 400, "up to 1000000000000"},
		{"window 7s", "PUT", "p", `{"limit":5,"window":"7s"}`, nil, 400, "got 7s"},
		{"window number", "PUT", "p", `{"limit":5,"window":1000000000}`, nil, 400, "window must be"},
		{"window tiny", "PUT", "p", `{"limit":5,"window":"1ms"}`, nil, 400, "got 1ms"},
		{"mode", "PUT", "p", `{"limit":5,"mode":"off"}`, nil, 400, "mode must be"},
		{"algorithm", "PUT", "p", `{"limit":5,"algorithm":"x"}`, nil, 400, "algorithm must be"},
		{"unknown field", "PUT", "p", `{"limit":5,"burst":10}`, nil, 400, `unknown field`},
		{"trailing data", "PUT", "p", `{"limit":5}{}`, nil, 400, "after the JSON object"},
		{"not JSON", "PUT", "p", `limit=5`, nil, 400, "malformed JSON"},
		{"empty body", "PUT", "p", ``, nil, 400, "empty"},
		{"2 MiB body", "PUT", "p", `{"limit":5,"name":"` + strings.Repeat("a", 2<<20) + `"}`, nil, 413, "larger than 1048576 bytes"},
		{"bad If-Match", "PUT", "p", `{"limit":5}`, map[string]string{"If-Match": "yesterday"}, 400, `If-Match must be "*" or entity tags`},
		{"stale If-Match", "PUT", "p", `{"limit":5}`, map[string]string{"If-Match": `"12345"`}, 412, "conflict"},
		{"bad If-None-Match", "PUT", "p", `{"limit":5}`, map[string]string{"If-None-Match": `"3"`}, 400, "If-None-Match"},
		{"get missing", "GET", "nope", "", nil, 404, "not found"},
		{"get bad name", "GET", "NOPE", "", nil, 400, "name must match"},
		{"delete missing", "DELETE", "nope", "", nil, 404, "not found"},
		{"status missing", "GET", "nope/instances", "", nil, 404, "not found"},
		{"history bad name", "GET", "N/history", "", nil, 400, "name must match"},
		{"audit missing", "GET", "nope/audit", "", nil, 404, "not found"},
		{"audit bad name", "GET", "N/audit", "", nil, 400, "name must match"},
		{"unknown path", "GET", "p/frobs", "", nil, 404, "no such endpoint"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := do(t, tc.method, base+tc.path, tc.hdr, tc.body)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, body)
			}
			if msg := errorOf(t, body); !strings.Contains(msg, tc.want) {
				t.Fatalf("error %q, want it to contain %q", msg, tc.want)
			}
		})
	}
	resp, err := cli.Get(ctxT(t), keys.Providers(), withPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Errorf("bad requests wrote %d keys, e.g. %s", len(resp.Kvs), resp.Kvs[0].Key)
	}

	// The good path, for contrast: create-only, ETag, If-Match.
	status, body := do(t, "PUT", base+"p", map[string]string{"If-None-Match": "*"}, `{"limit":5}`)
	if status != 200 {
		t.Fatalf("create: %d %s", status, body)
	}
	if status, body = do(t, "PUT", base+"p", map[string]string{"If-None-Match": "*"}, `{"limit":6}`); status != 412 {
		t.Fatalf("second create-only PUT: %d %s, want 412", status, body)
	}
	req, _ := http.NewRequest("GET", base+"p", nil)
	getResp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	getResp.Body.Close()
	etag := getResp.Header.Get("ETag")
	if status, body = do(t, "PUT", base+"p", map[string]string{"If-Match": etag}, `{"limit":7}`); status != 200 || !strings.Contains(body, `"changed": true`) {
		t.Fatalf("PUT with If-Match %s: %d %s", etag, status, body)
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if status, body := do(t, "GET", r.url()+path, nil, ""); status != 200 {
			t.Errorf("%s: %d %s", path, status, body)
		}
	}
	if _, body := do(t, "GET", r.url()+"/metrics", nil, ""); !strings.Contains(body, `configd_http_requests_total{code="400",route="PUT /v1/providers/{name}"}`) ||
		!strings.Contains(body, "configd_leader 1") || strings.Contains(body, "etcd_server_") {
		t.Errorf("metrics missing configd's own series, or carrying embed etcd's:\n%.2000s", body)
	}
}

// TestTokenRules: with --admin-token-file, writes need the bearer token
// (401 without, 403 with a wrong one), reads do not, the CLI sends it from
// --token-file, and the token never appears in the logs.
func TestTokenRules(t *testing.T) {
	const token = "s3cret-token-0123456789"
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1", "--admin-token-file", writeFile(t, "token", token+"\n"))
	url := r.url() + "/v1/providers/p"
	cases := []struct {
		name   string
		auth   string
		status int
	}{
		{"missing", "", 401},
		{"not bearer", "Basic " + token, 401},
		{"wrong", "Bearer wrong-token-0123456789", 403},
		{"prefix of the token", "Bearer " + token[:10], 403},
		{"right", "Bearer " + token, 200},
	}
	for _, tc := range cases {
		hdr := map[string]string{}
		if tc.auth != "" {
			hdr["Authorization"] = tc.auth
		}
		status, body := do(t, "PUT", url, hdr, `{"limit":5}`)
		if status != tc.status {
			t.Errorf("%s: PUT status %d, want %d: %s", tc.name, status, tc.status, body)
		}
		if tc.status != 200 {
			errorOf(t, body)
		}
		if status, _ := do(t, "DELETE", r.url()+"/v1/providers/other", hdr, ""); tc.status != 200 && status != tc.status {
			t.Errorf("%s: DELETE status %d, want %d", tc.name, status, tc.status)
		}
	}
	if status, _ := do(t, "GET", url, nil, ""); status != 200 {
		t.Errorf("GET without token: %d", status)
	}
	_, err := cliRun(t, "set", "p", "--limit", "9", "--server", r.url())
	if !errors.Is(err, ErrUnauthorized) || exitCode(err) != 1 {
		t.Errorf("CLI without --token-file: %v", err)
	}
	_, err = cliRun(t, "set", "p", "--limit", "9", "--server", r.url(), "--token-file", writeFile(t, "bad", "nope-nope-nope-nope"))
	if !errors.Is(err, ErrForbidden) {
		t.Errorf("CLI with a wrong token: %v", err)
	}
	cliOK(t, "set", "p", "--limit", "9", "--server", r.url(), "--token-file", writeFile(t, "good", token))
	if strings.Contains(r.log.String(), token) || strings.Contains(r.log.String(), token[:10]) {
		t.Errorf("the token appears in the logs")
	}
}

// TestServeRefusesNonLoopbackWithoutToken: serve will not listen beyond
// loopback without a token unless --insecure; the refusal is a usage error
// (exit code 2) and nothing starts.
func TestServeRefusesNonLoopbackWithoutToken(t *testing.T) {
	for _, listen := range []string{":7070", "0.0.0.0:7070", "[::]:7070", "10.1.2.3:7070", "example.com:7070"} {
		_, err := cliRun(t, "serve", "--listen", listen, "--etcd-endpoints", "http://127.0.0.1:1")
		if exitCode(err) != 2 || err == nil || !strings.Contains(err.Error(), "refusing to listen beyond loopback") {
			t.Errorf("listen %s: %v (exit %d)", listen, err, exitCode(err))
		}
	}
	c := DefaultConfig()
	c.Listen = "0.0.0.0:7070"
	c.Insecure = true
	if err := c.Validate(); err != nil {
		t.Errorf("--insecure: %v", err)
	}
	c.Insecure, c.AdminTokenFile = false, "/some/file"
	if err := c.Validate(); err != nil {
		t.Errorf("with a token: %v", err)
	}
	for _, l := range []string{"127.0.0.1:7070", "localhost:0", "[::1]:7070"} {
		c := DefaultConfig()
		c.Listen = l
		if err := c.Validate(); err != nil {
			t.Errorf("loopback %s: %v", l, err)
		}
	}
}

// TestConfigValidate covers serve's other settings.
func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name   string
		modify func(*Config)
		field  string
	}{
		{"listen without port", func(c *Config) { c.Listen = "127.0.0.1" }, "listen"},
		{"ttl fraction", func(c *Config) { c.SessionTTL = 1500 * 1e6 }, "session-ttl"},
		{"ttl zero", func(c *Config) { c.SessionTTL = 0 }, "session-ttl"},
		{"margin negative", func(c *Config) { c.Margin = -1 }, "propagation-margin"},
		{"log level", func(c *Config) { c.LogLevel = "loud" }, "log-level"},
		{"log format", func(c *Config) { c.LogFormat = "xml" }, "log-format"},
		{"prefix", func(c *Config) { c.Prefix = "sluice" }, "prefix"},
		{"replica id", func(c *Config) { c.ReplicaID = "a b" }, "replica-id"},
		{"data dir", func(c *Config) { c.DataDir = "" }, "data-dir"},
		{"peer url", func(c *Config) { c.EmbeddedPeerURL = "nope" }, "embedded-peer-url"},
		// issue 16, finding 3: the embedded etcd on every interface, in the clear.
		{"client url beyond loopback", func(c *Config) { c.EmbeddedClientURL = "http://0.0.0.0:2379" }, "embedded-client-url"},
		{"peer url beyond loopback", func(c *Config) { c.EmbeddedPeerURL = "http://0.0.0.0:2380" }, "embedded-peer-url"},
		{"https without a certificate", func(c *Config) { c.EmbeddedClientURL = "https://0.0.0.0:2379" }, "embedded-client-url"},
		{"certificate without key", func(c *Config) {
			c.EmbeddedClientURL, c.EmbeddedCertFile = "https://0.0.0.0:2379", "cert.pem"
		}, "embedded-cert-file"},
		{"certificate on http", func(c *Config) { c.EmbeddedCertFile, c.EmbeddedKeyFile = "cert.pem", "key.pem" }, "embedded-client-url"},
		{"retention negative", func(c *Config) { c.EmbeddedRetention = -60e9 }, "embedded-compaction-retention"},
		{"retention under a second", func(c *Config) { c.EmbeddedRetention = 500e6 }, "embedded-compaction-retention"},
		{"retention over a day", func(c *Config) { c.EmbeddedRetention = 25 * 3600e9 }, "embedded-compaction-retention"},
		{"shutdown", func(c *Config) { c.ShutdownTimeout = 0 }, "shutdown-timeout"},
		{"history keep zero", func(c *Config) { c.HistoryKeep = 0 }, "history-keep"},
		{"history keep huge", func(c *Config) { c.HistoryKeep = maxHistoryKeep + 1 }, "history-keep"},
		{"txn ops under a head, a publish and a grant", func(c *Config) { c.MaxTxnOps = 2 }, "etcd-max-txn-ops"},
		{"txn ops over the request size", func(c *Config) { c.MaxTxnOps = maxTxnOps + 1 }, "etcd-max-txn-ops"},
		{"adaptive interval zero", func(c *Config) { c.AdaptiveInterval = 0 }, "adaptive-interval"},
		{"adaptive interval an hour", func(c *Config) { c.AdaptiveInterval = 3600e9 }, "adaptive-interval"},
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	tls := DefaultConfig()
	tls.EmbeddedClientURL, tls.EmbeddedCertFile, tls.EmbeddedKeyFile = "https://0.0.0.0:2379", "cert.pem", "key.pem"
	if err := tls.Validate(); err != nil {
		t.Errorf("the embedded etcd beyond loopback with TLS: %v", err)
	}
	for _, tc := range cases {
		c := DefaultConfig()
		tc.modify(&c)
		err := c.Validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || exitCode(err) != 2 {
			t.Errorf("%s: %v, want a ConfigError for --%s", tc.name, err, tc.field)
		}
	}
	// etcd flags are checked too.
	for _, args := range [][]string{
		{"--etcd-endpoints", "not a url"},
		{"--etcd-endpoints", "http://127.0.0.1:2379", "--etcd-cert", "c.pem"},
		{"--etcd-endpoints", "http://127.0.0.1:2379", "--etcd-dial-timeout", "0s"},
		{"--etcd-endpoints", "http://127.0.0.1:2379", "--etcd-password-file", "p"},
	} {
		if _, err := cliRun(t, append([]string{"serve"}, args...)...); exitCode(err) != 2 {
			t.Errorf("serve %v: %v, want exit code 2", args, err)
		}
	}
}
