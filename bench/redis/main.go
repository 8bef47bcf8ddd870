// Command redis compares sluice's local decision with the central-Redis
// design it replaces, in one run on one machine, for BENCHMARKS.md:
//
//   - sluice: limiter.Acquire with a permit available (no network, no lock);
//   - redis-lua: the classic Redis token bucket, one EVALSHA per call of a
//     Lua script that reads tokens and last_refill with HMGET, refills by
//     the elapsed time, takes a token, writes both back with HMSET and
//     refreshes the key's EXPIRE;
//   - redis-incr: a fixed-window counter, INCR of the current window's key
//     plus EXPIRE, pipelined (one round trip per call).
//
// Each runs serially and with 2 and 16 goroutines, for -duration each,
// after a short warm-up; the report gives per-call latency p50/p99,
// throughput, and both as ratios against sluice at the same concurrency.
// Every limit is set far above what a run can use, so every call is a
// grant: the figures are the cost of a decision, not of a wait.
//
// sluice's latency is measured over batches of -batch calls timed together
// (one call takes less than reading the clock twice); Redis calls are timed
// one by one.
//
// The program starts its own redis-server on a random 127.0.0.1 port
// (--save "" --appendonly no: nothing touches the disk) and stops it at the
// end. It looks for redis-server on PATH (or -redis-server). When there is
// none it installs Debian's redis-server package with apt-get only if it
// runs as root and SLUICE_INSTALL_REDIS=1 is set; otherwise it prints
// "skipped: no redis-server ..." and exits 0, so CI without Redis stays
// green.
//
//	go run ./bench/redis
//	SLUICE_INSTALL_REDIS=1 go run ./bench/redis -duration 3s
//
// The Redis client is github.com/redis/go-redis/v9 with a pool of 32
// connections, over loopback TCP: the most favourable setting for Redis
// (no real network between the caller and the server).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice/bench/internal/redisbucket"
	"github.com/sluice-go/sluice/limiter"
)

// installEnv, set to 1, lets the program install redis-server with apt-get
// when it runs as root and finds none.
const installEnv = "SLUICE_INSTALL_REDIS"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/redis:", err)
		os.Exit(1)
	}
}

