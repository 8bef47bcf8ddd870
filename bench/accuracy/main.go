// Command accuracy measures how closely sluice's instances, as separate OS
// processes on one machine, hold a provider to its limit under uneven
// offered load above it, for BENCHMARKS.md:
//
//   - the most calls a provider stub saw in any aligned window, against the
//     limit (goal: never over), and how many windows were over;
//   - utilization of the limit (calls / limit) averaged over the windows
//     after a warm-up (goal: ≥ 97% with the fair algorithm), with the even
//     split's figure beside it;
//   - the recovery time after the offered load shifts between instances
//     halfway through: from the shift to the first window from which every
//     window is at least 97% of the limit;
//   - etcd requests per instance per second, counted in each instance.
//
// Four runs by default, each with a fresh provider and 8 fresh instance
// processes: (1) fair, (2) even, (3) fair with one instance's limiter clock
// 200 ms ahead and no NTP correction, (4) the same with a clock monitor
// (cluster.WithClockMonitor) measuring that clock against an SNTP responder
// that tells true time, so the correction cancels the skew.
//
// Each run is made on the provider's coordination named by -coordination:
// the shares (the default: configd publishes a share record per instance),
// the ledger (the provider is created with --coordination ledger: configd
// writes grants of room in numbered windows, and `configd audit` checks
// them at the end of the run), or both, each run on the shares and then on
// the ledger, with the ledger's utilization over the shares' in the
// summary. On the ledger there are no share generations to print: -detail
// prints the calls by instance only.
//
// The program starts an embedded etcd in this process, builds the configd
// binary and the instance program (bench/accuracy/instance) with `go
// build`, runs `configd serve` and each instance as separate processes, and
// serves the provider stub itself: an HTTP server on 127.0.0.1 that
// timestamps every call when it receives it and counts the calls in each
// aligned window of the provider. Each instance offers load with a paced
// loop (go.uber.org/ratelimit), asks its limiter for a permit with
// Acquire(ctx, maxWait), calls the stub for every permit (keep-alive HTTP
// client) and drops the request on ErrTimeout.
//
//	go run ./bench/accuracy                  # 4 runs of 60 s, about 5 minutes
//	go run ./bench/accuracy -duration 20s    # a quick check
//	go run ./bench/accuracy -runs fair,even -limit 1000
//	go run ./bench/accuracy -runs skew,skew-ntp -skewed 1 -skewed-duty 500ms -duration 20s
//	go run ./bench/accuracy -coordination both -runs fair,even
//
// The last one makes the skewed instance's load come in bursts (the last
// 500 ms of every 2 s) that start inside a window and cross a boundary: the
// case a clock error turns into an overshoot, since the instance then
// spends one of its windows' permits just before its early boundary and the
// next window's just after, both inside one aligned window. Under steady
// overload each instance spends its share at the start of its own window,
// and a skewed instance still puts one share in each aligned window.
//
// Times across processes are compared on the one machine's wall clock,
// which is the true time here: the injected skew lives only in one
// instance's limiter.
package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"go.etcd.io/etcd/api/v3/version"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/internal/harness"
	"github.com/sluice-go/sluice/internal/ntptest"
	"github.com/sluice-go/sluice/internal/schema"
)

type config struct {
	limit       int64
	window      time.Duration
	duration    time.Duration
	warmup      time.Duration
	factor      float64
	weights     []float64
	runs        []runSpec
	coords      []string // "shares", "ledger": each run on each, in this order
	skew        time.Duration
	skewed      int // 1-based instance number
	duty        time.Duration
	dutyPeriod  time.Duration
	maxWait     time.Duration
	goal        float64
	leaseTTL    time.Duration
	report      time.Duration
	ntpInterval time.Duration
	pacing      bool
	keep        bool
	detail      bool
	configdArgs string
}

// runSpec is one run: an algorithm, how the skewed instance's clock is
// handled, and the provider's coordination.
type runSpec struct {
	name      string
	algorithm string
	clock     string // "": no skew; "offset": skewed, uncorrected; "ntp": skewed, corrected
	coord     string // "shares" or "ledger"
}

// ledger reports whether the run's provider is coordinated by the ledger.
func (r runSpec) ledger() bool { return r.coord == coordLedger }

// provider names the run's provider: one per run and coordination, since
// a provider's coordination is fixed when it is created.
func (r runSpec) provider() string {
	if r.ledger() {
		return "acc-" + r.name + "-ledger"
	}
	return "acc-" + r.name
}

const (
	coordShares = "shares"
	coordLedger = "ledger"
)

var knownRuns = []runSpec{
	{name: "fair", algorithm: "fair"},
	{name: "even", algorithm: "even"},
	{name: "skew", algorithm: "fair", clock: "offset"},
	{name: "skew-ntp", algorithm: "fair", clock: "ntp"},
}

