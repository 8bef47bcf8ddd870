// Command consumer measures the Kafka consumer's figures for BENCHMARKS.md:
//
//  1. throughput vs limit: a handler that does no work, a backlog of about
//     -seconds at each limit, on an in-process kfake broker; the achieved
//     handler call rate per full window against the limit, and the rate
//     with no limiter at all (the ceiling of consumer + kfake here), so that
//     one can tell whether the limiter or the rest is the bottleneck;
//
//  2. the memory bound: a large backlog consumed with MaxInFlight fixed,
//     the heap in use sampled every 100 ms. The broker runs in a child
//     process (this program, re-executed), so that the heap measured is the
//     consumer's alone and not the broker's copy of the backlog.
//
//     go run ./bench/consumer
//     go run ./bench/consumer -limits 100,10000 -seconds 3 -mem-messages 200000
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/limiter"
)

// brokerEnv, when set to "topic|partitions|messages", makes this program a
// broker process: it starts kfake, produces the backlog, prints
// "ready <addr>" and serves until its stdin is closed.
const brokerEnv = "SLUICE_BENCH_BROKER"

func main() {
	if spec := os.Getenv(brokerEnv); spec != "" {
		if err := broker(spec); err != nil {
			fmt.Fprintln(os.Stderr, "broker:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench/consumer:", err)
		os.Exit(1)
	}
}

type flags struct {
	limits      []int64
	seconds     float64
	partitions  int
	workers     int
	maxInFlight int
	memMessages []int
	memInFlight []int
	pacing      bool
	skipRate    bool
	skipMem     bool
}

func parseFlags(args []string) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("consumer", flag.ContinueOnError)
	limits := fs.String("limits", "100,10000,100000", "limits to measure, in calls per second (window 1s)")
	fs.Float64Var(&f.seconds, "seconds", 5, "backlog at each limit, in seconds of calls at that limit")
	fs.IntVar(&f.partitions, "partitions", 8, "partitions of each topic")
	fs.IntVar(&f.workers, "workers", 8, "consumer workers")
	fs.IntVar(&f.maxInFlight, "max-in-flight", 1000, "consumer MaxInFlight for the throughput runs")
	mem := fs.String("mem-messages", "100000,1000000", "backlogs for the memory runs (comma-separated)")
	memIF := fs.String("mem-in-flight", "1000,20000", "MaxInFlight values for the memory runs: the first with every backlog, the others with the largest")
	fs.BoolVar(&f.pacing, "pacing", false, "pace the limiter (spread each window's permits across it)")
	fs.BoolVar(&f.skipRate, "skip-rate", false, "skip the throughput runs")
	fs.BoolVar(&f.skipMem, "skip-mem", false, "skip the memory runs")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	for _, s := range strings.Split(*limits, ",") {
		v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil || v <= 0 || v > limiter.MaxQuota {
			return f, fmt.Errorf("-limits: %q is not a limit in 1..%d", s, int64(limiter.MaxQuota))
		}
		f.limits = append(f.limits, v)
	}
	for _, s := range strings.Split(*mem, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || v <= 0 {
			return f, fmt.Errorf("-mem-messages: %q is not a positive count", s)
		}
		f.memMessages = append(f.memMessages, v)
	}
	for _, s := range strings.Split(*memIF, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || v < f.workers {
			return f, fmt.Errorf("-mem-in-flight: %q is not a count ≥ -workers", s)
		}
		f.memInFlight = append(f.memInFlight, v)
	}
	switch {
	case f.seconds <= 0 || f.seconds > 60:
		return f, fmt.Errorf("-seconds %v: must be in (0, 60]", f.seconds)
	case f.partitions <= 0 || f.workers <= 0 || f.maxInFlight < f.workers:
		return f, errors.New("-partitions and -workers must be > 0, and each max-in-flight ≥ -workers")
	}
	return f, nil
}

func run(args []string, out io.Writer) error {
	f, err := parseFlags(args)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "sluice consumer bench: %s/%s, %d CPU(s), GOMAXPROCS %d, %s\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	// The memory runs go first, so that nothing left by the throughput
	// runs' in-process broker weighs on the heap they measure; their table
	// is printed second.
	var mem strings.Builder
	if !f.skipMem {
		if err := memory(f, &mem); err != nil {
			return err
		}
	}
	if !f.skipRate {
		if err := rates(f, out); err != nil {
			return err
		}
	}
	_, err = io.WriteString(out, mem.String())
	return err
}

// noLimit is a consumer.Limiter that grants every permit at once: the
// ceiling run.
type noLimit struct{}

func (noLimit) AcquireN(context.Context, int64, time.Duration) error { return nil }
func (noLimit) Backoff(time.Duration)                                {}

