// Command adaptive measures how well a fleet follows a provider whose limit
// moves, for BENCHMARKS.md. A provider stub in this process enforces a
// hidden limit per wall-clock-aligned window, answers the calls beyond it
// with 429 and Retry-After (seconds to its next window, rounded up, as
// HTTP wants), and says on every answer what is left of its window
// (x-ratelimit-remaining-requests, x-ratelimit-reset-requests, as OpenAI
// does). Its limit moves during each run (-schedule, 1000 → 600 → 900 per
// second by default). 8 instance processes (bench/adaptive/instance) offer
// more than it allows, and four contenders run one after the other against
// the same schedule:
//
//   - sluice adaptive: configd's controller, ceiling -ceiling, floor 10%;
//   - sluice static at the ceiling: the operator's limit, never moved;
//   - per-instance adaptation: each instance alone (AIMD over x/time/rate,
//     with a pause for Retry-After), no coordination;
//   - sluice static at the true limit: configd set to the stub's limit at
//     the instant it changes (the ideal, which no one can know).
//
// Per contender: goodput (calls the stub accepted) as a share of its true
// limit, the share of calls answered 429, and the time to converge after
// each change: from the change to the end of the last window before the
// next change that missed either goal (accepted < 95% of the limit, or
// 429s > 1% of it); "never" if the phase's last window missed.
//
//	go run ./bench/adaptive
//	go run ./bench/adaptive -remaining=false   # a provider that only says 429
//	go run ./bench/adaptive -phase 20s -schedule 1000,500,800
//
// etcd is embedded in this process; configd serve and each instance are
// separate processes (built with go build).
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"go.etcd.io/etcd/api/v3/version"

	"github.com/sluice-go/sluice/internal/harness"
)

type config struct {
	instances int
	rate      int
	ceiling   int64
	schedule  []int64
	phase     time.Duration
	warmup    time.Duration
	keep      bool
	only      string
	report    time.Duration
	round     time.Duration
	remaining bool
}

func main() {
	var c config
	sched := "1000,600,900"
	flag.IntVar(&c.instances, "instances", 8, "instances (separate processes)")
	flag.IntVar(&c.rate, "rate", 250, "calls each instance offers per second")
	flag.Int64Var(&c.ceiling, "ceiling", 1000, "the operator's limit (the adaptive ceiling, the static limit)")
	flag.StringVar(&sched, "schedule", sched, "the provider's hidden limits per second, one per phase")
	flag.DurationVar(&c.phase, "phase", 15*time.Second, "how long each limit lasts")
	flag.DurationVar(&c.warmup, "warmup", 5*time.Second, "before the first phase: the instances join")
	flag.DurationVar(&c.report, "report-interval", time.Second, "instances' report interval (cluster.DefaultReportInterval is 1s)")
	flag.DurationVar(&c.round, "adaptive-interval", 500*time.Millisecond, "configd serve --adaptive-interval (the default is 500ms)")
	flag.BoolVar(&c.remaining, "remaining", true, "the stub says what is left of its window on every answer (off: only 429 and Retry-After)")
	flag.BoolVar(&c.keep, "keep", false, "keep the temp dir (etcd data, binaries, configd log)")
	flag.StringVar(&c.only, "only", "", "run only the contenders whose names contain this")
	flag.Parse()
	for _, s := range strings.Split(sched, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench/adaptive: bad -schedule %q\n", sched)
			os.Exit(2)
		}
		c.schedule = append(c.schedule, n)
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench/adaptive:", err)
		os.Exit(1)
	}
}

// contender is one way of limiting the fleet.
type contender struct {
	name     string
	provider string // sluice: the provider joined; "": local
	setArgs  []string
	follow   bool // configd set to the stub's limit at each change
}

// result is what the stub saw of one contender.
type result struct {
	name              string
	accepted, refused int64
	truth             int64
	converge          []string // per change
	windows           []window
}

