package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/user"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// passwordEnv is read when --etcd-username is set without --etcd-password-file.
const passwordEnv = "CONFIGD_ETCD_PASSWORD"

// etcdFlags are the etcd connection flags every subcommand shares.
type etcdFlags struct {
	endpoints    string
	caFile       string
	certFile     string
	keyFile      string
	username     string
	passwordFile string
	dialTimeout  time.Duration
}

func (f *etcdFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.endpoints, "etcd-endpoints", "", "comma-separated etcd client URLs (e.g. https://10.0.0.1:2379)")
	fs.StringVar(&f.caFile, "etcd-ca", "", "PEM file of the CA that signed etcd's server certificate (enables TLS)")
	fs.StringVar(&f.certFile, "etcd-cert", "", "PEM client certificate for etcd (with --etcd-key)")
	fs.StringVar(&f.keyFile, "etcd-key", "", "PEM client key for etcd (with --etcd-cert)")
	fs.StringVar(&f.username, "etcd-username", "", "etcd user name (password from --etcd-password-file or $"+passwordEnv+")")
	fs.StringVar(&f.passwordFile, "etcd-password-file", "", "file holding the etcd password")
	fs.DurationVar(&f.dialTimeout, "etcd-dial-timeout", 5*time.Second, "timeout for connecting to etcd")
}

// given reports whether etcd endpoints were given.
func (f *etcdFlags) given() bool { return strings.TrimSpace(f.endpoints) != "" }

// config builds a client config from the flags, checking them.
func (f *etcdFlags) config() (clientv3.Config, error) {
	var cfg clientv3.Config
	for _, ep := range strings.Split(f.endpoints, ",") {
		ep = strings.TrimSpace(ep)
		if ep == "" {
			continue
		}
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "unix" && u.Scheme != "unixs") || u.Host == "" {
			return cfg, usageErrorf("--etcd-endpoints: %q is not a URL such as http://127.0.0.1:2379", ep)
		}
		cfg.Endpoints = append(cfg.Endpoints, ep)
	}
	if len(cfg.Endpoints) == 0 {
		return cfg, usageErrorf("--etcd-endpoints: no endpoint given")
	}
	if f.dialTimeout <= 0 {
		return cfg, usageErrorf("--etcd-dial-timeout must be positive, got %v", f.dialTimeout)
	}
	cfg.DialTimeout = f.dialTimeout
	cfg.Logger = zap.NewNop()
	cfg.DialOptions = cluster.DialOptions()
	if (f.certFile == "") != (f.keyFile == "") {
		return cfg, usageErrorf("--etcd-cert and --etcd-key go together")
	}
	if f.caFile != "" || f.certFile != "" {
		info := transport.TLSInfo{CertFile: f.certFile, KeyFile: f.keyFile, TrustedCAFile: f.caFile}
		tlsCfg, err := info.ClientConfig()
		if err != nil {
			return cfg, fmt.Errorf("etcd TLS: %w", err)
		}
		cfg.TLS = tlsCfg
	}
	if f.username != "" {
		cfg.Username = f.username
		switch {
		case f.passwordFile != "":
			b, err := os.ReadFile(f.passwordFile)
			if err != nil {
				return cfg, fmt.Errorf("--etcd-password-file: %w", err)
			}
			cfg.Password = strings.TrimRight(string(b), "\r\n")
		default:
			cfg.Password = os.Getenv(passwordEnv)
		}
	} else if f.passwordFile != "" {
		return cfg, usageErrorf("--etcd-password-file needs --etcd-username")
	}
	return cfg, nil
}

// dial connects to etcd. clientv3.New does not wait for a connection; the
// first request does, up to its context's deadline.
func (f *etcdFlags) dial() (*clientv3.Client, error) {
	cfg, err := f.config()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	return cli, nil
}

// defaultServer is the admin API the CLI talks to when given no --server.
const defaultServer = "http://127.0.0.1:7070"

// clientFlags are the flags of the CLI subcommands (all but serve).
type clientFlags struct {
	etcd      etcdFlags
	server    string
	tokenFile string
	prefix    string
	timeout   time.Duration
	who       string
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	c.etcd.register(fs)
	fs.StringVar(&c.server, "server", defaultServer, "admin API of a running 'configd serve' (ignored with --etcd-endpoints)")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding the admin API bearer token (for writes)")
	fs.StringVar(&c.prefix, "prefix", schema.DefaultPrefix, "etcd key prefix (with --etcd-endpoints)")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "timeout for the whole command")
	fs.StringVar(&c.who, "who", defaultWho(), "who makes the change, recorded in history")
}

// defaultWho returns user@host.
func defaultWho() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host
}

// open returns the backend the flags select: etcd directly with
// --etcd-endpoints, else the admin API. close releases it.
func (c *clientFlags) open(stderr io.Writer) (b backend, closeFn func(), err error) {
	if c.timeout <= 0 {
		return nil, nil, usageErrorf("--timeout must be positive, got %v", c.timeout)
	}
	if c.etcd.given() {
		keys, err := schema.NewKeys(c.prefix)
		if err != nil {
			return nil, nil, err
		}
		cli, err := c.etcd.dial()
		if err != nil {
			return nil, nil, err
		}
		return &store{cli: cli, keys: keys}, func() { cli.Close() }, nil
	}
	api, err := newAPIClient(c.server, c.tokenFile, c.timeout)
	if err != nil {
		return nil, nil, err
	}
	return api, api.close, nil
}

// withTimeout bounds a CLI command.
func (c *clientFlags) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.timeout)
}

// readCommand is what the read-only subcommands (get, list, status,
// history, audit) share once their flags are parsed: the provider NAME
// (empty for list, and for audit of every provider), --json, and the open
// backend, bounded by --timeout.
type readCommand struct {
	name   string
	asJSON bool
	b      backend
	ctx    context.Context
	done   func() // releases the backend and the timeout
}

// nameArg is the provider NAME a read subcommand takes.
type nameArg int

const (
	nameNone     nameArg = iota // none (list)
	nameOne                     // exactly one
	nameOptional                // one or none (audit: none means all)
)

// openRead parses a read subcommand's flags and arguments, a provider
// NAME as names says, and opens its backend. It returns a nil
// readCommand and a nil error when --help was asked for.
func openRead(ctx context.Context, cmd, usage string, names nameArg, args []string, stdout, stderr io.Writer) (*readCommand, error) {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseArgs(fs, usage, args, stdout)
	if err != nil {
		return nil, helpOK(err)
	}
	rc := &readCommand{}
	switch {
	case names == nameOne || names == nameOptional && len(pos) > 0:
		if rc.name, err = oneName(cmd, pos); err != nil {
			return nil, err
		}
	case len(pos) != 0:
		return nil, usageErrorf("%s: takes no arguments, got %q", cmd, pos)
	}
	b, closeFn, err := cf.open(stderr)
	if err != nil {
		return nil, err
	}
	tctx, cancel := cf.withTimeout(ctx)
	rc.asJSON, rc.b, rc.ctx = *asJSON, b, tctx
	rc.done = func() { cancel(); closeFn() }
	return rc, nil
}