func main() {
	var c config
	weights, runs, coord := "50,16,13,9,6,3,2,1", "fair,even,skew,skew-ntp", coordShares
	flag.Int64Var(&c.limit, "limit", 2000, "the provider's limit, permits per window")
	flag.DurationVar(&c.window, "window", time.Second, "the provider's window")
	flag.DurationVar(&c.duration, "duration", 60*time.Second, "load time of each run (the load shifts halfway)")
	flag.DurationVar(&c.warmup, "warmup", 5*time.Second, "windows left out of the utilization average at the start of a run")
	flag.Float64Var(&c.factor, "load", 3, "total offered load, as a multiple of the limit")
	flag.StringVar(&weights, "weights", weights, "share of the offered load of each instance, one per instance (normalised); halfway the first and the last swap")
	flag.StringVar(&runs, "runs", runs, "runs, in order: fair, even, skew (fair, one clock ahead, no NTP), skew-ntp (the same, corrected by NTP)")
	flag.DurationVar(&c.skew, "skew", 200*time.Millisecond, "clock error injected on the skewed instance (positive: ahead)")
	flag.IntVar(&c.skewed, "skewed", 0, "the skewed instance's number (default: the last, which becomes the heavy one at the shift)")
	flag.DurationVar(&c.duty, "skewed-duty", 0, "the skewed instance offers its load only in the last D of each -skewed-duty-period (skew runs; 0: steady)")
	flag.DurationVar(&c.dutyPeriod, "skewed-duty-period", 2*time.Second, "period of -skewed-duty, aligned to the Unix epoch")
	flag.DurationVar(&c.maxWait, "max-wait", 10*time.Millisecond, "instances' Acquire maxWait")
	flag.Float64Var(&c.goal, "goal", 0.97, "utilization goal, for the recovery time")
	flag.DurationVar(&c.leaseTTL, "lease-ttl", 5*time.Second, "instances' lease TTL")
	flag.DurationVar(&c.report, "report-interval", time.Second, "instances' report interval")
	flag.DurationVar(&c.ntpInterval, "ntp-interval", 2*time.Second, "the skewed instance's clock monitor interval (skew-ntp)")
	flag.BoolVar(&c.pacing, "pacing", false, "set the provider's pacing (spread each window's permits across it)")
	flag.BoolVar(&c.keep, "keep", false, "keep the temp dir (etcd data, binaries, configd and instance logs)")
	flag.BoolVar(&c.detail, "detail", false, "also print each window's calls by instance, and every shares generation of the run (none on the ledger)")
	flag.StringVar(&c.configdArgs, "configd-args", "", "extra flags for configd serve, space-separated")
	flag.StringVar(&coord, "coordination", coord, "the providers' coordination: shares, ledger, or both (each run on the shares, then on the ledger)")
	flag.Parse()
	if err := parse(&c, weights, runs, coord); err != nil {
		fmt.Fprintln(os.Stderr, "bench/accuracy:", err)
		os.Exit(2)
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench/accuracy:", err)
		os.Exit(1)
	}
}

func parse(c *config, weights, runs, coord string) error {
	var err error
	if c.weights, err = harness.Weights(weights, 2); err != nil {
		return err
	}
	switch coord {
	case coordShares, coordLedger:
		c.coords = []string{coord}
	case "both":
		c.coords = []string{coordShares, coordLedger}
	default:
		return fmt.Errorf("-coordination %q: want shares, ledger or both", coord)
	}
	for _, s := range strings.Split(runs, ",") {
		i := slices.IndexFunc(knownRuns, func(r runSpec) bool { return r.name == strings.TrimSpace(s) })
		if i < 0 {
			return fmt.Errorf("unknown run %q in -runs (fair, even, skew, skew-ntp)", s)
		}
		c.runs = append(c.runs, knownRuns[i])
	}
	if c.skewed == 0 {
		c.skewed = len(c.weights)
	}
	if c.skewed < 1 || c.skewed > len(c.weights) {
		return fmt.Errorf("-skewed %d: instances are 1..%d", c.skewed, len(c.weights))
	}
	if c.limit < 1 || c.factor <= 0 || c.window < 10*time.Millisecond || c.goal <= 0 || c.goal > 1 {
		return errors.New("-limit, -load, -window or -goal out of range")
	}
	n := c.duration / c.window
	if n < 4 || c.warmup >= c.duration/2 {
		return errors.New("-duration too short: at least 4 windows, and a warm-up shorter than half of it")
	}
	c.duration = n * c.window
	return nil
}

// rates returns the offered rates (requests per second) of each instance
// before and after the shift: the first and the last instance swap.
func (c config) rates() (before, after []int) {
	perSec := c.factor * float64(c.limit) * float64(time.Second) / float64(c.window)
	for _, w := range c.weights {
		before = append(before, int(math.Round(perSec*w)))
	}
	after = slices.Clone(before)
	after[0], after[len(after)-1] = after[len(after)-1], after[0]
	return before, after
}

