package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/examples/internal/join"
	"github.com/sluice-go/sluice/limiter"
)

// run consumes until the demo backlog is handled, cfg.duration passes, or
// ctx is cancelled (then in-flight messages finish and are committed).
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	level := slog.LevelWarn
	if cfg.topic != "" {
		level = slog.LevelInfo
	}
	if cfg.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	signalled := ctx
	if cfg.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.duration)
		defer cancel()
	}

	brokers := cfg.brokers
	if len(brokers) == 0 {
		kc, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return fmt.Errorf("starting the in-process broker: %w", err)
		}
		defer kc.Close()
		brokers = kc.ListenAddrs()
		fmt.Fprintf(stdout, "in-process Kafka broker at %s\n", brokers[0])
	}
	topic, group := cfg.topic, cfg.group
	if topic == "" {
		topic = fmt.Sprintf("sluice-demo-%d", time.Now().UnixNano())
		if group == "" {
			group = topic
		}
	}

	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	if cfg.messages > 0 {
		if err := backlog(ctx, brokers, transport, topic, cfg.partitions, cfg.messages); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "produced %d messages to %s\n", cfg.messages, topic)
	}

	j, err := openLimits(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer func() {
		if err := j.Close(); err != nil {
			log.Warn("leaving the provider", "error", err)
		}
	}()
	lim, reg := j.Limiter, j.Registry

	prov := &provider{limit: cfg.limit, tokensLimit: cfg.tokensLimit, window: cfg.window}
	var handled atomic.Int64
	all := make(chan struct{})
	demo := cfg.topic == ""
	var climit consumer.Limiter = lim
	opts := []consumer.Option{consumer.WithLogger(log), consumer.WithRegisterer(reg)}
	if j.Multi != nil {
		climit = j.Multi
	}
	if j.Tokens >= 0 {
		opts = append(opts, consumer.WithCost(func(m kafka.Message) []limiter.Amount {
			return []limiter.Amount{limiter.Cost("tokens", tokensOf(m))}
		}))
	}
	c, err := consumer.New(consumer.Config{
		Brokers: brokers, Topic: topic, GroupID: group,
		Workers: cfg.workers, MaxInFlight: 4 * cfg.workers, Ordering: consumer.OrderKey,
		DrainTimeout: 5 * time.Second,
	}, climit, func(ctx context.Context, m kafka.Message) error {
		var estimate int64
		if j.Tokens >= 0 {
			estimate = tokensOf(m)
		}
		used, err := prov.call(estimate, m.Value)
		if j.Tokens >= 0 {
			// What the call used goes back to the tokens limit: a refused
			// call used none.
			if err := consumer.Settle(ctx, limiter.Cost("tokens", used)); err != nil {
				return err
			}
		}
		if err != nil {
			return err
		}
		if handled.Add(1) == int64(cfg.messages) && demo {
			close(all)
		}
		return nil
	}, opts...)
	if err != nil {
		return err
	}

	if cfg.metricsListen != "" {
		stopMetrics, err := serveMetrics(cfg.metricsListen, reg, log)
		if err != nil {
			return err
		}
		defer stopMetrics()
		fmt.Fprintf(stdout, "metrics at http://%s/metrics\n", cfg.metricsListen)
	}

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	errc := make(chan error, 1)
	// Windows are aligned to the wall clock, so the first one may be
	// partial: rates are measured from its start.
	start := time.Now().Truncate(cfg.window)
	go func() { errc <- c.Run(runCtx) }()
	fmt.Fprintf(stdout, "consuming %s (group %s) as %s; %s\n", topic, group, cfg.instanceID, j.Describe())

	every := 500 * time.Millisecond
	if !demo {
		every = 10 * time.Second
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	report := func(prefix string, at time.Time) {
		el := at.Sub(start)
		n := handled.Load()
		st := c.Stats()
		// Over the windows begun so far: a window's permits come at its
		// start unless the limiter paces them.
		windows := math.Ceil(el.Seconds() / cfg.window.Seconds())
		of := ""
		if demo {
			of = fmt.Sprintf("/%d", cfg.messages)
		}
		fmt.Fprintf(stdout, "%s %6.1fs  handled %d%s  %.0f/s over %.0f window(s)  quota %d per %v  busiest window %d (stub limit %d)  throttled %d  provider refusals %d  in flight %d\n",
			prefix, el.Seconds(), n, of, float64(n)/(windows*cfg.window.Seconds()), windows, lim.Stats().Quota, cfg.window,
			prov.busiest.Load(), cfg.limit, st.Throttled, prov.refused.Load(), st.InFlight)
		if j.Tokens >= 0 {
			ts := j.Multi.Stats()[j.Tokens]
			fmt.Fprintf(stdout, "%s tokens: quota %d per %v  busiest window %d (stub limit %s)  %d given back by settling  provider refusals %d\n",
				prefix, ts.Quota, ts.Window, prov.busiestTokens.Load(), stubLimit(cfg.tokensLimit), -ts.Settled, prov.refusedTokens.Load())
		}
	}
	end := time.Time{}
loop:
	for {
		select {
		case <-tick.C:
			report("  ", time.Now())
		case <-all:
			end = time.Now()
			stopRun()
			break loop
		case <-runCtx.Done():
			if signalled.Err() != nil {
				fmt.Fprintln(stdout, "stopping: finishing in-flight messages (signal again to abandon them)")
			}
			break loop
		}
	}
	runErr := <-errc
	if end.IsZero() {
		end = time.Now()
	}
	report("done", end)
	refused := false
	if n := prov.refused.Load(); n > 0 {
		refused = true
		fmt.Fprintln(stdout, refusalVerdict(n, "calls", "-limit", cfg.limit, lim.Stats().Quota, len(cfg.etcdEndpoints) > 0))
	}
	if n := prov.refusedTokens.Load(); n > 0 && j.Tokens >= 0 {
		refused = true
		fmt.Fprintln(stdout, refusalVerdict(n, "tokens", "-tokens-limit", cfg.tokensLimit, j.Multi.Stats()[j.Tokens].Quota, len(cfg.etcdEndpoints) > 0))
	}
	if !refused {
		fmt.Fprintln(stdout, "the provider stub never saw more than its limit in any window")
	}
	if demo && runErr == nil && handled.Load() < int64(cfg.messages) && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		fmt.Fprintf(stdout, "-duration %v reached before the backlog was done\n", cfg.duration)
	}
	return runErr
}

