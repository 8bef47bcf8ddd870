package agent

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluice-go/sluice/agent/agentpb"
	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

func grpcClient(t *testing.T, target string) agentpb.AgentClient {
	t.Helper()
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return agentpb.NewAgentClient(conn)
}

// reasonOf is the ErrorInfo reason of a gRPC refusal.
func reasonOf(err error) (codes.Code, string) {
	st := status.Convert(err)
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.Domain == ErrorDomain {
			return st.Code(), ei.Reason
		}
	}
	return st.Code(), ""
}

// TestGRPC: the gRPC API acquires, settles, cancels and refuses as the
// HTTP one does, each refusal naming its reason.
func TestGRPC(t *testing.T) {
	s := serve(t, conf(llm))
	c := grpcClient(t, "unix://"+filepath.Join(s.dir, "g.sock"))
	ctx := context.Background()
	g, err := c.Acquire(ctx, &agentpb.AcquireRequest{Provider: "llm", Caller: "g1", Cost: map[string]int64{"tokens": 600}, MaxWaitMs: 5})
	if err != nil || g.Grant == "" || g.Cost["tokens"] != 600 {
		t.Fatalf("Acquire: %v %v", g, err)
	}
	if _, err := c.Settle(ctx, &agentpb.SettleRequest{Id: g.Grant, Cost: map[string]int64{"tokens": 100}}); err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if r := s.limit(t, "llm", 1).Remaining; r != 900 {
		t.Fatalf("tokens remaining %d, want 900", r)
	}
	_, err = c.TryAcquire(ctx, &agentpb.AcquireRequest{Provider: "llm", Cost: map[string]int64{"tokens": 901}})
	if code, reason := reasonOf(err); code != codes.ResourceExhausted || reason != ReasonTimeout {
		t.Errorf("TryAcquire beyond the room: %v (%v %s)", err, code, reason)
	}
	r, err := c.Reserve(ctx, &agentpb.AcquireRequest{Provider: "llm", Cost: map[string]int64{"tokens": 900}})
	if err != nil || r.DelayMs != 0 {
		t.Fatalf("Reserve: %v %v", r, err)
	}
	if _, err := c.Cancel(ctx, &agentpb.CancelRequest{Id: r.Reservation}); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	for _, tc := range []struct {
		req    *agentpb.AcquireRequest
		code   codes.Code
		reason string
	}{
		{&agentpb.AcquireRequest{}, codes.InvalidArgument, ReasonBadRequest},
		{&agentpb.AcquireRequest{Provider: "llm", MaxWaitMs: -1}, codes.InvalidArgument, ReasonBadRequest},
		{&agentpb.AcquireRequest{Provider: "llm", Cost: map[string]int64{"images": 1}}, codes.InvalidArgument, ReasonInvalid},
		{&agentpb.AcquireRequest{Provider: "nope"}, codes.PermissionDenied, ReasonProviderNotAllowed},
	} {
		_, err := c.Acquire(ctx, tc.req)
		if code, reason := reasonOf(err); code != tc.code || reason != tc.reason {
			t.Errorf("Acquire(%v): %v; want %v %s", tc.req, err, tc.code, tc.reason)
		}
	}
	if _, err := c.Settle(ctx, &agentpb.SettleRequest{Id: "gone"}); err == nil {
		t.Error("Settle of an unknown id: no error")
	} else if code, reason := reasonOf(err); code != codes.NotFound || reason != ReasonUnknownGrant {
		t.Errorf("Settle of an unknown id: %v", err)
	}
}

