package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter/skew"
)

const serveUsage = `Usage: configd serve [flags]

Runs the daemon: the admin HTTP API, leader election between replicas, and
(on the leader) publishing every provider's shares.

With --etcd-endpoints it uses that etcd cluster; without, it starts an
embedded single-node etcd with its data under --data-dir, so one machine
needs nothing else; it discards revisions older than
--embedded-compaction-retention (an external etcd needs its own
--auto-compaction-retention).

The leader publishes each provider's shares with the provider's algorithm
(even or fair). Joins, leaves and config changes are published at once; a
change of demand alone (fair) only when some share moves by more than 1% of
the limit and a tenth of an average share, and by more than one permit, and
at most once per window; a move under way is finished regardless. It also
keeps the last --history-keep history entries per provider and deletes
older ones.

Writes through the API need 'Authorization: Bearer TOKEN' when
--admin-token-file is set; serve refuses a token file other users can read
or write, unless --insecure-token-file. serve refuses to listen on a
non-loopback address without a token, unless --insecure. Without a token
(or with --allowed-host), the API answers only requests whose Host is
localhost, an IP address, the --listen host or an --allowed-host name, and
421 to others, against DNS rebinding.

The first SIGINT/SIGTERM shuts down gracefully (drains requests, resigns
leadership); a second one aborts.

Examples:
  configd serve --data-dir /var/lib/configd
  configd serve --listen 0.0.0.0:7070 --admin-token-file /etc/configd/token \
      --etcd-endpoints https://etcd-1:2379,https://etcd-2:2379 \
      --etcd-ca ca.pem --etcd-cert client.pem --etcd-key client-key.pem

Flags:
`

// Config is serve's configuration. DefaultConfig gives the defaults,
// registerFlags binds it to flags, Validate checks it.
type Config struct {
	Listen            string        // admin API address
	AdminTokenFile    string        // bearer token for writes; empty: writes open
	Insecure          bool          // allow a non-loopback Listen without a token
	AllowedHosts      []string      // Host names the API answers besides localhost, IP addresses and Listen's host
	InsecureTokenFile bool          // accept an AdminTokenFile other users can read or write
	Etcd              etcdFlags     // external etcd; no endpoints: embedded
	DataDir           string        // embedded etcd's data
	EmbeddedClientURL string        // embedded etcd's client URL
	EmbeddedPeerURL   string        // embedded etcd's peer URL
	EmbeddedCertFile  string        // TLS certificate for the embedded client URL (https)
	EmbeddedKeyFile   string        // its key
	EmbeddedGateway   bool          // serve etcd's JSON gateway on the embedded client URL
	EmbeddedRetention time.Duration // embedded etcd's revision history kept; 0: never compacted
	MaxTxnOps         int           // operations in one of configd's transactions, at most etcd's --max-txn-ops; 0: see txnOps
	Prefix            string        // etcd key prefix
	ReplicaID         string        // this replica's name in the election
	SessionTTL        time.Duration // election session TTL; a dead leader is replaced after at most this
	Margin            time.Duration // propagation margin before new shares apply
	NTPServers        []string      // NTP servers configd measures its own clock against; none: not measured
	NTPInterval       time.Duration // between two measurements
	HistoryKeep       int64         // history entries kept per provider; older ones are pruned
	AdaptiveInterval  time.Duration // between two rounds of the adaptive controller
	ShutdownTimeout   time.Duration // how long a graceful shutdown may drain
	LogLevel          string        // debug, info, warn, error
	LogFormat         string        // text or json
}

// DefaultConfig returns serve's defaults.
func DefaultConfig() Config {
	return Config{
		Listen:            "127.0.0.1:7070",
		DataDir:           "configd.etcd",
		EmbeddedClientURL: "http://127.0.0.1:2379",
		EmbeddedPeerURL:   "http://127.0.0.1:2380",
		EmbeddedRetention: DefaultCompactionRetention,
		Prefix:            schema.DefaultPrefix,
		ReplicaID:         defaultReplicaID(),
		SessionTTL:        10 * time.Second,
		Margin:            DefaultPropagationMargin,
		NTPInterval:       skew.DefaultInterval,
		HistoryKeep:       DefaultHistoryKeep,
		AdaptiveInterval:  DefaultAdaptEvery,
		ShutdownTimeout:   10 * time.Second,
		LogLevel:          "info",
		LogFormat:         "text",
		Etcd:              etcdFlags{dialTimeout: 5 * time.Second},
	}
}

