// Command scale measures what coordination costs as a provider's fleet
// grows, for BENCHMARKS.md: N real cluster.Members (each with its own etcd
// client, all in this process) against an embedded etcd in this process
// and a `configd serve` process, for each N of -n.
//
// For each N it reports:
//
//   - join: the time from the last member's Join returning to every
//     member enforcing its even share of the whole limit;
//
//   - per member, while configd retunes the limit every -every (shares
//     move for every member each time): watch events and bytes received
//     per second, counted client-side by gRPC interceptors (mean and the
//     busiest member);
//
//   - etcd: requests per second in total (gRPC messages the server
//     received, from its own metrics), and the database's growth;
//
//   - configd: CPU seconds per second (/proc);
//
//   - publish: from `configd set` returning to a watch of the share
//     records alone (a client of its own in this process) seeing the first
//     record of the publish it caused (p50/p99; an upper bound, the
//     watch's delivery included);
//
//   - retune: from `configd set` returning to every member having applied
//     its new share (p50/p99); a retune not in force everywhere within
//     -settle is counted unsettled, at -settle, and the next one made;
//
//   - over: aligned windows in which the members' quotas, sampled every
//     -sample, added up to more than the total of the shares in force for
//     that window (the newest publish whose boundary it has reached).
//
// -coordination ledger measures a provider created on the ledger
// (schema.CoordinationLedger) instead, and both measures each N on both,
// one after the other, each on an etcd and a configd of its own. For the
// ledger, "publish" is until a watch of the ledger's head sees the new
// limit in it (a lowering that the open publish's grants fit writes no
// publish); "retune" until every member's limiter enforces its even share
// of the new limit; "over" judges a window by the limit the ledger's head
// puts in force for it. Two figures say what each of configd's
// rounds reads: etcd's Range requests per second (a round reads the
// ledger in one; the members read nothing in the steady phase) and the
// ledger's size, keys and bytes, read after each retune.
//
// One process holds N members' etcd clients and an etcd, where a
// deployment runs one member per process: its heap is N clients', and so
// is the garbage collector's work on every cycle, taken from the 2 cores
// the members share. -gogc (default 400, debug.SetGCPercent) makes the
// collector run less often; with Go's default of 100, N = 2,000 spent 23%
// of this process's CPU in it (assists and marking, in a -cpuprofile of a
// whole run) and a retune's record reached the last members after its
// boundary (BENCHMARKS.md, section 12).
//
//	go run ./bench/scale
//	go run ./bench/scale -n 100,1000 -retunes 10
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/follow"
	"github.com/sluice-go/sluice/internal/harness"
	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter/cluster"
)

const provider = "scale"

type options struct {
	keep      bool
	configd   string   // extra flags for configd serve
	txnOps    int      // configd's --etcd-max-txn-ops
	memberLog *os.File // nil: the members' logs are discarded
	sizes     []int
	limit     int64
	window    time.Duration
	report    time.Duration
	retunes   int
	every     time.Duration
	sample    time.Duration
	verbose   bool // print each retune: its time, and the member that settled last
	gogc      int  // debug.SetGCPercent for this process
	settle    time.Duration
	coords    []string
}

// result is one N's row.
type result struct {
	n                         int
	coord                     string
	join                      time.Duration
	eventsMean, eventsMax     float64 // per member per second
	bytesMean, bytesMax       float64
	eventsRetune, bytesRetune float64 // per member per retune (mean)
	etcdReqs                  float64 // per second, all clients
	etcdRanges                float64 // Range requests per second
	ledgerKeys, ledgerBytes   float64 // the ledger's size after a retune (mean)
	dbGrowth                  float64 // bytes per second
	configdCPU                float64 // CPU seconds per second
	publishP50, publishP99    time.Duration
	retuneP50, retuneP99      time.Duration
	windows, over, retunesRan int
	unsettled                 int // retunes not in force everywhere within -settle
}

