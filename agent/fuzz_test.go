package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

var fuzzSeeds = []string{
	`{"provider":"llm","caller":"w1","cost":{"tokens":700},"max_wait_ms":200}`,
	`{"provider":"llm","cost":{"requests":0,"tokens":1}}`,
	`{"provider":"llm","max_wait_ms":0.5}`,
	`{"provider":"llm","cost":{"tokens":1e3}}`,
	`{"provider":"llm","cost":{"tokens":-1}}`,
	`{"provider":"llm","cost":{"\u0074okens":5}}`,
	`{"provider":"llm","provider":"x"}`,
	`{"id":"g1-1","cost":{"tokens":3}}`,
	`{"provider":"llm"}{}`,
	`{"provider":"llm","class":"critical","max_wait_ms":5}`,
	`{"provider":"llm","class":"Critical"}`,
	`{"provider":"llm","class":""}`,
	`{"provider":"llm","class":"a-b_c9"}`,
	`{"provider":"llm","class":"critical\u0000"}`,
	`{"provider":"llm","class":7}`,
	`null`, `""`, `{`, `[1]`, "\xff",
}

// FuzzDecodeAcquire: the decoder never panics; what it accepts passes
// every check made before a provider is touched, and what it refuses
// wraps ErrBadRequest.
func FuzzDecodeAcquire(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte("POST /v1/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"))
	f.Fuzz(func(t *testing.T, body []byte) {
		// The lean loop's head parser, on the same bytes: it never panics,
		// and what it takes is a whole head of an operation.
		if h, ok := parseHead(body); ok && (h.headLen > len(body) || h.path == "" || h.contentLength < 0 ||
			!bytes.HasSuffix(body[:h.headLen], crlfcrlf)) {
			t.Fatalf("parseHead(%q) = %+v", body, h)
		}
		req, err := DecodeAcquire(body, time.Hour)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error %v does not wrap ErrBadRequest", err)
			}
			return
		}
		if req.Provider == "" || req.MaxWait < 0 || req.MaxWait > time.Hour {
			t.Fatalf("accepted %+v", req)
		}
		if err := checkCost(req.Cost); err != nil {
			t.Fatalf("accepted a cost checkCost refuses: %v", err)
		}
		if err := checkCaller(req.Caller); err != nil {
			t.Fatalf("accepted a caller checkCaller refuses: %v", err)
		}
		if req.Class != "" && !limiter.ValidClassName(req.Class) {
			t.Fatalf("accepted class %q, which is no class name", req.Class)
		}
	})
}

// FuzzHandler drives the HTTP API with any body on any operation: it
// never panics, always answers JSON with a status of its reason, and an
// answer other than 200 leaves the limits as they were.
func FuzzHandler(f *testing.F) {
	paths := []string{"/v1/acquire", "/v1/try_acquire", "/v1/reserve", "/v1/cancel", "/v1/settle"}
	for i, s := range fuzzSeeds {
		f.Add(uint8(i), []byte(s))
	}
	cfg := DefaultConfig()
	cfg.Socket, cfg.GRPCSocket, cfg.MaxGrants = "unused.sock", "", 1000
	cfg.Local = []LocalProvider{{Name: "llm", Limits: []limiter.Limit{{Quota: 1_000_000_000, Window: time.Hour},
		{Dimension: "tokens", Quota: 1_000_000_000, Window: time.Hour}}}}
	a, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { a.Close() })
	h := a.Handler()
	remaining := func() [2]int64 {
		m := a.providers["llm"].multi
		return [2]int64{m.Limiter(0).Stats().Remaining, m.Limiter(1).Stats().Remaining}
	}
	f.Fuzz(func(t *testing.T, op uint8, body []byte) {
		path := paths[int(op)%len(paths)]
		before := remaining()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", path, strings.NewReader(string(body))))
		var out struct {
			Error   string `json:"error"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
			t.Fatalf("%s %q: answer %q is not JSON", path, body, w.Body.Bytes())
		}
		if w.Code != outcomes[out.Error].http {
			t.Fatalf("%s %q: status %d for reason %q", path, body, w.Code, out.Error)
		}
		if w.Code != 200 && remaining() != before {
			t.Fatalf("%s %q: refused (%s) but the limits moved from %v to %v", path, body, out.Error, before, remaining())
		}
	})
}

// TestConfigValidate: each wrong field is named.
func TestConfigValidate(t *testing.T) {
	ok := DefaultConfig()
	if err := ok.Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	for _, tc := range []struct {
		field string
		mod   func(*Config)
	}{
		{"Socket", func(c *Config) { c.Socket, c.GRPCSocket = "", "" }},
		{"SocketMode", func(c *Config) { c.SocketMode = 0o7777 }},
		{"SocketMode", func(c *Config) { c.SocketMode = 0o066 }},
		{"GRPCSocket", func(c *Config) { c.GRPCSocket = c.Socket }},
		{"Listen", func(c *Config) { c.Listen, c.TokenFile = "0.0.0.0:7071", "t" }},
		{"Listen", func(c *Config) { c.Listen, c.TokenFile = "10.0.0.1:7071", "t" }},
		{"TokenFile", func(c *Config) { c.Listen = "127.0.0.1:7071" }},
		{"Endpoints", func(c *Config) { c.Providers = []string{"llm"} }},
		{"Providers", func(c *Config) { c.Endpoints, c.Providers = []string{"x"}, []string{"Bad Name"} }},
		{"Providers", func(c *Config) { c.Endpoints, c.Providers = []string{"x"}, []string{"llm~1"} }},
		{"Allow", func(c *Config) { c.Endpoints, c.Allow = []string{"x"}, []string{"["} }},
		{"Local", func(c *Config) {
			c.Local = []LocalProvider{{Name: "a", Limits: []limiter.Limit{{Quota: -1, Window: time.Second}}}}
		}},
		{"Local", func(c *Config) {
			c.Local = []LocalProvider{{Name: "a", Limits: []limiter.Limit{{Quota: 1, Window: time.Second}}}, {Name: "a", Limits: []limiter.Limit{{Quota: 1, Window: time.Second}}}}
		}},
		{"MaxProviders", func(c *Config) { c.MaxProviders = 0 }},
		{"MaxWait", func(c *Config) { c.MaxWait = 0 }},
		{"GrantTTL", func(c *Config) { c.GrantTTL = -1 }},
		{"MaxGrants", func(c *Config) { c.MaxGrants = 0 }},
		{"MaxCallers", func(c *Config) { c.MaxCallers = 0 }},
		{"ID", func(c *Config) { c.ID = "-bad" }},
	} {
		c := DefaultConfig()
		tc.mod(&c)
		err := c.Validate()
		ve, ok := errors.AsType[*ConfigValidationError](err)
		if !ok || ve.Field != tc.field || !errors.Is(err, ErrConfig) {
			t.Errorf("want an error naming %s, got %v", tc.field, err)
		}
	}
	for _, s := range []string{"llm=500/1m,tokens=200000/1m", "api=10/1s"} {
		if _, err := ParseLocal(s); err != nil {
			t.Errorf("ParseLocal(%q): %v", s, err)
		}
	}
	for _, s := range []string{"", "llm", "llm=", "llm=10", "llm=x/1s", "llm=10/7s", "llm=10/1s,a=1/1s,b=1/1s,c=1/1s,d=1/1s"} {
		if _, err := ParseLocal(s); !errors.Is(err, ErrConfig) {
			t.Errorf("ParseLocal(%q): %v; want ErrConfig", s, err)
		}
	}
}
