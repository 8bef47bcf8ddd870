package main

import (
	"fmt"
	"io"
	"net/url"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// embedded is the single-node etcd that serve runs when given no
// --etcd-endpoints.
type embedded struct {
	etcd    *embed.Etcd
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

// startEmbedded starts etcd with its data in dir, serving clients on
// clientURL and peers on peerURL, and waits until it is ready. It compacts
// its history older than retention (0: never; see
// DefaultCompactionRetention). Its log (errors only, JSON) goes to logOut.
func startEmbedded(dir, clientURL, peerURL string, retention time.Duration, logOut io.Writer) (*embedded, error) {
	cu, err := url.Parse(clientURL)
	if err != nil {
		return nil, err
	}
	pu, err := url.Parse(peerURL)
	if err != nil {
		return nil, err
	}
	e := &embedded{}
	cfg := embed.NewConfig()
	cfg.Name = "configd"
	cfg.Dir = dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(quietCore{zapcore.NewCore(
		zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		zapcore.Lock(zapcore.AddSync(logOut)),
		zap.LevelEnablerFunc(func(l zapcore.Level) bool { return l >= zapcore.ErrorLevel && !e.closing.Load() }),
	)}))
	// Single member, local disk: elections in ~100 ms rather than seconds.
	cfg.TickMs, cfg.ElectionMs = 10, 100
	if retention > 0 {
		// The compactor runs in the background: startup is not slowed.
		cfg.AutoCompactionMode = embed.CompactorModePeriodic
		cfg.AutoCompactionRetention = retention.String()
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
