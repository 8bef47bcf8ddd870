package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

// The lean loop against a hostile or broken client: every test here
// sends what no well-behaved client sends, and checks that the agent
// answers with a status and a message, changes nothing, and keeps no
// goroutine for it (TestMain's leak check).

// dialSock opens a connection to the agent's HTTP socket, closed with the test.
func dialSock(t *testing.T, s *served) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("unix", s.sock())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// readAnswer reads one answer and decodes its JSON body.
func readAnswer(t *testing.T, br *bufio.Reader, what string) (*http.Response, errorJSON) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s: no answer: %v", what, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e errorJSON
	if resp.StatusCode != 200 {
		if err := json.Unmarshal(b, &e); err != nil || e.Error == "" || e.Message == "" {
			t.Errorf("%s: status %d, body %q: want a JSON error with a message", what, resp.StatusCode, b)
		}
	}
	return resp, e
}

// closedByAgent reports whether the agent closed c (a read sees EOF).
func closedByAgent(br *bufio.Reader) bool {
	_, err := br.ReadByte()
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)
}

// TestLeanBareLFHead: a head whose lines end in LF alone (a hand-typed
// request, some old clients) is answered, not waited on forever for a
// CRLF blank line that never comes.
func TestLeanBareLFHead(t *testing.T) {
	s := serve(t, conf(llm))
	body := `{"provider":"llm","cost":{"tokens":1}}`
	for _, tc := range []struct{ name, req string }{
		{"GET", "GET /healthz HTTP/1.1\nHost: a\n\n"},
		{"POST", "POST /v1/try_acquire HTTP/1.1\nHost: a\nContent-Length: 38\n\n" + body},
	} {
		c, br := dialSock(t, s)
		io.WriteString(c, tc.req)
		if resp, _ := readAnswer(t, br, tc.name); resp.StatusCode != 200 {
			t.Errorf("%s with bare LF: status %d, want 200", tc.name, resp.StatusCode)
		}
	}
}

