// Command retune measures how sluice reacts to change, with configd and
// the instances as separate OS processes on one machine, for BENCHMARKS.md:
//
//  1. retune latency: the time from `configd set NAME --limit N` returning
//     to every one of the instances enforcing the new total — both the
//     moment the last instance has applied the new share (handed it to its
//     limiter, to take effect at the shares' boundary) and the moment the
//     new shares are in force (their boundary, or the last apply if that
//     came later); p50/p99 over -retunes retunes, each started at a random
//     phase of the window;
//  2. coordination cost: etcd requests per instance per second while every
//     instance admits 10 and 100,000 permits/s, counted client-side in each
//     instance by gRPC interceptors (unary calls, and messages sent on
//     streams: lease keep-alives, watch requests);
//  3. instance crash: one instance SIGKILLed, and the time until its share
//     is handed to the others (its lease expires after the lease TTL).
//
// The program starts an embedded etcd in this process
// (go.etcd.io/etcd/server/v3/embed, own temp dir, 127.0.0.1 ports), builds
// the configd binary and a small instance program (bench/retune/instance)
// with `go build`, and runs `configd serve` and each instance as separate
// processes. Instances print every share they apply, with its time, on
// stdout; this program reads those lines and watches the shares record in
// etcd itself.
//
//	go run ./bench/retune
//	go run ./bench/retune -retunes 20 -cost-seconds 5s
//
// Times across processes are compared on the one machine's wall clock.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
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
	"github.com/sluice-go/sluice/internal/schema"
)

const provider = "bench"

type config struct {
	instances   int
	retunes     int
	window      time.Duration
	leaseTTL    time.Duration
	report      time.Duration
	rates       []int
	warmup      time.Duration
	costFor     time.Duration
	keep        bool
	configdArgs string
}

func main() {
	var c config
	rates := "10,100000"
	flag.IntVar(&c.instances, "instances", 8, "instances (separate processes)")
	flag.IntVar(&c.retunes, "retunes", 50, "retunes to time")
	flag.DurationVar(&c.window, "window", time.Second, "the provider's window")
	flag.DurationVar(&c.leaseTTL, "lease-ttl", 5*time.Second, "instances' lease TTL (cluster.DefaultLeaseTTL is 5s)")
	flag.DurationVar(&c.report, "report-interval", time.Second, "instances' report interval (cluster.DefaultReportInterval is 1s)")
	flag.StringVar(&rates, "rates", rates, "admitted permits/s per instance at which to count etcd requests")
	flag.DurationVar(&c.warmup, "cost-warmup", 5*time.Second, "load before counting starts (the smoothed demand settles)")
	flag.DurationVar(&c.costFor, "cost-seconds", 10*time.Second, "how long to count etcd requests at each rate")
	flag.BoolVar(&c.keep, "keep", false, "keep the temp dir (etcd data, binaries, configd log)")
	flag.StringVar(&c.configdArgs, "configd-args", "", "extra flags for configd serve, space-separated")
	flag.Parse()
	for _, r := range strings.Split(rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || n < 0 {
			fmt.Fprintf(os.Stderr, "bench/retune: bad -rates %q\n", rates)
			os.Exit(2)
		}
		c.rates = append(c.rates, n)
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench/retune:", err)
		os.Exit(1)
	}
}