func run(c config) error {
	started := time.Now()
	printHeader(c)
	tmp, bins, cleanup, err := harness.WorkDir("sluice-accuracy-", c.keep, "./configd", "./bench/accuracy/instance")
	if err != nil {
		return err
	}
	defer cleanup()

	etcd, endpoint, err := harness.StartEtcd("accuracy", filepath.Join(tmp, "etcd"))
	if err != nil {
		return err
	}
	defer etcd.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	cd, err := harness.StartConfigd(bins[0], endpoint, filepath.Join(tmp, "configd.log"), c.configdArgs)
	if err != nil {
		return err
	}
	defer cd.Stop()
	st, err := startStub()
	if err != nil {
		return err
	}
	defer st.close()
	ntp, err := ntptest.Start() // tells true time: this machine's clock
	if err != nil {
		return err
	}
	defer ntp.Close()
	fmt.Printf("etcd %s at %s: embedded in this process (TickMs=10 ElectionMs=100)\n", version.Version, endpoint)
	fmt.Printf("configd serve: a separate process, pid %d, admin API %s; provider stub (this process) %s; SNTP responder %s (offset 0: true time)\n",
		cd.Cmd.Process.Pid, cd.Addr, st.url, ntp.Addr())
	before, after := c.rates()
	fmt.Printf("offered load, requests/s by instance (total %d/s = %.3g× the limit): %v; after the shift: %v\n",
		sumInts(before), c.factor, before, after)
	fmt.Printf("even share %d per window; fair (max-min) shares for this demand: %v before the shift\n\n",
		c.limit/int64(len(c.weights)), maxMinFair(c.limit, perWindow(c, before)))

	var results []result
	for _, spec := range c.runs {
		for _, coord := range c.coords {
			spec.coord = coord
			r, err := oneRun(c, spec, len(results)+1, bins[1], endpoint, cli, cd, st, ntp, tmp)
			if err != nil {
				return fmt.Errorf("run %s on the %s: %w", spec.name, coord, err)
			}
			results = append(results, r)
		}
	}
	printSummary(c, results)
	fmt.Printf("\netcd during the runs (its own metrics, embedded here): %s\n", harness.EtcdHealth())
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("load average after the run: %s", load)
	fmt.Printf("total run time %v\n", time.Since(started).Round(time.Second))
	return nil
}

func printHeader(c config) {
	fmt.Printf("$ %s\n", strings.Join(append([]string{"go run ./bench/accuracy"}, os.Args[1:]...), " "))
	fmt.Println(harness.Facts())
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("load average before the run: %s", load)
	fmt.Printf("limit %d per %v, %d instances, offered %.3g× the limit, duration %v per run (shift at %v), warm-up %v, maxWait %v, lease TTL %v, report interval %v, pacing %t, coordination %s\n\n",
		c.limit, c.window, len(c.weights), c.factor, c.duration, c.duration/c.window/2*c.window, c.warmup, c.maxWait, c.leaseTTL, c.report, c.pacing, strings.Join(c.coords, " then "))
}

// result is one run's figures.
type result struct {
	spec          runSpec
	windows       []int64 // calls the stub received per aligned window
	maxCalls      int64
	over          int
	maxGranted    int64 // by the time each permit was granted, instance side
	overGranted   int
	util, pre, po float64 // mean utilization after the warm-up, before and after the shift
	recovery      string
	writes, reqs  float64 // etcd record writes and all requests, per instance per second
	cpu           string
	audit         string // `configd audit`'s verdict (ledger runs)
}

// proc is one instance process and what it reported.
type proc struct {
	n      int
	id     string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	log    *os.File
	mu     sync.Mutex
	joined bool
	gens   map[int64]int64 // generation → share applied
	stats  chan map[string]string
}

func startProc(bin string, n int, args []string, logPath string) (*proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = io.MultiWriter(os.Stderr, logf)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{n: n, id: fmt.Sprintf("inst-%d", n), cmd: cmd, stdin: stdin, log: logf, gens: map[int64]int64{}, stats: make(chan map[string]string, 1)}
	go p.read(stdout)
	return p, nil
}

func (p *proc) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(p.log, line)
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		kv := map[string]string{}
		for _, x := range f[1:] {
			k, v, _ := strings.Cut(x, "=")
			kv[k] = v
		}
		switch f[0] {
		case "joined":
			p.mu.Lock()
			p.joined = true
			p.mu.Unlock()
		case "applied":
			gen, _ := strconv.ParseInt(kv["gen"], 10, 64)
			share, _ := strconv.ParseInt(kv["share"], 10, 64)
			p.mu.Lock()
			p.gens[gen] = share
			p.mu.Unlock()
		case "stats":
			p.stats <- kv
		}
	}
}

