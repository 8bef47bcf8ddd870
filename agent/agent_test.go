package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/limiter"
)

// childEnv, set to a socket path and a body (path|body), makes the test
// binary a caller that sends the acquisition, says "sent" and blocks until
// killed: a caller that vanishes mid-wait.
const childEnv = "SLUICE_AGENT_CHILD"

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		runChild(spec)
		return
	}
	goleak.VerifyTestMain(m, etcdtest.IgnoreLeaks()...)
}

func runChild(spec string) {
	path, body, _ := strings.Cut(spec, "|")
	c, err := net.Dial("unix", path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Fprintf(c, "POST /v1/acquire HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	fmt.Println("sent")
	select {} // until SIGKILL
}

// served is an agent serving in a temporary directory, stopped by the
// test's cleanup.
type served struct {
	*Agent
	dir    string
	ls     *Listeners
	client *http.Client
}

func serve(t *testing.T, cfg Config, opts ...Option) *served {
	t.Helper()
	dir := t.TempDir()
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(dir, "a.sock")
	}
	if cfg.GRPCSocket == "" {
		cfg.GRPCSocket = filepath.Join(dir, "g.sock")
	}
	a, err := New(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := a.Listen()
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ls) }()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", cfg.Socket)
	}}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		a.Close()
	})
	return &served{Agent: a, dir: dir, ls: ls, client: &http.Client{Transport: tr}}
}

// answer is a decoded HTTP answer.
type answer struct {
	Status      int
	Grant       string           `json:"grant"`
	Reservation string           `json:"reservation"`
	DelayMS     float64          `json:"delay_ms"`
	Cost        map[string]int64 `json:"cost"`
	Error       string           `json:"error"`
	Message     string           `json:"message"`
}

func (s *served) post(t *testing.T, path, body string) answer {
	t.Helper()
	resp, err := s.client.Post("http://agent"+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var a answer
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("%s %s: answer %q is not JSON: %v", path, body, b, err)
	}
	a.Status = resp.StatusCode
	return a
}

func (s *served) limit(t *testing.T, provider string, i int) LimitStatus {
	t.Helper()
	for _, p := range s.Status().Providers {
		if p.Name == provider && i < len(p.Limits) {
			return p.Limits[i]
		}
	}
	t.Fatalf("no limit %d of %s in %+v", i, provider, s.Status())
	return LimitStatus{}
}

// conf is the default config with the local providers lps and no
// sockets yet (serve puts them in a temporary directory).
func conf(lps ...LocalProvider) Config {
	c := DefaultConfig()
	c.Socket, c.GRPCSocket, c.Local = "", "", lps
	return c
}

func local(name string, limits ...limiter.Limit) LocalProvider {
	return LocalProvider{Name: name, Limits: limits}
}

// llm is 5 requests and 1,000 tokens per hour: no window boundary comes
// within a test, so every refusal is decided by the counts alone.
var llm = local("llm", limiter.Limit{Quota: 5, Window: time.Hour}, limiter.Limit{Dimension: "tokens", Quota: 1000, Window: time.Hour})

// TestAcquireSettleCancelOverHTTP: an acquisition takes from every limit,
// Settle gives back what the call did not use, Cancel gives back the rest,
// and a grant settles once.
func TestAcquireSettleCancelOverHTTP(t *testing.T) {
	s := serve(t, conf(llm))
	a := s.post(t, "/v1/acquire", `{"provider":"llm","caller":"w1","cost":{"tokens":700},"max_wait_ms":10}`)
	if a.Status != 200 || a.Grant == "" || a.Cost["tokens"] != 700 || a.Cost["requests"] != 1 {
		t.Fatalf("acquire: %+v", a)
	}
	if r := s.limit(t, "llm", 1).Remaining; r != 300 {
		t.Fatalf("tokens remaining %d after taking 700, want 300", r)
	}
	// All or nothing: 400 tokens are not there, so no request is taken.
	if b := s.post(t, "/v1/try_acquire", `{"provider":"llm","cost":{"tokens":400}}`); b.Status != 429 || b.Error != ReasonTimeout {
		t.Fatalf("try_acquire of 400 tokens with 300 left: %+v", b)
	}
	if r := s.limit(t, "llm", 0).Remaining; r != 4 {
		t.Fatalf("requests remaining %d after a refusal, want 4", r)
	}
	if b := s.post(t, "/v1/settle", `{"id":"`+a.Grant+`","cost":{"tokens":200}}`); b.Status != 200 {
		t.Fatalf("settle: %+v", b)
	}
	if r := s.limit(t, "llm", 1).Remaining; r != 800 {
		t.Fatalf("tokens remaining %d after settling 700 down to 200, want 800", r)
	}
	if b := s.post(t, "/v1/settle", `{"id":"`+a.Grant+`","cost":{"tokens":100}}`); b.Status != 404 || b.Error != ReasonUnknownGrant {
		t.Fatalf("second settle: %+v", b)
	}
	c := s.post(t, "/v1/acquire", `{"provider":"llm","cost":{"tokens":500}}`)
	if b := s.post(t, "/v1/cancel", `{"id":"`+c.Grant+`"}`); b.Status != 200 {
		t.Fatalf("cancel: %+v", b)
	}
	if r0, r1 := s.limit(t, "llm", 0).Remaining, s.limit(t, "llm", 1).Remaining; r0 != 4 || r1 != 800 {
		t.Fatalf("remaining %d requests, %d tokens after a cancel, want 4 and 800", r0, r1)
	}
}

