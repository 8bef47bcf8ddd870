// Command soak runs sluice for a long while on one machine and watches
// etcd's database size, for BENCHMARKS.md: does the embedded etcd's
// auto-compaction (configd serve --embedded-compaction-retention) keep the
// database from growing without bound?
//
// It builds the configd binary and an instance program
// (bench/soak/instance) with `go build`, and runs as separate processes,
// each in a process group of its own:
//
//   - `configd serve` with its EMBEDDED etcd (no --etcd-endpoints), its
//     own --data-dir and free 127.0.0.1 ports;
//   - -processes instance processes holding -instances real
//     cluster.Members between them, each Member with an etcd client (a
//     gRPC connection) of its own. Each Member asks for about -rate permits
//     per second (TryAcquire every 10 ms), swinging by ±-swing of it over
//     -period at a phase of its own, so demand, instance records and the
//     fair split keep moving.
//
// The provider has -window windows (100 ms) and the fair algorithm, its
// limit -limit-fraction of the mean demand. Every -every (30 s) the program
// prints etcd's revision, its compact revision, its database size and the
// size in use (clientv3 Maintenance.Status: DbSize, DbSizeInUse), the
// shares generation, the live and connected instances, the admitted rate
// and the Members' session restarts; at the end a verdict on whether the
// database size levelled off: its growth over the last third of the run
// against the first third.
//
//	go run ./bench/soak                      # 10 minutes, 50 instances in 5 processes
//	go run ./bench/soak -retention 0         # the same with auto-compaction off
//	go run ./bench/soak -duration 2m -every 10s
//
// Everything binds to 127.0.0.1. On exit, normal or SIGINT/SIGTERM, the
// instances leave gracefully, configd stops, and each child's process
// group is killed; on Linux a child also dies with this program (its
// parent-death signal).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/version"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/internal/child"
	"github.com/sluice-go/sluice/internal/harness"
	"github.com/sluice-go/sluice/internal/schema"
)

const provider = "soak"

// quota is etcd's default space quota (--quota-backend-bytes).
const quota = 2 << 30

type config struct {
	duration      time.Duration
	every         time.Duration
	instances     int
	processes     int
	window        time.Duration
	rate          float64
	swing         float64
	period        time.Duration
	limitFraction float64
	retention     string
	leaseTTL      time.Duration
	report        time.Duration
	keep          bool
}

func main() {
	var c config
	flag.DurationVar(&c.duration, "duration", 10*time.Minute, "how long the load runs, sampled from its start")
	flag.DurationVar(&c.every, "every", 30*time.Second, "how often etcd's size is sampled and printed")
	flag.IntVar(&c.instances, "instances", 50, "instances (cluster.Members), spread over -processes")
	flag.IntVar(&c.processes, "processes", 5, "instance processes")
	flag.DurationVar(&c.window, "window", 100*time.Millisecond, "the provider's window")
	flag.Float64Var(&c.rate, "rate", 100, "mean permits per second each instance asks for")
	flag.Float64Var(&c.swing, "swing", 0.5, "each instance's load swings by this fraction of -rate")
	flag.DurationVar(&c.period, "period", time.Minute, "one swing of the load")
	flag.Float64Var(&c.limitFraction, "limit-fraction", 0.8, "the provider's limit as a fraction of the mean demand")
	flag.StringVar(&c.retention, "retention", "", "configd serve --embedded-compaction-retention (empty: configd's default; 0: no auto-compaction)")
	flag.DurationVar(&c.leaseTTL, "lease-ttl", 5*time.Second, "instances' lease TTL")
	flag.DurationVar(&c.report, "report-interval", time.Second, "instances' report interval")
	flag.BoolVar(&c.keep, "keep", false, "keep the temp dir (etcd data, binaries, logs)")
	flag.Parse()
	if c.instances < 1 || c.processes < 1 || c.processes > c.instances || c.every <= 0 || c.duration < c.every || c.window <= 0 {
		fmt.Fprintln(os.Stderr, "bench/soak: need 1 <= -processes <= -instances, -every > 0, -duration >= -every, -window > 0")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, c)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/soak:", err)
		os.Exit(1)
	}
}