func (p *proc) send(line string) { fmt.Fprintln(p.stdin, line) }

func (p *proc) applied(gen int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.gens[gen]
	return ok
}

func (p *proc) getStats() (map[string]string, error) {
	p.send("stats")
	select {
	case kv := <-p.stats:
		return kv, nil
	case <-time.After(10 * time.Second):
		return nil, fmt.Errorf("%s: no stats", p.id)
	}
}

// stop asks the instance to leave and returns the CPU time it used.
func (p *proc) stop() time.Duration {
	p.send("quit")
	p.stdin.Close()
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
	p.log.Close()
	if ps := p.cmd.ProcessState; ps != nil {
		return ps.UserTime() + ps.SystemTime()
	}
	return 0
}

func oneRun(c config, spec runSpec, num int, bin, endpoint string, cli *clientv3.Client, cd *harness.Configd, st *stub, ntp *ntptest.Server, tmp string) (result, error) {
	res := result{spec: spec}
	prov := spec.provider()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := harness.NewWatcher(ctx, cli, prov)
	setArgs := c.setArgs(spec)
	if _, err := cd.Run(setArgs...); err != nil {
		return res, err
	}
	skewNote := "no clock skew"
	switch spec.clock {
	case "offset":
		skewNote = fmt.Sprintf("inst-%d's limiter clock %v ahead (limiter.WithClockOffset), no clock monitor", c.skewed, c.skew)
	case "ntp":
		skewNote = fmt.Sprintf("inst-%d's clock %v ahead (limiter.WithClock and the monitor's clock), corrected by cluster.WithClockMonitor against the SNTP responder every %v",
			c.skewed, c.skew, c.ntpInterval)
	}
	if spec.clock != "" && c.duty > 0 {
		skewNote += fmt.Sprintf("; inst-%d offers its load only in the last %v of every %v", c.skewed, c.duty, c.dutyPeriod)
	}
	fmt.Printf("── Run %d: %s on the %s — `configd %s`; %s\n", num, spec.name, spec.coord, strings.Join(setArgs, " "), skewNote)

	n := len(c.weights)
	procs := make([]*proc, n)
	var cpu time.Duration
	defer func() {
		for _, p := range procs {
			if p != nil {
				cpu += p.stop()
			}
		}
	}()
	for i := range procs {
		args := []string{"-etcd", endpoint, "-provider", prov, "-id", fmt.Sprintf("inst-%d", i+1), "-index", strconv.Itoa(i + 1),
			"-stub", st.url, "-max-wait", c.maxWait.String(), "-lease-ttl", c.leaseTTL.String(),
			"-report-interval", c.report.String(), "-window", c.window.String()}
		if i+1 == c.skewed && spec.clock != "" && c.duty > 0 {
			args = append(args, "-duty-on", c.duty.String(), "-duty-period", c.dutyPeriod.String())
		}
		if i+1 == c.skewed {
			switch spec.clock {
			case "offset":
				args = append(args, "-clock-offset", c.skew.String())
			case "ntp":
				args = append(args, "-clock-skew", c.skew.String(), "-ntp", ntp.Addr(), "-ntp-interval", c.ntpInterval.String())
			}
		}
		p, err := startProc(bin, i+1, args, filepath.Join(tmp, fmt.Sprintf("%s-inst-%d.log", strings.TrimPrefix(spec.provider(), "acc-"), i+1)))
		if err != nil {
			return res, err
		}
		procs[i] = p
	}
	held, err := waitHeld(c, spec, w, procs, 30*time.Second)
	if err != nil {
		return res, fmt.Errorf("instances joining: %w", err)
	}

	// The schedule: load from an aligned boundary; the shift halfway, on a
	// boundary; the end.
	W := int64(c.window)
	start := (time.Now().Add(500*time.Millisecond).UnixNano()/W + 1) * W
	nW := int64(c.duration / c.window)
	shift := start + nW/2*W
	end := start + nW*W
	before, after := c.rates()
	for i, p := range procs {
		p.send(fmt.Sprintf("load %d %d", before[i], start))
		p.send(fmt.Sprintf("load %d %d", after[i], shift))
		p.send(fmt.Sprintf("load 0 %d", end))
	}
	fmt.Printf("%d instances joined (%s); load from %s, shift at +%v, end at +%v\n",
		n, held, time.Unix(0, start).UTC().Format("15:04:05.000"), time.Duration(shift-start), time.Duration(end-start))
	statsBefore, err := statsAll(procs)
	if err != nil {
		return res, err
	}
	var ru0 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	cd0 := procCPU(cd.Cmd.Process.Pid)
	st.take() // drop anything before the run
	time.Sleep(time.Until(time.Unix(0, end).Add(c.maxWait + 500*time.Millisecond)))
	statsAfter, err := statsAll(procs)
	if err != nil {
		return res, err
	}
	calls := st.take()
	var ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cdCPU := procCPU(cd.Cmd.Process.Pid) - cd0
	status, _ := cd.Run("status", prov)
	var audit []byte
	if spec.ledger() {
		res.audit, audit = runAudit(cd, prov)
	}
	for i, p := range procs {
		cpu += p.stop()
		procs[i] = nil
	}
	selfCPU := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
	secs := float64(end-start) / 1e9
	res.cpu = fmt.Sprintf("CPU over the run: instances %.2f cores (all %d, including start and stop), report process (etcd, stub) %.2f, configd %.2f, of %d",
		cpu.Seconds()/secs, n, selfCPU.Seconds()/secs, cdCPU.Seconds()/secs, runtime.NumCPU())

	// Per aligned window, by the stub's receive time and by the instances'
	// grant time.
	k0 := start / W
	res.windows = make([]int64, nW)
	granted := make([]int64, nW)
	perInst := make([][]int64, nW)
	for k := range perInst {
		perInst[k] = make([]int64, n+1)
	}
	outside := 0
	for _, cl := range calls {
		if k := cl.recv/W - k0; k >= 0 && k < nW {
			res.windows[k]++
			if cl.inst >= 1 && int(cl.inst) <= n {
				perInst[k][cl.inst]++
			}
		} else {
			outside++
		}
		if k := cl.granted/W - k0; k >= 0 && k < nW {
			granted[k]++
		}
	}
	var overList []int64
	for k, v := range res.windows {
		res.maxCalls = max(res.maxCalls, v)
		if v > c.limit {
			res.over++
			overList = append(overList, int64(k))
		}
		res.maxGranted = max(res.maxGranted, granted[k])
		if granted[k] > c.limit {
			res.overGranted++
		}
	}
	warm := int64((c.warmup + c.window - 1) / c.window)
	sk := nW / 2
	util := func(from, to int64) float64 {
		var s float64
		for k := from; k < to; k++ {
			s += float64(res.windows[k]) / float64(c.limit)
		}
		return s / float64(to-from)
	}
	res.util, res.pre, res.po = util(warm, nW), util(warm, sk), util(sk, nW)
	goal := int64(math.Ceil(c.goal * float64(c.limit)))
	rec := int64(-1)
	for k := nW - 1; k >= sk && res.windows[k] >= goal; k-- {
		rec = k
	}
	switch {
	case rec < 0:
		res.recovery = "never"
	case rec == sk:
		res.recovery = "0s (no dip)"
	default:
		res.recovery = fmt.Sprintf("%v", time.Duration((rec-sk)*W))
	}
	var below []string
	for k := warm; k < nW; k++ {
		if res.windows[k] < goal {
			below = append(below, fmt.Sprintf("%d", k))
		}
	}

	// etcd traffic per instance per second.
	var writes, reqs []float64
	for i := range procs {
		b, a := statsBefore[i], statsAfter[i]
		s := float64(num64(a["t"])-num64(b["t"])) / 1e9
		mb, ma := harness.ParseMethods(b["methods"]), harness.ParseMethods(a["methods"])
		var wr float64
		for _, m := range []string{"Put", "Txn", "DeleteRange"} {
			wr += float64(ma[m] - mb[m])
		}
		writes = append(writes, wr/s)
		reqs = append(reqs, float64(num64(a["unary"])-num64(b["unary"])+num64(a["stream_sent"])-num64(b["stream_sent"]))/s)
	}
	res.writes, res.reqs = harness.Mean(writes), harness.Mean(reqs)

	// Print the run.
	fmt.Printf("calls the stub received per aligned window (limit %d; ! over the limit, · below %.0f%%, | the shift):\n", c.limit, 100*c.goal)
	printWindows(res.windows, c.limit, goal, sk)
	fmt.Printf("most in a window %d (%.2f%% of the limit), windows over the limit %d of %d; by grant time (instance side) most %d, over %d; calls outside the run's windows %d\n",
		res.maxCalls, 100*float64(res.maxCalls)/float64(c.limit), res.over, nW, res.maxGranted, res.overGranted, outside)
	fmt.Printf("utilization after the first %d windows %.2f%% (before the shift %.2f%%, after %.2f%%); recovery after the shift %s; windows below %.0f%% after the warm-up: %d %v\n",
		warm, 100*res.util, 100*res.pre, 100*res.po, res.recovery, 100*c.goal, len(below), below)
	for j, k := range overList {
		if j == 5 {
			fmt.Printf("  … %d more windows over\n", len(overList)-j)
			break
		}
		fmt.Printf("  window %d over: %d calls; by instance %v; by grant time %d\n", k, res.windows[k], perInst[k][1:], granted[k])
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "instance\toffered/s\tadmitted/s\trefused/s\toffered/s after\tadmitted/s after\trefused/s after\tother errors\tstub call errors\toverload drops\tshare at end\tlimiter clock offset\tclock known\tetcd writes/s\tetcd requests/s\t")
	half := float64(nW/2*W) / 1e9
	for i, p := range statsAfter {
		ph := strings.Split(p["phases"], ";")
		get := func(j, f int) int64 {
			if j >= len(ph) {
				return 0
			}
			v := strings.Split(ph[j], "/")
			if f >= len(v) {
				return 0
			}
			x, _ := strconv.ParseInt(v[f], 10, 64)
			return x
		}
		var other, callErr, overload int64
		for j := range ph {
			other += get(j, 3)
			callErr += get(j, 4)
			overload += get(j, 5)
		}
		fmt.Fprintf(tw, "inst-%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%d\t%d\t%d\t%s\t%s\t%s\t%.2f\t%.2f\t\n", i+1,
			float64(get(0, 0))/half, float64(get(0, 1))/half, float64(get(0, 2))/half,
			float64(get(1, 0))/half, float64(get(1, 1))/half, float64(get(1, 2))/half,
			other, callErr, overload, p["share"], p["clock_offset"], p["clock_known"], writes[i], reqs[i])
	}
	tw.Flush()
	switch {
	case c.detail:
		printDetail(perInst, granted, w.All(), start, end, W, spec.ledger())
	case spec.ledger():
		fmt.Printf("no shares generations on the ledger: configd writes grants under %s, which `configd audit` checks\n", schema.DefaultKeys().Ledger(prov))
	default:
		printShares(w.All(), start, shift, end, W)
	}
	fmt.Println(res.cpu)
	fmt.Printf("`configd status %s` at the end:\n%s\n", prov, indent(string(status)))
	if spec.ledger() {
		fmt.Printf("`configd audit %s` at the end: %s\n%s\n", prov, res.audit, indent(string(audit)))
	}
	return res, nil
}

