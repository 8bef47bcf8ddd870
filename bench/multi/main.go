// Command multi measures how closely sluice's instances, as separate OS
// processes, hold two limits of one downstream API at once — requests per
// second and tokens per ten seconds — under offered load above the binding
// one, for BENCHMARKS.md:
//
//   - per limit, the most the provider stub saw in any aligned window of
//     that limit, against the limit, and the windows over it (goal: none);
//   - utilization of the binding limit (tokens used / limit) averaged over
//     the whole windows after a warm-up (goal: ≥ 97%).
//
// Both limits are one provider's, configured through configd (configd
// set multi --limit 2000/1s --limit tokens=60000/10s; -algorithm, fair by
// default); each instance is an examples/httphandler process that joins
// every limit of it (-provider: cluster.JoinProvider). With
// -one-provider=false, each limit is a provider of its own and the
// instances join both (-provider, -tokens-provider: cluster.JoinGroup).
// Each admits a request only when both shares have room, calls the stub with
// its token estimate, and settles the tokens the stub says the call used
// (a random 50-100% of the estimate) back into the window charged. This
// program runs an embedded etcd, `configd serve` as a process, the stub
// (which counts what arrives in each aligned window of each limit, refused
// calls included) and the load: each instance gets HTTP requests at its
// own rate (-weights; equal by default), with estimates drawn uniformly
// from [-estimate-min, -estimate-max].
//
// The stub counts a call when it arrives, the limiter when it grants it.
// With settling, permits come free all through a window, so a call may be
// granted in its last moments and arrive in the next one; the instances'
// -transit (the limiter's guard band) keeps grants that far from a
// boundary.
//
//	go run ./bench/multi                   # 60 s
//	go run ./bench/multi -duration 30s     # a quick check
//	go run ./bench/multi -weights 50,16,13,9,6,3,2,1 -duration 120s -warmup 40s
//
// With -daily N the provider has a third limit, N requests per day: a
// budget, which the instances take from its counter in etcd; the program
// then says how many requests the stub saw in all against N, and what the
// counter says once every instance left (each gives back what it took and
// did not spend).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/internal/harness"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/internal/stub"
)

type config struct {
	requests, tokens         int64
	window, tokensWindow     time.Duration
	estMin, estMax           int64
	load                     float64
	weights                  []float64
	duration, warmup         time.Duration
	budget                   time.Duration
	keep                     bool
	requestsName, tokensName string
	algorithm                string
	transit                  time.Duration
	oneProvider              bool
	daily                    int64
}

func main() {
	c := config{requestsName: "multi", tokensName: "multi-tokens"}
	weights := "1,1,1,1,1,1,1,1"
	flag.Int64Var(&c.requests, "requests", 2000, "the requests limit, per -window")
	flag.DurationVar(&c.window, "window", time.Second, "the requests limit's window")
	flag.Int64Var(&c.tokens, "tokens", 60000, "the tokens limit, per -tokens-window")
	flag.DurationVar(&c.tokensWindow, "tokens-window", 10*time.Second, "the tokens limit's window")
	flag.Int64Var(&c.estMin, "estimate-min", 10, "least token estimate of a call")
	flag.Int64Var(&c.estMax, "estimate-max", 50, "largest token estimate of a call")
	flag.Float64Var(&c.load, "load", 3, "offered load, as a multiple of the tokens limit (at the mean use, 75% of the mean estimate)")
	flag.StringVar(&weights, "weights", weights, "share of the offered load of each instance, one per instance (normalised)")
	flag.DurationVar(&c.duration, "duration", 60*time.Second, "load time")
	flag.DurationVar(&c.warmup, "warmup", 10*time.Second, "time left out of the utilization at the start")
	flag.DurationVar(&c.budget, "budget", 200*time.Millisecond, "each request's latency budget (the instances' -budget)")
	flag.StringVar(&c.algorithm, "algorithm", "fair", "both providers' algorithm: fair or even")
	flag.DurationVar(&c.transit, "transit", 50*time.Millisecond, "the instances' -transit: no permit within it of a window boundary, so that no call granted in one window reaches the stub in the next")
	flag.BoolVar(&c.keep, "keep", false, "keep the work directory (etcd data, logs)")
	flag.BoolVar(&c.oneProvider, "one-provider", true, "both limits are one provider's (cluster.JoinProvider); false: a provider per limit (cluster.JoinGroup)")
	flag.Int64Var(&c.daily, "daily", 0, "a third limit of the provider: this many requests per day, a budget the instances take from its counter (0: none)")
	flag.Parse()
	if err := parse(&c, weights); err != nil {
		fmt.Fprintln(os.Stderr, "bench/multi:", err)
		os.Exit(2)
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench/multi:", err)
		os.Exit(1)
	}
}