// sample is one reading of etcd.
type sample struct {
	at            time.Duration // since the load started
	rev, compact  int64
	size, inUse   int64
	gen           int64
	live          int64
	connected     int
	admitted      int64
	restarts      int64
	compactions   int64
	compactedKeys int64
}

func run(ctx context.Context, c config) error {
	started := time.Now()
	printHeader(c)
	tmp, bins, cleanup, err := harness.WorkDir("sluice-soak-", c.keep, "./configd", "./bench/soak/instance")
	if err != nil {
		return err
	}
	defer cleanup()
	configdBin, instanceBin := bins[0], bins[1]

	// configd serve with its embedded etcd.
	clientURL := "http://" + harness.FreeAddr()
	args := []string{"--data-dir", filepath.Join(tmp, "etcd"), "--embedded-client-url", clientURL,
		"--embedded-peer-url", "http://" + harness.FreeAddr(), "--listen", "127.0.0.1:0", "--replica-id", "soak"}
	if c.retention != "" {
		args = append(args, "--embedded-compaction-retention", c.retention)
	}
	cd, err := harness.StartServe(configdBin, filepath.Join(tmp, "configd.log"), child.SysProcAttr(), args...)
	if err != nil {
		return err
	}
	defer stopConfigd(cd)
	retention := c.retention
	if retention == "" {
		retention = "configd's default"
	}
	fmt.Printf("configd serve: pid %d, admin API %s, embedded etcd %s at %s, --embedded-compaction-retention %s\n",
		cd.Cmd.Process.Pid, cd.Addr, version.Version, clientURL, retention)

	// configd's embedded etcd is closed to anyone without its credentials
	// (docs/security.md): this report reads as reader, the instances join
	// as instance.
	credentials := filepath.Join(tmp, "etcd", "credentials")
	pw, err := os.ReadFile(filepath.Join(credentials, "reader"))
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{clientURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		Username: "reader", Password: strings.TrimSpace(string(pw))})
	if err != nil {
		return err
	}
	defer cli.Close()

	perWindow := c.rate * c.window.Seconds()
	limit := int64(math.Round(c.limitFraction * perWindow * float64(c.instances)))
	if _, err := cd.Run("set", provider, "--limit", strconv.FormatInt(limit, 10), "--window", c.window.String(), "--algorithm", "fair"); err != nil {
		return err
	}

	// The instance processes.
	procs := make([]*child.Proc, c.processes)
	for i := range procs {
		n := c.instances / c.processes
		if i < c.instances%c.processes {
			n++
		}
		procs[i], err = child.Start(fmt.Sprintf("instance process p%d", i+1), filepath.Join(tmp, fmt.Sprintf("p%d.log", i+1)), instanceBin,
			"-etcd", clientURL, "-etcd-username", "instance", "-etcd-password-file", filepath.Join(credentials, "instance"), "-provider", provider, "-name", fmt.Sprintf("p%d", i+1), "-members", strconv.Itoa(n),
			"-rate", fmt.Sprint(c.rate), "-swing", fmt.Sprint(c.swing), "-period", c.period.String(),
			"-window", c.window.String(), "-lease-ttl", c.leaseTTL.String(), "-report-interval", c.report.String())
		if err != nil {
			return err
		}
		defer procs[i].Stop(15 * time.Second) // its members revoke their leases
	}
	for _, p := range procs {
		if _, err := p.WaitLine(ctx, "joined", 60*time.Second); err != nil {
			return err
		}
	}
	if err := waitShares(ctx, cli, c.instances, 60*time.Second); err != nil {
		return err
	}
	fmt.Printf("%d instances joined in %d processes (%d etcd clients, one per instance; %v of set-up); limit %d per %v (%.0f%% of the mean demand, %.0f/s per instance ±%.0f%% over %v)\n\n",
		c.instances, c.processes, c.instances, time.Since(started).Round(time.Second), limit, c.window, 100*c.limitFraction, c.rate, 100*c.swing, c.period)

	fmt.Printf("%7s %10s %8s %10s %10s %10s %8s %6s %10s %12s %8s\n",
		"elapsed", "revision", "rev/s", "compacted", "db size", "in use", "gen", "live", "connected", "admitted/s", "restarts")
	var samples []sample
	load := time.Now()
	tick := time.NewTicker(c.every)
	defer tick.Stop()
	for {
		s, err := read(ctx, cli, clientURL, procs)
		if err != nil {
			return err
		}
		s.at = time.Since(load)
		printSample(s, samples)
		samples = append(samples, s)
		if s.at >= c.duration-c.every/2 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("interrupted after %v", time.Since(load).Round(time.Second))
		case <-tick.C:
		}
	}
	verdict(samples)
	restarts, reloads, terms := samples[len(samples)-1].restarts, count(filepath.Join(tmp, "configd.log"), `msg="publisher: reloading state from etcd"`),
		count(filepath.Join(tmp, "configd.log"), `msg="became leader"`)
	fmt.Printf("member sessions restarted: %d; configd publisher reloads: %d; configd leader terms: %d\n", restarts, reloads, terms)
	fmt.Printf("total run time %v\n", time.Since(started).Round(time.Second))
	return nil
}