// printShares prints the shares generations published from a window before
// the shift to a few after, with the two instances that swap loads.
func printShares(all []schema.Shares, start, shift, end, W int64) {
	var lines []string
	n := 0
	for _, sh := range all {
		p := sh.Published.UnixNano()
		if p < shift-W || p >= end || n >= 12 {
			continue
		}
		n++
		ids := make([]string, 0, len(sh.Shares))
		for id := range sh.Shares {
			ids = append(ids, id)
		}
		slices.SortFunc(ids, func(a, b string) int {
			return cmp.Compare(num64(strings.TrimPrefix(a, "inst-")), num64(strings.TrimPrefix(b, "inst-")))
		})
		var parts []string
		for _, id := range ids {
			parts = append(parts, strconv.FormatInt(sh.Shares[id], 10))
		}
		lines = append(lines, fmt.Sprintf("  gen %d published %+.3fs from the shift, in force from %+.3fs: shares %s (sum %d)",
			sh.Generation, float64(p-shift)/1e9, float64(sh.EffectiveFrom-shift)/1e9, strings.Join(parts, " "), harness.Sum(sh.Shares)))
	}
	fmt.Printf("shares generations published from a window before the shift (inst-1 … inst-N; %d published during the run in all):\n", countFrom(all, start, end))
	if len(lines) == 0 {
		fmt.Println("  none")
	}
	for _, l := range lines {
		fmt.Println(l)
	}
}

