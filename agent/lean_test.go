package agent

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

// rawExchange writes req on a new connection to sock and reads n answers.
func rawExchange(t *testing.T, sock, req string, n int) []*http.Response {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var out []*http.Response
	for range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d of %q: %v", len(out)+1, req, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(strings.NewReader(string(b)))
		out = append(out, resp)
	}
	return out
}

func (s *served) sock() string { return filepath.Join(s.dir, "a.sock") }

func bodyOf(r *http.Response) string {
	b, _ := io.ReadAll(r.Body)
	return string(b)
}

func post(path, body string, headers ...string) string {
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: agent\r\n%sContent-Length: %d\r\n\r\n%s", path, strings.Join(headers, ""), len(body), body)
}

// TestLeanAnswersAsNetHTTP: every operation, granted or refused, gets over
// the socket (the lean loop) the status and body net/http's Handler gives.
func TestLeanAnswersAsNetHTTP(t *testing.T) {
	s := serve(t, conf(llm))
	h := s.Handler()
	viaHandler := func(path, body string) (int, string) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", path, strings.NewReader(body)))
		return w.Code, w.Body.String()
	}
	for _, tc := range []struct{ path, body string }{
		{"/v1/acquire", `{"provider":"llm","cost":{"tokens":1001}}`},
		{"/v1/acquire", `{"provider":"llm","cost":{"images":1}}`},
		{"/v1/acquire", `{"provider":"nope"}`},
		{"/v1/acquire", `{"provider":"llm","max_wait_ms":-1}`},
		{"/v1/acquire", `{"provider":"llm"} x`},
		{"/v1/acquire", ``},
		{"/v1/try_acquire", `{"provider":"llm","cost":{"tokens":1001}}`},
		{"/v1/reserve", `{"provider":"llm","caller":"bad caller"}`},
		{"/v1/cancel", `{"id":"g0-1"}`},
		{"/v1/cancel", `{"id":"g0-1","cost":{"tokens":1}}`},
		{"/v1/settle", `{"id":""}`},
	} {
		code, want := viaHandler(tc.path, tc.body)
		got := rawExchange(t, s.sock(), post(tc.path, tc.body), 1)[0]
		if b := bodyOf(got); got.StatusCode != code || b != want {
			t.Errorf("%s %s: lean %d %q, net/http %d %q", tc.path, tc.body, got.StatusCode, b, code, want)
		}
		if ct := got.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: Content-Type %q", tc.path, tc.body, ct)
		}
	}
	// A grant's answer is what encoding/json makes of it.
	for _, path := range []string{"/v1/acquire", "/v1/try_acquire", "/v1/reserve"} {
		got := bodyOf(rawExchange(t, s.sock(), post(path, `{"provider":"llm","cost":{"tokens":2}}`), 1)[0])
		var g grantedJSON
		if err := json.Unmarshal([]byte(got), &g); err != nil {
			t.Fatalf("%s: %q: %v", path, got, err)
		}
		want, _ := json.Marshal(g)
		if got != string(want)+"\n" {
			t.Errorf("%s: answer %q, encoding/json makes %q", path, got, want)
		}
		id := g.Grant + g.Reservation
		if a := s.post(t, "/v1/cancel", `{"id":"`+id+`"}`); a.Status != 200 {
			t.Errorf("cancelling %s: %+v", id, a)
		}
	}
	if st := s.limit(t, "llm", 1); st.Remaining != 1000 {
		t.Errorf("tokens remaining %d after cancelling every grant, want 1000", st.Remaining)
	}
}

// TestLeanHandsOffWhatItDoesNotRead: requests the lean loop leaves to
// net/http are answered by it, on the same connection, after answers the
// loop gave; the bytes read ahead are not lost.
func TestLeanHandsOffWhatItDoesNotRead(t *testing.T) {
	s := serve(t, conf(llm))
	acquire := `{"provider":"llm","cost":{"requests":0,"tokens":1}}` // the 1,000 tokens last the test
	// Pipelined: a lean POST, then a GET net/http answers.
	rs := rawExchange(t, s.sock(), post("/v1/acquire", acquire)+"GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n", 2)
	if rs[0].StatusCode != 200 || rs[1].StatusCode != 200 || !strings.Contains(bodyOf(rs[1]), `"ok":true`) {
		t.Errorf("pipelined acquire and healthz: %d, %d", rs[0].StatusCode, rs[1].StatusCode)
	}
	for _, tc := range []struct {
		name, req string
		status    int
	}{
		{"chunked body", "POST /v1/acquire HTTP/1.1\r\nHost: agent\r\nTransfer-Encoding: chunked\r\n\r\n" +
			fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(acquire), acquire), 200},
		{"Expect: 100-continue", post("/v1/acquire", acquire, "Expect: 100-continue\r\n"), 100},
		{"HTTP/1.0", strings.Replace(post("/v1/acquire", acquire), "HTTP/1.1", "HTTP/1.0", 1), 200},
		{"no Host", strings.Replace(post("/v1/acquire", acquire), "Host: agent\r\n", "", 1), 400},
		{"two Content-Lengths", post("/v1/acquire", acquire, "Content-Length: 3\r\n"), 400},
		{"a body larger than the lean buffer", post("/v1/acquire", `{"provider":"llm","caller":"`+strings.Repeat("x", leanBufSize)+`"}`), 400},
		{"a query", strings.Replace(post("/v1/acquire", acquire), "/v1/acquire", "/v1/acquire?x=1", 1), 200},
		{"GET of an operation", "GET /v1/acquire HTTP/1.1\r\nHost: agent\r\n\r\n", 405},
		{"an unknown path", post("/v1/nope", acquire), 404},
		{"a header line without a colon", post("/v1/acquire", acquire, "Bad header\r\n"), 400},
		{"a head larger than the buffer", post("/v1/acquire", acquire, "X-Pad: "+strings.Repeat("p", 2*leanBufSize)+"\r\n"), 200},
	} {
		got := rawExchange(t, s.sock(), tc.req, 1)[0]
		if got.StatusCode != tc.status {
			t.Errorf("%s: status %d %q, want %d", tc.name, got.StatusCode, bodyOf(got), tc.status)
		}
	}
}