func defaultReplicaID() string {
	host, _ := os.Hostname()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

func (c *Config) registerFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Listen, "listen", c.Listen, "admin API address (host:port)")
	fs.StringVar(&c.AdminTokenFile, "admin-token-file", c.AdminTokenFile, "file holding the bearer token required for writes")
	fs.BoolVar(&c.Insecure, "insecure", c.Insecure, "allow listening beyond loopback without --admin-token-file")
	fs.BoolVar(&c.InsecureTokenFile, "insecure-token-file", c.InsecureTokenFile,
		"accept an --admin-token-file that other users can read or write (with a warning) instead of refusing it")
	fs.Func("allowed-host", "a host name the admin API answers besides localhost, IP addresses and the --listen host "+
		"(checked against DNS rebinding without --admin-token-file, or whenever this is given); repeat for several", func(v string) error {
		c.AllowedHosts = append(c.AllowedHosts, v)
		return nil
	})
	c.Etcd.register(fs)
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "embedded etcd's data directory (without --etcd-endpoints)")
	fs.StringVar(&c.EmbeddedClientURL, "embedded-client-url", c.EmbeddedClientURL, "embedded etcd's client URL")
	fs.StringVar(&c.EmbeddedPeerURL, "embedded-peer-url", c.EmbeddedPeerURL, "embedded etcd's peer URL (loopback: a single member has no peers)")
	fs.StringVar(&c.EmbeddedCertFile, "embedded-cert-file", c.EmbeddedCertFile, "PEM certificate the embedded etcd serves its https client URL with (with --embedded-key-file)")
	fs.StringVar(&c.EmbeddedKeyFile, "embedded-key-file", c.EmbeddedKeyFile, "PEM key of --embedded-cert-file")
	fs.BoolVar(&c.EmbeddedGateway, "embedded-gateway", c.EmbeddedGateway, "serve etcd's JSON gateway (/v3/...) on the embedded client URL (off: gRPC only)")
	fs.DurationVar(&c.EmbeddedRetention, "embedded-compaction-retention", c.EmbeddedRetention,
		"revision history the embedded etcd keeps; it compacts older revisions periodically (0: never)")
	fs.IntVar(&c.MaxTxnOps, "etcd-max-txn-ops", c.MaxTxnOps, fmt.Sprintf(
		"the most operations configd writes in one transaction, at most the etcd's --max-txn-ops (0: %d, etcd's default; with the embedded etcd %d, which configd starts it with)",
		ledger.DefaultMaxOps, EmbeddedMaxTxnOps))
	fs.StringVar(&c.Prefix, "prefix", c.Prefix, "etcd key prefix")
	fs.StringVar(&c.ReplicaID, "replica-id", c.ReplicaID, "this replica's name in the leader election")
	fs.DurationVar(&c.SessionTTL, "session-ttl", c.SessionTTL, "leader session TTL, whole seconds (a dead leader is replaced within it)")
	fs.DurationVar(&c.Margin, "propagation-margin", c.Margin, "new shares apply from the first window boundary at least this far ahead")
	fs.Func("ntp-server", "an NTP server (host or host:port) to measure configd's clock against, as the instances do; repeat for several", func(v string) error {
		c.NTPServers = append(c.NTPServers, v)
		return nil
	})
	fs.DurationVar(&c.NTPInterval, "ntp-interval", c.NTPInterval, "time between two measurements of configd's clock (with --ntp-server)")
	fs.Int64Var(&c.HistoryKeep, "history-keep", c.HistoryKeep, "history entries kept per provider; the leader deletes older ones")
	fs.DurationVar(&c.AdaptiveInterval, "adaptive-interval", c.AdaptiveInterval, "between two rounds of an adaptive provider's controller (10ms..1m; at most the instances' report interval)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "how long a graceful shutdown may take")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json")
}

// ConfigError says which setting of Config is wrong.
type ConfigError struct {
	Field string
	Value string
	Err   error
}