// TestTimeoutDecidedAtOnce: when the earliest permit lies beyond maxWait,
// Acquire refuses with TIMEOUT without waiting and takes nothing.
func TestTimeoutDecidedAtOnce(t *testing.T) {
	s := serve(t, conf(llm))
	if a := s.post(t, "/v1/acquire", `{"provider":"llm","cost":{"requests":5}}`); a.Status != 200 {
		t.Fatalf("acquire 5: %+v", a)
	}
	a := s.post(t, "/v1/acquire", `{"provider":"llm","max_wait_ms":60000}`)
	if a.Status != 429 || a.Error != ReasonTimeout {
		t.Fatalf("acquire past the quota, next window more than a minute away: %+v", a)
	}
	m := s.providers["llm"].multi.Limiter(0).Stats()
	if m.Delayed != 0 || m.TimedOut != 1 || m.Waiting != 0 {
		t.Errorf("stats %+v: want 1 timed out, none delayed or waiting (decided at once)", m)
	}
}

// TestReserveAndCancel: a reservation says when it is valid; Cancel gives
// it back; settling it before it is valid is refused and changes nothing.
func TestReserveAndCancel(t *testing.T) {
	s := serve(t, conf(local("api", limiter.Limit{Quota: 1, Window: time.Hour})))
	if a := s.post(t, "/v1/acquire", `{"provider":"api"}`); a.Status != 200 {
		t.Fatal(a)
	}
	r := s.post(t, "/v1/reserve", `{"provider":"api","max_wait_ms":3600000}`)
	if r.Status != 200 || r.Reservation == "" || r.DelayMS <= 0 {
		t.Fatalf("reserve into the next window: %+v", r)
	}
	if b := s.post(t, "/v1/settle", `{"id":"`+r.Reservation+`"}`); b.Status != 409 || b.Error != ReasonNotYetValid {
		t.Fatalf("settle before valid: %+v", b)
	}
	if w := s.limit(t, "api", 0).Waiting; w != 1 {
		t.Fatalf("waiting %d, want the reservation", w)
	}
	if b := s.post(t, "/v1/cancel", `{"id":"`+r.Reservation+`"}`); b.Status != 200 {
		t.Fatalf("cancel: %+v", b)
	}
	if w := s.limit(t, "api", 0).Waiting; w != 0 {
		t.Fatalf("waiting %d after cancel, want 0", w)
	}
}