// printDetail prints each window's calls by instance, and every shares
// generation published during the run (none on the ledger).
func printDetail(perInst [][]int64, granted []int64, all []schema.Shares, start, end, W int64, ledger bool) {
	fmt.Println("calls per window by instance (stub receive time), and all calls by grant time:")
	for k, row := range perInst {
		fmt.Printf("  %3d: %v  granted %d\n", k, row[1:], granted[k])
	}
	if ledger {
		fmt.Println("no shares generations on the ledger (its grants are not printed; `configd audit` checks them)")
		return
	}
	fmt.Println("shares generations published during the run (inst-1 … inst-N):")
	for _, sh := range all {
		p := sh.Published.UnixNano()
		if p < start-W || p >= end {
			continue
		}
		ids := slices.SortedFunc(maps.Keys(sh.Shares), func(a, b string) int {
			return cmp.Compare(num64(strings.TrimPrefix(a, "inst-")), num64(strings.TrimPrefix(b, "inst-")))
		})
		var parts []string
		for _, id := range ids {
			parts = append(parts, strconv.FormatInt(sh.Shares[id], 10))
		}
		fmt.Printf("  gen %d published %+.3fs from the start, in force from window %d: %s (sum %d)\n",
			sh.Generation, float64(p-start)/1e9, (sh.EffectiveFrom-start)/W, strings.Join(parts, " "), harness.Sum(sh.Shares))
	}
}

