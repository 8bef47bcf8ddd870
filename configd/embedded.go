package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// embedded is the single-node etcd that serve runs when given no
// --etcd-endpoints.
type embedded struct {
	etcd    *embed.Etcd
	own     string      // configd's own plain loopback URL, with TLS on the client URL; "": the client URL
	closing atomic.Bool // silences the logger while the server stops
}

// DefaultCompactionRetention is how much revision history the embedded
// etcd keeps (serve's --embedded-compaction-retention).
//
// etcd keeps every revision of every key until it is compacted: without
// compaction each rewrite of a shares record or an instance record stays
// in the database, which grows until etcd's space quota (2 GiB) refuses
// every write. So the embedded etcd compacts itself, in etcd's periodic
// mode: the retention is a time, the unit that outages and watch delays are
// measured in, whatever the write rate (which grows with the instances, and
// a shares record with them; revision mode would also run only every five
// minutes). Every minute it discards the revisions older than about a
// minute, so the database holds one to two minutes of history.
//
// Nothing in sluice reads an old revision. History is only for watchers
// that resume after a broken connection: within the retention they resume
// where they left off; later they get ErrCompacted, and both watchers then
// read everything again (configd's publisher reloads, an instance's
// cluster.Member registers again). With the default lease TTL (5 s) and
// session TTL (10 s), a watcher cut off for a minute has lost its lease
// (an instance) or its session (configd) and reads everything again
// anyway.
const DefaultCompactionRetention = time.Minute

// maxCompactionRetention is the longest --embedded-compaction-retention.
const maxCompactionRetention = 24 * time.Hour

// embeddedOptions is how serve runs its embedded etcd.
type embeddedOptions struct {
	dir                string // data directory; the credentials live in its credentials/
	clientURL, peerURL string
	certFile, keyFile  string        // TLS for clientURL (https); both or neither
	gateway            bool          // serve etcd's JSON gateway (/v3/...) on clientURL
	retention          time.Duration // compaction retention (0: never; see DefaultCompactionRetention)
	maxTxnOps          int           // etcd's --max-txn-ops (0: etcd's default)
	keys               schema.Keys
}

// startEmbedded starts etcd with its data in o.dir, closed to anyone
// without credentials (see access.go), and returns it with a client
// authenticated as root. At the first start it sets the credentials up
// with etcd listening on a loopback port nobody knows, so that no
// unauthenticated request is ever served on o.clientURL. Its log (errors
// only, JSON) goes to logOut.
func startEmbedded(ctx context.Context, o embeddedOptions, logOut io.Writer) (*embedded, *clientv3.Client, error) {
	if _, err := readPassword(o.dir, rootUser); errors.Is(err, fs.ErrNotExist) {
		if err := prepareAccess(ctx, o, logOut); err != nil {
			return nil, nil, err
		}
	}
	e, err := runEmbedded(o, logOut)
	if err != nil {
		return nil, nil, err
	}
	cli, err := e.rootClient(ctx, o.dir)
	if errors.Is(err, rpctypes.ErrAuthNotEnabled) {
		// A first start that stopped between writing the credentials and
		// turning authentication on: finish it, away from clientURL.
		e.close()
		if err := prepareAccess(ctx, o, logOut); err != nil {
			return nil, nil, err
		}
		if e, err = runEmbedded(o, logOut); err != nil {
			return nil, nil, err
		}
		cli, err = e.rootClient(ctx, o.dir)
	}
	if err != nil {
		e.close()
		return nil, nil, err
	}
	return e, cli, nil
}

// prepareAccess runs etcd on a free loopback port, without TLS or the
// gateway, and closes its access (closeAccess).
func prepareAccess(ctx context.Context, o embeddedOptions, logOut io.Writer) error {
	port, err := freeLoopbackPort()
	if err != nil {
		return err
	}
	p := o
	p.clientURL, p.certFile, p.keyFile, p.gateway = "http://"+port, "", "", false
	e, err := runEmbedded(p, logOut)
	if err != nil {
		return err
	}
	defer e.close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.clientURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return closeAccess(ctx, cli, o.dir, o.keys)
}

// freeLoopbackPort returns 127.0.0.1:port for a port free a moment ago.
func freeLoopbackPort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// runEmbedded starts etcd as o says and waits until it is ready. With TLS
// on the client URL it also listens on a loopback port of its own, plain,
// for configd's client (authentication still applies there).
func runEmbedded(o embeddedOptions, logOut io.Writer) (*embedded, error) {
	cu, err := url.Parse(o.clientURL)
	if err != nil {
		return nil, err
	}
	pu, err := url.Parse(o.peerURL)
	if err != nil {
		return nil, err
	}
	e := &embedded{}
	cfg := embed.NewConfig()
	cfg.Name = "configd"
	cfg.Dir = o.dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.EnableGRPCGateway = o.gateway
	if o.certFile != "" {
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: o.certFile, KeyFile: o.keyFile}
		port, err := freeLoopbackPort()
		if err != nil {
			return nil, err
		}
		own := url.URL{Scheme: "http", Host: port}
		cfg.ListenClientUrls = append(cfg.ListenClientUrls, own)
		e.own = own.String()
	}
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(quietCore{zapcore.NewCore(
		zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		zapcore.Lock(zapcore.AddSync(logOut)),
		zap.LevelEnablerFunc(func(l zapcore.Level) bool { return l >= zapcore.ErrorLevel && !e.closing.Load() }),
	)}))
	if o.maxTxnOps > 0 {
		cfg.MaxTxnOps = uint(o.maxTxnOps)
	}
	// Single member, local disk: elections in ~100 ms rather than seconds.
	cfg.TickMs, cfg.ElectionMs = 10, 100
	if o.retention > 0 {
		// The compactor runs in the background: startup is not slowed.
		cfg.AutoCompactionMode = embed.CompactorModePeriodic
		cfg.AutoCompactionRetention = o.retention.String()
	}
	etcd, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	select {
	case <-etcd.Server.ReadyNotify():
	case err := <-etcd.Err():
		etcd.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	case <-time.After(30 * time.Second):
		etcd.Close()
		return nil, fmt.Errorf("embedded etcd: not ready after 30s")
	}
	e.etcd = etcd
	return e, nil
}

// rootClient returns a client authenticated as root, through the loopback
// listener of configd's own when there is one.
func (e *embedded) rootClient(ctx context.Context, dataDir string) (*clientv3.Client, error) {
	pw, err := readPassword(dataDir, rootUser)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd's root credentials: %w", err)
	}
	eps := e.endpoints()
	if e.own != "" {
		eps = []string{e.own}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: cluster.DialOptions(), Username: rootUser, Password: pw, Context: ctx})
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	return cli, nil
}

func (e *embedded) endpoints() []string {
	var out []string
	for _, u := range e.etcd.Config().AdvertiseClientUrls {
		out = append(out, u.String())
	}
	return out
}

func (e *embedded) close() {
	e.closing.Store(true)
	e.etcd.Close()
}

// quietCore drops the errors a healthy embedded member logs anyway.
type quietCore struct{ zapcore.Core }

func (c quietCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if ent.Message == "failed to update storage version" { // once, at first start; harmless
		return ce
	}
	return c.Core.Check(ent, ce)
}

func (c quietCore) With(f []zapcore.Field) zapcore.Core { return quietCore{c.Core.With(f)} }
