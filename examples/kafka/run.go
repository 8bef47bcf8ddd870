package main

import (
	"context"
	"errors"
	"fmt"
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
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/examples/internal/join"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/cluster"
	"github.com/sluice-go/sluice/limiter/metrics"
	"github.com/sluice-go/sluice/limiter/skew"
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

	lim, closeLim, info, err := newLimiter(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeLim()
	labels := prometheus.Labels{"provider": cfg.provider, "instance": cfg.instanceID}
	reg := prometheus.NewRegistry()
	if err := metrics.Register(reg, lim, labels); err != nil {
		return err
	}
	if info.member != nil {
		if err := reg.Register(cluster.NewCollector(info.member, labels)); err != nil {
			return err
		}
	}

	prov := &provider{limit: cfg.limit, window: cfg.window}
	var handled atomic.Int64
	all := make(chan struct{})
	demo := cfg.topic == ""
	c, err := consumer.New(consumer.Config{
		Brokers: brokers, Topic: topic, GroupID: group,
		Workers: cfg.workers, MaxInFlight: 4 * cfg.workers, Ordering: consumer.OrderKey,
		DrainTimeout: 5 * time.Second,
	}, lim, func(ctx context.Context, m kafka.Message) error {
		if err := prov.call(); err != nil {
			return err
		}
		if handled.Add(1) == int64(cfg.messages) && demo {
			close(all)
		}
		return nil
	}, consumer.WithLogger(log), consumer.WithRegisterer(reg))
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
	fmt.Fprintf(stdout, "consuming %s (group %s) as %s; %s\n", topic, group, cfg.instanceID, info.what)

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
	if n := prov.refused.Load(); n > 0 {
		fmt.Fprintln(stdout, refusalVerdict(n, cfg.limit, lim.Stats().Quota, len(cfg.etcdEndpoints) > 0))
	} else {
		fmt.Fprintln(stdout, "the provider stub never saw more than its limit in any window")
	}
	if demo && runErr == nil && handled.Load() < int64(cfg.messages) && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		fmt.Fprintf(stdout, "-duration %v reached before the backlog was done\n", cfg.duration)
	}
	return runErr
}

// limiterInfo says where the limiter's quota comes from.
type limiterInfo struct {
	member *cluster.Member // nil for a local limiter
	what   string
}

// newLimiter returns a local limiter of cfg.limit per window, or, with
// etcd endpoints, the limiter of a Member that joined cfg.provider.
func newLimiter(ctx context.Context, cfg config, log *slog.Logger) (*limiter.Limiter, func(), limiterInfo, error) {
	if len(cfg.etcdEndpoints) == 0 {
		lim, err := limiter.New(cfg.limit, cfg.window)
		if err != nil {
			return nil, nil, limiterInfo{}, err
		}
		return lim, func() { lim.Close() }, limiterInfo{what: fmt.Sprintf("local limiter: %d per %v", cfg.limit, cfg.window)}, nil
	}
	pw, err := join.Password(cfg.etcdPassFile)
	if err != nil {
		return nil, nil, limiterInfo{}, err
	}
	ecfg := clientv3.Config{Endpoints: cfg.etcdEndpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: cluster.DialOptions(), Username: cfg.etcdUser, Password: pw}
	if cfg.etcdCA != "" || cfg.etcdCert != "" {
		info := transport.TLSInfo{CertFile: cfg.etcdCert, KeyFile: cfg.etcdKey, TrustedCAFile: cfg.etcdCA}
		tlsCfg, err := info.ClientConfig()
		if err != nil {
			return nil, nil, limiterInfo{}, fmt.Errorf("etcd TLS: %w", err)
		}
		ecfg.TLS = tlsCfg
	}
	cli, err := clientv3.New(ecfg)
	if err != nil {
		return nil, nil, limiterInfo{}, fmt.Errorf("etcd: %w", err)
	}
	opts := []cluster.Option{
		cluster.WithID(cfg.instanceID),
		cluster.WithLogger(log),
		cluster.WithFallback(cfg.fallback, cfg.window),
	}
	if cfg.etcdPrefix != "" {
		opts = append(opts, cluster.WithPrefix(cfg.etcdPrefix))
	}
	if len(cfg.ntpServers) > 0 {
		mon, err := skew.New(skew.WithServers(cfg.ntpServers...), skew.WithLogger(log))
		if err != nil {
			cli.Close()
			return nil, nil, limiterInfo{}, err
		}
		opts = append(opts, cluster.WithClockMonitor(mon))
	}
	m, err := cluster.Join(ctx, cli, cfg.provider, opts...)
	if err != nil {
		cli.Close()
		return nil, nil, limiterInfo{}, err
	}
	closeFn := func() {
		if err := m.Close(); err != nil {
			log.Warn("leaving the provider", "error", err)
		}
		cli.Close()
	}
	st := m.Status()
	what := fmt.Sprintf("joined provider %s through etcd (share %d of %d, source %s", cfg.provider, st.Share, st.Total, st.Source)
	if q := m.Limiter().Stats().Quota; q != st.Share {
		// A share grows only from a window boundary at least the change
		// margin ahead (so that no window gets it twice): say so, or the
		// first lines' "quota 0" contradicts this one.
		what += fmt.Sprintf("; it takes effect at a window boundary ahead, the quota is %d until then", q)
	}
	return m.Limiter(), closeFn, limiterInfo{member: m, what: what + ")"}, nil
}

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
// calls per wall-clock-aligned window and answers the rest with "429, retry
// at the next window". Each process has its own stub, so with several
// instances it checks only this instance's calls.
type provider struct {
	limit   int64
	window  time.Duration
	mu      sync.Mutex
	win     int64
	used    int64
	refused atomic.Int64
	busiest atomic.Int64 // most calls accepted in one window
}

func (p *provider) call() error {
	now := time.Now().UnixNano()
	w := now / int64(p.window)
	p.mu.Lock()
	defer p.mu.Unlock()
	if w != p.win {
		p.win, p.used = w, 0
	}
	if p.used >= p.limit {
		p.refused.Add(1)
		return consumer.RetryAfter(time.Duration((w+1)*int64(p.window)-now), errors.New("provider: 429 too many requests"))
	}
	p.used++
	if p.used > p.busiest.Load() {
		p.busiest.Store(p.used)
	}
	return nil
}

// refusalVerdict says why the provider stub refused calls. This instance's
// stub allows stubLimit per window (-limit); with etcd, what the limiter
// lets through is the share configd gives it of the provider's limit,
// which an operator may set above the stub's (a retune above what the
// provider allows): the refusals are then the stub's configuration, not a
// limiter letting more through than it was told.
func refusalVerdict(refused, stubLimit, quota int64, cluster bool) string {
	if cluster && quota > stubLimit {
		return fmt.Sprintf("the provider stub refused %d calls: its own limit (-limit %d per window) is below the quota configd gave this instance (%d): "+
			"the provider's limit in configd is above what the stub allows, so the stub refuses what sluice was told to let through", refused, stubLimit, quota)
	}
	return fmt.Sprintf("the provider stub refused %d calls: the limiter let more through than the stub's limit of %d per window", refused, stubLimit)
}