// TestLeanOverTCPNeedsTheToken: over TCP the lean loop answers a request
// with the token, and leaves one without it to net/http's refusal.
func TestLeanOverTCPNeedsTheToken(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := conf(llm)
	cfg.Listen, cfg.TokenFile = "127.0.0.1:0", tok
	s := serve(t, cfg)
	var addr string
	for _, l := range s.ls.HTTP {
		if a, ok := l.Addr().(*net.TCPAddr); ok {
			addr = a.String()
		}
	}
	exchange := func(req string) *http.Response {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, req)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	body := `{"provider":"llm","cost":{"tokens":1}}`
	if r := exchange(post("/v1/try_acquire", body, "Authorization: Bearer 0123456789abcdef0123\r\n")); r.StatusCode != 200 {
		t.Errorf("with the token: %d", r.StatusCode)
	}
	for _, auth := range []string{"", "Authorization: Bearer wrong\r\n", "Authorization: Bearer\r\n"} {
		if r := exchange(post("/v1/try_acquire", body, auth)); r.StatusCode != 401 {
			t.Errorf("with %q: %d, want 401", auth, r.StatusCode)
		}
	}
	if st := s.limit(t, "llm", 1); st.Remaining != 999 {
		t.Errorf("tokens remaining %d, want 999: only the request with the token takes", st.Remaining)
	}
}

// TestLeanWaitThenAnswerOnTheSameConnection: a wait watches the
// connection for the caller leaving; once it is granted, the watch ends
// and the connection serves the next request.
func TestLeanWaitThenAnswerOnTheSameConnection(t *testing.T) {
	// 1 per 10 ms: the second acquisition waits for the next window.
	s := serve(t, conf(local("api", limiter.Limit{Quota: 1, Window: 10 * time.Millisecond})))
	c, err := net.Dial("unix", s.sock())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for i := range 3 {
		io.WriteString(c, post("/v1/acquire", `{"provider":"api","max_wait_ms":1000}`))
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("acquisition %d on one connection: %v %v", i, resp, err)
		}
		io.Copy(io.Discard, resp.Body)
	}
	if st := s.providers["api"].multi.Limiter(0).Stats(); st.Admitted != 3 {
		t.Errorf("admitted %d, want 3", st.Admitted)
	}
}

// TestParseHead: the heads the lean loop reads itself, and some it leaves.
func TestParseHead(t *testing.T) {
	for _, tc := range []struct {
		head string
		ok   bool
		want reqHead
	}{
		{"POST /v1/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n\r\n", true, reqHead{path: "/v1/acquire", contentLength: 12}},
		{"POST /v1/settle HTTP/1.1\r\nhost: a\r\ncontent-length:0\r\nConnection: Close\r\n\r\n", true, reqHead{path: "/v1/settle", close: true}},
		{"POST /v1/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nAuthorization: Bearer x\r\n\r\n", true, reqHead{path: "/v1/acquire", contentLength: 1, auth: []byte("Bearer x")}},
		{"POST /v1/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", false, reqHead{}},
		{"POST /v1/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999\r\n\r\n", false, reqHead{}},
		{"POST /v1/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n continued\r\n\r\n", false, reqHead{}},
		{"POST /v1/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nX: a\x01b\r\n\r\n", false, reqHead{}},
		{"POST /v1/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nConnection: upgrade\r\n\r\n", false, reqHead{}},
		{"POST  /v1/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n", false, reqHead{}},
		{"post /v1/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n", false, reqHead{}},
		{"POST /v1/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n", false, reqHead{}},
	} {
		h, ok := parseHead([]byte(tc.head))
		if ok != tc.ok {
			t.Errorf("%q: ok %v, want %v", tc.head, ok, tc.ok)
			continue
		}
		if ok {
			tc.want.headLen = len(tc.head)
			if h.path != tc.want.path || h.headLen != tc.want.headLen || h.contentLength != tc.want.contentLength ||
				h.close != tc.want.close || string(h.auth) != string(tc.want.auth) {
				t.Errorf("%q: %+v, want %+v", tc.head, h, tc.want)
			}
		}
	}
}