// rates runs the throughput part on one in-process broker.
func rates(f flags, out io.Writer) error {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return fmt.Errorf("starting kfake: %w", err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()

	fmt.Fprintf(out, "\n(a) handler call rate vs limit: no-op handler, in-process kfake, %d partitions, %d workers, MaxInFlight %d, window 1s, pacing %v, backlog %.0fs at each limit\n",
		f.partitions, f.workers, f.maxInFlight, f.pacing, f.seconds)
	biggest := slices.Max(f.limits)
	ceilN := int(float64(biggest) * f.seconds)
	topic := fmt.Sprintf("ceiling-%d", time.Now().UnixNano())
	if err := backlog(brokers, transport, topic, f.partitions, ceilN); err != nil {
		return err
	}
	res, err := consume(brokers, topic, ceilN, f.workers, f.maxInFlight, noLimit{}, 0)
	if err != nil {
		return err
	}
	ceiling := float64(ceilN) / res.span.Seconds()
	fmt.Fprintf(out, "  no limiter:   %8d messages in %6.2fs = %9.0f calls/s  (ceiling of consumer + kfake on this machine)\n",
		ceilN, res.span.Seconds(), ceiling)

	fmt.Fprintf(out, "  %9s %9s %7s %11s %11s %11s %9s  %s\n", "limit/s", "backlog", "windows", "mean/window", "min/window", "max/window", "of limit", "bottleneck")
	for _, lim := range f.limits {
		n := int(float64(lim) * f.seconds)
		topic := fmt.Sprintf("limit-%d-%d", lim, time.Now().UnixNano())
		if err := backlog(brokers, transport, topic, f.partitions, n); err != nil {
			return err
		}
		l, err := limiter.New(lim, time.Second, limiter.WithPacing(f.pacing))
		if err != nil {
			return err
		}
		res, err := consume(brokers, topic, n, f.workers, f.maxInFlight, l, time.Second)
		l.Close()
		if err != nil {
			return err
		}
		// Full windows only: the first is cut by the start, the last by the
		// end of the backlog.
		full := res.perWindow
		if len(full) > 2 {
			full = full[1 : len(full)-1]
		} else {
			full = nil
		}
		if len(full) == 0 {
			fmt.Fprintf(out, "  %9d %9d %7d  (backlog too small for a full window; raise -seconds)\n", lim, n, 0)
			continue
		}
		var sum int64
		for _, c := range full {
			sum += c
		}
		mean := float64(sum) / float64(len(full))
		verdict := "limiter (as it should: at the limit)"
		switch {
		case mean < 0.99*float64(lim) && ceiling < float64(lim):
			verdict = "consumer + kfake (the ceiling is below the limit)"
		case mean < 0.99*float64(lim):
			verdict = "LIMITER: below its quota with headroom left"
		}
		fmt.Fprintf(out, "  %9d %9d %7d %11.0f %11d %11d %8.1f%%  %s\n",
			lim, n, len(full), mean, slices.Min(full), slices.Max(full), 100*mean/float64(lim), verdict)
	}
	return nil
}

type result struct {
	span      time.Duration // first handler call to last
	perWindow []int64       // calls per aligned window, first to last
}

// consume runs one consumer over n messages of topic and returns when all
// were handled. window > 0 also counts the calls per aligned window.
func consume(brokers []string, topic string, n, workers, maxInFlight int, lim consumer.Limiter, window time.Duration) (result, error) {
	var handled atomic.Int64
	var first, last atomic.Int64
	var mu sync.Mutex
	perWindow := map[int64]int64{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := consumer.New(consumer.Config{
		Brokers: brokers, Topic: topic, GroupID: topic, Workers: workers, MaxInFlight: maxInFlight,
	}, lim, func(context.Context, kafka.Message) error {
		now := time.Now().UnixNano()
		first.CompareAndSwap(0, now)
		if window > 0 {
			mu.Lock()
			perWindow[now/int64(window)]++
			mu.Unlock()
		}
		if handled.Add(1) == int64(n) {
			last.Store(now)
			cancel()
		}
		return nil
	})
	if err != nil {
		return result{}, err
	}
	// A guard against a hung run, not a measurement.
	guard := time.AfterFunc(5*time.Minute, cancel)
	defer guard.Stop()
	if err := c.Run(ctx); err != nil {
		return result{}, err
	}
	if handled.Load() < int64(n) {
		return result{}, fmt.Errorf("topic %s: only %d of %d messages handled before the 5 min guard", topic, handled.Load(), n)
	}
	r := result{span: time.Duration(last.Load() - first.Load())}
	if window > 0 {
		lo, hi := int64(1<<62), int64(0)
		for w := range perWindow {
			lo, hi = min(lo, w), max(hi, w)
		}
		for w := lo; w <= hi; w++ {
			r.perWindow = append(r.perWindow, perWindow[w])
		}
	}
	return r, nil
}

// backlog creates topic and produces n small messages to it.
func backlog(brokers []string, transport *kafka.Transport, topic string, partitions, n int) error {
	ctx := context.Background()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: transport}
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}},
	})
	if err != nil {
		return fmt.Errorf("creating topic %s: %w", topic, err)
	}
	if err := res.Errors[topic]; err != nil {
		return fmt.Errorf("creating topic %s: %w", topic, err)
	}
	w := &kafka.Writer{
		Addr: kafka.TCP(brokers...), Topic: topic, Transport: transport,
		Balancer: &kafka.RoundRobin{}, BatchSize: 5000, BatchBytes: 16 << 20, BatchTimeout: time.Millisecond,
	}
	defer w.Close()
	const chunk = 50_000
	msgs := make([]kafka.Message, 0, chunk)
	for i := 0; i < n; {
		msgs = msgs[:0]
		for ; i < n && len(msgs) < chunk; i++ {
			msgs = append(msgs, kafka.Message{Key: fmt.Appendf(nil, "k%d", i%1024), Value: fmt.Appendf(nil, "event-%09d", i)})
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			return fmt.Errorf("producing the backlog to %s: %w", topic, err)
		}
	}
	return nil
}