type config struct {
	duration    time.Duration
	warmup      time.Duration
	batch       int
	redisServer string
	goroutines  []int
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("redis", flag.ContinueOnError)
	var c config
	fs.DurationVar(&c.duration, "duration", 2*time.Second, "how long each case runs at each concurrency")
	fs.DurationVar(&c.warmup, "warmup", 300*time.Millisecond, "warm-up before each measurement")
	fs.IntVar(&c.batch, "batch", 100, "sluice calls timed together per latency sample")
	fs.StringVar(&c.redisServer, "redis-server", "", "redis-server binary (default: from PATH)")
	gs := fs.String("goroutines", "1,2,16", "comma-separated concurrency levels")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, s := range strings.Split(*gs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("-goroutines: %q is not a positive integer", s)
		}
		c.goroutines = append(c.goroutines, n)
	}
	if c.duration <= 0 || c.warmup < 0 || c.batch < 1 {
		return errors.New("-duration and -batch must be positive, -warmup not negative")
	}

	bin, err := findRedis(ctx, c.redisServer, out)
	if err != nil {
		return err
	}
	if bin == "" {
		return nil // skipped, said why
	}
	srv, err := startRedis(ctx, bin)
	if err != nil {
		return err
	}
	defer srv.stop()

	rdb := redis.NewClient(&redis.Options{Addr: srv.addr, PoolSize: 32, MinIdleConns: 16, DisableIdentity: true})
	defer rdb.Close()
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return fmt.Errorf("redis INFO: %w", err)
	}

	lim, err := limiter.New(limiter.MaxQuota, time.Hour)
	if err != nil {
		return err
	}
	defer lim.Close()
	bucket := redis.NewScript(redisbucket.Script)
	if err := bucket.Load(ctx, rdb).Err(); err != nil {
		return fmt.Errorf("SCRIPT LOAD: %w", err)
	}

	cases := []benchCase{
		{name: "sluice Acquire (local)", batch: c.batch, call: func(ctx context.Context) error {
			return lim.Acquire(ctx, time.Second)
		}},
		{name: "Redis Lua token bucket (EVALSHA)", batch: 1, call: func(ctx context.Context) error {
			// 1e12 tokens/s and capacity: never empty in a run.
			n, err := bucket.Run(ctx, rdb, []string{"sluice:bench:bucket"}, 1e12, 1e12, time.Now().UnixMicro(), 1, 60).Int64()
			if err == nil && n != 1 {
				err = errors.New("token bucket refused")
			}
			return err
		}},
		{name: "Redis INCR+EXPIRE (fixed window)", batch: 1, call: func(ctx context.Context) error {
			key := "sluice:bench:window:" + strconv.FormatInt(time.Now().Unix(), 10)
			var incr *redis.IntCmd
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				incr = p.Incr(ctx, key)
				p.Expire(ctx, key, 2*time.Second)
				return nil
			})
			if err == nil && incr.Val() > 1e12 {
				err = errors.New("window limit reached")
			}
			return err
		}},
	}

	fmt.Fprintf(out, "sluice vs a central Redis limiter, same run, same machine\n")
	fmt.Fprintf(out, "go %s %s/%s, GOMAXPROCS %d, cpu %s\n", strings.TrimPrefix(runtime.Version(), "go"), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), cpuModel())
	fmt.Fprintf(out, "redis-server %s (%s) on %s, --save '' --appendonly no; client go-redis/v9, pool 32, loopback TCP\n",
		infoField(info, "redis_version"), bin, srv.addr)
	fmt.Fprintf(out, "each case %v per concurrency after %v warm-up; sluice latency from batches of %d calls\n\n", c.duration, c.warmup, c.batch)

	var results []result
	for _, g := range c.goroutines {
		for _, bc := range cases {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if c.warmup > 0 {
				if _, err := measure(ctx, bc, g, c.warmup); err != nil {
					return fmt.Errorf("%s warm-up: %w", bc.name, err)
				}
			}
			r, err := measure(ctx, bc, g, c.duration)
			if err != nil {
				return fmt.Errorf("%s, %d goroutines: %w", bc.name, g, err)
			}
			results = append(results, r)
		}
	}
	printTable(out, results)
	return nil
}

// benchCase is one limiter under test; call makes one decision.
type benchCase struct {
	name  string
	batch int // calls timed together per latency sample
	call  func(ctx context.Context) error
}

type result struct {
	name       string
	goroutines int
	calls      int64
	elapsed    time.Duration
	p50, p99   time.Duration
}

func (r result) throughput() float64 { return float64(r.calls) / r.elapsed.Seconds() }

// measure runs bc on g goroutines for d and returns its figures.
func measure(ctx context.Context, bc benchCase, g int, d time.Duration) (result, error) {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		samples []time.Duration
		calls   int64
		first   error
	)
	start := time.Now()
	deadline := start.Add(d)
	for range g {
		wg.Go(func() {
			local := make([]time.Duration, 0, 1<<14)
			var n int64
			var err error
			for err == nil && ctx.Err() == nil {
				t0 := time.Now()
				if t0.After(deadline) {
					break
				}
				for range bc.batch {
					if err = bc.call(ctx); err != nil {
						break
					}
				}
				local = append(local, time.Since(t0)/time.Duration(bc.batch))
				n += int64(bc.batch)
			}
			mu.Lock()
			samples = append(samples, local...)
			calls += n
			if err != nil && first == nil {
				first = err
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return result{}, first
	}
	if err := ctx.Err(); err != nil {
		return result{}, err
	}
	slices.Sort(samples)
	return result{name: bc.name, goroutines: g, calls: calls, elapsed: elapsed,
		p50: quantile(samples, 0.50), p99: quantile(samples, 0.99)}, nil
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

func printTable(out io.Writer, rs []result) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	// AlignRight suits the figures; the names are padded to align left.
	width := len("case")
	for _, r := range rs {
		width = max(width, len(r.name))
	}
	fmt.Fprintf(tw, "%-*s\tgoroutines\tcalls\tcalls/s\tp50\tp99\tp50 ÷ sluice\tp99 ÷ sluice\tsluice calls/s ÷ this\t\n", width, "case")
	base := map[int]result{}
	for _, r := range rs {
		if strings.HasPrefix(r.name, "sluice") {
			base[r.goroutines] = r
		}
	}
	for _, r := range rs {
		b := base[r.goroutines]
		fmt.Fprintf(tw, "%-*s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", width, r.name, r.goroutines, r.calls, si(r.throughput()),
			dur(r.p50), dur(r.p99), ratio(r.p50, b.p50), ratio(r.p99, b.p99), ratioF(b.throughput(), r.throughput()))
	}
	tw.Flush()
}

func ratio(a, b time.Duration) string {
	if b <= 0 {
		return "-"
	}
	return ratioF(float64(a), float64(b))
}

func ratioF(a, b float64) string {
	if b <= 0 {
		return "-"
	}
	x := a / b
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f×", x)
	case x >= 10:
		return fmt.Sprintf("%.1f×", x)
	}
	return fmt.Sprintf("%.2f×", x)
}

// dur prints a latency with a precision that suits it.
func dur(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%.1fns", float64(d))
	case d < time.Millisecond:
		return fmt.Sprintf("%.1fµs", float64(d)/1e3)
	}
	return fmt.Sprintf("%.2fms", float64(d)/1e6)
}

