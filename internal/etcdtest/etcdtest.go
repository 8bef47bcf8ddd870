// Package etcdtest starts a real etcd, one member or a cluster of several,
// inside the test process (go.etcd.io/etcd/server/v3/embed) for tests that
// need one; there are no mocks of etcd in sluice.
//
//	func TestSomething(t *testing.T) {
//		srv := etcdtest.Start(t)     // stopped by t.Cleanup
//		cli := srv.Client(t)         // closed by t.Cleanup
//		cli.Put(ctx, "k", "v")
//		srv.Stop()                   // etcd outage: clients see errors
//		srv.Restart()                // same data dir, same ports
//	}
//
// StartCluster starts several members that form one cluster, for tests of
// what clients do when a member (the raft leader, say) dies: each member
// is a Server, which Kill stops without a leadership transfer and Restart
// brings back.
//
// Options make the member secure, as production etcd is: WithClientCerts
// serves clients over TLS and requires a client certificate signed by the
// test's CA (NewCerts generates one, with server and client certificates,
// into a temporary directory); WithAuth turns on etcd's user/password
// authentication with a root user, and AddUser adds users whose role can
// touch only given key prefixes. Client and Config then carry the TLS
// material and the root credentials.
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
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
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
	name      string // member name
	cluster   string // initial cluster ("name=peerURL,..."); "" for a single member
	dir       string
	clientURL url.URL
	peerURL   url.URL
	opts      options
	mu        sync.Mutex
	etcd      *embed.Etcd // nil while stopped
	rpcs      *rpcs       // the running member's client RPCs, for Kill
	// closing silences the server's logger while it shuts down, when it
	// logs its closed listeners as errors.
	closing atomic.Bool
}

// Option configures the member Start starts.
type Option interface{ apply(*options) }

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

type options struct {
	certs        *Certs // nil: plain http
	rootPassword string // empty: auth off
}

// WithClientCerts serves clients over TLS with certs' server certificate,
// and refuses clients that present no certificate signed by certs' CA
// (etcd's --client-cert-auth). Endpoints then are https URLs. Peers stay
// plain http (loopback only).
func WithClientCerts(certs *Certs) Option {
	return optionFunc(func(o *options) { o.certs = certs })
}

// WithAuth turns on etcd's authentication once the member is first ready:
// it adds the user "root" with rootPassword and the root role, then enables
// auth. From then on every request needs a user's credentials; Client and
// Config use root's. AddUser adds users with narrower roles.
func WithAuth(rootPassword string) Option {
	return optionFunc(func(o *options) { o.rootPassword = rootPassword })
}

// RootUser is the etcd user WithAuth creates.
const RootUser = "root"

// Start starts a member on free loopback ports with its data in a temporary
// directory, and registers Stop with tb.Cleanup. It fails the test if the
// member is not ready within StartTimeout.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	s := newServer(tb, "etcdtest", opts)
	for try := 1; ; try++ {
		err := s.start()
		if err == nil {
			break
		}
		// A port free a moment ago (freeAddr) can be taken by another
		// process before etcd binds it: other ports, a few times.
		if try == 3 || !strings.Contains(err.Error(), "address already in use") {
			tb.Fatalf("etcdtest: %v", err)
		}
		s = newServer(tb, "etcdtest", opts)
	}
	tb.Cleanup(s.Stop)
	if s.opts.rootPassword != "" {
		if err := s.enableAuth(); err != nil {
			tb.Fatalf("etcdtest: enabling auth: %v", err)
		}
	}
	return s
}

// newServer prepares a member on free loopback ports, with its data in a
// temporary directory; start starts it.
func newServer(tb testing.TB, name string, opts []Option) *Server {
	tb.Helper()
	s := &Server{
		tb:        tb,
		name:      name,
		dir:       tb.TempDir(),
		clientURL: url.URL{Scheme: "http", Host: freeAddr(tb)},
		peerURL:   url.URL{Scheme: "http", Host: freeAddr(tb)},
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&s.opts)
		}
	}
	if s.opts.certs != nil {
		s.clientURL.Scheme = "https"
	}
	return s
}

// Name returns the member's name ("etcdtest", or "m0", "m1"… in a
// cluster).
func (s *Server) Name() string { return s.name }

// Endpoints returns the client URLs, for clientv3.Config.Endpoints.
func (s *Server) Endpoints() []string { return []string{s.clientURL.String()} }

// Dir returns the member's data directory.
func (s *Server) Dir() string { return s.dir }