func main() {
	sizes := flag.String("n", "100,250,500,1000,2000", "fleet sizes, comma-separated")
	o := options{}
	flag.Int64Var(&o.limit, "limit", 1_000_000, "the provider's limit per window")
	flag.DurationVar(&o.window, "window", time.Second, "the provider's window")
	flag.DurationVar(&o.report, "report", time.Second, "the members' report interval")
	flag.IntVar(&o.retunes, "retunes", 8, "retunes per fleet size")
	flag.DurationVar(&o.every, "every", 2*time.Second, "time between retunes")
	flag.DurationVar(&o.sample, "sample", 50*time.Millisecond, "how often every member's quota is sampled")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (etcd's data, configd's log)")
	flag.StringVar(&o.configd, "configd", "", "extra flags for configd serve, space-separated (as -configd='--propagation-margin 300ms')")
	flag.IntVar(&o.txnOps, "txnops", harness.EtcdMaxTxnOps, "configd's --etcd-max-txn-ops (128: etcd's default)")
	cpuProfile := flag.String("cpuprofile", "", "write this process's CPU profile (members, etcd, the harness) to this file")
	flag.BoolVar(&o.verbose, "v", false, "print each retune's time and the member that settled last")
	flag.IntVar(&o.gogc, "gogc", 400, "the garbage collector's target percentage for this process, which holds every member (debug.SetGCPercent)")
	memberLog := flag.String("memberlog", "", "append the members' warnings and errors to this file")
	flag.DurationVar(&o.settle, "settle", 2*time.Minute, "the longest a retune is waited for; one not in force everywhere by then is counted unsettled (at this time) and the next is made")
	coord := flag.String("coordination", "shares", "the provider's coordination: shares, ledger, or both (each N on each)")
	flag.Parse()
	switch *coord {
	case "shares", "ledger":
		o.coords = []string{*coord}
	case "both":
		o.coords = []string{"shares", "ledger"}
	default:
		fmt.Fprintf(os.Stderr, "scale: -coordination: %q: want shares, ledger or both\n", *coord)
		os.Exit(2)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "scale: -cpuprofile:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	if *memberLog != "" {
		f, err := os.OpenFile(*memberLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "scale: -memberlog:", err)
			os.Exit(2)
		}
		defer f.Close()
		o.memberLog = f
	}
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "scale: -n: %q is not a fleet size\n", f)
			os.Exit(2)
		}
		o.sizes = append(o.sizes, n)
	}
	debug.SetGCPercent(o.gogc)
	if err := run(o); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	fmt.Println(harness.Facts())
	dir, bins, cleanup, err := harness.WorkDir("sluice-scale-", o.keep, "./configd")
	if err != nil {
		return err
	}
	defer cleanup()
	fmt.Printf("limit %d per %v, report interval %v, %d retunes %v apart per size; one process holds every member, GOGC %d\n\n",
		o.limit, o.window, o.report, o.retunes, o.every, o.gogc)
	var rows []result
	for _, n := range o.sizes {
		for _, coord := range o.coords {
			r, err := measure(o, n, coord, filepath.Join(dir, coord+"-"+strconv.Itoa(n)), bins[0])
			if err != nil {
				printRows(rows) // what was measured before
				return fmt.Errorf("N=%d, %s: %w", n, coord, err)
			}
			rows = append(rows, r)
			fmt.Printf("N=%d %s done: %s\n", n, coord, harness.EtcdHealth())
		}
	}
	printRows(rows)
	if len(o.coords) == 2 {
		printRatios(rows)
	}
	return nil
}

