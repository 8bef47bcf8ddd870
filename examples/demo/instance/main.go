// Command instance is one instance of the demo (examples/demo): it joins
// the demo's provider through etcd and calls the provider stub (HTTP POST)
// once per permit, with load the demo sets at run time. It is built and
// started by the demo; running it by hand is possible but not its purpose.
//
//	instance -mode load  -etcd-endpoints URL -provider NAME -id ID -stub URL
//	instance -mode kafka -etcd-endpoints URL -provider NAME -id ID -stub URL
//
// Mode load offers requests with a paced open-loop generator
// (examples/loadgen): each takes a permit with Acquire(ctx, -max-wait), and
// is refused if none comes within it. Mode kafka is a Kafka consumer
// (package consumer) on an in-process broker (kfake): the offered load is
// produced to a topic and consumed through the limiter, and nothing is ever
// refused — what the share does not allow yet stays in the topic as lag.
//
// Commands on stdin, one per line: "rate N" sets the offered requests per
// second. Closing stdin, SIGINT or SIGTERM leave gracefully (the lease is
// revoked). On stdout it prints one line once it runs:
//
//	ready id=ID metrics=http://ADDR/metrics
//
// and serves Prometheus metrics there: the limiter's, the member's, and
// sluice_example_offered_total, sluice_example_refused_total and
// sluice_example_lag_messages.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/examples/internal/join"
	"github.com/sluice-go/sluice/examples/loadgen"
)

type flags struct {
	mode, stub string
	maxWait    time.Duration
	join       join.Config
}

func main() {
	var f flags
	var endpoints, ntp string
	flag.StringVar(&f.mode, "mode", "load", "load (paced requests, refused beyond -max-wait) or kafka (a consumer on an in-process broker)")
	flag.StringVar(&f.stub, "stub", "", "URL of the provider stub (POST per permit)")
	flag.DurationVar(&f.maxWait, "max-wait", 50*time.Millisecond, "Acquire's maxWait in mode load")
	flag.StringVar(&endpoints, "etcd-endpoints", "", "comma-separated etcd URLs")
	flag.StringVar(&f.join.Provider, "provider", "demo-api", "provider to join")
	flag.StringVar(&f.join.ID, "id", "", "instance id")
	flag.DurationVar(&f.join.Window, "window", time.Second, "the provider's window (for the fallback)")
	flag.DurationVar(&f.join.LeaseTTL, "lease-ttl", 0, "etcd lease TTL (0: cluster's default)")
	flag.StringVar(&ntp, "ntp-servers", "", "NTP servers (host:port) for a clock monitor")
	flag.DurationVar(&f.join.NTPInterval, "ntp-interval", 2*time.Second, "clock monitor interval")
	flag.DurationVar(&f.join.ClockSkew, "clock-skew", 0, "inject a clock error: the limiter's clock is the system clock plus this")
	flag.Parse()
	f.join.Endpoints = join.List(endpoints)
	f.join.NTPServers = join.List(ntp)
	if f.stub == "" || len(f.join.Endpoints) == 0 || (f.mode != "load" && f.mode != "kafka") {
		fmt.Fprintln(os.Stderr, "instance: -stub and -etcd-endpoints are required; -mode is load or kafka")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, f); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "instance:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, f flags) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("instance", f.join.ID)
	f.join.Logger = log
	j, err := join.Open(ctx, f.join)
	if err != nil {
		return err
	}
	defer j.Close()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512, IdleConnTimeout: time.Minute}, Timeout: 5 * time.Second}
	call := func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.stub, nil)
		if err != nil {
			return err
		}
		req.Header.Set("X-Instance", f.join.ID)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("provider: %s", resp.Status)
		}
		return nil
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // runs before wg.Wait: stop the loops, then wait for them

	reg := j.Registry
	var gen *loadgen.Generator
	var lag atomic.Int64
	switch f.mode {
	case "load":
		gen = loadgen.New(j.Limiter, call, loadgen.WithMaxWait(f.maxWait))
		wg.Go(func() { gen.Run(ctx) })
	case "kafka":
		var errc <-chan error
		gen, errc, err = startKafka(ctx, &wg, j, call, &lag, log)
		if err != nil {
			return err
		}
		go func() {
			if err := <-errc; err != nil && ctx.Err() == nil {
				log.Error("consumer stopped", "error", err)
				cancel()
			}
		}()
	}
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_example_offered_total", Help: "Requests (or messages) offered."},
			func() float64 { return float64(gen.Stats().Offered) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_example_refused_total", Help: "Requests refused: no permit within maxWait."},
			func() float64 { return float64(gen.Stats().Refused) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_example_lag_messages", Help: "Kafka messages produced and not yet handled."},
			func() float64 { return float64(lag.Load()) }),
	)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	fmt.Printf("ready id=%s metrics=http://%s/metrics\n", j.Member.ID(), ln.Addr())

	// Commands from the demo; EOF (the demo went away) ends the instance.
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case l, ok := <-lines:
			if !ok {
				return nil
			}
			fs := strings.Fields(l)
			if len(fs) == 2 && fs[0] == "rate" {
				if n, err := strconv.Atoi(fs[1]); err == nil && n >= 0 {
					gen.SetRate(n)
					continue
				}
			}
			log.Warn("unknown command", "line", l)
		}
	}
}