func parse(c *config, weights string) error {
	var err error
	if c.weights, err = harness.Weights(weights, 1); err != nil {
		return err
	}
	if c.requests < 1 || c.tokens < 1 || c.estMin < 1 || c.estMax < c.estMin || c.load <= 0 {
		return errors.New("-requests, -tokens, -estimate-min/-max or -load out of range")
	}
	if c.duration < c.warmup+2*c.tokensWindow {
		return errors.New("-duration must leave two tokens windows after -warmup")
	}
	if c.daily < 0 || c.daily > 0 && !c.oneProvider {
		return errors.New("-daily must be positive, with -one-provider")
	}
	return nil
}

// rate is the offered requests per second in all: load times the tokens
// limit's rate, at the mean use per call.
func (c config) rate() float64 {
	meanUse := 0.75 * float64(c.estMin+c.estMax) / 2
	return c.load * float64(c.tokens) / c.tokensWindow.Seconds() / meanUse
}

func run(c config) error {
	fmt.Printf("$ %s\n%s\n", strings.Join(append([]string{"go run ./bench/multi"}, os.Args[1:]...), " "), harness.Facts())
	tmp, bins, cleanup, err := harness.WorkDir("sluice-multi-", c.keep, "./configd", "./examples/httphandler")
	if err != nil {
		return err
	}
	defer cleanup()
	etcd, endpoint, err := harness.StartEtcd("multi", filepath.Join(tmp, "etcd"))
	if err != nil {
		return err
	}
	defer etcd.Close()
	cd, err := harness.StartConfigd(bins[0], endpoint, filepath.Join(tmp, "configd.log"), "")
	if err != nil {
		return err
	}
	defer cd.Stop()
	requests, tokensLimit := fmt.Sprintf("%d/%v", c.requests, c.window), fmt.Sprintf("tokens=%d/%v", c.tokens, c.tokensWindow)
	sets := [][]string{{c.requestsName, "--limit", requests, "--limit", tokensLimit}}
	if c.daily > 0 {
		sets[0] = append(sets[0], "--limit", fmt.Sprintf("%d/24h", c.daily))
	}
	if !c.oneProvider {
		sets = [][]string{{c.requestsName, "--limit", requests}, {c.tokensName, "--limit", tokensLimit}}
	}
	for _, args := range sets {
		if _, err := cd.Run(append(append([]string{"set"}, args...), "--algorithm", c.algorithm)...); err != nil {
			return err
		}
	}
	st := stub.New(c.requests, c.window)
	tokens := stub.New(c.tokens, c.tokensWindow)
	st.Tokens(tokens, func(estimate int64) int64 { return estimate/2 + rand.Int64N(estimate/2+1) })
	stubURL, stopStub, err := serve(st)
	if err != nil {
		return err
	}
	defer stopStub()

	insts, err := startInstances(c, bins[1], endpoint, stubURL, tmp)
	defer func() {
		for _, in := range insts {
			in.stop()
		}
	}()
	if err != nil {
		return err
	}
	tokensOf := c.tokensName
	if c.oneProvider {
		tokensOf = c.requestsName
	}
	fmt.Printf("limits: %d requests per %v (provider %s) and %d tokens per %v (provider %s), %s; %d instances (examples/httphandler processes), budget %v, transit %v\n",
		c.requests, c.window, c.requestsName, c.tokens, c.tokensWindow, tokensOf, c.algorithm, len(insts), c.budget, c.transit)
	fmt.Printf("offered: %.0f requests/s in all (%.3g× the tokens limit at the mean use), weights %v, estimates %d-%d tokens, used 50-100%%\n\n",
		c.rate(), c.load, c.weights, c.estMin, c.estMax)

	if c.daily > 0 {
		fmt.Printf("and a daily budget of %d requests (provider %s~2), taken by the instances from its counter\n\n", c.daily, c.requestsName)
	}
	start := time.Now()
	results := offer(c, insts)
	report(c, st, tokens, start, results)
	if c.daily > 0 {
		for _, in := range insts {
			in.stop() // each gives back what it took and did not spend
		}
		return reportDaily(c, st, endpoint, start)
	}
	return nil
}

// reportDaily says what the stub saw of the daily budget, and what its
// counter says once every instance left.
func reportDaily(c config, st *stub.Stub, endpoint string, start time.Time) error {
	var seen int64
	for _, w := range st.Windows() {
		seen += w.Calls
	}
	day := start.UnixNano() - start.UnixNano()%int64(24*time.Hour)
	if end := time.Now().UnixNano(); end-end%int64(24*time.Hour) != day {
		fmt.Println("daily    the run crossed midnight (UTC): its requests fall in two days; not judged")
		return nil
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	key := schema.DefaultKeys().Budget(c.requestsName+"~2", 24*time.Hour, day)
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return err
	}
	var taken int64
	if len(resp.Kvs) > 0 {
		r, err := schema.DecodeBudgetRecord(resp.Kvs[0].Value)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		taken = r.Taken
	}
	over := 0
	if seen > c.daily {
		over = 1
	}
	fmt.Printf("daily    the stub saw %d requests of a budget of %d in the day (%d over); spent %.1f%%; the counter says %d taken once every instance left\n",
		seen, c.daily, over, 100*float64(seen)/float64(c.daily), taken)
	return nil
}