func run(c config) error {
	fmt.Printf("# bench/adaptive, %s\n", harness.Facts())
	fmt.Printf("instances %d offering %d calls/s each, report interval %v; configd --adaptive-interval %v; ceiling %d/s; hidden limit %v per second, %v each; remaining headers %v\n",
		c.instances, c.rate, c.report, c.round, c.ceiling, c.schedule, c.phase, c.remaining)
	tmp, bins, cleanup, err := harness.WorkDir("sluice-adaptive-", c.keep, "./configd", "./bench/adaptive/instance")
	if err != nil {
		return err
	}
	defer cleanup()
	etcd, endpoint, err := harness.StartEtcd("adaptive", filepath.Join(tmp, "etcd"))
	if err != nil {
		return err
	}
	defer etcd.Close()
	cd, err := harness.StartConfigd(bins[0], endpoint, filepath.Join(tmp, "configd.log"), "--adaptive-interval "+c.round.String())
	if err != nil {
		return err
	}
	defer cd.Stop()
	fmt.Printf("etcd %s embedded in this process; configd serve pid %d; instances: separate processes\n\n", version.Version, cd.Cmd.Process.Pid)

	st := &stub{window: time.Second, remaining: c.remaining}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: st}
	go srv.Serve(ln)
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/"

	ceiling := strconv.FormatInt(c.ceiling, 10)
	contenders := []contender{
		{name: "sluice adaptive", provider: "adaptive", setArgs: []string{"--limit", ceiling + "/1s", "--adaptive", fmt.Sprintf("floor=%d", max(1, c.ceiling/10))}},
		{name: "sluice static at the ceiling", provider: "static", setArgs: []string{"--limit", ceiling + "/1s"}},
		{name: "per-instance adaptation", provider: ""},
		{name: "sluice static at the true limit", provider: "ideal", setArgs: []string{"--limit", strconv.FormatInt(c.schedule[0], 10) + "/1s"}, follow: true},
	}
	var results []result
	for _, ct := range contenders {
		if c.only != "" && !strings.Contains(ct.name, c.only) {
			continue
		}
		r, err := runOne(c, cd, bins[1], endpoint, url, st, ct)
		if err != nil {
			return fmt.Errorf("%s: %w", ct.name, err)
		}
		results = append(results, r)
		fmt.Printf("%s: done\n", ct.name)
	}
	printTable(c, results)
	if c.keep {
		for _, r := range results {
			f, err := os.Create(filepath.Join(tmp, strings.ReplaceAll(r.name, " ", "-")+".csv"))
			if err != nil {
				return err
			}
			fmt.Fprintln(f, "start,limit,accepted,refused")
			for _, w := range r.windows {
				fmt.Fprintf(f, "%d,%d,%d,%d\n", w.start.Unix(), w.limit, w.accepted, w.refused)
			}
			f.Close()
		}
	}
	return nil
}

// runOne runs one contender through the schedule.
func runOne(c config, cd *harness.Configd, bin, endpoint, url string, st *stub, ct contender) (result, error) {
	if ct.provider != "" {
		if _, err := cd.Run(append([]string{"set", ct.provider}, ct.setArgs...)...); err != nil {
			return result{}, err
		}
	}
	st.reset(c.schedule[0])
	var procs []*exec.Cmd
	var stdins []io.WriteCloser
	defer func() {
		for _, in := range stdins {
			in.Close()
		}
		for _, p := range procs {
			p.Wait()
		}
	}()
	joined := make(chan struct{}, c.instances)
	for i := range c.instances {
		mode := "sluice"
		if ct.provider == "" {
			mode = "local"
		}
		cmd := exec.Command(bin, "-mode", mode, "-etcd", endpoint, "-provider", ct.provider, "-id", fmt.Sprintf("inst-%d", i),
			"-url", url, "-rate", strconv.Itoa(c.rate), "-report-interval", c.report.String(), "-local-max", strconv.FormatInt(c.ceiling/int64(c.instances), 10))
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return result{}, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return result{}, err
		}
		if err := cmd.Start(); err != nil {
			return result{}, err
		}
		procs, stdins = append(procs, cmd), append(stdins, in)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "joined") {
					joined <- struct{}{}
				}
			}
		}()
	}
	for range c.instances {
		select {
		case <-joined:
		case <-time.After(60 * time.Second):
			return result{}, fmt.Errorf("instances did not join")
		}
	}
	time.Sleep(c.warmup) // a benchmark's settling time, not a synchronisation
	var changes []time.Time
	for i, limit := range c.schedule {
		// Change at a window boundary, so that every window has one limit.
		// The stub fixes a window's limit when its first call arrives, so
		// the change goes in just before the boundary.
		next := time.Now().Truncate(time.Second).Add(time.Second)
		time.Sleep(time.Until(next.Add(-5 * time.Millisecond)))
		st.setLimit(limit)
		changes = append(changes, next)
		if ct.follow && i > 0 {
			if _, err := cd.Run("set", ct.provider, "--limit", strconv.FormatInt(limit, 10)+"/1s"); err != nil {
				return result{}, err
			}
		}
		time.Sleep(c.phase)
	}
	end := time.Now().Truncate(time.Second)
	ws := st.windows(changes[0], end)
	r := result{name: ct.name, windows: ws}
	for _, w := range ws {
		r.accepted += w.accepted
		r.refused += w.refused
		r.truth += w.limit
	}
	for i := range changes {
		to := end
		if i+1 < len(changes) {
			to = changes[i+1]
		}
		r.converge = append(r.converge, converge(ws, changes[i], to))
	}
	return r, nil
}