// memory runs the memory part: one broker process per backlog size.
func memory(f flags, out io.Writer) error {
	fmt.Fprintf(out, "\n(b) memory bound: no limiter, no-op handler, %d workers, %d partitions; broker in a child process; heap sampled every 100 ms\n",
		f.workers, f.partitions)
	fmt.Fprintf(out, "  %9s %11s %12s %15s %15s %14s %13s %8s\n", "backlog", "MaxInFlight", "heap before", "peak heap inuse", "peak live heap", "max in flight", "consume time", "samples")
	for _, n := range f.memMessages {
		if err := memoryRun(f, n, f.memInFlight[0], out); err != nil {
			return err
		}
	}
	for _, inFlight := range f.memInFlight[1:] {
		if err := memoryRun(f, slices.Max(f.memMessages), inFlight, out); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "  heap inuse = runtime.MemStats.HeapInuse (includes garbage not yet collected, so it follows GOGC's pacing);\n")
	fmt.Fprintf(out, "  live heap = runtime/metrics /gc/heap/live:bytes (marked live at the last GC); in flight = Stats().InFlight\n")
	fmt.Fprintf(out, "  (fetched, not yet committed), which MaxInFlight caps by construction\n")
	return nil
}

func memoryRun(f flags, n, maxInFlight int, out io.Writer) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	topic := fmt.Sprintf("memory-%d-%d", n, maxInFlight)
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%d|%d", brokerEnv, topic, f.partitions, n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() {
		stdin.Close() // the broker exits when its stdin closes
		_ = cmd.Wait()
	}()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		return fmt.Errorf("broker process ended before it was ready: %v", lines.Err())
	}
	addr, ok := strings.CutPrefix(lines.Text(), "ready ")
	if !ok {
		return fmt.Errorf("broker process said %q", lines.Text())
	}
	go io.Copy(io.Discard, stdout)

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.HeapInuse

	var handled atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := consumer.New(consumer.Config{
		Brokers: []string{addr}, Topic: topic, GroupID: topic, Workers: f.workers, MaxInFlight: maxInFlight,
	}, noLimit{}, func(context.Context, kafka.Message) error {
		if handled.Add(1) == int64(n) {
			cancel()
		}
		return nil
	})
	if err != nil {
		return err
	}
	var peakHeap, peakLive uint64
	var peakInFlight int64
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	samples := 0
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
			runtime.ReadMemStats(&ms)
			peakHeap = max(peakHeap, ms.HeapInuse)
			metrics.Read(live)
			if live[0].Value.Kind() == metrics.KindUint64 {
				peakLive = max(peakLive, live[0].Value.Uint64())
			}
			peakInFlight = max(peakInFlight, c.Stats().InFlight)
			samples++
		}
	}()
	guard := time.AfterFunc(5*time.Minute, cancel)
	defer guard.Stop()
	start := time.Now()
	runErr := c.Run(ctx)
	took := time.Since(start)
	close(stopSampling)
	<-sampled
	if runErr != nil {
		return runErr
	}
	if handled.Load() < int64(n) {
		return fmt.Errorf("only %d of %d messages handled before the 5 min guard", handled.Load(), n)
	}
	fmt.Fprintf(out, "  %9d %11d %10.1fMB %13.1fMB %13.1fMB %14d %12.2fs %8d\n",
		n, maxInFlight, mb(before), mb(peakHeap), mb(peakLive), peakInFlight, took.Seconds(), samples)
	return nil
}

func mb(b uint64) float64 { return float64(b) / (1 << 20) }

// broker is the broker process of the memory runs.
func broker(spec string) error {
	parts := strings.Split(spec, "|")
	if len(parts) != 3 {
		return fmt.Errorf("bad spec %q", spec)
	}
	partitions, err1 := strconv.Atoi(parts[1])
	n, err2 := strconv.Atoi(parts[2])
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("bad spec %q: %w", spec, err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return err
	}
	defer cluster.Close()
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	if err := backlog(cluster.ListenAddrs(), transport, parts[0], partitions, n); err != nil {
		return err
	}
	fmt.Printf("ready %s\n", cluster.ListenAddrs()[0])
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}