// openLimits returns the limits cfg selects (package join): a local
// limiter of cfg.limit per window, or with etcd the share of cfg.provider;
// with tokens, a Multi of requests and tokens, local or a share of each
// of two providers.
func openLimits(ctx context.Context, cfg config, log *slog.Logger) (*join.Joined, error) {
	jc := join.Config{
		Endpoints: cfg.etcdEndpoints, Username: cfg.etcdUser, PasswordFile: cfg.etcdPassFile,
		CAFile: cfg.etcdCA, CertFile: cfg.etcdCert, KeyFile: cfg.etcdKey, Prefix: cfg.etcdPrefix,
		Provider: cfg.provider, TokensProvider: cfg.tokensProvider, ID: cfg.instanceID,
		Limit: cfg.limit, Window: cfg.window, Fallback: cfg.fallback, TokensFallback: cfg.tokensFallback,
		NTPServers: cfg.ntpServers, Logger: log,
	}
	if len(cfg.etcdEndpoints) == 0 {
		jc.TokensLimit = cfg.tokensLimit
	}
	return join.Open(ctx, jc)
}

// tokensOf is a message's estimated tokens: what it takes from the tokens
// limit before the call, settled to what the call used after it.
func tokensOf(m kafka.Message) int64 { return 20 + 10*int64(len(m.Value)) }

// serveMetrics serves reg on addr until the returned function is called.
func serveMetrics(addr string, reg *prometheus.Registry, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-metrics-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "error", err)
		}
	})
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		wg.Wait()
	}, nil
}

