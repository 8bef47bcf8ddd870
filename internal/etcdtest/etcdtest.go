// Package etcdtest starts a real single-node etcd inside the test process
// (go.etcd.io/etcd/server/v3/embed) for tests that need one; there are no
// mocks of etcd in sluice.
//
//	func TestSomething(t *testing.T) {
//		srv := etcdtest.Start(t)     // stopped by t.Cleanup
//		cli := srv.Client(t)         // closed by t.Cleanup
//		cli.Put(ctx, "k", "v")
//		srv.Stop()                   // etcd outage: clients see errors
//		srv.Restart()                // same data dir, same ports
//	}
//
// A member is ready in well under a second (TickMs=10, ElectionMs=100). The
// server logs only errors, to stderr, and nothing while it stops. Note that embed registers its metrics on the
// default Prometheus registerer: code under test should use its own
// registry.
//
// Goroutine-leak checks: after Stop, embed and the client leave a few
// goroutines that end on their own shortly after (gRPC and zap internals);
// IgnoreLeaks lists them for go.uber.org/goleak.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// StartTimeout bounds how long Start and Restart wait for the member to be
// ready.
const StartTimeout = 20 * time.Second

// Server is one embedded etcd member. Its methods are safe for concurrent
// use.
type Server struct {
	tb        testing.TB
	dir       string
	clientURL url.URL
	peerURL   url.URL
	mu        sync.Mutex
	etcd      *embed.Etcd // nil while stopped
	// closing silences the server's logger while it shuts down, when it
	// logs its closed listeners as errors.
	closing atomic.Bool
}

// Start starts a member on free loopback ports with its data in a temporary
// directory, and registers Stop with tb.Cleanup. It fails the test if the
// member is not ready within StartTimeout.
func Start(tb testing.TB) *Server {
	tb.Helper()
	s := &Server{
		tb:        tb,
		dir:       tb.TempDir(),
		clientURL: url.URL{Scheme: "http", Host: freeAddr(tb)},
		peerURL:   url.URL{Scheme: "http", Host: freeAddr(tb)},
	}
	if err := s.start(); err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// Endpoints returns the client URLs, for clientv3.Config.Endpoints.
func (s *Server) Endpoints() []string { return []string{s.clientURL.String()} }

// Dir returns the member's data directory.
func (s *Server) Dir() string { return s.dir }

// Client returns a new client of this server with a quiet logger and a short
// dial timeout; it is closed by tb.Cleanup.
func (s *Server) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   s.Endpoints(),
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		tb.Fatalf("etcdtest: client: %v", err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// Stop stops the member (an outage, as clients see it). It is idempotent.
// While clients hold watch or lease keep-alive streams, etcd's graceful stop
// waits for them up to its request timeout (about 5 s with these settings)
// before closing them; requests already get no answers during that time.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcd == nil {
		return
	}
	s.closing.Store(true)
	s.etcd.Close()
	s.etcd = nil
}

// Restart starts the member again on the same data directory and ports,
// after Stop. It fails the test if the member does not come back.
func (s *Server) Restart() {
	s.tb.Helper()
	if err := s.start(); err != nil {
		s.tb.Fatalf("etcdtest: restart: %v", err)
	}
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcd != nil {
		return fmt.Errorf("already running")
	}
	cfg := embed.NewConfig()
	cfg.Name = "etcdtest"
	cfg.Dir = s.dir
	cfg.LogLevel = "error"
	s.closing.Store(false)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(quietCore{zapcore.NewCore(
		zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		zapcore.Lock(os.Stderr),
		zap.LevelEnablerFunc(func(l zapcore.Level) bool { return l >= zapcore.ErrorLevel && !s.closing.Load() }),
	)}))
	cfg.TickMs = 10
	cfg.ElectionMs = 100
	cfg.ListenClientUrls = []url.URL{s.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{s.clientURL}
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{s.peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("member failed: %w", err)
	case <-time.After(StartTimeout):
		e.Close()
		return fmt.Errorf("member not ready after %v", StartTimeout)
	}
	s.etcd = e
	return nil
}

// freeAddr returns a loopback address with a port that was free a moment
// ago.
func freeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("etcdtest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

// IgnoreLeaks returns goleak options for the goroutines that embed etcd and
// its client leave running after they are closed; they are not sluice's.
func IgnoreLeaks() []goleak.Option {
	return []goleak.Option{
		// zap's sink for the embedded server's logger never exits.
		goleak.IgnoreTopFunction("go.uber.org/zap/zapcore.(*BufferedWriteSyncer).flushLoop"),
		// gRPC's and etcd's process-wide background loops, started once.
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreAnyFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
	}
}

// quietCore drops the errors a healthy embedded member logs anyway.
type quietCore struct{ zapcore.Core }

func (c quietCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Message == "failed to update storage version" { // logged once at first start; harmless
		return ce
	}
	return c.Core.Check(e, ce)
}

func (c quietCore) With(f []zapcore.Field) zapcore.Core { return quietCore{c.Core.With(f)} }