func run(c config) error {
	started := time.Now()
	printHeader(c)
	tmp, bins, cleanup, err := harness.WorkDir("sluice-retune-", c.keep, "./configd", "./bench/retune/instance")
	if err != nil {
		return err
	}
	defer cleanup()
	configdBin, instanceBin := bins[0], bins[1]

	// etcd, in this process.
	etcd, endpoint, err := harness.StartEtcd("retune", filepath.Join(tmp, "etcd"))
	if err != nil {
		return err
	}
	defer etcd.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := harness.NewWatcher(ctx, cli, provider)

	// configd serve, a process.
	cd, err := harness.StartConfigd(configdBin, endpoint, filepath.Join(tmp, "configd.log"), c.configdArgs)
	if err != nil {
		return err
	}
	defer cd.Stop()
	fmt.Printf("etcd %s at %s: embedded in this process (TickMs=10 ElectionMs=100)\n", version.Version, endpoint)
	fmt.Printf("configd serve: a separate process (the built binary), pid %d, admin API %s; instances: separate processes\n",
		cd.Cmd.Process.Pid, cd.Addr)

	set := func(limit int64) (time.Time, time.Duration, error) {
		start := time.Now()
		_, err := cd.Run("set", provider, "--limit", strconv.FormatInt(limit, 10), "--window", c.window.String())
		done := time.Now()
		if err != nil {
			return done, 0, err
		}
		return done, done.Sub(start), nil
	}
	baseLimit := int64(80_000)
	if _, _, err := set(baseLimit); err != nil {
		return err
	}

	// The instances, processes.
	insts := make([]*instance, c.instances)
	for i := range insts {
		insts[i], err = startInstance(instanceBin, endpoint, fmt.Sprintf("inst-%d", i+1), c)
		if err != nil {
			return err
		}
		defer insts[i].stop()
	}
	sh, err := settle(w, insts, 30*time.Second, func(sh schema.Shares) bool {
		return sh.Instances == c.instances && sh.Total == baseLimit && harness.Sum(sh.Shares) == baseLimit
	})
	if err != nil {
		return fmt.Errorf("instances joining: %w", err)
	}
	fmt.Printf("%d instances joined; generation %d in force: %d each of %d\n\n", c.instances, sh.Generation, sh.Shares[insts[0].id], sh.Total)

	// 1. Retunes.
	var applyLat, forceLat, publishLat, setDur []time.Duration
	late, multi := 0, 0
	for i := range c.retunes {
		// Start at a random phase of the window.
		time.Sleep(rand.N(c.window))
		// Down and up in turn, by 100 permits per instance and more each
		// time: every retune changes every share.
		step := int64(i/2+1) * int64(c.instances) * 100
		limit := baseLimit - step
		if i%2 == 1 {
			limit = baseLimit + step
		}
		prev, _ := w.Latest()
		done, took, err := set(limit)
		if err != nil {
			return err
		}
		// The new total is enforced once it is all handed out: configd's
		// handover may grow shares in a second publish, after the shrinking
		// instances acknowledged.
		sh, err := w.WaitShares(10*time.Second, func(sh schema.Shares) bool { return sh.Total == limit && harness.Sum(sh.Shares) == limit })
		if err != nil {
			return fmt.Errorf("retune %d: %w", i+1, err)
		}
		last, err := lastApplied(insts, sh, 10*time.Second)
		if err != nil {
			return fmt.Errorf("retune %d: %w", i+1, err)
		}
		inForce := max(last, sh.EffectiveFrom)
		if last > sh.EffectiveFrom {
			late++
		}
		if sh.Generation > prev.Generation+1 {
			multi++
		}
		publishLat = append(publishLat, sh.Published.Sub(done))
		applyLat = append(applyLat, time.Duration(last-done.UnixNano()))
		forceLat = append(forceLat, time.Duration(inForce-done.UnixNano()))
		setDur = append(setDur, took)
		// Let the new shares take effect before the next retune.
		time.Sleep(time.Until(time.Unix(0, inForce)))
	}
	fmt.Printf("1. Retune: `configd set %s --limit N` (a process, through the admin API), %d times, %d instances, window %v\n",
		provider, c.retunes, c.instances, c.window)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "measured from `configd set` returning to\tp50\tp99\tmin\tmax\t")
	for _, row := range []struct {
		name string
		d    []time.Duration
	}{
		{"the leader publishing the new shares, all handed out (configd's clock)", publishLat},
		{"the last instance applying its new share", applyLat},
		{"the new shares in force on every instance (boundary)", forceLat},
		{"(for reference: `configd set` itself, start to exit)", setDur},
	} {
		fmt.Fprintf(tw, "%s\t%v\t%v\t%v\t%v\t\n", row.name, harness.Pct(row.d, 50), harness.Pct(row.d, 99), slices.Min(row.d).Round(time.Millisecond), slices.Max(row.d).Round(time.Millisecond))
	}
	tw.Flush()
	fmt.Printf("retunes with an instance applying after the shares' boundary: %d of %d; needing more than one publish: %d\n", late, c.retunes, multi)
	fmt.Printf("(new shares take effect at the first window boundary at least configd's propagation margin, 200ms by default, after publishing)\n\n")

	// 2. Coordination cost.
	costLimit := int64(slices.Max(c.rates)) * int64(c.instances) * 5 / 4
	if _, _, err := set(costLimit); err != nil {
		return err
	}
	if _, err := settle(w, insts, 30*time.Second, func(sh schema.Shares) bool { return sh.Total == costLimit && harness.Sum(sh.Shares) == costLimit }); err != nil {
		return err
	}
	fmt.Printf("2. Coordination cost: etcd requests per instance per second, counted in each instance by gRPC client interceptors\n")
	fmt.Printf("   (limit %d per %v, share %d each; %v of load before counting, then %v counted; lease TTL %v, report interval %v)\n",
		costLimit, c.window, costLimit/int64(c.instances), c.warmup, c.costFor, c.leaseTTL, c.report)
	tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "offered/instance\tadmitted/s/instance\trequests/s/instance\tmin\tmax\tunary/s\tstream msgs sent/s\tstream msgs recv/s\tby method (per instance per s)\t")
	for _, rate := range c.rates {
		for _, in := range insts {
			in.send(fmt.Sprintf("load %d", rate))
		}
		time.Sleep(c.warmup)
		before, err := statsAll(insts)
		if err != nil {
			return err
		}
		time.Sleep(c.costFor)
		after, err := statsAll(insts)
		if err != nil {
			return err
		}
		for _, in := range insts {
			in.send("load 0")
		}
		var reqs []float64
		var adm, un, snt, rcv float64
		methods := map[string]float64{}
		for i := range insts {
			secs := float64(after[i].t-before[i].t) / 1e9
			u := float64(after[i].unary-before[i].unary) / secs
			s := float64(after[i].sent-before[i].sent) / secs
			reqs = append(reqs, u+s)
			un += u
			snt += s
			rcv += float64(after[i].recv-before[i].recv) / secs
			adm += float64(after[i].admitted-before[i].admitted) / secs
			for m, n := range after[i].methods {
				methods[m] += float64(n-before[i].methods[m]) / secs
			}
		}
		n := float64(len(insts))
		var mb []string
		for _, m := range slices.Sorted(maps.Keys(methods)) {
			if v := methods[m] / n; v > 0 {
				mb = append(mb, fmt.Sprintf("%s %.2f", m, v))
			}
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t\n", rate, adm/n, harness.Mean(reqs), slices.Min(reqs), slices.Max(reqs),
			un/n, snt/n, rcv/n, strings.Join(mb, ", "))
	}
	tw.Flush()
	fmt.Println("(requests = unary calls + messages sent on streams; received stream messages are watch events and keep-alive answers)")
	fmt.Println()

	// 3. Crash.
	victim := insts[len(insts)-1]
	survivors := insts[:len(insts)-1]
	prev, _ := w.Latest()
	killed := time.Now()
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	victim.cmd.Wait()
	victim.killed = true
	sh, err = w.WaitShares(c.leaseTTL+30*time.Second, func(sh schema.Shares) bool {
		_, in := sh.Shares[victim.id]
		return sh.Generation > prev.Generation && !in && harness.Sum(sh.Shares) == sh.Total
	})
	if err != nil {
		return fmt.Errorf("crash: %w", err)
	}
	gone, ok := w.Deleted(victim.id)
	last, err := lastApplied(survivors, sh, 10*time.Second)
	if err != nil {
		return fmt.Errorf("crash: %w", err)
	}
	time.Sleep(time.Until(time.Unix(0, sh.EffectiveFrom)))
	var after []int64
	for _, in := range survivors {
		after = append(after, sh.Shares[in.id])
	}
	fmt.Printf("3. Instance crash: %s SIGKILLed; lease TTL %v; its share %d goes to the %d others (%d → %d..%d each)\n",
		victim.id, c.leaseTTL, prev.Shares[victim.id], len(survivors), prev.Shares[survivors[0].id], slices.Min(after), slices.Max(after))
	tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "event\ttime after the SIGKILL\t")
	if ok {
		fmt.Fprintf(tw, "its instance key deleted (lease expired)\t%v\t\n", gone.Sub(killed).Round(time.Millisecond))
		fmt.Fprintf(tw, "its share held until (key deleted + fail_static)\t%v\t\n", (gone.Sub(killed) + schema.DefaultFailStatic).Round(time.Millisecond))
	}
	fmt.Fprintf(tw, "new shares published (generation %d, configd's clock)\t%v\t\n", sh.Generation, sh.Published.Sub(killed).Round(time.Millisecond))
	fmt.Fprintf(tw, "last survivor applied its new share\t%v\t\n", time.Duration(last-killed.UnixNano()).Round(time.Millisecond))
	fmt.Fprintf(tw, "new shares in force (boundary)\t%v\t\n", time.Duration(max(last, sh.EffectiveFrom)-killed.UnixNano()).Round(time.Millisecond))
	tw.Flush()
	fmt.Printf("(a lease expires one TTL after its last keep-alive, sent about every TTL/3, so a crashed instance's key\n"+
		" goes between about 2/3 TTL and one TTL after the crash; configd then keeps its share reserved for the\n"+
		" provider's fail_static, %v, since an instance only cut off from etcd keeps enforcing it that long)\n", schema.DefaultFailStatic)
	fmt.Printf("\netcd during the run (its own metrics, embedded here): %s\n", harness.EtcdHealth())
	fmt.Printf("total run time %v\n", time.Since(started).Round(time.Second))
	return nil
}