func printHeader(c config) {
	fmt.Printf("$ %s\n", strings.Join(append([]string{"go run ./bench/soak"}, os.Args[1:]...), " "))
	fmt.Println(harness.Facts())
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("load average before the run: %s", load)
	fmt.Printf("duration %v, sampled every %v; %d instances in %d processes; window %v; lease TTL %v, report interval %v\n",
		c.duration, c.every, c.instances, c.processes, c.window, c.leaseTTL, c.report)
}

// read samples etcd and the instances.
func read(ctx context.Context, cli *clientv3.Client, clientURL string, procs []*child.Proc) (sample, error) {
	var s sample
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := cli.Status(rctx, clientURL)
	if err != nil {
		return s, fmt.Errorf("etcd status: %w", err)
	}
	s.rev, s.size, s.inUse = st.Header.Revision, st.DbSize, st.DbSizeInUse
	keys := schema.DefaultKeys()
	sh, _, _, err := harness.ReadShares(rctx, cli, provider)
	if err != nil {
		return s, err
	}
	s.gen = sh.Generation
	resp, err := cli.Get(rctx, keys.Instances(provider), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return s, err
	}
	s.live = resp.Count
	m, err := scrape(rctx, clientURL+"/metrics", "etcd_debugging_mvcc_compact_revision",
		"etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count", "etcd_debugging_mvcc_db_compaction_keys_total")
	if err != nil {
		return s, err
	}
	s.compact, s.compactions, s.compactedKeys = m[0], m[1], m[2]
	for _, p := range procs {
		p.Send("stats")
		line, err := p.WaitLine(ctx, "stats", 10*time.Second)
		if err != nil {
			return s, err
		}
		kv := fields(line)
		s.connected += int(kv["connected"])
		s.admitted += kv["admitted"]
		s.restarts += kv["restarts"]
	}
	return s, nil
}

// scrape reads the values of the named series (without labels) from a
// Prometheus text endpoint; a series not there reads 0.
func scrape(ctx context.Context, url string, names ...string) ([]int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := make([]int64, len(names))
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		for i, n := range names {
			if v, ok := strings.CutPrefix(sc.Text(), n+" "); ok {
				f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
				out[i] = int64(f)
			}
		}
	}
	return out, sc.Err()
}

func printSample(s sample, prev []sample) {
	revRate, admRate := "", ""
	if len(prev) > 0 {
		p := prev[len(prev)-1]
		secs := (s.at - p.at).Seconds()
		revRate = fmt.Sprintf("%.1f", float64(s.rev-p.rev)/secs)
		admRate = fmt.Sprintf("%.0f", float64(s.admitted-p.admitted)/secs)
	}
	compact := "none" // etcd says -1 before the first compaction
	if s.compact >= 0 {
		compact = strconv.FormatInt(s.compact, 10)
	}
	fmt.Printf("%7s %10d %8s %10s %10s %10s %8d %6d %10d %12s %8d\n",
		s.at.Round(time.Second), s.rev, revRate, compact, mib(s.size), mib(s.inUse), s.gen, s.live, s.connected, admRate, s.restarts)
}