// TestTCPNeedsTheToken: on loopback TCP every request needs the token, on
// HTTP and gRPC alike; the Unix socket does not.
func TestTCPNeedsTheToken(t *testing.T) {
	cfg := conf(llm)
	dir := t.TempDir()
	cfg.TokenFile = filepath.Join(dir, "token")
	const token = "0123456789abcdef-secret"
	if err := os.WriteFile(cfg.TokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.GRPCListen = "127.0.0.1:0", "127.0.0.1:0"
	s := serve(t, cfg)
	hs, gs := s.ls.Addrs()
	tcp := func(auth string) int {
		req, _ := http.NewRequest("POST", "http://"+hs[1]+"/v1/acquire", strings.NewReader(`{"provider":"llm"}`))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	defer http.DefaultClient.CloseIdleConnections()
	if got := tcp(""); got != 401 {
		t.Errorf("TCP without a token: %d, want 401", got)
	}
	if got := tcp("Bearer wrong-token-of-some-length"); got != 401 {
		t.Errorf("TCP with a wrong token: %d, want 401", got)
	}
	if got := tcp("Bearer " + token); got != 200 {
		t.Errorf("TCP with the token: %d, want 200", got)
	}
	if a := s.post(t, "/v1/acquire", `{"provider":"llm"}`); a.Status != 200 {
		t.Errorf("Unix socket without a token: %+v", a)
	}
	c := grpcClient(t, gs[1])
	_, err := c.Acquire(context.Background(), &agentpb.AcquireRequest{Provider: "llm"})
	if code, reason := reasonOf(err); code != codes.Unauthenticated || reason != ReasonUnauthenticated {
		t.Errorf("gRPC over TCP without a token: %v", err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
	if _, err := c.Acquire(ctx, &agentpb.AcquireRequest{Provider: "llm"}); err != nil {
		t.Errorf("gRPC over TCP with the token: %v", err)
	}
	if r := s.limit(t, "llm", 0).Remaining; r != 2 {
		t.Errorf("requests remaining %d, want 2: only the three authorised acquisitions took", r)
	}
}

// TestSocketPermissions: the sockets have the configured mode from the
// moment they appear; a stale socket is replaced, a live one refused.
func TestSocketPermissions(t *testing.T) {
	s := serve(t, conf(llm))
	for _, name := range []string{"a.sock", "g.sock"} {
		fi, err := os.Stat(filepath.Join(s.dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
			t.Errorf("%s: mode %v, want a socket of 0660", name, fi.Mode())
		}
	}
	cfg := conf(llm)
	cfg.Socket, cfg.GRPCSocket = filepath.Join(s.dir, "a.sock"), ""
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.Listen(); err == nil || !strings.Contains(err.Error(), "another process serves") {
		t.Errorf("Listen on a live agent's socket: %v", err)
	}
	// A stale socket: bound, then closed without removing its file.
	stale := filepath.Join(t.TempDir(), "stale.sock")
	l, err := listenUnix(stale, 0o600, "")
	if err != nil {
		t.Fatal(err)
	}
	l.(*unixListener).UnixListener.Close()
	cfg.Socket = stale
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ls, err := c.Listen()
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	ls.close()
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Listen(); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Listen over a regular file: %v", err)
	}
}

// TestSharedProviderJoinedOnFirstUse: a provider allowed by pattern is
// joined through etcd on its first request, as a cluster member, and its
// share (the whole limit, alone) is enforced; one outside the patterns is
// refused without joining.
func TestSharedProviderJoinedOnFirstUse(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	keys := schema.DefaultKeys()
	sec := schema.Duration(time.Second)
	c := schema.ProviderConfig{Version: 1, Name: "llm-a", Limit: 1000, Window: sec, FailStatic: sec,
		Lanes: []schema.Lane{{Lane: 1, Dimension: "tokens", Limit: 50000, Window: sec}}}.WithDefaults()
	for _, c := range []schema.ProviderConfig{c, c.Lanes[0].Derive(c)} { // as configd writes them
		b, err := schema.Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(context.Background(), keys.Config(c.Name), string(b)); err != nil {
			t.Fatal(err)
		}
	}
	cfg := conf()
	cfg.Endpoints, cfg.Allow, cfg.ID, cfg.LeaseTTL = srv.Endpoints(), []string{"llm-*"}, "agent-1", time.Second
	s := serve(t, cfg)
	if a := s.post(t, "/v1/acquire", `{"provider":"other"}`); a.Status != 403 || a.Error != ReasonProviderNotAllowed {
		t.Errorf("a provider outside the allowed patterns: %+v", a)
	}
	// Alone, with no configd, the member takes the whole limit once the
	// even split's hold has passed; until then it has no share.
	waitFor(t, "the share", func() bool {
		a := s.post(t, "/v1/try_acquire", `{"provider":"llm-a","cost":{"tokens":100}}`)
		if a.Status == 200 {
			return true
		}
		if a.Error != ReasonTimeout {
			t.Fatalf("try_acquire: %+v", a)
		}
		return false
	})
	st := s.Status()
	if len(st.Providers) != 1 || len(st.Providers[0].Limits) != 2 {
		t.Fatalf("status %+v: want llm-a with two limits", st)
	}
	l := st.Providers[0].Limits[1]
	if l.Dimension != "tokens" || l.Provider != "llm-a~1" || l.Source != "even" || l.Total != 50000 {
		t.Errorf("tokens limit %+v: want lane llm-a~1 on the even split of 50000", l)
	}
	resp, err := cli.Get(context.Background(), keys.Instance("llm-a", "agent-1"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Errorf("the agent's instance record under llm-a: %v %v", resp, err)
	}
}

// TestGRPCCanceledCallerHoldsNothing: a gRPC caller whose context ends
// while it waits gives the permits back.
func TestGRPCCanceledCallerHoldsNothing(t *testing.T) {
	s := serve(t, conf(local("api", limiter.Limit{Quota: 1, Window: time.Hour})))
	c := grpcClient(t, "unix://"+filepath.Join(s.dir, "g.sock"))
	if _, err := c.Acquire(context.Background(), &agentpb.AcquireRequest{Provider: "api"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, &agentpb.AcquireRequest{Provider: "api", MaxWaitMs: 3_600_000})
		errc <- err
	}()
	lim := s.providers["api"].multi.Limiter(0)
	waitFor(t, "the acquisition to wait", func() bool { return lim.Stats().Waiting == 1 })
	cancel()
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Errorf("cancelled Acquire: %v", err)
	}
	waitFor(t, "the wait to end", func() bool { return lim.Stats().Waiting == 0 })
	if st := lim.Stats(); st.Canceled != 1 || st.Admitted != 1 {
		t.Errorf("stats %+v: want the cancelled permit given back", st)
	}
}

// TestClassField: acquire, try_acquire and reserve take a class over
// HTTP and gRPC alike; a class name is served (listed by the provider or
// not), anything else is refused with BAD_REQUEST naming the class, and
// takes nothing.
func TestClassField(t *testing.T) {
	s := serve(t, conf(local("api", limiter.Limit{Quota: 1000, Window: time.Hour})))
	c := grpcClient(t, "unix://"+filepath.Join(s.dir, "g.sock"))
	ctx := context.Background()
	paths := []string{"/v1/acquire", "/v1/try_acquire", "/v1/reserve"}
	grpcOps := []func(*agentpb.AcquireRequest) error{
		func(r *agentpb.AcquireRequest) error { _, err := c.Acquire(ctx, r); return err },
		func(r *agentpb.AcquireRequest) error { _, err := c.TryAcquire(ctx, r); return err },
		func(r *agentpb.AcquireRequest) error { _, err := c.Reserve(ctx, r); return err },
	}
	taken := int64(0)
	for _, class := range []string{"critical", "batch", "nonesuch", "a-b_c9", ""} {
		for i, path := range paths {
			if a := s.post(t, path, `{"provider":"api","class":"`+class+`"}`); a.Status != 200 {
				t.Errorf("%s class %q: %+v", path, class, a)
			}
			if err := grpcOps[i](&agentpb.AcquireRequest{Provider: "api", Class: class}); err != nil {
				t.Errorf("gRPC %s class %q: %v", path, class, err)
			}
			taken += 2
		}
	}
	// Each bad class as JSON writes it, and as it is.
	for _, class := range [][2]string{{"Critical", "Critical"}, {"critical ", "critical "}, {"9lives", "9lives"},
		{"-x", "-x"}, {"é", "é"}, {`crit\u0000`, "crit\x00"}, {strings.Repeat("a", 33), strings.Repeat("a", 33)}} {
		for i, path := range paths {
			if a := s.post(t, path, `{"provider":"api","class":"`+class[0]+`"}`); a.Status != 400 || a.Error != ReasonBadRequest || !strings.Contains(a.Message, "class") {
				t.Errorf("%s class %q: %+v, want 400 BAD_REQUEST naming the class", path, class[1], a)
			}
			err := grpcOps[i](&agentpb.AcquireRequest{Provider: "api", Class: class[1]})
			if code, reason := reasonOf(err); code != codes.InvalidArgument || reason != ReasonBadRequest || !strings.Contains(err.Error(), "class") {
				t.Errorf("gRPC %s class %q: %v, want InvalidArgument BAD_REQUEST naming the class", path, class[1], err)
			}
		}
	}
	if r := s.limit(t, "api", 0).Remaining; r != 1000-taken {
		t.Errorf("remaining %d, want %d: a refused class took permits", r, 1000-taken)
	}
}

// TestGRPCWaitsQueueNoCall: calls waiting for a permit, more of them than
// the server has stream workers, hold no other call back, and each ends
// when its caller leaves.
func TestGRPCWaitsQueueNoCall(t *testing.T) {
	// The next window has room for every wait, this one for none.
	n := runtime.GOMAXPROCS(0) + 2
	s := serve(t, conf(llm, local("slow", limiter.Limit{Quota: int64(n), Window: time.Hour})))
	c := grpcClient(t, "unix://"+filepath.Join(s.dir, "g.sock"))
	if _, err := c.Acquire(context.Background(), &agentpb.AcquireRequest{Provider: "slow", Cost: map[string]int64{limiter.Requests: int64(n)}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := c.Acquire(ctx, &agentpb.AcquireRequest{Provider: "slow", MaxWaitMs: float64(time.Hour / time.Millisecond)})
			errs <- err
		}()
	}
	for s.limit(t, "slow", 0).Waiting < n {
		time.Sleep(time.Millisecond) // polling the waits' start
	}
	other, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	if _, err := c.Acquire(other, &agentpb.AcquireRequest{Provider: "llm"}); err != nil {
		t.Errorf("an acquisition beside %d waits: %v", n, err)
	}
	cancel()
	for range n {
		if err := <-errs; status.Code(err) != codes.Canceled {
			t.Errorf("a wait whose caller left: %v, want Canceled", err)
		}
	}
	// The agent learns of a caller leaving from its RST_STREAM, after the
	// client has returned.
	for deadline := time.Now().Add(10 * time.Second); s.limit(t, "slow", 0).Waiting > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d still waiting 10 s after their callers left", s.limit(t, "slow", 0).Waiting)
		}
		time.Sleep(time.Millisecond) // polling the waits' end
	}
}