func printRows(rows []result) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "N\tcoordination\tjoin→all\tevents/member/s\t(max)\tbytes/member/s\t(max)\tevents/member/retune\tbytes/member/retune\tetcd req/s\t(Range)\tdb growth KiB/s\tconfigd CPU\tpublish p50\tp99\tretune p50\tp99\twindows\tover\tunsettled\tledger keys\tKiB\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%v\t%.2f\t%.2f\t%.0f\t%.0f\t%.1f\t%.0f\t%.0f\t%.0f\t%.1f\t%.0f%%\t%v\t%v\t%v\t%v\t%d\t%d\t%d\t%.0f\t%.0f\t\n", r.n, r.coord, r.join.Round(time.Millisecond),
			r.eventsMean, r.eventsMax, r.bytesMean, r.bytesMax, r.eventsRetune, r.bytesRetune, r.etcdReqs, r.etcdRanges, r.dbGrowth/1024, 100*r.configdCPU,
			r.publishP50, r.publishP99, r.retuneP50, r.retuneP99, r.windows, r.over, r.unsettled, r.ledgerKeys, r.ledgerBytes/1024)
	}
	tw.Flush()
}

// printRatios prints, for each N measured on both, the ledger's figures
// over the shares'.
func printRatios(rows []result) {
	fmt.Println("\nledger / shares:")
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "N\tretune p99\tevents/member/retune\tetcd req/s\tconfigd CPU\tdb growth\t")
	for i, l := range rows {
		if l.coord != "ledger" || i == 0 || rows[i-1].n != l.n {
			continue
		}
		s := rows[i-1]
		fmt.Fprintf(tw, "%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", l.n, float64(l.retuneP99)/float64(s.retuneP99), l.eventsRetune/s.eventsRetune,
			l.etcdReqs/s.etcdReqs, l.configdCPU/s.configdCPU, l.dbGrowth/s.dbGrowth)
	}
	tw.Flush()
}

// fleet is the members of one N and their counters.
type fleet struct {
	members  []*cluster.Member
	counters []*harness.Counter
	clients  []*clientv3.Client
}

func (f *fleet) close() {
	var wg sync.WaitGroup
	for i, m := range f.members {
		wg.Go(func() {
			m.Close()
			f.clients[i].Close()
		})
	}
	wg.Wait()
}