// backlog creates topic (if missing) and produces n small messages to it.
func backlog(ctx context.Context, brokers []string, transport *kafka.Transport, topic string, partitions, n int) error {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: transport}
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}},
	})
	if err != nil {
		return fmt.Errorf("creating topic %s: %w", topic, err)
	}
	if err := res.Errors[topic]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return fmt.Errorf("creating topic %s: %w", topic, err)
	}
	w := &kafka.Writer{
		Addr: kafka.TCP(brokers...), Topic: topic, Transport: transport,
		Balancer: &kafka.Hash{}, BatchSize: 1000, BatchTimeout: time.Millisecond,
	}
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: fmt.Appendf(nil, "customer-%d", i%97), Value: fmt.Appendf(nil, "event-%d", i)}
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		_ = w.Close()
		return fmt.Errorf("producing the backlog: %w", err)
	}
	return w.Close()
}

// provider stands in for the rate-limited API: it accepts at most limit
// calls, and with tokensLimit at most that many tokens used, per
// wall-clock-aligned window, and answers the rest with "429, retry at the
// next window". Each process has its own stub, so with several instances
// it checks only this instance's calls.
type provider struct {
	limit, tokensLimit int64
	window             time.Duration
	mu                 sync.Mutex
	win                int64
	used, tokens       int64
	refused            atomic.Int64 // over the calls limit
	refusedTokens      atomic.Int64 // over the tokens limit
	busiest            atomic.Int64 // most calls accepted in one window
	busiestTokens      atomic.Int64 // most tokens used in one window
}

// call is one call estimated at estimate tokens (0: tokens not counted),
// asking value: it uses 50-100% of the estimate, as a model API's answer
// uses fewer tokens than its request's maximum, and says how many.
func (p *provider) call(estimate int64, value []byte) (used int64, err error) {
	if estimate > 0 {
		h := fnv.New32a()
		h.Write(value)
		used = max(1, estimate*int64(50+h.Sum32()%51)/100)
	}
	now := time.Now().UnixNano()
	w := now / int64(p.window)
	p.mu.Lock()
	defer p.mu.Unlock()
	if w != p.win {
		p.win, p.used, p.tokens = w, 0, 0
	}
	retry := time.Duration((w+1)*int64(p.window) - now)
	switch {
	case p.used >= p.limit:
		p.refused.Add(1)
		return 0, consumer.RetryAfter(retry, errors.New("provider: 429 too many requests"))
	case p.tokensLimit > 0 && p.tokens+used > p.tokensLimit:
		p.refusedTokens.Add(1)
		return 0, consumer.RetryAfter(retry, errors.New("provider: 429 too many tokens"))
	}
	p.used++
	p.tokens += used
	p.busiest.Store(max(p.busiest.Load(), p.used))
	p.busiestTokens.Store(max(p.busiestTokens.Load(), p.tokens))
	return used, nil
}

// refusalVerdict says why the provider stub refused calls over its limit
// of what (calls or tokens). This instance's stub allows stubLimit per
// window (flag); with etcd, what the limiter lets through is the share
// configd gives it of the provider's limit, which an operator may set
// above the stub's (a retune above what the provider allows): the
// refusals are then the stub's configuration, not a limiter letting more
// through than it was told.
func refusalVerdict(refused int64, what, flag string, stubLimit, quota int64, cluster bool) string {
	if cluster && quota > stubLimit {
		return fmt.Sprintf("the provider stub refused %d calls: its own limit (%s %d %s per window) is below the quota configd gave this instance (%d): "+
			"the provider's limit in configd is above what the stub allows, so the stub refuses what sluice was told to let through", refused, flag, stubLimit, what, quota)
	}
	return fmt.Sprintf("the provider stub refused %d calls: the limiter let more through than the stub's limit of %d %s per window", refused, stubLimit, what)
}

// stubLimit says the stub's tokens limit: "none" for 0.
func stubLimit(n int64) string {
	if n == 0 {
		return "none"
	}
	return fmt.Sprint(n)
}
