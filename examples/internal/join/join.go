// Package join is what the examples share to get their limits: a local
// limiter of a fixed quota, or the limiter of a cluster.Member that joined
// a provider through etcd, optionally with an NTP clock monitor; with a
// tokens limit, a limiter.Multi of requests and tokens, local or a
// cluster.Group of two providers; and a Prometheus registry of its own
// holding the limiters' and the members' collectors.
package join

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/cluster"
	"github.com/sluice-go/sluice/limiter/metrics"
	"github.com/sluice-go/sluice/limiter/skew"
)

// Config selects the limiter.
type Config struct {
	// Endpoints are etcd's client URLs; none: a local limiter of Limit per
	// Window.
	Endpoints []string
	// Username and PasswordFile authenticate to etcd ("": none). configd's
	// embedded etcd wants user "instance" and the password configd wrote to
	// <data-dir>/credentials/instance.
	Username, PasswordFile string
	// CAFile, with Endpoints, enables TLS: the CA that signed etcd's
	// server certificate; CertFile and KeyFile, a client certificate.
	CAFile, CertFile, KeyFile string
	Prefix                    string // etcd key prefix shared with configd ("": cluster's default)
	Provider                  string
	// TokensProvider, with Endpoints, is a second provider, whose limit
	// counts tokens: the instance joins both (cluster.JoinGroup), and
	// Multi holds the two limits.
	TokensProvider string
	ID             string // instance id; "" lets cluster choose
	Limit          int64  // local quota (no Endpoints)
	// Classes, without Endpoints and TokensLimit, are the local limiter's
	// priority classes (limiter.WithClasses). A joined provider's come
	// from its config (configd set --class).
	Classes []limiter.Class
	// TokensLimit, without Endpoints, is a local second limit: tokens per
	// Window, held with Limit in Multi.
	TokensLimit int64
	Window      time.Duration
	Fallback    int64 // quota before a share is known (cold start without etcd)
	// TokensFallback is the tokens lane's (with TokensProvider): a
	// fallback of requests says nothing of tokens.
	TokensFallback int64
	LeaseTTL       time.Duration

	// NTPServers, when given, make the member measure its clock
	// (cluster.WithClockMonitor) every NTPInterval.
	NTPServers  []string
	NTPInterval time.Duration
	// ClockSkew makes the limiter's clock (and the monitor's) the system
	// clock plus ClockSkew: an injected clock error, for demos and tests.
	ClockSkew time.Duration

	Logger *slog.Logger
}

// Joined is a limiter, its registry, and where its quota comes from.
type Joined struct {
	Limiter  *limiter.Limiter
	Member   *cluster.Member // nil for a local limiter
	Registry *prometheus.Registry
	// Multi and Group, with Config.TokensProvider: the requests and the
	// tokens limit, each a share of its provider (Limiter and Member are
	// the requests one's).
	Multi *limiter.Multi
	Group *cluster.Group
	// Tokens is the index of Multi's limit that counts tokens, -1 when
	// none does (no Multi, or a provider whose limits count only
	// requests).
	Tokens   int
	provider string
	cli      *clientv3.Client
}

// Describe says where the quota comes from, for a start-up line.
func (j *Joined) Describe() string {
	if j.Member == nil && j.Multi != nil {
		return fmt.Sprintf("limits: %v (local, all or nothing)", j.Multi.Limits())
	}
	if j.Member == nil {
		st := j.Limiter.Stats()
		return fmt.Sprintf("local limiter: %d per %v", st.Quota, st.Window)
	}
	if j.Multi != nil {
		var parts []string
		for _, m := range j.Group.Members() {
			st := m.Status()
			parts = append(parts, fmt.Sprintf("%s (share %d of %d, source %s)", m.Provider(), st.Share, st.Total, st.Source))
		}
		return fmt.Sprintf("joined %s as %s through etcd, all or nothing", strings.Join(parts, " and "), j.Member.ID())
	}
	st := j.Member.Status()
	s := fmt.Sprintf("joined %s as %s through etcd (share %d of %d, source %s", j.provider, j.Member.ID(), st.Share, st.Total, st.Source)
	if q := j.Limiter.Stats().Quota; q != st.Share {
		// A share grows only from a window boundary at least the change
		// margin ahead (so that no window gets it twice): say so, or a
		// first report's lower quota contradicts this line.
		s += fmt.Sprintf("; it takes effect at a window boundary ahead, the quota is %d until then", q)
	}
	return s + ")"
}

// Close leaves the providers (revoking the leases) or closes the local
// limiter.
func (j *Joined) Close() error {
	var err error
	switch {
	case j.Group != nil:
		err = j.Group.Close()
	case j.Member != nil:
		err = j.Member.Close()
	case j.Multi != nil:
		return j.Multi.Close()
	default:
		return j.Limiter.Close()
	}
	j.cli.Close()
	return err
}