// startKafka starts an in-process broker, a paced producer (the offered
// load: gen's rate in messages per second) and a consumer that calls the
// provider once per message through the member's limiter. lag counts
// messages produced and not yet handled. The goroutines end when ctx does
// (wg waits for them).
func startKafka(ctx context.Context, wg *sync.WaitGroup, j *join.Joined, call func(context.Context) error, lag *atomic.Int64, log *slog.Logger) (*loadgen.Generator, <-chan error, error) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, nil, fmt.Errorf("in-process broker: %w", err)
	}
	brokers := kc.ListenAddrs()
	const topic = "demo-events"
	tr := &kafka.Transport{}
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: tr}
	if _, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 4, ReplicationFactor: 1}},
	}); err != nil {
		kc.Close()
		return nil, nil, fmt.Errorf("creating %s: %w", topic, err)
	}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: tr, Balancer: &kafka.Hash{},
		Async: true, BatchTimeout: 5 * time.Millisecond}
	var seq atomic.Int64
	// The producer is the offered load: no limiter (nil), one message per
	// request, never refused.
	gen := loadgen.New(nil, func(ctx context.Context) error {
		n := seq.Add(1)
		lag.Add(1)
		return w.WriteMessages(ctx, kafka.Message{Key: fmt.Appendf(nil, "k%d", n%1024), Value: fmt.Appendf(nil, "event-%d", n)})
	})
	c, err := consumer.New(consumer.Config{
		Brokers: brokers, Topic: topic, GroupID: "demo", Workers: 128, MaxInFlight: 512,
		DrainTimeout: 2 * time.Second, Ordering: consumer.OrderKey,
	}, j.Limiter, func(ctx context.Context, m kafka.Message) error {
		if err := call(ctx); err != nil {
			// Not an attempt lost: try again after a second (and pause
			// the limiter as long), never drop the message.
			return consumer.RetryAfter(time.Second, err)
		}
		lag.Add(-1)
		return nil
	}, consumer.WithLogger(log), consumer.WithRegisterer(j.Registry))
	if err != nil {
		w.Close()
		kc.Close()
		return nil, nil, err
	}
	errc := make(chan error, 1)
	wg.Go(func() {
		var inner sync.WaitGroup
		inner.Go(func() { gen.Run(ctx) })
		errc <- c.Run(ctx) // stops fetching and drains before the broker closes
		inner.Wait()
		w.Close()
		tr.CloseIdleConnections()
		kc.Close()
	})
	return gen, errc, nil
}