func measure(o options, n int, coord, dir, configdBin string) (result, error) {
	res := result{n: n, coord: coord}
	led := coord == "ledger"
	etcd, url, err := harness.StartEtcd("scale", dir)
	if err != nil {
		return res, err
	}
	defer etcd.Close()
	extra := strings.TrimSpace(fmt.Sprintf("--etcd-max-txn-ops %d %s", o.txnOps, o.configd))
	cd, err := harness.StartConfigd(configdBin, url, dir+"-configd.log", extra)
	if err != nil {
		return res, err
	}
	defer cd.Stop()
	args := []string{"set", provider, "--limit", strconv.FormatInt(o.limit, 10), "--window", o.window.String()}
	if led {
		args = append(args, "--coordination", "ledger")
	}
	if _, err := cd.Run(args...); err != nil {
		return res, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f, err := join(ctx, o, n, url)
	defer f.close()
	if err != nil {
		return res, err
	}
	t0 := time.Now()
	if _, err := settle(ctx, f, o.limit, led, 2*time.Minute); err != nil {
		return res, fmt.Errorf("after the joins: %w", err)
	}
	res.join = time.Since(t0)

	watchCli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second})
	if err != nil {
		return res, err
	}
	defer watchCli.Close()
	pubCli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second})
	if err != nil {
		return res, err
	}
	defer pubCli.Close()
	rec := newRecorder(ctx, watchCli, pubCli, f.members, o.sample, led)
	defer rec.stop()

	// The steady phase: retunes every o.every, counted from here.
	before := snapshot(ctx, f, watchCli, url, cd.Cmd.Process.Pid)
	limits := []int64{o.limit * 9 / 10, o.limit}
	var lat, pub []time.Duration
	var sizes [][2]int64 // the ledger's keys and bytes after each retune
	for i := range o.retunes {
		next := limits[i%2]
		begun := time.Now()
		if _, err := cd.Run("set", provider, "--limit", strconv.FormatInt(next, 10)); err != nil {
			return res, err
		}
		// From set returning, the config written: what the coordination
		// takes, not the start of the CLI's process.
		start := time.Now()
		last, err := settle(ctx, f, next, led, o.settle)
		switch {
		case errors.Is(err, errUnsettled):
			// Counted at the wait, and the next retune made: the
			// figures of the others still say what the rest costs.
			res.unsettled++
			last = err.Error()
		case err != nil:
			return res, fmt.Errorf("retune %d to %d: %w", i, next, err)
		}
		lat = append(lat, time.Since(start))
		if led {
			if k, b, err := ledgerSize(ctx, watchCli); err == nil {
				sizes = append(sizes, [2]int64{k, b})
			}
		}
		if d, ok := rec.published(ctx, start, next); ok {
			pub = append(pub, d)
		}
		if o.verbose {
			fmt.Printf("N=%d retune %d to %d: set returned %s, settled after %v; last to settle: %s\n",
				len(f.members), i, next, start.UTC().Format("15:04:05.000"), lat[len(lat)-1].Round(time.Millisecond), last)
		}
		rec.retuned(begun, time.Now(), limits[(i+1)%2], next)
		if rest := o.every - time.Since(begun); rest > 0 {
			time.Sleep(rest) // the pace of the retunes, not a synchronisation
		}
	}
	after := snapshot(ctx, f, watchCli, url, cd.Cmd.Process.Pid)
	secs := after.at.Sub(before.at).Seconds()
	var ev, by []float64
	for i := range f.members {
		ev = append(ev, float64(after.events[i]-before.events[i])/secs)
		by = append(by, float64(after.bytes[i]-before.bytes[i])/secs)
	}
	res.eventsMean, res.eventsMax = harness.Mean(ev), slices.Max(ev)
	res.bytesMean, res.bytesMax = harness.Mean(by), slices.Max(by)
	res.eventsRetune = res.eventsMean * secs / float64(len(lat))
	res.bytesRetune = res.bytesMean * secs / float64(len(lat))
	res.etcdReqs = (after.etcdMsgs - before.etcdMsgs) / secs
	res.etcdRanges = (after.etcdRanges - before.etcdRanges) / secs
	for _, sz := range sizes {
		res.ledgerKeys += float64(sz[0]) / float64(len(sizes))
		res.ledgerBytes += float64(sz[1]) / float64(len(sizes))
	}
	res.dbGrowth = float64(after.db-before.db) / secs
	res.configdCPU = (after.configdCPU - before.configdCPU) / secs
	res.retuneP50, res.retuneP99, res.retunesRan = harness.Pct(lat, 50), harness.Pct(lat, 99), len(lat)
	if len(pub) > 0 {
		res.publishP50, res.publishP99 = harness.Pct(pub, 50), harness.Pct(pub, 99)
	}
	rec.stop()
	res.windows, res.over = rec.check(o.window)
	return res, nil
}

