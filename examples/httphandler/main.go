// Command httphandler is the request-handler example: an HTTP server whose
// handler calls a rate-limited downstream API once per request, within the
// request's latency budget. It waits for a permit only as long as the budget
// allows, then answers 503 with Retry-After (the seconds until the limiter's
// next window); when the downstream still answers 429 with Retry-After, it
// pauses the limiter for that long (limiter.Backoff). It serves the
// limiter's metrics on /metrics, from a registry of its own.
//
// Standalone, it calls an in-process provider stub with a limit and uses a
// local limiter:
//
//	go run ./examples/httphandler -limit 100
//	curl -i -H 'X-Latency-Budget: 50ms' http://127.0.0.1:8080/
//	curl -s http://127.0.0.1:8080/metrics | grep sluice_
//
// With -tokens-limit it enforces two limits at once, requests and tokens,
// as for a model API: each request names its estimated tokens (X-Tokens,
// or -tokens), is admitted only when both limits have room, and settles
// the tokens the downstream says it used (X-Tokens-Used), giving back
// what was charged too much. The stub then limits tokens too, each call
// using a random 50–100% of its estimate:
//
//	go run ./examples/httphandler -limit 100 -tokens-limit 20000 -downstream-tokens-limit 20000
//	curl -i -H 'X-Tokens: 800' http://127.0.0.1:8080/
//
// With -class, repeated, the local limiter serves priority classes,
// highest first, each with an optional reserve (a count, or a share of
// the limit); a request names its class with X-Sluice-Class:
//
//	go run ./examples/httphandler -limit 100 -class critical=60% -class default -class batch
//	curl -i -H 'X-Sluice-Class: critical' http://127.0.0.1:8080/
//
// With -etcd-endpoints it joins a provider and enforces the share configd
// gives it; with -tokens-provider too, it joins a second provider whose
// limit counts tokens, and enforces both shares together
// (cluster.JoinGroup):
//
//	go run ./examples/httphandler -etcd-endpoints http://127.0.0.1:2379 -provider payments-api \
//	    -downstream http://payments.internal/charge
//	go run ./examples/httphandler -etcd-endpoints http://127.0.0.1:2379 -provider llm-api \
//	    -tokens-provider llm-api-tokens -downstream http://llm.internal/complete
//
// A joined provider's classes are those configd sets (configd set
// --class), and X-Sluice-Class names them the same way.
//
// It runs until SIGINT/SIGTERM (or -duration).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-go/sluice/examples/internal/join"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/internal/stub"
	"github.com/sluice-go/sluice/limiter"
)