// serve serves h on a free loopback port.
func serve(h http.Handler) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return "http://" + ln.Addr().String() + "/", func() { srv.Close() }, nil
}

// instance is one httphandler process.
type instance struct {
	url  string
	cmd  *exec.Cmd
	rate float64
}

func (in *instance) stop() {
	in.cmd.Process.Signal(syscall.SIGTERM)
	in.cmd.Wait()
}

func startInstances(c config, bin, endpoint, stubURL, tmp string) ([]*instance, error) {
	var insts []*instance
	for i, w := range c.weights {
		addr := harness.FreeAddr()
		logf, err := os.Create(filepath.Join(tmp, fmt.Sprintf("inst-%d.log", i+1)))
		if err != nil {
			return insts, err
		}
		args := []string{"-listen", addr, "-etcd-endpoints", endpoint, "-provider", c.requestsName,
			"-downstream", stubURL, "-instance-id", fmt.Sprintf("inst-%d", i+1),
			"-budget", c.budget.String(), "-window", c.window.String(), "-transit", c.transit.String()}
		if !c.oneProvider {
			args = append(args, "-tokens-provider", c.tokensName)
		}
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			return insts, err
		}
		insts = append(insts, &instance{url: "http://" + addr + "/", cmd: cmd, rate: c.rate() * w})
	}
	// Ready when it answers, and its two shares are in force: one request
	// admitted.
	deadline := time.Now().Add(60 * time.Second)
	for _, in := range insts {
		for {
			if code, err := get(http.DefaultClient, in.url, c.estMin); err == nil && code == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				return insts, fmt.Errorf("instance %s not admitting within 60 s (logs in %s)", in.url, tmp)
			}
			time.Sleep(50 * time.Millisecond) // polling a process we started
		}
	}
	return insts, nil
}

func get(cl *http.Client, url string, estimate int64) (int, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Tokens", strconv.FormatInt(estimate, 10))
	resp, err := cl.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// results counts the instances' answers.
type results struct {
	ok, refused, other, failed atomic.Int64
}

// offer sends each instance requests at its rate, open-loop, for the
// duration.
func offer(c config, insts []*instance) *results {
	var r results
	cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512, IdleConnTimeout: time.Minute}, Timeout: 5 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), c.duration)
	defer cancel()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2048)
	for _, in := range insts {
		wg.Go(func() {
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			var due float64
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				for due += in.rate / 1000; due >= 1; due-- {
					sem <- struct{}{}
					wg.Go(func() {
						defer func() { <-sem }()
						code, err := get(cl, in.url, c.estMin+rand.Int64N(c.estMax-c.estMin+1))
						switch {
						case err != nil:
							r.failed.Add(1)
						case code == http.StatusOK:
							r.ok.Add(1)
						case code == http.StatusServiceUnavailable:
							r.refused.Add(1)
						default:
							r.other.Add(1)
						}
					})
				}
			}
		})
	}
	wg.Wait()
	return &r
}

func report(c config, st, tokens *stub.Stub, start time.Time, r *results) {
	from := start.Add(c.warmup)
	fmt.Printf("answers: %d admitted, %d refused by the instances (503), %d other (504: the call outlasted its budget; 502), %d failed\n\n",
		r.ok.Load(), r.refused.Load(), r.other.Load(), r.failed.Load())
	for _, lm := range []struct {
		name  string
		s     *stub.Stub
		limit int64
		w     time.Duration
	}{{"requests", st, c.requests, c.window}, {"tokens", tokens, c.tokens, c.tokensWindow}} {
		var n, over, overAll int
		var most, sum int64
		var utils []string
		minUtil := math.Inf(1)
		for _, w := range lm.s.Windows() {
			if w.Over() {
				overAll++
			}
			if w.Start.Before(from) || w.Start.Add(lm.w).After(start.Add(c.duration)) {
				continue // the warm-up, and the window the load ended in
			}
			n++
			most, sum = max(most, w.Calls), sum+w.Calls
			if w.Over() {
				over++
			}
			u := float64(w.Calls) / float64(w.Limit)
			minUtil = min(minUtil, u)
			utils = append(utils, fmt.Sprintf("%.1f%%", 100*u))
		}
		if n == 0 {
			fmt.Printf("%-8s no whole window after the warm-up\n", lm.name)
			continue
		}
		fmt.Printf("%-8s %d windows of %v after the warm-up: most %d of %d, %d over (%d over in the whole run); utilization mean %.1f%%, lowest %.1f%%\n",
			lm.name, n, lm.w, most, lm.limit, over, overAll, 100*float64(sum)/float64(int64(n)*lm.limit), 100*minUtil)
		if lm.w >= 5*time.Second {
			fmt.Printf("         each window: %s\n", strings.Join(utils, " "))
		}
	}
}