// join starts n members, 32 at a time, each with its own counted client.
func join(ctx context.Context, o options, n int, url string) (*fleet, error) {
	f := &fleet{members: make([]*cluster.Member, n), counters: make([]*harness.Counter, n), clients: make([]*clientv3.Client, n)}
	sem := make(chan struct{}, 32)
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	log := slog.New(slog.DiscardHandler)
	if o.memberLog != nil {
		log = slog.New(slog.NewTextHandler(o.memberLog, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			c := harness.NewCounter()
			cli, err := c.Dial(url)
			if err == nil {
				var m *cluster.Member
				m, err = cluster.Join(ctx, cli, provider, cluster.WithID(fmt.Sprintf("m-%05d", i)),
					cluster.WithReportInterval(o.report), cluster.WithFallback(0, o.window), cluster.WithLogger(log))
				mu.Lock()
				f.members[i], f.counters[i], f.clients[i] = m, c, cli
				mu.Unlock()
			}
			if err != nil {
				mu.Lock()
				first = cmpErr(first, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// Keep what joined, so that close stops it.
	k := 0
	for i := range f.members {
		if f.members[i] != nil {
			f.members[k], f.counters[k], f.clients[k] = f.members[i], f.counters[i], f.clients[i]
			k++
		} else if f.clients[i] != nil {
			f.clients[i].Close()
		}
	}
	f.members, f.counters, f.clients = f.members[:k], f.counters[:k], f.clients[:k]
	return f, first
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// errUnsettled is settle's error when the members did not all enforce
// their share in time.
var errUnsettled = errors.New("the members did not all enforce")

// settle waits until every member enforces its share of limit (the even
// split of configd: limit/N, the remainder to the first), from configd's
// shares, with the share in force in its limiter; or, on the ledger, with
// its grants' quota in force in its limiter.
// It returns the state of the member that was found not to enforce its
// share last, in the last poll before they all did.
func settle(ctx context.Context, f *fleet, limit int64, led bool, wait time.Duration) (last string, err error) {
	deadline := time.Now().Add(wait)
	n := int64(len(f.members))
	for {
		var sum int64
		ok, why := true, ""
		for _, m := range f.members {
			st, q := m.Status(), m.Limiter().Stats().Quota
			if led && (st.Source != follow.SourceLedger || q < limit/n) {
				ok, why = false, fmt.Sprintf("%s: source %s, quota in force %d", m.ID(), st.Source, q)
				break
			}
			if !led && (st.Source != follow.SourceShares || st.Total != limit || st.Share < limit/n || q != st.Share) {
				ok, why = false, fmt.Sprintf("%s: source %s, share %d of %d (generation %d), quota in force %d", m.ID(), st.Source, st.Share, st.Total, st.Generation, q)
				break
			}
			sum += q
		}
		if ok && sum == limit {
			return last, nil
		}
		if ok {
			why = fmt.Sprintf("the quotas in force add up to %d", sum)
		}
		if why != "" {
			last = time.Now().UTC().Format("15:04:05.000 ") + why
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("%w: their share of %d within %v: %s", errUnsettled, limit, wait, why)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(20 * time.Millisecond): // polling Status: a Member offers no event
		}
	}
}

// state is the counters at one moment.
type state struct {
	at            time.Time
	events, bytes []int64
	etcdMsgs      float64
	etcdRanges    float64
	db            int64
	configdCPU    float64 // seconds
}

func snapshot(ctx context.Context, f *fleet, cli *clientv3.Client, url string, configdPid int) state {
	s := state{at: time.Now()}
	for _, c := range f.counters {
		s.events = append(s.events, c.WatchEvents.Load())
		s.bytes = append(s.bytes, c.RecvBytes.Load())
	}
	if mfs, err := prometheus.DefaultGatherer.Gather(); err == nil {
		for _, mf := range mfs {
			if mf.GetName() == "grpc_server_msg_received_total" {
				for _, m := range mf.GetMetric() {
					s.etcdMsgs += m.GetCounter().GetValue()
					for _, l := range m.GetLabel() {
						if l.GetName() == "grpc_method" && l.GetValue() == "Range" {
							s.etcdRanges += m.GetCounter().GetValue()
						}
					}
				}
			}
		}
	}
	if st, err := cli.Status(ctx, url); err == nil {
		s.db = st.DbSize
	}
	s.configdCPU = harness.CPUSeconds(configdPid)
	return s
}

// retune is a change of the limit, from when it was made until every
// member enforced its new share.
type retune struct {
	start, end time.Time
	from, to   int64
}

// recorder samples every member's quota per window, and follows the
// published shares, until stopped.
type recorder struct {
	led     bool // the provider's coordination is the ledger
	mu      sync.Mutex
	quotas  map[int64]map[int]int64 // window start → member → most enforced
	views   []schema.Shares         // every view of the share records, in order
	head    ledger.Head             // the ledger's head, read once stopped: its limits in force
	pubs    []seenTotal             // every share record of a total, as first seen
	retunes []retune
	cli     *clientv3.Client
	// The sampler stops first; the follower only once it has seen the
	// records etcd holds then: a follower that lags behind a busy etcd
	// would otherwise judge the last windows by an older total.
	stopSampling, stopFollowing context.CancelFunc
	sampling, following         sync.WaitGroup
	once                        sync.Once
}

// seenTotal is a share record of total, or a head of the ledger whose
// last limit is total, seen at at.
type seenTotal struct {
	at    time.Time
	total int64
}

// watchPublishes notes when each share record of the provider is seen,
// with its total, or each head of its ledger, with the limit of its last
// step, until ctx ends: a lowering the open publish's grants already fit
// writes a limit in the head and no publish, and every other write of the
// ledger rewrites the head too. The share records or the head alone, on
// a client of their own: the follower, which reads every instance record
// too, lags behind a busy etcd by seconds.
func (r *recorder) watchPublishes(ctx context.Context, cli *clientv3.Client) {
	key, opts := schema.DefaultKeys().Shares(provider), []clientv3.OpOption{clientv3.WithPrefix()}
	if r.led {
		key, opts = ledgerKeys().Head(), nil
	}
	for wr := range cli.Watch(ctx, key, opts...) {
		at := time.Now()
		for _, ev := range wr.Events {
			s := ledger.NewState()
			if err := ledgerKeys().Decode(s, key, ev.Kv.Value); r.led && err == nil && ev.Type == clientv3.EventTypePut {
				if e, ok := s.Head.Current(); ok && len(e.Limits) > 0 {
					r.mu.Lock()
					r.pubs = append(r.pubs, seenTotal{at: at, total: e.Limits[len(e.Limits)-1].Limit})
					r.mu.Unlock()
				}
			}
			if rec, err := schema.DecodeShareRecord(ev.Kv.Value); !r.led && err == nil && ev.Type == clientv3.EventTypePut && rec.Total > 0 {
				r.mu.Lock()
				r.pubs = append(r.pubs, seenTotal{at: at, total: rec.Total})
				r.mu.Unlock()
			}
		}
	}
}

// published returns how long after start a share record of total, or a
// head of the ledger naming it, was first seen, waiting a few seconds for
// it: false if it was not.
func (r *recorder) published(ctx context.Context, start time.Time, total int64) (time.Duration, bool) {
	for wait := 0; wait < 100; wait++ {
		r.mu.Lock()
		for _, p := range r.pubs {
			if p.total == total && !p.at.Before(start) {
				r.mu.Unlock()
				return p.at.Sub(start), true
			}
		}
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return 0, false
		case <-time.After(20 * time.Millisecond): // polling the follower, which offers no event
		}
	}
	return 0, false
}

func newRecorder(ctx context.Context, cli, pubCli *clientv3.Client, members []*cluster.Member, every time.Duration, led bool) *recorder {
	fctx, stopFollowing := context.WithCancel(ctx)
	ctx, stopSampling := context.WithCancel(ctx)
	r := &recorder{led: led, quotas: map[int64]map[int]int64{}, cli: cli, stopSampling: stopSampling, stopFollowing: stopFollowing}
	r.following.Go(func() { r.watchPublishes(fctx, pubCli) })
	if !led {
		r.following.Go(func() {
			harness.FollowShares(fctx, cli, provider, func(v schema.Shares) {
				r.mu.Lock()
				r.views = append(r.views, v)
				r.mu.Unlock()
			}, nil)
		})
	}
	r.sampling.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			r.mu.Lock()
			for i, m := range members {
				st := m.Limiter().Stats()
				ws := st.WindowStart.UnixNano()
				if r.quotas[ws] == nil {
					r.quotas[ws] = map[int]int64{}
				}
				r.quotas[ws][i] = max(r.quotas[ws][i], st.Quota)
			}
			r.mu.Unlock()
		}
	})
	return r
}

// retuned records a retune from limit from to limit to.
func (r *recorder) retuned(start, end time.Time, from, to int64) {
	r.mu.Lock()
	r.retunes = append(r.retunes, retune{start, end, from, to})
	r.mu.Unlock()
}

// stop stops sampling, waits (up to 30 s) until the follower has seen the
// share records etcd holds now, or reads the ledger's head, and stops it.
func (r *recorder) stop() {
	r.once.Do(func() {
		r.stopSampling()
		r.sampling.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if r.led {
			if resp, err := r.cli.Get(ctx, ledgerKeys().Head()); err == nil && len(resp.Kvs) == 1 {
				s := ledger.NewState()
				if err := ledgerKeys().Decode(s, ledgerKeys().Head(), resp.Kvs[0].Value); err == nil {
					r.head = s.Head
				}
			}
		} else if want, _, ok, err := harness.ReadShares(ctx, r.cli, provider); err == nil && ok {
			for ctx.Err() == nil && !r.saw(want) {
				time.Sleep(10 * time.Millisecond) // polling the follower's progress
			}
		}
		r.stopFollowing()
		r.following.Wait()
	})
}

// saw reports whether the newest view followed is want's generation.
func (r *recorder) saw(want schema.Shares) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.views)
	return n > 0 && r.views[n-1].Generation >= want.Generation
}