// Error implements error: "--listen \"x\": must be host:port ...".
func (e *ConfigError) Error() string {
	return fmt.Sprintf("--%s %q: %v", e.Field, e.Value, e.Err)
}

// Unwrap returns the cause.
func (e *ConfigError) Unwrap() error { return e.Err }

// Is makes a ConfigError a usage error (exit code 2).
func (e *ConfigError) Is(target error) bool { return target == errUsage }

// Validate checks the config; the error is a *ConfigError.
func (c Config) Validate() error {
	host, port, err := net.SplitHostPort(c.Listen)
	if err != nil || port == "" {
		return &ConfigError{"listen", c.Listen, errors.New("must be host:port, e.g. 127.0.0.1:7070")}
	}
	if !isLoopback(host) && c.AdminTokenFile == "" && !c.Insecure {
		return &ConfigError{"listen", c.Listen, errors.New("refusing to listen beyond loopback without --admin-token-file (or pass --insecure)")}
	}
	for _, h := range c.AllowedHosts {
		if !validHostName(h) {
			return &ConfigError{"allowed-host", h, errors.New("must be a host name such as configd.internal: no scheme, port, path or wildcard")}
		}
	}
	if c.AdaptiveInterval < 10*time.Millisecond || c.AdaptiveInterval > time.Minute {
		return &ConfigError{"adaptive-interval", c.AdaptiveInterval.String(), errors.New("must be from 10ms to 1m")}
	}
	if c.Etcd.given() {
		if _, err := c.Etcd.config(); err != nil {
			return err
		}
	} else {
		if c.DataDir == "" {
			return &ConfigError{"data-dir", c.DataDir, errors.New("must be set when no --etcd-endpoints are given")}
		}
		if err := c.validateEmbedded(); err != nil {
			return err
		}
		if c.EmbeddedRetention != 0 && (c.EmbeddedRetention < time.Second || c.EmbeddedRetention > maxCompactionRetention) {
			return &ConfigError{"embedded-compaction-retention", c.EmbeddedRetention.String(), errors.New("must be 0 (never compact) or from 1s to 24h")}
		}
	}
	if c.MaxTxnOps != 0 && (c.MaxTxnOps < ledger.MinOps || c.MaxTxnOps > maxTxnOps) {
		return &ConfigError{"etcd-max-txn-ops", strconv.Itoa(c.MaxTxnOps), fmt.Errorf("must be 0 (etcd's default) or from %d to %d", ledger.MinOps, maxTxnOps)}
	}
	if _, err := schema.NewKeys(c.Prefix); err != nil {
		return &ConfigError{"prefix", c.Prefix, err}
	}
	if schema.ValidateReplicaID(c.ReplicaID) != nil { // as election keys are checked
		return &ConfigError{"replica-id", c.ReplicaID, errors.New("must be 1 to 128 characters, no spaces or slashes")}
	}
	if c.SessionTTL < time.Second || c.SessionTTL%time.Second != 0 || c.SessionTTL > schema.MaxSessionTTL {
		return &ConfigError{"session-ttl", c.SessionTTL.String(), errors.New("must be whole seconds from 1s to 1h")}
	}
	if c.Margin < 0 || c.Margin > time.Minute {
		return &ConfigError{"propagation-margin", c.Margin.String(), errors.New("must be from 0 to 1m")}
	}
	if len(c.NTPServers) > 0 {
		if _, err := skew.New(skew.WithServers(c.NTPServers...), skew.WithInterval(c.NTPInterval)); err != nil {
			return &ConfigError{"ntp-server", strings.Join(c.NTPServers, ","), err}
		}
	}
	if c.HistoryKeep < 1 || c.HistoryKeep > maxHistoryKeep {
		return &ConfigError{"history-keep", strconv.FormatInt(c.HistoryKeep, 10), fmt.Errorf("must be from 1 to %d", maxHistoryKeep)}
	}
	if c.ShutdownTimeout <= 0 {
		return &ConfigError{"shutdown-timeout", c.ShutdownTimeout.String(), errors.New("must be positive")}
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return &ConfigError{"log-level", c.LogLevel, err}
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return &ConfigError{"log-format", c.LogFormat, errors.New("must be text or json")}
	}
	return nil
}