// TestBadInputChangesNothing: every malformed request is refused with a
// clear status and reason, and takes nothing.
func TestBadInputChangesNothing(t *testing.T) {
	s := serve(t, conf(llm))
	cases := []struct {
		path, body string
		status     int
		reason     string
	}{
		{"/v1/acquire", ``, 400, ReasonBadRequest},
		{"/v1/acquire", `{`, 400, ReasonBadRequest},
		{"/v1/acquire", `[]`, 400, ReasonBadRequest},
		{"/v1/acquire", `{"provider":"llm"} {}`, 400, ReasonBadRequest},
		{"/v1/acquire", `{"provider":"llm","unknown":1}`, 400, ReasonBadRequest},
		{"/v1/acquire", `{"cost":{"tokens":1}}`, 400, ReasonBadRequest},
		{"/v1/acquire", `{"provider":"LLM!"}`, 400, ReasonBadRequest},
		{"/v1/acquire", `{"provider":"llm","cost":{"tokens":1.5}}`, 400, ReasonBadRequest},
		{"/v1/acquire", `{"provider":"llm","cost":{"tokens":-1}}`, 400, ReasonBadRequest},
		{"/v1/acquire", `{"provider":"llm","cost":{"tokens":99999999999999999999}}`, 400, ReasonBadRequest},
		{"/v1/acquire", `{"provider":"llm","cost":{"Tokens":1}}`, 400, ReasonBadRequest},
		{"/v1/acquire", `{"provider":"llm","cost":{"a":1,"b":1,"c":1,"d":1,"e":1}}`, 400, ReasonBadRequest},
		{"/v1/acquire", `{"provider":"llm","cost":{"images":1}}`, 400, ReasonInvalid},
		{"/v1/acquire", `{"provider":"llm","cost":{"requests":0}}`, 400, ReasonInvalid},
		{"/v1/acquire", `{"provider":"llm","cost":{"tokens":1001}}`, 429, ReasonNoQuota},
		{"/v1/acquire", `{"provider":"llm","max_wait_ms":-1}`, 400, ReasonBadRequest},
		{"/v1/acquire", `{"provider":"llm","max_wait_ms":1e300}`, 400, ReasonBadRequest},
		{"/v1/acquire", `{"provider":"llm","max_wait_ms":"1s"}`, 400, ReasonBadRequest},
		{"/v1/acquire", `{"provider":"llm","caller":"a b"}`, 400, ReasonBadRequest},
		{"/v1/acquire", `{"provider":"llm","class":"Critical"}`, 400, ReasonBadRequest},
		{"/v1/try_acquire", `{"provider":"llm","class":"critical "}`, 400, ReasonBadRequest},
		{"/v1/reserve", `{"provider":"llm","class":"` + strings.Repeat("a", 33) + `"}`, 400, ReasonBadRequest},
		{"/v1/acquire", `{"provider":"llm","class":1}`, 400, ReasonBadRequest},
		{"/v1/acquire", `{"provider":"other"}`, 403, ReasonProviderNotAllowed},
		{"/v1/acquire", `{"provider":"llm","cost":{"tokens":1}` + strings.Repeat(" ", MaxBody) + `}`, 413, ReasonTooLarge},
		{"/v1/settle", `{"id":"nope"}`, 404, ReasonUnknownGrant},
		{"/v1/settle", `{}`, 400, ReasonBadRequest},
		{"/v1/settle", `{"id":"x","cost":{"tokens":-3}}`, 400, ReasonBadRequest},
		{"/v1/cancel", `{"id":"x","cost":{"tokens":3}}`, 400, ReasonBadRequest},
		{"/v1/cancel", `{"id":"` + strings.Repeat("g", 65) + `"}`, 400, ReasonBadRequest},
		{"/v1/nothing", `{}`, 404, ReasonNotFound},
	}
	for _, c := range cases {
		a := s.post(t, c.path, c.body)
		if a.Status != c.status || a.Error != c.reason || a.Message == "" {
			t.Errorf("%s %.80s: %d %s %q, want %d %s and a message", c.path, c.body, a.Status, a.Error, a.Message, c.status, c.reason)
		}
	}
	// A refusal quotes what it refuses cut short: a 60 KB dimension name
	// is not echoed back whole.
	if a := s.post(t, "/v1/acquire", `{"provider":"llm","cost":{"`+strings.Repeat("x", 60_000)+`":1}}`); a.Status != 400 || a.Error != ReasonBadRequest || len(a.Message) > 300 {
		t.Errorf("a 60 KB dimension name: %d %s, a message of %d bytes; want 400 %s and a short message", a.Status, a.Error, len(a.Message), ReasonBadRequest)
	}
	// A body declared beyond MaxBody is refused at once, not waited for
	// until the read times out.
	c, err := net.Dial("unix", filepath.Join(s.dir, "a.sock"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /v1/acquire HTTP/1.1\r\nHost: agent\r\nContent-Length: 99999999999\r\n\r\n{}")
	c.SetReadDeadline(time.Now().Add(s.cfg.HeaderTimeout / 2))
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
		t.Errorf("a declared body of 99999999999 bytes: %v; want 413 at once", err)
	} else if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 413 || !bytes.Contains(b, []byte(ReasonTooLarge)) {
		t.Errorf("a declared body of 99999999999 bytes: %d %s; want 413 %s", resp.StatusCode, b, ReasonTooLarge)
	}
	c.Close()
	resp, err := s.client.Get("http://agent/v1/acquire")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET /v1/acquire: %d, Allow %q; want 405, POST", resp.StatusCode, resp.Header.Get("Allow"))
	}
	// A settle that names an unknown dimension is refused and the grant
	// can still be settled.
	g := s.post(t, "/v1/acquire", `{"provider":"llm","cost":{"tokens":10}}`)
	if b := s.post(t, "/v1/settle", `{"id":"`+g.Grant+`","cost":{"images":1}}`); b.Status != 400 || b.Error != ReasonInvalid {
		t.Errorf("settle of an unknown dimension: %+v", b)
	}
	// An id guessed from another (the same number, another secret) is
	// unknown.
	guess := g.Grant[:strings.LastIndexByte(g.Grant, '.')+1] + "0"
	if b := s.post(t, "/v1/cancel", `{"id":"`+guess+`"}`); b.Status != 404 || b.Error != ReasonUnknownGrant {
		t.Errorf("cancel of a guessed id: %+v", b)
	}
	if b := s.post(t, "/v1/settle", `{"id":"`+g.Grant+`","cost":{"tokens":0,"requests":0}}`); b.Status != 200 {
		t.Errorf("settle after a refused one: %+v", b)
	}
	if r0, r1 := s.limit(t, "llm", 0).Remaining, s.limit(t, "llm", 1).Remaining; r0 != 5 || r1 != 1000 {
		t.Errorf("remaining %d requests, %d tokens after bad input; want the quotas, 5 and 1000", r0, r1)
	}
	if st := s.Status(); len(st.Providers) != 1 || st.Grants != 0 {
		t.Errorf("status after bad input: %+v; want llm alone and no grants kept", st)
	}
}

