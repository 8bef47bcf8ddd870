package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// FuzzPreconditions feeds arbitrary If-Match and If-None-Match values to
// the API's precondition parsing: it must not panic; a refusal must be a
// one-line *schema.ValidationError; an acceptance a precondition the store
// knows (0 only for If-None-Match: * alone, neverMatches with a reason, a
// list only of two or more positive revisions). And what the CLI's client
// sends for a revision (writeHeaders) must parse back to that revision.
func FuzzPreconditions(f *testing.F) {
	for _, s := range [][2]string{
		{`"42"`, ""}, {`W/"42"`, ""}, {"*", ""}, {"", "*"}, {`"1", "2"`, ""}, {`""`, ""},
		{`"-1"`, ""}, {"99999999999999999999", ""}, {"", `"*"`}, {`"5"`, "*"}, {" \t*\t ", ""}, {"\"\xff\"", ""},
		{`W/"1", "2", , "2"`, ""}, {`"a,b"`, ""}, {`*, "1"`, ""}, {`"1" "2"`, ""}, {`"042"`, ""},
	} {
		f.Add(s[0], s[1], int64(42))
	}
	f.Add("", "", int64(-1))
	f.Add("", "", int64(0))
	f.Fuzz(func(t *testing.T, ifMatch, ifNoneMatch string, rev int64) {
		r := &http.Request{Header: http.Header{}}
		if ifMatch != "" {
			r.Header["If-Match"] = []string{ifMatch}
		}
		if ifNoneMatch != "" {
			r.Header["If-None-Match"] = []string{ifNoneMatch}
		}
		got, err := preconditions(r)
		hasIM, hasINM := strings.Trim(ifMatch, " \t") != "", strings.Trim(ifNoneMatch, " \t") != ""
		switch {
		case err != nil:
			var ve *schema.ValidationError
			if !errors.As(err, &ve) || !errors.Is(err, schema.ErrInvalid) {
				t.Fatalf("If-Match %q If-None-Match %q: error %v is not a schema.ValidationError", ifMatch, ifNoneMatch, err)
			}
			if msg := err.Error(); strings.ContainsAny(msg, "\r\n") || !strings.Contains(msg, "If-") || len(msg) > 512 {
				t.Fatalf("error %q: want one short line naming the header", msg)
			}
		case hasIM && hasINM:
			if got.ifRev != neverMatches || got.why == "" {
				t.Fatalf("If-Match %q with If-None-Match %q gave %+v, want neverMatches", ifMatch, ifNoneMatch, got)
			}
		case hasINM:
			if got.ifRev != 0 || got.revs != nil {
				t.Fatalf("If-None-Match %q gave %+v, want revision 0", ifNoneMatch, got)
			}
		case !hasIM:
			if got.ifRev != anyRevision || got.revs != nil {
				t.Fatalf("no precondition gave %+v", got)
			}
		case got.revs != nil:
			if got.ifRev != anyRevision || len(got.revs) < 2 || slices.ContainsFunc(got.revs, func(r int64) bool { return r <= 0 }) {
				t.Fatalf("If-Match %q gave %+v", ifMatch, got)
			}
		case got.ifRev == neverMatches:
			if got.why == "" {
				t.Fatalf("If-Match %q never matches, without a reason", ifMatch)
			}
		case got.ifRev == 0 || got.ifRev < mustExist:
			t.Fatalf("If-Match %q gave %+v", ifMatch, got)
		}

		// Client and server agree on every revision the CLI can send.
		if rev < anyRevision {
			return
		}
		back, err := preconditions(&http.Request{Header: writeHeaders(rev, "who")})
		if err != nil || back.ifRev != rev || back.revs != nil {
			t.Fatalf("writeHeaders(%d) parses back as %+v, %v", rev, back, err)
		}
	})
}

