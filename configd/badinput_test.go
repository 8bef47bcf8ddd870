package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// This file extends TestBadInputCLI and TestAPIBadInput (which it does not
// repeat) with a sweep over every subcommand's flags and arguments and over
// the admin API's bodies, headers and paths. Each bad input must get a clear
// error (what was wrong, what is allowed), match the package's sentinel, and
// change nothing in etcd — neither a new provider nor an existing one.

// snapshot returns every config and history key under the providers prefix
// with its mod revision: what a write by configd's CLI or API would change.
// Shares and instance keys are left out (the leader may republish shares).
func snapshot(t testing.TB, cli *clientv3.Client) map[string]int64 {
	t.Helper()
	resp, err := cli.Get(ctxT(t), keys.Providers(), withPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, kv := range resp.Kvs {
		k, err := keys.Parse(string(kv.Key))
		if err != nil || k.Kind == schema.KindConfig || k.Kind == schema.KindHistory {
			out[string(kv.Key)] = kv.ModRevision
		}
	}
	return out
}

// diffSnapshots describes what changed between two snapshots, "" if nothing.
func diffSnapshots(before, after map[string]int64) string {
	var d []string
	for k, r := range after {
		if b, ok := before[k]; !ok {
			d = append(d, "added "+k)
		} else if b != r {
			d = append(d, fmt.Sprintf("rewrote %s (revision %d → %d)", k, b, r))
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			d = append(d, "deleted "+k)
		}
	}
	sort.Strings(d)
	return strings.Join(d, "; ")
}

// TestBadInputCLISweep runs every subcommand with bad flags and arguments
// against an existing provider "keep" (limit 100), through the admin API
// and straight to etcd. Every case must exit with code 2, print one line
// that names what was wrong, match errUsage or schema.ErrInvalid, and leave
// "keep" and everything else in etcd as it was.
func TestBadInputCLISweep(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	cli := srv.Client(t)
	cliOK(t, "set", "keep", "--limit", "100", "--server", r.url())
	huge := "99999999999999999999" // beyond int64
	cases := []struct {
		args []string
		want []string // substrings of the error, all required
		only string   // "api" or "etcd": only with that connection; "none": args carry their own
	}{
		// set: limits, windows, floors, offsets, modes out of range or
		// unparseable, on an existing provider (no --limit needed).
		{args: []string{"set", "keep", "--limit", huge}, want: []string{"limit must be a positive integer up to 1000000000000", `got "` + huge + `"`}},
		{args: []string{"set", "keep", "--limit", ""}, want: []string{"limit must be", `got ""`}},
		{args: []string{"set", "keep", "--limit", "0x10"}, want: []string{"limit must be", `got "0x10"`}},
		{args: []string{"set", "keep", "--limit", "1_000"}, want: []string{"limit must be", `got "1_000"`}},
		{args: []string{"set", "keep", "--limit", "-9223372036854775808"}, want: []string{"limit must be", "got -9223372036854775808"}},
		{args: []string{"set", "keep", "--limit"}, want: []string{"flag needs an argument: -limit"}},
		{args: []string{"set", "keep", "--window", "0"}, want: []string{"window must be a duration from 10ms to 1h that divides 24h", "got 0s"}},
		{args: []string{"set", "keep", "--window", "-1s"}, want: []string{"window must be", "got -1s"}},
		{args: []string{"set", "keep", "--window", ""}, want: []string{"window must be", `got ""`}},
		{args: []string{"set", "keep", "--window", "1000"}, want: []string{"window must be", `got "1000"`}},
		{args: []string{"set", "keep", "--window", "9999999999h"}, want: []string{"window must be", `got "9999999999h"`}},
		{args: []string{"set", "keep", "--window", "NaNs"}, want: []string{"window must be", `got "NaNs"`}},
		{args: []string{"set", "keep", "--floor", "-1"}, want: []string{"floor must be an integer from 0 up to the limit", "got -1"}},
		{args: []string{"set", "keep", "--floor", "101"}, want: []string{"floor must be", "got 101"}},
		{args: []string{"set", "keep", "--floor", "abc"}, want: []string{"floor must be", `got "abc"`}},
		{args: []string{"set", "keep", "--floor", huge}, want: []string{"floor must be", huge}},
		{args: []string{"set", "keep", "--max-clock-offset", "2h"}, want: []string{"max_clock_offset", "got 2h0m0s"}},
		{args: []string{"set", "keep", "--max-clock-offset", "soon"}, want: []string{"max_clock_offset", `got "soon"`}},
		{args: []string{"set", "keep", "--fail-static", "2h"}, want: []string{"fail_static", "got 2h0m0s", "from 0 to 1h"}},
		{args: []string{"set", "keep", "--fail-static", "later"}, want: []string{"fail_static", `got "later"`}},
		{args: []string{"set", "keep", "--max-clock-offset", "-1s"}, want: []string{"max_clock_offset", "got -1s", "from 0 to 1h"}},
		{args: []string{"set", "keep", "--mode", ""}, want: []string{`mode must be "enforce" or "shadow"`, `got ""`}},
		{args: []string{"set", "keep", "--mode", "ENFORCE"}, want: []string{`mode must be "enforce" or "shadow"`, `got "ENFORCE"`}},
		{args: []string{"set", "keep", "--algorithm", ""}, want: []string{`algorithm must be "even" or "fair"`}},
		{args: []string{"set", "keep", "--pacing=maybe"}, want: []string{`invalid boolean value "maybe" for -pacing`}},
		{args: []string{"set", "keep", "--dry-run=2", "--limit", "5"}, want: []string{`invalid boolean value "2" for -dry-run`}},
		{args: []string{"set", "keep", "--limit", "5", "--if-revision", "abc"}, want: []string{"--if-revision must be a revision number >= 0", `got "abc"`}},
		{args: []string{"set", "keep", "--limit", "5", "--if-revision", huge}, want: []string{"--if-revision must be", huge}},
		{args: []string{"set", "keep", "--limit", "5", "--timeout", "0s"}, want: []string{"--timeout must be positive, got 0s"}},
		{args: []string{"set", "keep", "--limit", "5", "--timeout", "-1s"}, want: []string{"--timeout must be positive, got -1s"}},
		{args: []string{"set", "keep", "--limit", "5", "--timeout", "forever"}, want: []string{`invalid value "forever" for flag -timeout`}},
		{args: []string{"set", "keep", "--", "--limit", "5"}, want: []string{"exactly one provider NAME, got 3 arguments"}},
		{args: []string{"set", "-", "--limit", "5"}, want: []string{"name must match", `got "-"`}},
		{args: []string{"set", "../keep", "--limit", "5"}, want: []string{"name must match", `got "../keep"`}},
		{args: []string{"set", "café", "--limit", "5"}, want: []string{"name must match", `got "café"`}},
		{args: []string{"set", "ｋｅｅｐ", "--limit", "5"}, want: []string{"name must match"}},
		{args: []string{"set", "keep\x00", "--limit", "5"}, want: []string{"name must match", `got "keep\x00"`}},
		{args: []string{"set", "keep\n", "--limit", "5"}, want: []string{"name must match", `got "keep\n"`}},
		{args: []string{"set", "k p", "--limit", "5"}, want: []string{"name must match"}},
		{args: []string{"set", strings.Repeat("k", 10000), "--limit", "5"}, want: []string{"name must match", `..."`}},
		// get, list, delete, status, history: arity, flags.
		{args: []string{"get"}, want: []string{"get: want exactly one provider NAME, got 0 arguments"}},
		{args: []string{"get", "keep", "extra"}, want: []string{"exactly one provider NAME, got 2"}},
		{args: []string{"get", "keep", "--json=yes"}, want: []string{`invalid boolean value "yes" for -json`}},
		{args: []string{"get", "keep", "--bogus"}, want: []string{"flag provided but not defined: -bogus", "configd get --help"}},
		{args: []string{"get", "keep", "--timeout", "-1ns"}, want: []string{"--timeout must be positive"}},
		{args: []string{"list", "--bogus"}, want: []string{"flag provided but not defined: -bogus"}},
		{args: []string{"list", "--json=x"}, want: []string{`invalid boolean value "x" for -json`}},
		{args: []string{"list", "a", "b"}, want: []string{"list: takes no arguments"}},
		{args: []string{"delete"}, want: []string{"delete: want exactly one provider NAME, got 0"}},
		{args: []string{"delete", "keep", "other"}, want: []string{"exactly one provider NAME, got 2"}},
		{args: []string{"delete", "keep", "--if-revision", "0"}, want: []string{"--if-revision must be a revision number >= 1", `got "0"`}},
		{args: []string{"delete", "keep", "--if-revision", "-5"}, want: []string{"--if-revision must be", `got "-5"`}},
		{args: []string{"delete", "keep", "--if-revision", "x"}, want: []string{"--if-revision must be", `got "x"`}},
		{args: []string{"delete", "keep", "--if-revision", huge}, want: []string{"--if-revision must be", huge}},
		{args: []string{"delete", "keep", "--if-revision"}, want: []string{"flag needs an argument: -if-revision"}},
		{args: []string{"delete", "../keep"}, want: []string{"name must match"}},
		{args: []string{"status"}, want: []string{"status: want exactly one provider NAME"}},
		{args: []string{"status", "keep", "x"}, want: []string{"exactly one provider NAME, got 2"}},
		{args: []string{"status", "KEEP"}, want: []string{"name must match", `got "KEEP"`}},
		{args: []string{"history", "keep", "x"}, want: []string{"exactly one provider NAME, got 2"}},
		{args: []string{"history", "keep/../keep"}, want: []string{"name must match"}},
		{args: []string{"history", "keep", "--bogus=1"}, want: []string{"flag provided but not defined: -bogus"}},
		// Connection flags.
		{args: []string{"get", "keep", "--server", "ftp://127.0.0.1:7070"}, want: []string{"--server", "is not a URL such as http://127.0.0.1:7070"}, only: "api"},
		{args: []string{"get", "keep", "--server", ""}, want: []string{"--server", "is not a URL"}, only: "api"},
		{args: []string{"get", "keep", "--prefix", "sluice"}, want: []string{"prefix must start and end with", `got "sluice"`}, only: "etcd"},
		{args: []string{"get", "keep", "--prefix", "//"}, want: []string{"prefix must start and end with"}, only: "etcd"},
		{args: []string{"get", "keep", "--etcd-endpoints", "nope"}, want: []string{"--etcd-endpoints", `"nope" is not a URL`}, only: "none"},
		{args: []string{"get", "keep", "--etcd-endpoints", " , "}, want: []string{"--etcd-endpoints: no endpoint given"}, only: "none"},
		{args: []string{"get", "keep", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-dial-timeout", "-1s"}, want: []string{"--etcd-dial-timeout must be positive"}, only: "none"},
		{args: []string{"get", "keep", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-key", "k.pem"}, want: []string{"--etcd-cert and --etcd-key go together"}, only: "none"},
		// serve (never reaches etcd: every case is refused first).
		{args: []string{"serve", "extra"}, want: []string{"serve: takes no arguments"}, only: "none"},
		{args: []string{"serve", "--etcd-endpoints", "http://127.0.0.1:1", "--session-ttl", "-1s"}, want: []string{"--session-ttl"}, only: "none"},
		{args: []string{"serve", "--etcd-endpoints", "http://127.0.0.1:1", "--history-keep", "-1"}, want: []string{"--history-keep"}, only: "none"},
		{args: []string{"serve", "--etcd-endpoints", "http://127.0.0.1:1", "--history-keep", huge}, want: []string{`invalid value "` + huge + `" for flag -history-keep`}, only: "none"},
		{args: []string{"serve", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-max-txn-ops", "-5"}, want: []string{"--etcd-max-txn-ops", "must be 0 (etcd's default) or from 3 to 4096"}, only: "none"},
		{args: []string{"serve", "--etcd-endpoints", "http://127.0.0.1:1", "--propagation-margin", "x"}, want: []string{`invalid value "x" for flag -propagation-margin`}, only: "none"},
		{args: []string{"serve", "--etcd-endpoints", "http://127.0.0.1:1", "--listen", ""}, want: []string{"--listen"}, only: "none"},
		{args: []string{"serve", "--etcd-endpoints", "http://127.0.0.1:1", "--log-level"}, want: []string{"flag needs an argument: -log-level"}, only: "none"},
	}
	modes := map[string][]string{
		"api":  {"--server", r.url()},
		"etcd": {"--etcd-endpoints", srv.Endpoints()[0]},
	}
	before := snapshot(t, cli)
	for mode, conn := range modes {
		for _, tc := range cases {
			if tc.only == "none" && mode != "api" || tc.only != "" && tc.only != "none" && tc.only != mode {
				continue
			}
			args := tc.args
			if tc.only != "none" {
				// The connection right after the subcommand, so that the
				// case's own flags come last and win, and a flag left
				// without its value at the end stays so.
				args = append(append(append([]string{}, args[0]), conn...), args[1:]...)
			}
			name := strings.Join(tc.args, "_")
			if len(name) > 60 {
				name = name[:60]
			}
			t.Run(mode+"/"+name, func(t *testing.T) {
				_, err := cliRun(t, args...)
				if err == nil {
					t.Fatal("accepted")
				}
				msg := err.Error()
				var problems []string
				if exitCode(err) != 2 {
					problems = append(problems, fmt.Sprintf("exit code %d, want 2", exitCode(err)))
				}
				if !errors.Is(err, errUsage) && !errors.Is(err, schema.ErrInvalid) {
					problems = append(problems, "matches neither errUsage nor schema.ErrInvalid")
				}
				if strings.Contains(msg, "\n") {
					problems = append(problems, "more than one line")
				}
				for _, w := range tc.want {
					if !strings.Contains(msg, w) {
						problems = append(problems, fmt.Sprintf("does not contain %q", w))
					}
				}
				if len(msg) > 400 {
					problems = append(problems, fmt.Sprintf("%d bytes long", len(msg)))
				}
				if len(problems) > 0 {
					t.Errorf("error %q: %s", msg, strings.Join(problems, "; "))
				}
			})
		}
	}
	if d := diffSnapshots(before, snapshot(t, cli)); d != "" {
		t.Errorf("bad input changed etcd: %s", d)
	}
	if out := cliOK(t, "get", "keep", "--server", r.url()); !strings.Contains(out, "limit:            100") {
		t.Errorf("keep changed:\n%s", out)
	}
}

// doRaw sends one request without following redirects and returns status,
// headers and body.
func doRaw(t *testing.T, method, url string, hdr http.Header, body string) (int, http.Header, string) {
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
		req.Header[k] = v
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// jsonErrorOf decodes a JSON error body, reporting false if it is not one.
func jsonErrorOf(body string) (string, bool) {
	var e struct {
		Error string `json:"error"`
	}
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Error == "" {
		return "", false
	}
	return e.Error, true
}

// h builds a header from name, value pairs; a name may repeat.
func h(kv ...string) http.Header {
	out := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		out[http.CanonicalHeaderKey(kv[i])] = append(out[http.CanonicalHeaderKey(kv[i])], kv[i+1])
	}
	return out
}

// TestAPIBadInputSweep sends the admin API bad bodies (content types,
// truncated, deeply nested, numbers as strings, NaN and infinities,
// duplicated keys, oversized), bad precondition headers and bad provider
// names in the path (traversal, encoded slashes, unicode, control
// characters). Each must be answered with its status and a JSON error
// naming what was wrong, and nothing in etcd may change — the existing
// provider "keep" included.
func TestAPIBadInputSweep(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	cli := srv.Client(t)
	base := r.url() + "/v1/providers/"
	if status, body := do(t, "PUT", base+"keep", nil, `{"limit":100}`); status != 200 {
		t.Fatalf("creating keep: %d %s", status, body)
	}
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	deepObj := func(n int) string { return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n) }
	cases := []struct {
		name, method, path string
		hdr                http.Header
		body               string
		status             int
		want               string
	}{
		// Content types: the body is read as JSON whatever the type says,
		// so a form or multipart body is malformed JSON.
		{"form body", "PUT", "new", h("Content-Type", "application/x-www-form-urlencoded"), "limit=5", 400, "malformed JSON"},
		{"multipart body", "PUT", "new", h("Content-Type", "multipart/form-data; boundary=x"), "--x\r\nContent-Disposition: form-data; name=\"limit\"\r\n\r\n5\r\n--x--\r\n", 400, "malformed JSON"},
		{"utf-16 body", "PUT", "new", h("Content-Type", "application/json; charset=utf-16"), "\xff\xfe{\x00\"\x00l\x00", 400, "malformed JSON"},
		{"BOM", "PUT", "new", nil, "\xef\xbb\xbf{\"limit\":5}", 400, "malformed JSON"},
		{"xml", "PUT", "new", h("Content-Type", "application/xml"), "<limit>5</limit>", 400, "malformed JSON"},
		// Truncated JSON.
		{"truncated object", "PUT", "new", nil, `{"limit":5`, 400, "empty or truncated"},
		{"truncated value", "PUT", "new", nil, `{"limit":`, 400, "empty or truncated"},
		{"truncated string", "PUT", "new", nil, `{"limit":5,"window":"1`, 400, "empty or truncated"},
		{"just a brace", "PUT", "new", nil, `{`, 400, "empty or truncated"},
		{"whitespace only", "PUT", "new", nil, " \n\t ", 400, "empty or truncated"},
		// Deeply nested JSON: refused by the decoder's depth limit, without
		// a stack overflow.
		{"nested arrays in an unknown field", "PUT", "new", nil, `{"limit":5,"x":` + deep(100000) + `}`, 400, "malformed JSON"},
		{"nested arrays in limit", "PUT", "new", nil, `{"limit":` + deep(20000) + `}`, 400, "malformed JSON"},
		{"nested objects", "PUT", "new", nil, deepObj(50000), 400, "malformed JSON"},
		{"nested within the depth limit", "PUT", "new", nil, `{"limit":5,"x":` + deep(100) + `}`, 400, "unknown field"},
		// Wrong top-level types.
		{"array body", "PUT", "new", nil, `[]`, 400, "object"},
		{"string body", "PUT", "new", nil, `"limit"`, 400, "object"},
		{"number body", "PUT", "new", nil, `5`, 400, "object"},
		{"null body", "PUT", "new", nil, `null`, 400, "limit must be a positive integer"},
		// Numbers as strings, and other wrong types.
		{"pacing as string", "PUT", "new", nil, `{"limit":5,"pacing":"true"}`, 400, "pacing must be of type boolean"},
		{"floor as string", "PUT", "new", nil, `{"limit":5,"floor":"1"}`, 400, "floor must be"},
		{"version as string", "PUT", "new", nil, `{"limit":5,"version":"1"}`, 400, "version must be 1"},
		{"offset as number", "PUT", "new", nil, `{"limit":5,"max_clock_offset":100}`, 400, "clock offset"},
		{"limit as exponent string", "PUT", "new", nil, `{"limit":"1e3"}`, 400, "got a JSON string"},
		{"limit as object", "PUT", "new", nil, `{"limit":{"n":5}}`, 400, "limit must be"},
		{"limit as bool", "PUT", "new", nil, `{"limit":true}`, 400, "limit must be"},
		{"limit as array", "PUT", "new", nil, `{"limit":[5]}`, 400, "limit must be"},
		{"mode as number", "PUT", "new", nil, `{"limit":5,"mode":1}`, 400, "mode must be"},
		{"name as number", "PUT", "new", nil, `{"limit":5,"name":7}`, 400, "name must match"},
		// NaN and infinities are not JSON; huge and fractional numbers do
		// not fit an integer.
		{"NaN", "PUT", "new", nil, `{"limit":NaN}`, 400, "malformed JSON"},
		{"Infinity", "PUT", "new", nil, `{"limit":Infinity}`, 400, "malformed JSON"},
		{"-Infinity", "PUT", "new", nil, `{"limit":-Infinity}`, 400, "malformed JSON"},
		{"1e400", "PUT", "new", nil, `{"limit":1e400}`, 400, "got 1e400"},
		{"5e0", "PUT", "new", nil, `{"limit":5e0}`, 400, "got 5e0"},
		{"huge integer", "PUT", "new", nil, `{"limit":99999999999999999999}`, 400, "got 99999999999999999999"},
		{"version 2", "PUT", "new", nil, `{"limit":5,"version":2}`, 400, "version must be 1 (or absent), got 2"},
		{"floor above limit", "PUT", "new", nil, `{"limit":5,"floor":6}`, 400, "floor must be an integer from 0 up to the limit, got 6"},
		{"negative offset", "PUT", "new", nil, `{"limit":5,"max_clock_offset":"-1s"}`, 400, "max_clock_offset"},
		{"negative fail static", "PUT", "new", nil, `{"limit":5,"fail_static":"-1s"}`, 400, "fail_static"},
		// Duplicated keys, and keys that match a field only when case is
		// ignored: encoding/json would let the last one win and match
		// "LIMIT" to limit, so one body could say two things (a proxy or an
		// auditor reading the first value sees another limit than configd
		// stores). Both are refused, naming the key.
		{"duplicated limit", "PUT", "new", nil, `{"limit":0,"limit":5}`, 400, `body: duplicate key "limit" (a key may appear only once in an object)`},
		{"duplicated limit, same value", "PUT", "new", nil, `{"limit":5,"limit":5}`, 400, `duplicate key "limit"`},
		{"duplicated limit, escaped", "PUT", "new", nil, `{"limit":5,"\u006cimit":7}`, 400, `duplicate key "limit"`},
		{"limit and LIMIT", "PUT", "new", nil, `{"limit":5,"LIMIT":7}`, 400, `body: unknown field "LIMIT" (field names are case-sensitive; did you mean "limit"?)`},
		{"Limit alone", "PUT", "new", nil, `{"Limit":5}`, 400, `unknown field "Limit" (field names are case-sensitive; did you mean "limit"?)`},
		{"long s folds to s", "PUT", "new", nil, `{"limit":5,"pacing":false,"ver\u017fion":1}`, 400, `did you mean "version"?`},
		{"duplicated name", "PUT", "new", nil, `{"name":"new","name":"other","limit":5}`, 400, `duplicate key "name"`},
		// Oversized.
		{"1 MiB + 1 of padding", "PUT", "new", nil, `{"limit":5}` + strings.Repeat(" ", 1<<20), 413, "larger than 1048576 bytes"},
		{"8 MiB", "PUT", "new", nil, strings.Repeat("x", 8<<20), 413, "larger than 1048576 bytes"},
		// Preconditions. configd's ETags are revisions in quotes: a tag
		// that is not one is well formed but never matches (412); a
		// header that is not "*" or entity tags is 400.
		{"If-Match empty quotes", "PUT", "keep", h("If-Match", `""`), `{"limit":5}`, 412, "If-Match names no revision"},
		{"If-Match negative", "PUT", "keep", h("If-Match", `"-1"`), `{"limit":5}`, 412, "If-Match names no revision"},
		{"If-Match overflow", "PUT", "keep", h("If-Match", `"99999999999999999999"`), `{"limit":5}`, 412, "If-Match names no revision"},
		{"If-Match hex", "PUT", "keep", h("If-Match", `"0x10"`), `{"limit":5}`, 412, "If-Match names no revision"},
		{"If-Match list", "PUT", "keep", h("If-Match", `"1", "0"`), `{"limit":5}`, 412, "conflict"},
		{"If-Match unicode", "PUT", "keep", h("If-Match", `"٣"`), `{"limit":5}`, 412, "If-Match names no revision"},
		{"If-Match unquoted", "PUT", "keep", h("If-Match", `42`), `{"limit":5}`, 400, `If-Match must be "*" or entity tags`},
		{"If-Match unterminated", "PUT", "keep", h("If-Match", `"42`), `{"limit":5}`, 400, `If-Match must be "*" or entity tags`},
		{"If-Match no comma", "PUT", "keep", h("If-Match", `"1" "2"`), `{"limit":5}`, 400, `If-Match must be "*" or entity tags`},
		{"If-Match control character", "PUT", "keep", h("If-Match", "\"4\t2\""), `{"limit":5}`, 400, `If-Match must be "*" or entity tags`},
		{"If-Match stale weak", "PUT", "keep", h("If-Match", `W/"1"`), `{"limit":5}`, 412, "a weak entity tag"},
		{"If-Match 64 KiB", "PUT", "keep", h("If-Match", strings.Repeat("9", 64<<10)), `{"limit":5}`, 400, `If-Match must be "*" or entity tags`},
		{"If-None-Match quoted star", "PUT", "new", h("If-None-Match", `"*"`), `{"limit":5}`, 400, `If-None-Match supports only "*"`},
		{"If-None-Match list", "PUT", "new", h("If-None-Match", `*, "3"`), `{"limit":5}`, 400, "If-None-Match"},
		{"If-None-Match on existing", "PUT", "keep", h("If-None-Match", "*"), `{"limit":5}`, 412, "was expected not to exist"},
		{"If-Match and If-None-Match", "PUT", "both", h("If-Match", `"12345"`, "If-None-Match", "*"), `{"limit":5}`, 412, "never hold together"},
		{"If-Match * on a missing provider", "PUT", "new", h("If-Match", "*"), `{"limit":5}`, 412, `"new" does not exist, and If-Match: * writes only a provider that exists`},
		{"delete If-Match bad", "DELETE", "keep", h("If-Match", "yesterday"), "", 400, "If-Match must be"},
		{"delete If-Match stale", "DELETE", "keep", h("If-Match", `"1"`), "", 412, "conflict"},
		{"delete If-None-Match bad", "DELETE", "keep", h("If-None-Match", "x"), "", 400, "If-None-Match"},
		// Provider names in the path.
		{"encoded slash", "PUT", "a%2Fb", nil, `{"limit":5}`, 400, `name must match ^[a-z0-9][a-z0-9._-]{0,127}$, got "a/b"`},
		{"encoded traversal", "PUT", "..%2Fkeep", nil, `{"limit":5}`, 400, "name must match"},
		{"encoded dot dot", "PUT", "%2e%2e", nil, `{"limit":5}`, 400, "name must match"},
		{"dot", "GET", "%2e", nil, "", 400, "name must match"},
		{"unicode", "PUT", "caf%C3%A9", nil, `{"limit":5}`, 400, `got "café"`},
		{"fullwidth", "PUT", "%EF%BD%8B%EF%BD%85%EF%BD%85%EF%BD%90", nil, `{"limit":5}`, 400, "name must match"},
		{"right-to-left override", "PUT", "%E2%80%AEpeek", nil, `{"limit":5}`, 400, "name must match"},
		{"invalid utf-8", "PUT", "p%FF", nil, `{"limit":5}`, 400, "name must match"},
		{"NUL", "PUT", "p%00", nil, `{"limit":5}`, 400, `got "p\x00"`},
		{"newline", "PUT", "p%0Aq", nil, `{"limit":5}`, 400, "name must match"},
		{"leading space", "PUT", "%20p", nil, `{"limit":5}`, 400, "name must match"},
		{"leading dash", "PUT", "-p", nil, `{"limit":5}`, 400, "name must match"},
		{"129 characters", "PUT", strings.Repeat("p", 129), nil, `{"limit":5}`, 400, "name must match"},
		{"8 KiB name", "GET", strings.Repeat("p", 8<<10), nil, "", 400, `..."`},
		{"delete encoded slash", "DELETE", "keep%2F..%2Fkeep", nil, "", 400, "name must match"},
		{"status unicode", "GET", "caf%C3%A9/instances", nil, "", 400, "name must match"},
		{"history traversal", "GET", "..%2F..%2Fconfigd/history", nil, "", 400, "name must match"},
		{"empty name", "PUT", "", nil, `{"limit":5}`, 404, "no such endpoint"},
		// Methods a path does not serve: 405, with Allow.
		{"POST", "POST", "keep", nil, `{"limit":5}`, 405, "method not allowed: POST /v1/providers/keep; it allows DELETE, GET, HEAD, PUT"},
		{"PATCH", "PATCH", "keep", nil, `{"limit":5}`, 405, "method not allowed: PATCH"},
		{"PUT on instances", "PUT", "keep/instances", nil, `{"limit":5}`, 405, "it allows GET, HEAD"},
	}
	before := snapshot(t, cli)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, hdr, body := doRaw(t, tc.method, base+tc.path, tc.hdr, tc.body)
			var problems []string
			if status != tc.status {
				problems = append(problems, fmt.Sprintf("status %d, want %d", status, tc.status))
			}
			msg, ok := jsonErrorOf(body)
			if ct := hdr.Get("Content-Type"); ct != "application/json" || !ok {
				problems = append(problems, fmt.Sprintf("not a JSON error: Content-Type %q, body %.200q", ct, body))
			} else {
				if !strings.Contains(msg, tc.want) {
					problems = append(problems, fmt.Sprintf("error does not contain %q", tc.want))
				}
				if len(msg) > 1000 {
					problems = append(problems, fmt.Sprintf("error is %d bytes: it echoes the input unshortened", len(msg)))
				}
			}
			if len(problems) > 0 {
				t.Errorf("%s %s: error %.300q: %s", tc.method, tc.path, msg, strings.Join(problems, "; "))
			}
		})
	}
	if d := diffSnapshots(before, snapshot(t, cli)); d != "" {
		t.Errorf("bad requests changed etcd: %s", d)
	}
	if status, body := do(t, "GET", base+"keep", nil, ""); status != 200 || !strings.Contains(body, `"limit": 100`) {
		t.Errorf("keep after the sweep: %d %s", status, body)
	}
}

// TestAPIPathTraversalNeverReachesAnotherKey: unencoded dot segments are
// cleaned by the router, which answers with a redirect (never a write);
// whatever the client does next, nothing outside the named provider is
// written.
func TestAPIPathTraversalNeverReachesAnotherKey(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	cli := srv.Client(t)
	before := snapshot(t, cli)
	for _, path := range []string{
		"/v1/providers/../providers/x", "/v1/providers/./x/../y", "/v1/providers//x", "/v1/providers/x/", "/v1/providers/x/.",
	} {
		for _, method := range []string{"PUT", "DELETE"} {
			status, hdr, body := doRaw(t, method, r.url()+path, nil, `{"limit":5}`)
			switch {
			case status == http.StatusMovedPermanently || status == http.StatusTemporaryRedirect || status == http.StatusPermanentRedirect:
				t.Logf("%s %s: %d to %s", method, path, status, hdr.Get("Location"))
			case status >= 400 && status < 500:
				errorOf(t, body)
			default:
				t.Errorf("%s %s: %d %s, want a redirect or a 4xx", method, path, status, body)
			}
		}
	}
	if d := diffSnapshots(before, snapshot(t, cli)); d != "" {
		t.Errorf("traversal attempts changed etcd: %s", d)
	}
}

// TestAPIOddActorHeader: X-Sluice-Actor is free text from the caller (HTTP
// itself keeps out control characters but tab). A valid write with a huge
// actor of tabs, bidi overrides and invalid UTF-8 is recorded in history
// shortened and printable.
func TestAPIOddActorHeader(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	actor := "evil\t\u202e\u200b" + strings.Repeat("\xff", 100) + strings.Repeat("a", 16<<10)
	status, _, body := doRaw(t, "PUT", r.url()+"/v1/providers/p", h(actorHeader, actor), `{"limit":5}`)
	if status != 200 {
		t.Fatalf("PUT: %d %s", status, body)
	}
	_, _, body = doRaw(t, "GET", r.url()+"/v1/providers/p/history", nil, "")
	var hist []schema.HistoryEntry
	if err := json.Unmarshal([]byte(body), &hist); err != nil || len(hist) != 1 {
		t.Fatalf("history: %v: %s", err, body)
	}
	who := hist[0].Who
	if len(who) > 256 {
		t.Errorf("history who is %d bytes long, want at most 256", len(who))
	}
	if strings.ContainsAny(who, "\t\u202e\u200b") {
		t.Errorf("history who keeps unprintable characters: %q", who)
	}
	if !strings.HasPrefix(who, "evil") || !strings.Contains(who, "via api@127.0.0.1") {
		t.Errorf("history who = %.80q..., want the actor and the caller", who)
	}
}