// EmbeddedMaxTxnOps is the embedded etcd's --max-txn-ops unless
// --etcd-max-txn-ops says otherwise: a ledger's publish to a thousand
// instances is one transaction, not eight, each after a read of the whole
// ledger.
const EmbeddedMaxTxnOps = 2048

// maxTxnOps bounds --etcd-max-txn-ops: the most the ledger plans.
const maxTxnOps = ledger.MaxOps

// txnOps returns the operations one of configd's transactions may make.
func (c Config) txnOps() int {
	switch {
	case c.MaxTxnOps != 0:
		return c.MaxTxnOps
	case c.Etcd.given():
		return ledger.DefaultMaxOps
	}
	return EmbeddedMaxTxnOps
}

// isLoopback reports whether host (from host:port) is a loopback address.
// An empty host means every interface, so it is not.
// validateEmbedded checks the embedded etcd's URLs and TLS: it is closed
// by authentication (access.go) wherever it listens, but beyond loopback
// its passwords and data would cross the network in the clear, so a
// client URL there needs TLS; the peer URL stays on loopback, since a
// single member has no peers.
func (c Config) validateEmbedded() error {
	cu, err := url.Parse(c.EmbeddedClientURL)
	if err != nil || (cu.Scheme != "http" && cu.Scheme != "https") || cu.Hostname() == "" || cu.Port() == "" {
		return &ConfigError{"embedded-client-url", c.EmbeddedClientURL, errors.New("must be a URL such as http://127.0.0.1:2379")}
	}
	pu, err := url.Parse(c.EmbeddedPeerURL)
	if err != nil || pu.Scheme != "http" || pu.Hostname() == "" || pu.Port() == "" {
		return &ConfigError{"embedded-peer-url", c.EmbeddedPeerURL, errors.New("must be a URL such as http://127.0.0.1:2380")}
	}
	if !isLoopback(pu.Hostname()) {
		return &ConfigError{"embedded-peer-url", c.EmbeddedPeerURL, errors.New("must be a loopback address: the embedded etcd is a single member, with no peers")}
	}
	if (c.EmbeddedCertFile == "") != (c.EmbeddedKeyFile == "") {
		return &ConfigError{"embedded-cert-file", c.EmbeddedCertFile, errors.New("--embedded-cert-file and --embedded-key-file go together")}
	}
	tls := c.EmbeddedCertFile != ""
	switch {
	case cu.Scheme == "https" && !tls:
		return &ConfigError{"embedded-client-url", c.EmbeddedClientURL, errors.New("https needs --embedded-cert-file and --embedded-key-file")}
	case cu.Scheme == "http" && tls:
		return &ConfigError{"embedded-client-url", c.EmbeddedClientURL, errors.New("must be https with --embedded-cert-file")}
	case !isLoopback(cu.Hostname()) && !tls:
		return &ConfigError{"embedded-client-url", c.EmbeddedClientURL, errors.New("refusing to serve etcd beyond loopback without TLS: give an https URL with --embedded-cert-file and --embedded-key-file")}
	}
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

func newLogger(w io.Writer, c Config) *slog.Logger {
	level, _ := parseLevel(c.LogLevel)
	opts := &slog.HandlerOptions{Level: level}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg.registerFlags(fs)
	if err := parseFlags(fs, serveUsage, args, stdout); err != nil {
		return helpOK(err)
	}
	if fs.NArg() != 0 {
		return usageErrorf("serve: takes no arguments, got %q", fs.Args())
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	return serve(ctx, cfg, stderr)
}

// serve runs the daemon until ctx ends, then shuts down gracefully.
func serve(ctx context.Context, cfg Config, logOut io.Writer) error {
	log := newLogger(logOut, cfg)
	var token []byte
	if cfg.AdminTokenFile != "" {
		var err error
		if token, err = readTokenFile(cfg.AdminTokenFile, cfg.InsecureTokenFile, log); err != nil {
			return err
		}
	}
	keys, _ := schema.NewKeys(cfg.Prefix)

	var cli *clientv3.Client
	var err error
	if cfg.Etcd.given() {
		cli, err = cfg.Etcd.dial()
	} else {
		var emb *embedded
		emb, cli, err = startEmbedded(ctx, embeddedOptions{
			dir: cfg.DataDir, clientURL: cfg.EmbeddedClientURL, peerURL: cfg.EmbeddedPeerURL,
			certFile: cfg.EmbeddedCertFile, keyFile: cfg.EmbeddedKeyFile, gateway: cfg.EmbeddedGateway,
			retention: cfg.EmbeddedRetention, maxTxnOps: cfg.txnOps(), keys: keys,
		}, logOut)
		if err != nil {
			return err
		}
		defer emb.close()
		if err := grantProviders(ctx, cli, keys); err != nil {
			cli.Close()
			return err
		}
		log.Info("embedded etcd ready: instances authenticate as user "+instanceUser+" with the password in "+credentialsFile(cfg.DataDir, instanceUser),
			"data_dir", cfg.DataDir, "client_url", cfg.EmbeddedClientURL, "gateway", cfg.EmbeddedGateway,
			"compaction_retention", cfg.EmbeddedRetention)
	}
	if err != nil {
		return err
	}
	defer cli.Close()

	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	st := &store{cli: cli, keys: keys, log: log}
	if !cfg.Etcd.given() {
		st.admit = func(ctx context.Context, name string) error { return grantProvider(ctx, cli, keys, name) }
	}
	clk, err := startClock(ctx, cfg, m, log)
	if err != nil {
		return err
	}
	defer clk.stop()
	el := &elector{
		cli: cli, keys: keys, id: cfg.ReplicaID, ttl: cfg.SessionTTL, log: log, metrics: m,
		pub: &publisher{
			cli: cli, keys: keys, log: log.With("replica", cfg.ReplicaID), metrics: m, margin: cfg.Margin,
			replica: cfg.ReplicaID, historyKeep: cfg.HistoryKeep, now: time.Now, clock: clk.now, uncertainty: clk.uncertainty,
			txnOps: cfg.txnOps(),
		},
	}
	var hosts *hostPolicy
	if len(token) == 0 || len(cfg.AllowedHosts) > 0 {
		hosts = newHostPolicy(cfg.Listen, cfg.AllowedHosts)
	}
	a := &api{
		store: st, token: token, hosts: hosts, log: log, metrics: m, leader: el.leading.Load, publishError: el.pub.publishError,
		ready: func(ctx context.Context) error {
			_, err := cli.Get(ctx, keys.Election(), clientv3.WithCountOnly())
			return err
		},
	}
	a.console = newConsole(a, cfg.ReplicaID)
	defer a.console.hub.close()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{
		Handler:           a.handler(reg),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}

	// The console's event streams last as long as their pages: a shutdown
	// ends them, or it would wait for them until its timeout.
	srv.RegisterOnShutdown(a.console.hub.close)

	var wg sync.WaitGroup
	leadCtx, stopLeading := context.WithCancel(ctx)
	defer stopLeading()
	wg.Go(func() { el.run(leadCtx) })
	ad := &adaptor{cli: cli, keys: keys, store: st, replica: cfg.ReplicaID, log: log.With("replica", cfg.ReplicaID),
		metrics: m, now: clk.now, every: cfg.AdaptiveInterval, margin: cfg.Margin, uncertainty: clk.uncertainty}
	wg.Go(func() { ad.run(leadCtx) })
	serveErr := make(chan error, 1)
	wg.Go(func() { serveErr <- srv.Serve(ln) })
	log.Info("configd serving", "listen", ln.Addr().String(), "replica", cfg.ReplicaID,
		"writes_need_token", len(token) > 0, "checks_host", hosts != nil, "prefix", keys.Prefix(),
		"console", "http://"+ln.Addr().String()+consolePath)

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down: draining requests and resigning (a second signal aborts)")
	case runErr = <-serveErr:
		log.Error("admin API stopped", "error", runErr)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("admin API did not drain in time", "error", err)
		srv.Close()
	}
	stopLeading()
	wg.Wait()
	log.Info("configd stopped")
	if errors.Is(runErr, http.ErrServerClosed) {
		runErr = nil
	}
	return runErr
}