// FuzzAdminRequest sends arbitrary requests — method, provider name in the
// path (escaped or raw), sub-resource, If-Match, body — to the admin API's
// handler over a real etcd. Whatever the input: no panic; the status is one
// the API documents; every refusal is a JSON error; a refused request or a
// read changes nothing in etcd; an accepted PUT stores exactly the config
// it answers, under the name in the path.
func FuzzAdminRequest(f *testing.F) {
	f.Add(uint8(1), "p", false, "", `{"limit":5}`)
	f.Add(uint8(1), "p", false, `"1"`, `{"limit":5,"window":"100ms","mode":"shadow","algorithm":"fair","pacing":true,"floor":1}`)
	f.Add(uint8(1), "p", false, "", `{"limit":0,"limit":5}`)
	f.Add(uint8(1), "P", false, "", `{"limit":5}`)
	f.Add(uint8(1), "../p", true, "", `{"limit":5}`)
	f.Add(uint8(1), "a/b", false, "", `{"limit":5}`)
	f.Add(uint8(1), "café", false, "", `{"limit":5}`)
	f.Add(uint8(1), "p", false, "", `{"limit":5`)
	f.Add(uint8(1), "p", false, "", `[[[[[[[[[[`)
	f.Add(uint8(2), "p", false, `"x"`, "")
	f.Add(uint8(2), "p", false, "", "")
	f.Add(uint8(0), "p", false, "", "")
	f.Add(uint8(3), "p", false, "", "")
	f.Add(uint8(4), "p", false, "", "")
	f.Add(uint8(5), "p", false, "", "{}")

	srv := etcdtest.Start(f)
	cli := srv.Client(f)
	k := schema.DefaultKeys()
	a := &api{
		store:   &store{cli: cli, keys: k},
		log:     slog.New(slog.DiscardHandler),
		metrics: newMetrics(prometheus.NewRegistry()),
		leader:  func() bool { return false },
		ready:   func(context.Context) error { return nil },
	}
	hd := a.handler(prometheus.NewRegistry())
	revision := func(t *testing.T) int64 {
		resp, err := cli.Get(t.Context(), "probe")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}

	f.Fuzz(func(t *testing.T, op uint8, name string, raw bool, ifMatch, body string) {
		methods := []string{"GET", "PUT", "DELETE", "GET", "GET", "POST"}
		suffixes := []string{"", "", "", "/instances", "/history", ""}
		i := int(op) % len(methods)
		method := methods[i]
		seg := url.PathEscape(name)
		if raw {
			seg = name
		}
		u, err := url.Parse("http://configd/v1/providers/" + seg + suffixes[i])
		if err != nil {
			return // not a request an HTTP server could receive
		}
		req := &http.Request{Method: method, URL: u, Header: http.Header{}, Host: "configd",
			Body: http.NoBody, RemoteAddr: "127.0.0.1:1", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
		if body != "" {
			req.Body = httpBody(body)
			req.ContentLength = int64(len(body))
		}
		if ifMatch != "" {
			req.Header["If-Match"] = []string{ifMatch}
		}
		req = req.WithContext(t.Context())
		before := revision(t)
		rec := httptest.NewRecorder()
		hd.ServeHTTP(rec, req)
		after := revision(t)

		status := rec.Code
		switch status {
		case 200, 400, 404, 405, 409, 412, 413:
		case 301, 307, 308:
			if !raw && !strings.Contains(seg, "%") {
				t.Logf("redirect for %q", seg)
			}
			if before != after {
				t.Fatalf("%s %s: redirect %d, but etcd moved from revision %d to %d", method, u, status, before, after)
			}
			return
		default:
			t.Fatalf("%s %s If-Match %q body %q: status %d: %s", method, u, ifMatch, body, status, rec.Body)
		}
		if status != 200 {
			var e errorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error == "" {
				t.Fatalf("%s %s: %d with a body that is not a JSON error: %q", method, u, status, rec.Body)
			}
		}
		if (status != 200 || method == "GET") && before != after {
			t.Fatalf("%s %s If-Match %q body %q: answered %d but etcd moved from revision %d to %d", method, u, ifMatch, body, status, before, after)
		}
		if method != "PUT" || status != 200 {
			return
		}
		if err := schema.ValidateName(name); err != nil && !raw {
			t.Fatalf("PUT accepted the invalid name %q", name)
		}
		var ch changeView
		if err := json.Unmarshal(rec.Body.Bytes(), &ch); err != nil || ch.New == nil {
			t.Fatalf("PUT answer %q: %v", rec.Body, err)
		}
		resp, err := cli.Get(t.Context(), k.Config(ch.New.Name))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 {
			t.Fatalf("PUT %s answered 200 but %s does not exist", u, k.Config(ch.New.Name))
		}
		stored, err := schema.DecodeProviderConfig(resp.Kvs[0].Value)
		if err != nil || !stored.Equal(*ch.New) {
			t.Fatalf("PUT %s body %q answered %+v, stored %+v (%v)", u, body, *ch.New, stored, err)
		}
		if got := resp.Kvs[0].ModRevision; ch.Changed && got != ch.Revision {
			t.Fatalf("answered revision %d, stored at %d", ch.Revision, got)
		}
		if !strings.HasSuffix(u.Path, "/"+ch.New.Name) {
			t.Fatalf("PUT %s stored provider %q", u.Path, ch.New.Name)
		}
	})
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

func httpBody(s string) readCloser { return readCloser{bytes.NewReader([]byte(s))} }