// Config returns a client config for this server: its endpoints, a quiet
// logger, a short dial timeout, the client certificate when the member
// requires one (WithClientCerts), and root's credentials when auth is on
// (WithAuth). Change what a test needs (Username, Password, TLS) and pass it
// to clientv3.New.
func (s *Server) Config(tb testing.TB) clientv3.Config {
	tb.Helper()
	cfg := clientv3.Config{
		Endpoints:   s.Endpoints(),
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	}
	if s.opts.certs != nil {
		tlsCfg, err := s.opts.certs.ClientTLSInfo().ClientConfig()
		if err != nil {
			tb.Fatalf("etcdtest: client TLS: %v", err)
		}
		cfg.TLS = tlsCfg
	}
	if s.opts.rootPassword != "" {
		cfg.Username, cfg.Password = RootUser, s.opts.rootPassword
	}
	return cfg
}

// Client returns a new client of this server built from Config; it is
// closed by tb.Cleanup.
func (s *Server) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(s.Config(tb))
	if err != nil {
		tb.Fatalf("etcdtest: client: %v", err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// AddUser adds an etcd user with password and a role of the same name that
// may read and write every key under each of prefixes (each a key prefix,
// e.g. "/sluice/"), and nothing else. It needs WithAuth.
func (s *Server) AddUser(tb testing.TB, name, password string, prefixes ...string) {
	tb.Helper()
	perms := make([]Perm, len(prefixes))
	for i, p := range prefixes {
		perms[i] = Perm{Key: p, Write: true}
	}
	s.AddRole(tb, name, password, perms...)
}

// Perm is one permission of a role AddRole creates: every key under the
// prefix Key, read only or read and write.
type Perm struct {
	Key   string
	Write bool
}

// AddRole adds an etcd user with password and a role of the same name
// holding exactly perms. It needs WithAuth.
func (s *Server) AddRole(tb testing.TB, name, password string, perms ...Perm) {
	tb.Helper()
	if s.opts.rootPassword == "" {
		tb.Fatalf("etcdtest: AddRole needs WithAuth")
	}
	cli := s.Client(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.RoleAdd(ctx, name); err != nil {
		tb.Fatalf("etcdtest: role %s: %v", name, err)
	}
	for _, p := range perms {
		typ := clientv3.PermissionType(clientv3.PermRead)
		if p.Write {
			typ = clientv3.PermissionType(clientv3.PermReadWrite)
		}
		if _, err := cli.RoleGrantPermission(ctx, name, p.Key, clientv3.GetPrefixRangeEnd(p.Key), typ); err != nil {
			tb.Fatalf("etcdtest: role %s on %s: %v", name, p.Key, err)
		}
	}
	if _, err := cli.UserAdd(ctx, name, password); err != nil {
		tb.Fatalf("etcdtest: user %s: %v", name, err)
	}
	if _, err := cli.UserGrantRole(ctx, name, name); err != nil {
		tb.Fatalf("etcdtest: user %s role: %v", name, err)
	}
}

// enableAuth adds root and enables auth, through a client without
// credentials (auth is still off).
func (s *Server) enableAuth() error {
	cfg := s.Config(s.tb)
	cfg.Username, cfg.Password = "", ""
	cli, err := clientv3.New(cfg)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.RoleAdd(ctx, RootUser); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return err
	}
	if _, err := cli.UserAdd(ctx, RootUser, s.opts.rootPassword); err != nil {
		return err
	}
	if _, err := cli.UserGrantRole(ctx, RootUser, RootUser); err != nil {
		return err
	}
	_, err = cli.AuthEnable(ctx)
	return err
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

// Kill stops the member as a crash would: its raft node and peer
// transport stop at once, without the leadership transfer a graceful Stop
// makes, and every client RPC in progress ends at once with
// codes.Unavailable, as when a dead process's connections are reset (watch
// and lease keep-alive streams included; Stop instead waits up to etcd's
// request timeout, about 5 s, for them). New RPCs fail the same way until
// the listeners are closed, which Kill does before it returns. It returns
// how many RPCs in progress it ended. It is idempotent (a member already
// stopped ends none); Restart brings the member back.
func (s *Server) Kill() (ended int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcd == nil {
		return 0
	}
	s.closing.Store(true)
	s.etcd.Server.HardStop()
	ended = s.rpcs.kill()
	s.etcd.Close()
	s.etcd = nil
	return ended
}

// Restart starts the member again on the same data directory and ports,
// after Stop or Kill. It fails the test if the member does not come back.
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
	cfg.Name = s.name
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
	cfg.BcryptCost = 4 // bcrypt.MinCost: password checks cost ~1 ms, not ~100
	if c := s.opts.certs; c != nil {
		cfg.ClientTLSInfo = transport.TLSInfo{
			CertFile:       c.ServerCertFile,
			KeyFile:        c.ServerKeyFile,
			TrustedCAFile:  c.CAFile,
			ClientCertAuth: true,
		}
	}
	s.rpcs = newRPCs()
	cfg.GRPCAdditionalServerOptions = s.rpcs.serverOptions()
	cfg.ListenClientUrls = []url.URL{s.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{s.clientURL}
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{s.peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	if s.cluster != "" {
		cfg.InitialCluster = s.cluster
	}
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