func mib(b int64) string { return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20)) }

// verdict compares the database's growth over the last third of the run
// with its growth over the first third.
func verdict(samples []sample) {
	end := samples[len(samples)-1].at
	at := func(t time.Duration) sample { // the sample nearest t
		best := samples[0]
		for _, s := range samples {
			if (s.at - t).Abs() < (best.at - t).Abs() {
				best = s
			}
		}
		return best
	}
	a, b, c, d := samples[0], at(end/3), at(2*end/3), samples[len(samples)-1]
	rate := func(x, y sample, f func(sample) int64) float64 { // bytes per minute
		return float64(f(y)-f(x)) / (y.at - x.at).Minutes()
	}
	size := func(s sample) int64 { return s.size }
	inUse := func(s sample) int64 { return s.inUse }
	first, last := rate(a, b, size), rate(c, d, size)
	fmt.Printf("\ndb size: %s at the start, %s at the end (largest %s); compactions %d, %d keys compacted\n",
		mib(a.size), mib(d.size), mib(maxSize(samples)), d.compactions, d.compactedKeys)
	fmt.Printf("db size growth: first third (%v to %v) %s/min, last third (%v to %v) %s/min\n",
		a.at.Round(time.Second), b.at.Round(time.Second), kib(first), c.at.Round(time.Second), d.at.Round(time.Second), kib(last))
	fmt.Printf("db size in use growth: first third %s/min, last third %s/min\n", kib(rate(a, b, inUse)), kib(rate(c, d, inUse)))
	fmt.Printf("revisions: %.1f/s over the run\n", float64(d.rev-a.rev)/(d.at-a.at).Seconds())
	levelled := last <= 0 || last <= first/4
	if levelled {
		fmt.Printf("verdict: LEVELLED OFF — the last third grew %.0f%% as fast as the first third\n", 100*last/math.Max(first, 1))
		return
	}
	fmt.Printf("verdict: STILL GROWING — the last third grew %.0f%% as fast as the first third; at that rate the %d GiB space quota is reached in about %v\n",
		100*last/math.Max(first, 1), quota>>30, (time.Duration(float64(quota-d.size)/last) * time.Minute).Round(time.Minute))
}

func kib(bytesPerMin float64) string { return fmt.Sprintf("%.1f KiB", bytesPerMin/1024) }

func maxSize(samples []sample) int64 {
	var m int64
	for _, s := range samples {
		m = max(m, s.size)
	}
	return m
}

// count returns how many lines of the file at path contain s.
func count(path, s string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	return strings.Count(string(b), s)
}

// fields parses "word k=v k=v ..." into its numeric values.
func fields(line string) map[string]int64 {
	kv := map[string]int64{}
	for _, f := range strings.Fields(line)[1:] {
		if k, v, ok := strings.Cut(f, "="); ok {
			kv[k], _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return kv
}

// waitShares waits until configd has published shares naming n instances.
func waitShares(ctx context.Context, cli *clientv3.Client, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if sh, _, _, err := harness.ReadShares(ctx, cli, provider); err == nil && sh.Instances == n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no shares for %d instances within %v", n, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stopConfigd stops configd (SIGTERM, then SIGKILL after 15 s) and kills
// its process group.
func stopConfigd(cd *harness.Configd) {
	cd.Stop()
	killGroup(cd.Cmd.Process.Pid)
}

// killGroup sends SIGKILL to the process group pgid (a child started with
// child.SysProcAttr leads its own); a group already gone is no error.
func killGroup(pgid int) {
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		fmt.Fprintf(os.Stderr, "bench/soak: killing process group %d: %v\n", pgid, err)
	}
}