// TestVanishedCallerHoldsNothing: a caller process killed while its
// acquisition waits leaves nothing taken: its connection's end cancels
// the wait, and the next window's permit goes back.
func TestVanishedCallerHoldsNothing(t *testing.T) {
	s := serve(t, conf(local("api", limiter.Limit{Quota: 1, Window: time.Hour})))
	if a := s.post(t, "/v1/acquire", `{"provider":"api"}`); a.Status != 200 {
		t.Fatal(a)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+filepath.Join(s.dir, "a.sock")+`|{"provider":"api","caller":"doomed","max_wait_ms":3600000}`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "sent\n" {
		t.Fatalf("child said %q", line)
	}
	lim := s.providers["api"].multi.Limiter(0)
	waitFor(t, "the child's acquisition to wait", func() bool { return lim.Stats().Waiting == 1 })
	cmd.Process.Kill()
	cmd.Wait()
	waitFor(t, "the wait to end", func() bool { return lim.Stats().Waiting == 0 })
	st := lim.Stats()
	if st.Canceled != 1 || st.Admitted != 1 || st.WaitingPermits != 0 {
		t.Errorf("stats %+v: want the vanished caller's permit cancelled, only the first admitted", st)
	}
	// The next window's permit is free: a reservation lands where the
	// vanished one was.
	r, err := s.providers["api"].multi.Reserve(time.Hour)
	if err != nil {
		t.Fatalf("reserving the next window's permit: %v", err)
	}
	r.Cancel()
}

// waitFor polls cond, which reads state another goroutine or process
// changes, until it holds; the test's own deadline bounds it.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-t.Context().Done():
			t.Fatalf("gave up waiting for %s", what)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// TestShutdownEndsWaitsWithClosed: Serve's shutdown answers a waiting
// acquisition CLOSED instead of waiting out its maxWait.
func TestShutdownEndsWaitsWithClosed(t *testing.T) {
	dir := t.TempDir()
	cfg := conf(local("api", limiter.Limit{Quota: 1, Window: time.Hour}))
	cfg.Socket = filepath.Join(dir, "a.sock")
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ls, err := a.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ls) }()
	c, err := net.Dial("unix", filepath.Join(dir, "a.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send := func(body string) {
		fmt.Fprintf(c, "POST /v1/acquire HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
	br := bufio.NewReader(c)
	send(`{"provider":"api"}`)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("first acquire: %v %v", resp, err)
	} else {
		io.Copy(io.Discard, resp.Body)
	}
	send(`{"provider":"api","max_wait_ms":3600000}`)
	lim := a.providers["api"].multi.Limiter(0)
	waitFor(t, "the acquisition to wait", func() bool { return lim.Stats().Waiting == 1 })
	cancel()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || !bytes.Contains(b, []byte(ReasonClosed)) {
		t.Errorf("waiting acquire at shutdown: %d %s; want 503 CLOSED", resp.StatusCode, b)
	}
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "a.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after Serve: %v; want it removed", err)
	}
}