func countFrom(all []schema.Shares, start, end int64) int {
	n := 0
	for _, sh := range all {
		if p := sh.Published.UnixNano(); p >= start && p < end {
			n++
		}
	}
	return n
}

func printWindows(v []int64, limit, goal, shift int64) {
	var b strings.Builder
	for k, x := range v {
		if k%10 == 0 {
			if k > 0 {
				b.WriteByte('\n')
			}
			fmt.Fprintf(&b, "  %3d:", k)
		}
		mark := " "
		switch {
		case x > limit:
			mark = "!"
		case x < goal:
			mark = "·"
		}
		sep := " "
		if int64(k) == shift {
			sep = "|"
		}
		fmt.Fprintf(&b, "%s%5d%s", sep, x, mark)
	}
	fmt.Println(b.String())
}

func printSummary(c config, rs []result) {
	fmt.Printf("══ Summary: limit %d per %v, %d instance processes, offered %.3g× the limit (one instance 50%%), shifted at the half; windows of the stub's receive time\n",
		c.limit, c.window, len(c.weights), c.factor)
	coords := !slices.Equal(c.coords, []string{coordShares}) // then a column for the coordination, one for the audit
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	printRow(tw, coords, "coordination", "audit", "run", "algorithm", "clock", "most calls in a window", "vs limit", "windows over",
		fmt.Sprintf("utilization after %v", c.warmup), "before shift", "after shift", fmt.Sprintf("recovery (≥ %.0f%%)", 100*c.goal),
		"etcd writes/s/instance", "etcd requests/s/instance")
	for _, r := range rs {
		printRow(tw, coords, r.spec.coord, cmp.Or(r.audit, "-"), r.spec.name, r.spec.algorithm, clockNote(c, r.spec),
			strconv.FormatInt(r.maxCalls, 10), fmt.Sprintf("%.2f%%", 100*float64(r.maxCalls)/float64(c.limit)), fmt.Sprintf("%d / %d", r.over, len(r.windows)),
			fmt.Sprintf("%.2f%%", 100*r.util), fmt.Sprintf("%.2f%%", 100*r.pre), fmt.Sprintf("%.2f%%", 100*r.po), r.recovery,
			fmt.Sprintf("%.2f", r.writes), fmt.Sprintf("%.2f", r.reqs))
	}
	tw.Flush()
	printRatio(rs)
}

// printRow prints a row of the summary: cols, and with coords the
// coordination after the first column and the audit at the end.
func printRow(w io.Writer, coords bool, coord, audit string, cols ...string) {
	if coords {
		cols = append(slices.Insert(cols, 1, coord), audit)
	}
	fmt.Fprintln(w, strings.Join(cols, "\t")+"\t")
}

// clockNote says how spec's skewed instance's clock runs.
func clockNote(c config, spec runSpec) string {
	switch spec.clock {
	case "offset":
		return fmt.Sprintf("inst-%d %s, no NTP", c.skewed, signed(c.skew))
	case "ntp":
		return fmt.Sprintf("inst-%d %s, NTP", c.skewed, signed(c.skew))
	}
	return "true"
}

// printRatio prints, for each run made on the shares and then on the
// ledger, the ledger's utilization over the shares'.
func printRatio(rs []result) {
	var parts []string
	for i, r := range rs {
		if !r.spec.ledger() || i == 0 || rs[i-1].spec.name != r.spec.name {
			continue
		}
		s := rs[i-1]
		parts = append(parts, fmt.Sprintf("%s %.3f (%.2f%% / %.2f%%)", r.spec.name, r.util/s.util, 100*r.util, 100*s.util))
	}
	if len(parts) > 0 {
		fmt.Printf("utilization after the warm-up, ledger / shares: %s\n", strings.Join(parts, "; "))
	}
}

// setArgs is the configd command that creates spec's provider.
func (c config) setArgs(spec runSpec) []string {
	args := []string{"set", spec.provider(), "--limit", strconv.FormatInt(c.limit, 10), "--window", c.window.String(), "--algorithm", spec.algorithm}
	if c.pacing {
		args = append(args, "--pacing")
	}
	if spec.ledger() {
		args = append(args, "--coordination", coordLedger)
	}
	return args
}

// waitHeld waits until the instances hold the limit between them, and
// says how they do.
func waitHeld(c config, spec runSpec, w *harness.Watcher, procs []*proc, timeout time.Duration) (string, error) {
	if spec.ledger() {
		return settleLedger(procs, c.limit, timeout)
	}
	sh, err := settle(w, procs, timeout, func(sh schema.Shares) bool {
		return sh.Instances == len(procs) && sh.Total == c.limit
	})
	return fmt.Sprintf("generation %d in force", sh.Generation), err
}