// Open returns the limiter cfg selects. With Endpoints it waits, within
// ctx, for cluster.Join (which itself gives up on etcd after its cold
// start timeout and runs on the fallback quota).
func Open(ctx context.Context, cfg Config) (*Joined, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	labels := prometheus.Labels{"provider": cfg.Provider, "instance": cfg.ID}
	reg := prometheus.NewRegistry()
	if len(cfg.Endpoints) == 0 {
		var opts []limiter.Option
		if cfg.ClockSkew != 0 {
			opts = append(opts, limiter.WithClock(skewed(cfg.ClockSkew)))
		}
		if len(cfg.Classes) > 0 {
			opts = append(opts, limiter.WithClasses(cfg.Classes...))
		}
		return openLocal(cfg, labels, opts)
	}
	pw, err := Password(cfg.PasswordFile)
	if err != nil {
		return nil, err
	}
	ecfg := clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: cluster.DialOptions(), Username: cfg.Username, Password: pw}
	if cfg.CAFile != "" || cfg.CertFile != "" {
		info := transport.TLSInfo{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, TrustedCAFile: cfg.CAFile}
		if ecfg.TLS, err = info.ClientConfig(); err != nil {
			return nil, fmt.Errorf("etcd TLS: %w", err)
		}
	}
	cli, err := clientv3.New(ecfg)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	opts, err := memberOptions(cfg, log)
	if err != nil {
		cli.Close()
		return nil, err
	}
	j := &Joined{Registry: reg, provider: cfg.Provider, cli: cli}
	if cfg.TokensProvider != "" {
		j.Group, err = cluster.JoinGroup(ctx, cli, []cluster.Lane{{Provider: cfg.Provider}, {Provider: cfg.TokensProvider, Dimension: "tokens",
			Fallback: &cluster.Fallback{Quota: cfg.TokensFallback, Window: cfg.Window}}}, opts...)
	} else {
		// Every limit the provider's config holds (configd set NAME
		// --limit 100/1s --limit tokens=200000/1m).
		j.Group, err = cluster.JoinProvider(ctx, cli, cfg.Provider, opts...)
	}
	if err != nil {
		cli.Close()
		return nil, err
	}
	members := j.Group.Members()
	j.Member, j.Limiter = members[0], members[0].Limiter()
	if len(members) > 1 {
		j.Multi = j.Group.Multi()
	}
	j.Tokens = tokensLimit(j.Multi)
	for _, m := range members {
		labels := prometheus.Labels{"provider": m.Provider(), "instance": m.ID()}
		if err := metrics.Register(reg, m.Limiter(), labels); err != nil {
			j.Close()
			return nil, err
		}
		if err := reg.Register(cluster.NewCollector(m, labels)); err != nil {
			j.Close()
			return nil, err
		}
	}
	return j, nil
}

// tokensLimit returns the index of m's limit that counts tokens, or -1.
func tokensLimit(m *limiter.Multi) int {
	if m == nil {
		return -1
	}
	return slices.IndexFunc(m.Limits(), func(l limiter.Limit) bool { return l.Dimension == "tokens" })
}

// openLocal returns a local limiter of cfg.Limit per window, or with
// cfg.TokensLimit a Multi of it and a tokens limit; the requests limit's
// metrics are in the registry.
func openLocal(cfg Config, labels prometheus.Labels, opts []limiter.Option) (*Joined, error) {
	j := &Joined{Registry: prometheus.NewRegistry(), Tokens: -1}
	if cfg.TokensLimit > 0 {
		m, err := limiter.NewMulti([]limiter.Limit{
			{Quota: cfg.Limit, Window: cfg.Window},
			{Dimension: "tokens", Quota: cfg.TokensLimit, Window: cfg.Window},
		}, opts...)
		if err != nil {
			return nil, err
		}
		j.Multi, j.Limiter = m, m.Limiter(0)
		j.Tokens = tokensLimit(m)
	} else {
		lim, err := limiter.New(cfg.Limit, cfg.Window, opts...)
		if err != nil {
			return nil, err
		}
		j.Limiter = lim
	}
	if err := metrics.Register(j.Registry, j.Limiter, labels); err != nil {
		j.Close()
		return nil, err
	}
	return j, nil
}

// memberOptions returns the cluster options cfg selects.
func memberOptions(cfg Config, log *slog.Logger) ([]cluster.Option, error) {
	opts := []cluster.Option{cluster.WithLogger(log), cluster.WithFallback(cfg.Fallback, cfg.Window)}
	if cfg.Prefix != "" {
		opts = append(opts, cluster.WithPrefix(cfg.Prefix))
	}
	if cfg.ID != "" {
		opts = append(opts, cluster.WithID(cfg.ID))
	}
	if cfg.LeaseTTL > 0 {
		opts = append(opts, cluster.WithLeaseTTL(cfg.LeaseTTL))
	}
	var clock skew.Clock
	if cfg.ClockSkew != 0 {
		clock = skewed(cfg.ClockSkew)
		opts = append(opts, cluster.WithLimiterOptions(limiter.WithClock(clock)))
	}
	if len(cfg.NTPServers) > 0 {
		sopts := []skew.Option{skew.WithServers(cfg.NTPServers...), skew.WithLogger(log), skew.WithTimeout(500 * time.Millisecond)}
		if cfg.NTPInterval > 0 {
			sopts = append(sopts, skew.WithInterval(cfg.NTPInterval))
		}
		if clock != nil {
			sopts = append(sopts, skew.WithClock(clock))
		}
		mon, err := skew.New(sopts...)
		if err != nil {
			return nil, err
		}
		opts = append(opts, cluster.WithClockMonitor(mon))
	}
	return opts, nil
}

// skewed is the system clock off by d (positive: ahead).
type skewed time.Duration

func (d skewed) Now() time.Time { return time.Now().Add(time.Duration(d)) }

// List splits a comma-separated flag value (endpoints, NTP servers) into
// its non-empty, trimmed items.
func List(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Password reads an etcd password from file, without the trailing newline;
// "" for no file.
func Password(file string) (string, error) {
	if file == "" {
		return "", nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("etcd password: %w", err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}