// converge returns the time from the change at from to the end of the
// last window before to that missed a goal, "0s" if none did, or "never"
// if the last one did.
func converge(ws []window, from, to time.Time) string {
	last := time.Time{}
	var lastStart time.Time
	for _, w := range ws {
		if w.start.Before(from) || !w.start.Before(to) {
			continue
		}
		lastStart = w.start
		if float64(w.accepted) < 0.95*float64(w.limit) || float64(w.refused) > 0.01*float64(w.limit) {
			last = w.start.Add(time.Second)
		}
	}
	switch {
	case last.IsZero():
		return "0s"
	case !last.Before(lastStart.Add(time.Second)):
		return "never"
	}
	return last.Sub(from).String()
}

func printTable(c config, rs []result) {
	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	head := "contender\tgoodput (of the true limit)\tanswered 429"
	for i := 1; i < len(c.schedule); i++ {
		head += fmt.Sprintf("\tconverged after %d → %d", c.schedule[i-1], c.schedule[i])
	}
	fmt.Fprintln(tw, head)
	for _, r := range rs {
		line := fmt.Sprintf("%s\t%.1f%%\t%.2f%%", r.name, 100*float64(r.accepted)/float64(max(r.truth, 1)),
			100*float64(r.refused)/float64(max(r.accepted+r.refused, 1)))
		for _, cv := range r.converge[1:] {
			line += "\t" + cv
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	fmt.Printf("\nfirst phase (%d, from the start) converged: ", c.schedule[0])
	for _, r := range rs {
		fmt.Printf("%s %s; ", r.name, r.converge[0])
	}
	fmt.Println()
}

// window is one aligned window as the stub saw it.
type window struct {
	start             time.Time
	limit             int64
	accepted, refused int64
}

// stub is the provider: a hidden limit per aligned window.
type stub struct {
	window    time.Duration
	remaining bool // send x-ratelimit-remaining-requests and -reset-requests
	mu        sync.Mutex
	limit     int64
	wins      map[int64]*window
}

func (s *stub) reset(limit int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limit, s.wins = limit, map[int64]*window{}
}

func (s *stub) setLimit(limit int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limit = limit
}

func (s *stub) windows(from, to time.Time) []window {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []window
	for t := from; t.Before(to); t = t.Add(s.window) {
		w := s.wins[t.UnixNano()/int64(s.window)]
		if w == nil {
			w = &window{start: t, limit: s.limit} // nothing arrived
		}
		out = append(out, *w)
	}
	slices.SortFunc(out, func(a, b window) int { return a.start.Compare(b.start) })
	return out
}

func (s *stub) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	now := time.Now()
	k := now.UnixNano() / int64(s.window)
	s.mu.Lock()
	w := s.wins[k]
	if w == nil {
		w = &window{start: time.Unix(0, k*int64(s.window)), limit: s.limit}
		s.wins[k] = w
	}
	ok := w.accepted < w.limit
	if ok {
		w.accepted++
	} else {
		w.refused++
	}
	left := w.limit - w.accepted
	s.mu.Unlock()
	reset := w.start.Add(s.window).Sub(now)
	if s.remaining {
		rw.Header().Set("x-ratelimit-remaining-requests", strconv.FormatInt(left, 10))
		rw.Header().Set("x-ratelimit-reset-requests", reset.Round(time.Millisecond).String())
	}
	if !ok {
		rw.Header().Set("Retry-After", strconv.FormatInt(int64((reset+time.Second-1)/time.Second), 10))
		rw.WriteHeader(http.StatusTooManyRequests)
		return
	}
	rw.WriteHeader(http.StatusOK)
}
