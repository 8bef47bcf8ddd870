// Command kafka is the Kafka consumer demo: it produces a backlog, consumes
// it through a sluice limiter into a provider stub that has a rate limit,
// and prints progress and the achieved rate against the limit.
//
// With no -brokers it starts an in-process Kafka-protocol broker (kfake), so
// it needs nothing else:
//
//	go run ./examples/kafka
//	go run ./examples/kafka -messages 20000 -limit 5000 -window 100ms
//	go run ./examples/kafka -brokers localhost:9092
//
// It ends on its own once the backlog is handled, or after -duration. The
// first Ctrl-C stops it gracefully (in-flight messages finish and are
// committed), a second one abandons them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/limiter"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kafka demo:", err)
		os.Exit(1)
	}
}

type flags struct {
	messages   int
	limit      int64
	window     time.Duration
	duration   time.Duration
	brokers    string
	partitions int
	workers    int
	verbose    bool
}

func parseFlags(args []string, stderr io.Writer) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("kafka", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&f.messages, "messages", 3000, "messages in the backlog")
	fs.Int64Var(&f.limit, "limit", 1000, "provider limit: calls per window")
	fs.DurationVar(&f.window, "window", time.Second, "limit window (10ms..1h, divides 24h)")
	fs.DurationVar(&f.duration, "duration", 30*time.Second, "stop after this long even if the backlog is not done")
	fs.StringVar(&f.brokers, "brokers", "", "comma-separated Kafka brokers; empty starts an in-process broker")
	fs.IntVar(&f.partitions, "partitions", 4, "partitions of the demo topic")
	fs.IntVar(&f.workers, "workers", 8, "consumer workers")
	fs.BoolVar(&f.verbose, "v", false, "log the consumer's debug messages")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	switch {
	case f.messages <= 0:
		return f, fmt.Errorf("-messages %d: must be > 0", f.messages)
	case f.limit <= 0:
		return f, fmt.Errorf("-limit %d: must be > 0", f.limit)
	case f.duration <= 0:
		return f, fmt.Errorf("-duration %v: must be > 0", f.duration)
	case f.partitions <= 0:
		return f, fmt.Errorf("-partitions %d: must be > 0", f.partitions)
	case f.workers <= 0:
		return f, fmt.Errorf("-workers %d: must be > 0", f.workers)
	}
	return f, nil
}

func run(args []string, stdout, stderr io.Writer) error {
	f, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	level := slog.LevelWarn
	if f.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	// First signal: graceful stop; second: abort the drain.
	ctx, cancel := context.WithTimeout(context.Background(), f.duration)
	defer cancel()
	abort := make(chan struct{})
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt)
	defer signal.Stop(sigs)
	var sigWG sync.WaitGroup
	sigDone := make(chan struct{})
	defer func() { close(sigDone); sigWG.Wait() }()
	sigWG.Go(func() {
		select {
		case <-sigs:
			fmt.Fprintln(stdout, "stopping: finishing in-flight messages (Ctrl-C again to abandon them)")
			cancel()
		case <-sigDone:
			return
		}
		select {
		case <-sigs:
			close(abort)
		case <-sigDone:
		}
	})

	brokers := strings.Split(f.brokers, ",")
	if f.brokers == "" {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return fmt.Errorf("starting the in-process broker: %w", err)
		}
		defer cluster.Close()
		brokers = cluster.ListenAddrs()
		fmt.Fprintf(stdout, "in-process Kafka broker at %s\n", brokers[0])
	}
	stamp := time.Now().UnixNano()
	topic, group := fmt.Sprintf("sluice-demo-%d", stamp), fmt.Sprintf("sluice-demo-%d", stamp)

	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	if err := backlog(ctx, brokers, transport, topic, f.partitions, f.messages); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "produced %d messages to %s (%d partitions)\n", f.messages, topic, f.partitions)

	lim, err := limiter.New(f.limit, f.window)
	if err != nil {
		return err
	}
	defer lim.Close()
	prov := &provider{limit: f.limit, window: f.window}

	var handled atomic.Int64
	all := make(chan struct{})
	c, err := consumer.New(consumer.Config{
		Brokers: brokers, Topic: topic, GroupID: group,
		Workers: f.workers, MaxInFlight: 4 * f.workers, Ordering: consumer.OrderKey,
		DrainTimeout: 5 * time.Second,
	}, lim, func(ctx context.Context, m kafka.Message) error {
		if err := prov.call(); err != nil {
			return err
		}
		if handled.Add(1) == int64(f.messages) {
			close(all)
		}
		return nil
	}, consumer.WithLogger(log))
	if err != nil {
		return err
	}

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	errc := make(chan error, 1)
	// Windows are aligned to the wall clock, so the first one may be
	// partial: rates are measured from its start.
	start := time.Now().Truncate(f.window)
	go func() { errc <- c.RunWithAbort(runCtx, abort) }()
	fmt.Fprintf(stdout, "consuming at most %d calls per %v (%.0f/s)\n", f.limit, f.window, rate(f.limit, f.window))

	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	report := func(prefix string, at time.Time) {
		el := at.Sub(start)
		n := handled.Load()
		st := c.Stats()
		// Over the windows begun so far: a window's permits come at its
		// start unless the limiter paces them.
		windows := math.Ceil(el.Seconds() / f.window.Seconds())
		fmt.Fprintf(stdout, "%s %6.1fs  handled %d/%d  %.0f/s over %.0f window(s) (limit %.0f/s)  busiest window %d (limit %d)  throttled %d  provider refusals %d  in flight %d\n",
			prefix, el.Seconds(), n, f.messages, float64(n)/(windows*f.window.Seconds()), windows, rate(f.limit, f.window),
			prov.busiest.Load(), f.limit, st.Throttled, prov.refused.Load(), st.InFlight)
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
			break loop
		}
	}
	runErr := <-errc
	if end.IsZero() {
		end = time.Now()
	}
	report("done", end)
	if prov.refused.Load() > 0 {
		fmt.Fprintf(stdout, "the provider refused %d calls: the limiter let more through than the provider's limit\n", prov.refused.Load())
	} else {
		fmt.Fprintln(stdout, "the provider never saw more than its limit in any window")
	}
	if runErr == nil && handled.Load() < int64(f.messages) && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		fmt.Fprintf(stdout, "-duration %v reached before the backlog was done\n", f.duration)
	}
	return runErr
}

func rate(limit int64, window time.Duration) float64 {
	return float64(limit) / window.Seconds()
}

// backlog creates topic and produces n small messages to it.
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
// at the next window".
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