type config struct {
	listen           string
	downstream       string
	downstreamLimit  int64
	downstreamTokens int64
	tokens           int64
	budget           time.Duration
	callTime         time.Duration
	transit          time.Duration
	duration         time.Duration
	join             join.Config
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "httphandler:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "httphandler:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	var endpoints, ntp string
	fs := flag.NewFlagSet("httphandler", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "address to serve / and /metrics on")
	fs.StringVar(&c.downstream, "downstream", "", "URL of the rate-limited API (POST); empty: an in-process stub allowing -downstream-limit per window")
	fs.Int64Var(&c.downstreamLimit, "downstream-limit", 100, "the in-process stub's limit per window")
	fs.DurationVar(&c.budget, "budget", 200*time.Millisecond, "latency budget of a request that does not send "+BudgetHeader)
	fs.DurationVar(&c.callTime, "call-time", 20*time.Millisecond, "part of the budget kept for the downstream call; the rest may be spent waiting for a permit")
	fs.DurationVar(&c.transit, "transit", 0, "the most a call takes to reach the provider, which counts it when it arrives: no permit is granted within it of a window boundary (the limiter's guard band), so none arrives in the next window; not with -ntp-servers, whose measurement sets the band")
	fs.DurationVar(&c.duration, "duration", 0, "stop after this long; 0: until signalled")
	fs.Int64Var(&c.join.Limit, "limit", 100, "the local limiter's quota per window (without -etcd-endpoints)")
	fs.Var(classFlag{&c.join.Classes}, "class", "a priority class of the local limiter, NAME or NAME=RESERVE (a count, or a share such as 60%); repeat it, highest first")
	fs.Int64Var(&c.join.TokensLimit, "tokens-limit", 0, "a second limit: tokens per window (-window), enforced with the requests limit; 0: none")
	fs.Int64Var(&c.tokens, "tokens", 100, "estimated tokens of a request that does not send "+TokensHeader+" (with -tokens-limit or -tokens-provider)")
	fs.Int64Var(&c.downstreamTokens, "downstream-tokens-limit", 0, "the in-process stub's tokens limit per window; 0: it does not limit tokens")
	fs.DurationVar(&c.join.Window, "window", time.Second, "the local limiter's window, and the fallback's")
	fs.StringVar(&endpoints, "etcd-endpoints", "", "comma-separated etcd URLs: join -provider and enforce the share configd publishes")
	fs.StringVar(&c.join.Username, "etcd-username", "", "etcd user (configd's embedded etcd: instance)")
	fs.StringVar(&c.join.PasswordFile, "etcd-password-file", "", "file holding the etcd user's password (configd's embedded etcd: DATA-DIR/credentials/instance)")
	fs.StringVar(&c.join.Provider, "provider", "httphandler-demo", "provider name (metrics label; with -etcd-endpoints, the provider whose every limit is joined: cluster.JoinProvider)")
	fs.StringVar(&c.join.TokensProvider, "tokens-provider", "", "with -etcd-endpoints: a second provider, whose limit counts tokens; both shares are enforced together (cluster.JoinGroup)")
	fs.StringVar(&c.join.ID, "instance-id", "", "instance id (default: chosen by cluster.Join)")
	fs.Int64Var(&c.join.Fallback, "fallback", 0, "quota per window before a share is known when etcd is unreachable (0: fail-closed)")
	fs.Int64Var(&c.join.TokensFallback, "tokens-fallback", 0, "with -tokens-provider: tokens per window before its share is known when etcd is unreachable (0: fail-closed)")
	fs.StringVar(&ntp, "ntp-servers", "", "comma-separated NTP servers (host or host:port) to measure the clock with (with -etcd-endpoints)")
	fs.DurationVar(&c.join.NTPInterval, "ntp-interval", 64*time.Second, "time between NTP measurements")
	fs.DurationVar(&c.join.ClockSkew, "clock-skew", 0, "inject a clock error: the limiter's clock is the system clock plus this (demos)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	c.join.Endpoints, c.join.NTPServers = join.List(endpoints), join.List(ntp)
	switch {
	case c.budget <= 0:
		return c, fmt.Errorf("-budget %v: must be > 0", c.budget)
	case c.callTime < 0 || c.callTime >= c.budget:
		return c, fmt.Errorf("-call-time %v: must be ≥ 0 and less than -budget", c.callTime)
	case c.downstreamLimit <= 0:
		return c, fmt.Errorf("-downstream-limit %d: must be > 0", c.downstreamLimit)
	case c.join.TokensLimit < 0 || c.downstreamTokens < 0 || c.tokens < 0 || c.join.TokensFallback < 0:
		return c, fmt.Errorf("-tokens-limit %d, -downstream-tokens-limit %d, -tokens %d, -tokens-fallback %d: must be ≥ 0", c.join.TokensLimit, c.downstreamTokens, c.tokens, c.join.TokensFallback)
	case c.join.TokensFallback > 0 && c.join.TokensProvider == "":
		return c, errors.New("-tokens-fallback is the fallback of -tokens-provider's share; without it, a local tokens limit is -tokens-limit")
	case c.join.TokensLimit > 0 && len(c.join.Endpoints) > 0:
		return c, errors.New("-tokens-limit is a local limit: with -etcd-endpoints, the tokens limit is a provider's, named with -tokens-provider")
	case c.join.TokensProvider != "" && len(c.join.Endpoints) == 0:
		return c, errors.New("-tokens-provider needs -etcd-endpoints (a local tokens limit is -tokens-limit)")
	case len(c.join.Classes) > 0 && (len(c.join.Endpoints) > 0 || c.join.TokensLimit > 0):
		return c, errors.New("-class is the local requests limiter's: a joined provider's classes are its config's (configd set --class), and -tokens-limit takes none here")
	case len(c.join.NTPServers) > 0 && len(c.join.Endpoints) == 0:
		return c, errors.New("-ntp-servers needs -etcd-endpoints")
	case c.transit < 0 || (c.transit > 0 && len(c.join.NTPServers) > 0):
		return c, fmt.Errorf("-transit %v: must be ≥ 0, and not given with -ntp-servers (the clock measurement sets the guard band)", c.transit)
	}
	return c, nil
}

// classFlag collects -class values as configd's --class reads them. A
// share of the limit is kept as hundredths of a percent of it
// (limiter.Class.Of), so that it follows the quota.
type classFlag struct{ cs *[]limiter.Class }

func (f classFlag) String() string {
	if f.cs == nil {
		return ""
	}
	var parts []string
	for _, c := range *f.cs {
		parts = append(parts, c.Name)
	}
	return strings.Join(parts, ",")
}

func (f classFlag) Set(s string) error {
	c, err := schema.ParseClass(s)
	if err != nil {
		return err
	}
	lc := limiter.Class{Name: c.Name, Reserve: c.Reserve.Count}
	if c.Reserve.Share != 0 {
		lc.Reserve, lc.Of = c.Reserve.Share, 10000
	}
	*f.cs = append(*f.cs, lc)
	if len(*f.cs) > limiter.MaxClasses {
		return fmt.Errorf("at most %d classes", limiter.MaxClasses)
	}
	return nil
}

// run serves until ctx ends or cfg.duration passes.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg.join.Logger = log
	if cfg.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.duration)
		defer cancel()
	}
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("-listen: %w", err)
	}
	defer ln.Close()

	down := cfg.downstream
	if down == "" {
		st := stub.New(cfg.downstreamLimit, cfg.join.Window)
		if cfg.downstreamTokens > 0 {
			st.Tokens(stub.New(cfg.downstreamTokens, cfg.join.Window), func(estimate int64) int64 {
				return estimate/2 + rand.Int64N(estimate/2+1) // 50–100% of the estimate
			})
		}
		sln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		ssrv := &http.Server{Handler: st, ReadHeaderTimeout: 5 * time.Second}
		go ssrv.Serve(sln)
		defer ssrv.Close()
		down = "http://" + sln.Addr().String() + "/"
		fmt.Fprintf(stdout, "downstream: in-process provider stub at %s, %d calls per %v", down, cfg.downstreamLimit, cfg.join.Window)
		if cfg.downstreamTokens > 0 {
			fmt.Fprintf(stdout, " and %d tokens", cfg.downstreamTokens)
		}
		fmt.Fprintln(stdout)
	}

	h := &handler{
		tokens: cfg.tokens, budget: cfg.budget, callTime: cfg.callTime,
		down: &httpDownstream{url: down, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}}},
	}
	reg, describe, closeLimits, err := h.openLimits(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeLimits()
	if cfg.transit > 0 {
		if h.multi != nil {
			h.multi.SetClockUncertainty(cfg.transit)
		} else {
			h.lim.SetClockUncertainty(cfg.transit)
		}
	}
	for _, c := range []struct {
		result string
		n      func() int64
	}{{"ok", h.ok.Load}, {"refused", h.refused.Load}, {"backoff", h.backedOff.Load}, {"failed", h.failed.Load}} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_example_http_requests_total", Help: "Requests served by the httphandler example, by result.",
			ConstLabels: prometheus.Labels{"result": c.result},
		}, func() float64 { return float64(c.n()) }))
	}

	mux := http.NewServeMux()
	mux.Handle("GET /{$}", h)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	fmt.Fprintln(stdout, describe)
	fmt.Fprintf(stdout, "listening on http://%s/ (budget %v unless %s says otherwise; metrics at /metrics)\n", ln.Addr(), cfg.budget, BudgetHeader)

	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	fmt.Fprintf(stdout, "served: ok %d, refused (503) %d, provider backoff %d, failed %d\n", h.ok.Load(), h.refused.Load(), h.backedOff.Load(), h.failed.Load())
	if h.multi != nil {
		st := h.multi.Stats()[1]
		fmt.Fprintf(stdout, "tokens: %d admitted (as used), %d given back by settling, %d used beyond a window's limit\n", st.Admitted, -st.Settled, st.Overdrawn)
	}
	return err
}

// openLimits sets h's limits, what cfg.join selects: one limit (local, or
// a share of a provider's), or a requests and a tokens limit (local with
// -tokens-limit, or with -tokens-provider a share of each of two
// providers'). It returns the registry of the limits' metrics, a start-up
// line saying where they come from, and how to close them.
func (h *handler) openLimits(ctx context.Context, cfg config) (reg *prometheus.Registry, describe string, closeFn func() error, err error) {
	j, err := join.Open(ctx, cfg.join)
	if err != nil {
		return nil, "", nil, err
	}
	h.lim, h.multi = j.Limiter, j.Multi
	return j.Registry, j.Describe(), j.Close, nil
}