func printHeader(c config) {
	fmt.Printf("$ %s\n", strings.Join(append([]string{"go run ./bench/retune"}, os.Args[1:]...), " "))
	fmt.Println(harness.Facts())
	fmt.Printf("instances %d, window %v, lease TTL %v, report interval %v, retunes %d\n\n",
		c.instances, c.window, c.leaseTTL, c.report, c.retunes)
}

// instance is one instance process and what it reported.
type instance struct {
	id     string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	killed bool

	mu      sync.Mutex
	applied map[int64]appliedEvent // by generation, the first apply
	stats   chan stats
}

type appliedEvent struct {
	t, from, share int64
	source         string
}

type stats struct {
	t, unary, sent, recv, admitted int64
	methods                        map[string]int64
}

func startInstance(bin, endpoint, id string, c config) (*instance, error) {
	cmd := exec.Command(bin, "-etcd", endpoint, "-provider", provider, "-id", id,
		"-lease-ttl", c.leaseTTL.String(), "-report-interval", c.report.String(), "-window", c.window.String())
	cmd.Stderr = os.Stderr
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
	in := &instance{id: id, cmd: cmd, stdin: stdin, applied: map[int64]appliedEvent{}, stats: make(chan stats, 1)}
	go in.read(stdout)
	return in, nil
}