// check returns how many windows it checked, and how many of them the
// members' quotas added up to more than the total in force: the total of
// the newest view whose boundary (its records' latest) the window has
// reached; on the ledger, the limit its head puts in force for the
// window — or, in a window a retune was under way in (from the change
// until every member enforced its new share), the larger of the old and
// the new limit: while the limit changes, a window in which some
// instance still enforces the old limit's share may hold the old limit
// (docs/architecture.md, section 5).
func (r *recorder) check(window time.Duration) (windows, over int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for ws, byMember := range r.quotas {
		var bound int64 = -1
		for _, v := range r.views {
			if v.EffectiveFrom <= ws {
				bound = v.Total
			}
		}
		if e, ok := r.head.Current(); ok && ledger.WindowOf(ws, e.Window) >= e.Start && ws%int64(e.Window) == 0 {
			bound = e.Limit(ledger.WindowOf(ws, e.Window))
		}
		if bound < 0 {
			continue
		}
		start, end := time.Unix(0, ws), time.Unix(0, ws).Add(window)
		for _, rt := range r.retunes {
			if start.Before(rt.end) && end.After(rt.start) {
				bound = max(bound, rt.from, rt.to)
			}
		}
		var sum int64
		for _, q := range byMember {
			sum += q
		}
		windows++
		if sum > bound {
			over++
			fmt.Printf("  window %s: quotas add up to %d, over the total %d\n", time.Unix(0, ws).UTC().Format("15:04:05.000"), sum, bound)
		}
	}
	return windows, over
}

// ledgerKeys returns the keys of the provider's ledger.
func ledgerKeys() ledger.Keys { return ledger.Keys(schema.DefaultKeys().Ledger(provider)) }

// ledgerSize returns the number of the ledger's records and their bytes,
// keys and values: what each of configd's rounds reads (store.Read).
func ledgerSize(ctx context.Context, cli *clientv3.Client) (keys, bytes int64, err error) {
	resp, err := cli.Get(ctx, string(ledgerKeys()), clientv3.WithPrefix())
	if err != nil {
		return 0, 0, err
	}
	for _, kv := range resp.Kvs {
		bytes += int64(len(kv.Key) + len(kv.Value))
	}
	return int64(len(resp.Kvs)), bytes, nil
}