// settleLedger waits until every instance follows the ledger with at
// least an even share in force (what the split gives instances that want
// nothing yet) and the quotas add up to limit. The instances' stats are
// the event source: a Member refreshes its status every report interval,
// and announces no grant.
func settleLedger(procs []*proc, limit int64, timeout time.Duration) (string, error) {
	t0 := time.Now()
	deadline := t0.Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		stats, err := statsAll(procs)
		if err != nil {
			return "", err
		}
		held, sum, least, ok := ledgerHeld(stats)
		if ok && sum == limit && least >= limit/int64(len(procs)) {
			return fmt.Sprintf("on the ledger after %v: quotas in force %s, sum %d", time.Since(t0).Round(time.Millisecond), held, sum), nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no even share or more each, adding up to %d, in force on the ledger within %v: %s", limit, timeout, held)
		}
		<-tick.C
	}
}

// ledgerHeld returns the instances' quotas in force as SOURCE/QUOTA (only
// the quota where the source is the ledger), their sum and least, and
// whether every instance follows the ledger.
func ledgerHeld(stats []map[string]string) (held string, sum, least int64, all bool) {
	all, least = true, math.MaxInt64
	parts := make([]string, len(stats))
	for i, kv := range stats {
		q := num64(kv["share"])
		parts[i] = kv["share"]
		if kv["source"] != schema.SourceLedger {
			parts[i] = kv["source"] + "/" + kv["share"]
			all = false
		}
		sum, least = sum+q, min(least, q)
	}
	return strings.Join(parts, " "), sum, least, all
}

// runAudit runs `configd audit prov` and returns its verdict (ok when
// every window's grants are within the limit and every record decodes)
// and its output.
func runAudit(cd *harness.Configd, prov string) (string, []byte) {
	out, err := cd.Run("audit", prov)
	if err != nil {
		return "FAILED", out
	}
	return "ok", out
}

// settle waits for shares satisfying cond, applied by every instance and
// in force.
func settle(w *harness.Watcher, procs []*proc, timeout time.Duration, cond func(schema.Shares) bool) (schema.Shares, error) {
	deadline := time.Now().Add(timeout)
	for {
		sh, err := w.WaitShares(time.Until(deadline), cond)
		if err != nil {
			return sh, err
		}
		all := true
		for _, p := range procs {
			all = all && p.applied(sh.Generation)
		}
		if cur, _ := w.Latest(); all && cur.Generation == sh.Generation {
			time.Sleep(time.Until(time.Unix(0, sh.EffectiveFrom)))
			return sh, nil
		}
		if time.Now().After(deadline) {
			return sh, fmt.Errorf("generation %d not applied by every instance within %v", sh.Generation, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func statsAll(procs []*proc) ([]map[string]string, error) {
	out := make([]map[string]string, len(procs))
	for i, p := range procs {
		kv, err := p.getStats()
		if err != nil {
			return nil, err
		}
		out[i] = kv
	}
	return out, nil
}

// stub is the provider: it timestamps every call it receives.
type stub struct {
	srv *http.Server
	url string
	mu  sync.Mutex
	cs  []call
}

type call struct {
	recv, granted int64 // Unix ns: received here; granted by the instance's limiter
	inst          int16
}

func startStub() (*stub, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &stub{url: "http://" + l.Addr().String() + "/call"}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go s.srv.Serve(l)
	return s, nil
}

func (s *stub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now().UnixNano()
	inst, _ := strconv.Atoi(r.Header.Get("X-Instance"))
	g, _ := strconv.ParseInt(r.Header.Get("X-Granted"), 10, 64)
	s.mu.Lock()
	s.cs = append(s.cs, call{recv: now, granted: g, inst: int16(inst)})
	s.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// take returns the calls received since the last take.
func (s *stub) take() []call {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs := s.cs
	s.cs = nil
	return cs
}

func (s *stub) close() { s.srv.Close() }

// procCPU returns the CPU time process pid used so far (Linux, from
// /proc/PID/stat at 100 ticks per second); 0 if unknown.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * 10 * time.Millisecond
}

// maxMinFair returns the max-min fair split of limit for demands, by
// water-filling (for the header only: configd/alloc computes the real
// shares, with its floor and rounding).
func maxMinFair(limit int64, demand []int64) []int64 {
	out := make([]int64, len(demand))
	idx := make([]int, len(demand))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(demand[a], demand[b]) })
	left := limit
	for j, i := range idx {
		eq := left / int64(len(idx)-j)
		out[i] = min(demand[i], eq)
		left -= out[i]
	}
	return out
}

func perWindow(c config, rates []int) []int64 {
	out := make([]int64, len(rates))
	for i, r := range rates {
		out[i] = int64(math.Round(float64(r) * float64(c.window) / float64(time.Second)))
	}
	return out
}

func sumInts(v []int) (s int) {
	for _, x := range v {
		s += x
	}
	return s
}

func signed(d time.Duration) string {
	if d > 0 {
		return "+" + d.String()
	}
	return d.String()
}

func num64(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ")
}