func (in *instance) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		kv := map[string]string{}
		for _, x := range f[1:] {
			k, v, _ := strings.Cut(x, "=")
			kv[k] = v
		}
		num := func(k string) int64 { n, _ := strconv.ParseInt(kv[k], 10, 64); return n }
		switch f[0] {
		case "applied":
			gen := num("gen")
			in.mu.Lock()
			if _, seen := in.applied[gen]; !seen && gen > 0 {
				in.applied[gen] = appliedEvent{t: num("t"), from: num("from"), share: num("share"), source: kv["source"]}
			}
			in.mu.Unlock()
		case "stats":
			st := stats{t: num("t"), unary: num("unary"), sent: num("stream_sent"), recv: num("stream_recv"), admitted: num("admitted"), methods: map[string]int64{}}
			st.methods = harness.ParseMethods(kv["methods"])
			in.stats <- st
		}
	}
}

func (in *instance) send(line string) {
	fmt.Fprintln(in.stdin, line)
}

// appliedGen returns when the instance applied generation gen.
func (in *instance) appliedGen(gen int64) (appliedEvent, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	ev, ok := in.applied[gen]
	return ev, ok
}

func (in *instance) stop() {
	if in.killed {
		return
	}
	in.send("quit")
	in.stdin.Close()
	done := make(chan struct{})
	go func() { in.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		in.cmd.Process.Kill()
		<-done
	}
}

func statsAll(insts []*instance) ([]stats, error) {
	out := make([]stats, len(insts))
	for i, in := range insts {
		in.send("stats")
		select {
		case out[i] = <-in.stats:
		case <-time.After(10 * time.Second):
			return nil, fmt.Errorf("%s: no stats", in.id)
		}
	}
	return out, nil
}

// lastApplied waits until every instance has applied generation sh and
// returns the latest apply time (Unix ns).
func lastApplied(insts []*instance, sh schema.Shares, timeout time.Duration) (int64, error) {
	deadline := time.Now().Add(timeout)
	for {
		var last int64
		missing := ""
		for _, in := range insts {
			ev, ok := in.appliedGen(sh.Generation)
			if !ok {
				missing = in.id
				break
			}
			if ev.share != sh.Shares[in.id] || ev.from != sh.EffectiveFrom {
				return 0, fmt.Errorf("%s applied generation %d as share %d from %d, published %d from %d",
					in.id, sh.Generation, ev.share, ev.from, sh.Shares[in.id], sh.EffectiveFrom)
			}
			last = max(last, ev.t)
		}
		if missing == "" {
			return last, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%s did not apply generation %d within %v", missing, sh.Generation, timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// settle waits for shares satisfying cond, applied by every instance and
// in force.
func settle(w *harness.Watcher, insts []*instance, timeout time.Duration, cond func(schema.Shares) bool) (schema.Shares, error) {
	deadline := time.Now().Add(timeout)
	for {
		sh, err := w.WaitShares(time.Until(deadline), cond)
		if err != nil {
			return sh, err
		}
		if _, err := lastApplied(insts, sh, 3*time.Second); err == nil {
			// A newer generation may have replaced it meanwhile (joins in
			// a burst): settle on the newest.
			if cur, _ := w.Latest(); cur.Generation == sh.Generation {
				time.Sleep(time.Until(time.Unix(0, sh.EffectiveFrom)))
				return sh, nil
			}
		}
		if time.Now().After(deadline) {
			return sh, fmt.Errorf("generation %d not applied by every instance within %v", sh.Generation, timeout)
		}
	}
}