// TestLeanIncompleteRequestTimesOut: a client that sends part of a head
// (slowloris), or fewer body bytes than its Content-Length, and then
// nothing, is answered 408 and closed after HeaderTimeout, and took
// nothing.
func TestLeanIncompleteRequestTimesOut(t *testing.T) {
	cfg := conf(llm)
	cfg.HeaderTimeout = 20 * time.Millisecond
	s := serve(t, cfg)
	body := `{"provider":"llm","cost":{"tokens":1}}`
	for _, tc := range []struct{ name, req string }{
		{"half a head", "POST /v1/acquire HTTP/1.1\r\nHost: a\r\n"},
		{"a head without its end", post("/v1/acquire", body)[:60]},
		{"a body shorter than its Content-Length", post("/v1/acquire", body)[:len(post("/v1/acquire", body))-5]},
		{"a byte", "P"},
		// net/http reads this one (chunked): the same timeout holds.
		{"a chunked body that stops", "POST /v1/acquire HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"pro"},
	} {
		c, br := dialSock(t, s)
		io.WriteString(c, tc.req)
		resp, e := readAnswer(t, br, tc.name)
		if resp.StatusCode != http.StatusRequestTimeout || e.Error != ReasonBadRequest {
			t.Errorf("%s: %d %+v, want 408 BAD_REQUEST", tc.name, resp.StatusCode, e)
		}
		if !closedByAgent(br) {
			t.Errorf("%s: the connection stays open after the 408", tc.name)
		}
	}
	// A slow client that completes its request within the timeout is
	// still answered: the deadline covers the whole request, not a read.
	if st := s.limit(t, "llm", 1); st.Remaining != 1000 {
		t.Errorf("tokens remaining %d after incomplete requests, want 1000", st.Remaining)
	}
}

// TestLeanIdleConnectionIsNotTimedOut: a kept connection with nothing
// sent is idle, not slow: the timeout starts at a request's first byte.
func TestLeanIdleConnectionIsNotTimedOut(t *testing.T) {
	cfg := conf(llm)
	cfg.HeaderTimeout = 5 * time.Millisecond
	s := serve(t, cfg)
	c, br := dialSock(t, s)
	io.WriteString(c, post("/v1/try_acquire", `{"provider":"llm","cost":{"tokens":1}}`))
	if resp, _ := readAnswer(t, br, "before idling"); resp.StatusCode != 200 {
		t.Fatalf("before idling: %d", resp.StatusCode)
	}
	// The connection is in the agent's loop now. Idle for several
	// timeouts (what is tested, not a synchronisation), then ask again.
	time.Sleep(4 * cfg.HeaderTimeout)
	io.WriteString(c, post("/v1/try_acquire", `{"provider":"llm","cost":{"tokens":1}}`))
	if resp, _ := readAnswer(t, br, "after idling"); resp.StatusCode != 200 {
		t.Errorf("after idling: %d", resp.StatusCode)
	}
}

// TestLeanBodyLongerThanContentLength: the bytes past Content-Length are
// the next request; garbage there is refused by net/http with 400 and
// the connection closed, after the first request's answer, and the
// garbage took nothing.
func TestLeanBodyLongerThanContentLength(t *testing.T) {
	s := serve(t, conf(llm))
	c, br := dialSock(t, s)
	body := `{"provider":"llm","cost":{"tokens":1}}`
	io.WriteString(c, post("/v1/try_acquire", body)+`{"provider":"llm","cost":{"tokens":7}}`+"\r\n\r\n")
	if resp, _ := readAnswer(t, br, "the first request"); resp.StatusCode != 200 {
		t.Errorf("first request: %d", resp.StatusCode)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 400 {
		t.Errorf("the bytes past Content-Length: %v %v, want 400", resp, err)
	}
	if st := s.limit(t, "llm", 1); st.Remaining != 999 {
		t.Errorf("tokens remaining %d, want 999: the extra bytes took nothing", st.Remaining)
	}
}

// TestLeanConnectionClose: Connection: close is answered, says so, and
// the agent closes; the request pipelined after it is not run.
func TestLeanConnectionClose(t *testing.T) {
	s := serve(t, conf(llm))
	c, br := dialSock(t, s)
	body := `{"provider":"llm","cost":{"tokens":1}}`
	io.WriteString(c, post("/v1/try_acquire", body, "Connection: close\r\n")+post("/v1/try_acquire", body))
	resp, _ := readAnswer(t, br, "Connection: close")
	if resp.StatusCode != 200 || !resp.Close {
		t.Errorf("Connection: close: status %d, close %v", resp.StatusCode, resp.Close)
	}
	if !closedByAgent(br) {
		t.Error("the agent kept the connection open after Connection: close")
	}
	if st := s.limit(t, "llm", 1); st.Remaining != 999 {
		t.Errorf("tokens remaining %d, want 999: the request after close is not run", st.Remaining)
	}
}

// TestLeanPipelined: requests sent back to back are answered in order
// on the lean path, each taking once.
func TestLeanPipelined(t *testing.T) {
	s := serve(t, conf(llm))
	c, br := dialSock(t, s)
	var req strings.Builder
	for range 4 {
		req.WriteString(post("/v1/try_acquire", `{"provider":"llm","cost":{"requests":0,"tokens":10}}`))
	}
	io.WriteString(c, req.String())
	for i := range 4 {
		if resp, _ := readAnswer(t, br, "pipelined"); resp.StatusCode != 200 {
			t.Errorf("pipelined request %d: %d", i, resp.StatusCode)
		}
	}
	if st := s.limit(t, "llm", 1); st.Remaining != 960 {
		t.Errorf("tokens remaining %d, want 960", st.Remaining)
	}
}

// TestLeanMalformedAnsweredByNetHTTP: heads the lean loop does not read
// are answered by net/http with a 4xx and change nothing.
func TestLeanMalformedAnsweredByNetHTTP(t *testing.T) {
	s := serve(t, conf(llm))
	body := `{"provider":"llm","cost":{"tokens":1}}`
	for _, tc := range []struct {
		name, req string
		status    int
	}{
		{"a NUL in the path", strings.Replace(post("/v1/acquire", body), "/v1/acquire", "/v1/acq\x00uire", 1), 400},
		{"an invalid method", strings.Replace(post("/v1/acquire", body), "POST", "P@ST", 1), 400},
		{"an unknown method", strings.Replace(post("/v1/acquire", body), "POST", "BREW", 1), 405},
		{"a space before the colon", post("/v1/acquire", body, "X-A : b\r\n"), 400},
		{"Content-Length and a bad chunk", post("/v1/acquire", "zz\r\n"+body, "Transfer-Encoding: chunked\r\n"), 400},
		{"a Content-Length not a number", strings.Replace(post("/v1/acquire", body), "Content-Length: 38", "Content-Length: 3 8", 1), 400},
		{"an invalid Host", strings.Replace(post("/v1/acquire", body), "Host: agent", "Host: a gent", 1), 400},
		{"a head of 2 MB", post("/v1/acquire", body, "X-Pad: "+strings.Repeat("p", 2<<20)+"\r\n"), 431},
		{"a body of 100 kB", post("/v1/acquire", `{"provider":"llm","caller":"`+strings.Repeat("x", 100<<10)+`"}`), 413},
		{"HTTP/2.0", strings.Replace(post("/v1/acquire", body), "HTTP/1.1", "HTTP/2.0", 1), 505},
	} {
		c, br := dialSock(t, s)
		go io.WriteString(c, tc.req) // the agent may answer before reading it all
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Errorf("%s: no answer: %v", tc.name, err)
			continue
		}
		if resp.StatusCode != tc.status {
			b, _ := io.ReadAll(resp.Body)
			t.Errorf("%s: status %d %q, want %d", tc.name, resp.StatusCode, b, tc.status)
		}
	}
	if st := s.limit(t, "llm", 1); st.Remaining != 1000 {
		t.Errorf("tokens remaining %d, want 1000: no malformed request took", st.Remaining)
	}
}

// TestLeanCallerGoneMidWaitOnKeptConnection: a caller that waits on a
// connection that already served a request, and closes it, holds
// nothing; the agent keeps serving others.
func TestLeanCallerGoneMidWaitOnKeptConnection(t *testing.T) {
	s := serve(t, conf(local("api", limiter.Limit{Quota: 1, Window: time.Hour})))
	c, br := dialSock(t, s)
	io.WriteString(c, post("/v1/acquire", `{"provider":"api"}`))
	if resp, _ := readAnswer(t, br, "first"); resp.StatusCode != 200 {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	io.WriteString(c, post("/v1/acquire", `{"provider":"api","max_wait_ms":3600000}`))
	lim := s.providers["api"].multi.Limiter(0)
	waitFor(t, "the acquisition to wait", func() bool { return lim.Stats().Waiting == 1 })
	c.Close()
	waitFor(t, "the wait to end", func() bool { return lim.Stats().Waiting == 0 })
	if st := lim.Stats(); st.Canceled != 1 || st.WaitingPermits != 0 {
		t.Errorf("stats %+v: want the wait cancelled, nothing held", st)
	}
	// The agent serves on: the permit the caller gave up is free again
	// only in the next window, so a try now is refused, and answered.
	c2, br2 := dialSock(t, s)
	io.WriteString(c2, post("/v1/try_acquire", `{"provider":"api"}`))
	if resp, e := readAnswer(t, br2, "after the caller left"); resp.StatusCode != 429 || e.Error != ReasonTimeout {
		t.Errorf("after the caller left: %d %+v, want 429 TIMEOUT", resp.StatusCode, e)
	}
}

// FuzzParseHead: whatever head the lean loop answers itself, net/http
// reads the same way — the same operation, body length, Host,
// Authorization and Connection: close — so that the two paths never
// disagree on what a request is.
func FuzzParseHead(f *testing.F) {
	body := `{"provider":"llm"}`
	for _, s := range []string{
		post("/v1/acquire", body),
		post("/v1/settle", body, "Connection: close\r\n", "Authorization: Bearer x\r\n"),
		post("/v1/reserve", body, "content-length: 18\r\n"),
		"POST /v1/cancel HTTP/1.1\r\nhost: [::1]:80\r\nContent-Length: 007\r\nX: \t a \t\r\n\r\n",
		"POST /v1/acquire HTTP/1.1\nHost: a\nContent-Length: 2\n\n{}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, ok := parseHead(b)
		if !ok || !validHost(h.host) {
			return
		}
		r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b)))
		if err != nil {
			t.Fatalf("the lean loop reads %q as %+v; net/http refuses it: %v", b, h, err)
		}
		if r.Method != "POST" || r.URL.Path != h.path || r.URL.RawQuery != "" || r.ContentLength != int64(h.contentLength) ||
			r.Host != string(h.host) || r.Header.Get("Authorization") != string(h.auth) || r.Close != h.close {
			t.Fatalf("%q: lean %+v; net/http %s %s length %d host %q auth %q close %v", b, h, r.Method, r.URL,
				r.ContentLength, r.Host, r.Header.Get("Authorization"), r.Close)
		}
	})
}