func si(x float64) string {
	switch {
	case x >= 1e6:
		return fmt.Sprintf("%.1fM", x/1e6)
	case x >= 1e3:
		return fmt.Sprintf("%.1fk", x/1e3)
	}
	return fmt.Sprintf("%.0f", x)
}

// findRedis returns the redis-server binary to run, installing it when
// allowed, or "" after printing why the run is skipped.
func findRedis(ctx context.Context, explicit string, out io.Writer) (string, error) {
	if explicit != "" {
		return exec.LookPath(explicit)
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	if os.Geteuid() != 0 || os.Getenv(installEnv) != "1" {
		fmt.Fprintf(out, "skipped: no redis-server on PATH (as root, set %s=1 to let this program run 'apt-get install -y redis-server')\n", installEnv)
		return "", nil
	}
	fmt.Fprintln(out, "no redis-server on PATH; installing it: apt-get install -y redis-server")
	install := func() error {
		cmd := exec.CommandContext(ctx, "apt-get", "install", "-y", "-q", "redis-server")
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		b, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, lastLine(b))
		}
		return nil
	}
	if err := install(); err != nil {
		// A fresh machine may have no package lists yet.
		if b, uerr := exec.CommandContext(ctx, "apt-get", "update", "-q").CombinedOutput(); uerr != nil {
			fmt.Fprintf(out, "skipped: no redis-server, and apt-get update failed: %v: %s\n", uerr, lastLine(b))
			return "", nil
		}
		if err := install(); err != nil {
			fmt.Fprintf(out, "skipped: no redis-server, and apt-get install failed: %v\n", err)
			return "", nil
		}
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		fmt.Fprintln(out, "skipped: apt-get installed redis-server but it is not on PATH")
		return "", nil
	}
	return p, nil
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// redisServer is the redis-server process this program started.
type redisServer struct {
	cmd  *exec.Cmd
	addr string
	done chan error
	logs *strings.Builder
	mu   *sync.Mutex
}

// startRedis starts bin on a free 127.0.0.1 port with persistence off and
// waits until it answers PING.
func startRedis(ctx context.Context, bin string) (*redisServer, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	s := &redisServer{cmd: cmd, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), done: make(chan error, 1), logs: &strings.Builder{}, mu: &sync.Mutex{}}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			s.mu.Lock()
			s.logs.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
		}
		s.done <- cmd.Wait()
	}()
	rdb := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1, DisableIdentity: true})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := rdb.Ping(pctx).Err()
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case werr := <-s.done:
			s.done <- werr
			return nil, fmt.Errorf("redis-server exited: %v\n%s", werr, s.output())
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop()
			return nil, fmt.Errorf("redis-server on %s not answering PING: %v\n%s", s.addr, err, s.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *redisServer) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logs.String()
}

// stop ends the server with SIGTERM (it exits without saving: --save ”),
// and kills it if it has not gone within 5 s.
func (s *redisServer) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func infoField(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return "?"
}
