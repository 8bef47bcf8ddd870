// Command shards measures configd spread over replicas, for BENCHMARKS.md:
// P providers of I instances each, led by R `configd serve` processes
// against an embedded etcd in this process.
//
// The instances are records, not cluster.Members (P·I of them do not fit
// on one machine as processes): each provider's records sit on one lease,
// and an acknowledger in this process answers every share record written
// with the instance's record acknowledging that generation, as a member
// does. For each fleet of -fleets it reports:
//
//   - hand-out: from the last record written to every provider's shares
//     adding up to its whole limit, split over all its instances;
//
//   - retune: every provider's limit changed at once (down by 10%, then
//     back, -every apart), until every provider's shares add up to the
//     new limit (p50/p99 over -retunes);
//
//   - per replica: providers led, and CPU seconds per retune (/proc);
//
//   - failover: the replica leading most is killed (SIGKILL); the time
//     until every provider it led has another owner (its session TTL,
//     -session-ttl, bounds it from below), how many providers moved, and
//     how many led by the others moved too (must be 0).
//
// -coordination ledger measures providers created on the ledger
// (schema.CoordinationLedger) instead, and both measures each fleet on
// both, the shares first, each on an etcd and replicas of its own. The
// instance records then name a holder (schema.InstanceRecord.Holder),
// which configd grants to; nothing acknowledges, and nothing releases
// (no ledger.Holder runs). Each quantity is read from the provider's
// ledger, followed by a watch and decoded as store.Read decodes it
// (store.Read itself checks the followed ledgers after the hand-out and
// the failover):
//
//   - hand-out: from the last record written until, for every provider,
//     configd has written what hands out its limit over all its
//     instances' holders: the head's last limit step is the limit, and
//     the grants of the first window the newest publish governs add up
//     to it, each holder granted something (State.Allowances of the
//     current era). "in force": until the grants of the current window
//     do. A publish written while instances were still registering
//     grants the limit to fewer holders and is not released here, so the
//     newest publish starts after it ends, up to the horizon (fail_static,
//     10 windows) later;
//
//   - retune: until, for every provider, configd has written the new
//     limit as above. A raise is then in force (top-ups fill the windows
//     before the newest publish); a lowering is in force from the window
//     the head names for it, once the older grants end (or, with
//     members, once they release them). The shares' retune is the same
//     moment: every record written at the new total, not held, their
//     shares adding up to it;
//
//   - failover: the owners as for the shares; "ledger kept", until every
//     provider the killed replica led has its ledger's head written by
//     its new owner, the limit written and its grants of the current
//     window adding up to the limit in force; "short" counts the moved
//     providers whose grants of the current window added up to less at
//     some look during the failover (their grants ran out before the new
//     owner extended them), "others short" the providers not moved.
//
//     go run ./bench/shards
//     go run ./bench/shards -replicas 1 -fleets 100x100,300x100,1000x100
//     go run ./bench/shards -coordination both -fleets 1000x100
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/internal/harness"
	"github.com/sluice-go/sluice/internal/ledger"
	ledgerstore "github.com/sluice-go/sluice/internal/ledger/store"
	"github.com/sluice-go/sluice/internal/schema"
)

var keys = schema.DefaultKeys()

type fleetSize struct{ providers, instances int }

type options struct {
	fleets     []fleetSize
	replicas   int
	retunes    int
	every      time.Duration
	sessionTTL time.Duration
	timeout    time.Duration
	keep       bool
	configd    string   // extra flags for configd serve
	txnOps     int      // configd's --etcd-max-txn-ops
	coords     []string // "shares", "ledger": each fleet on each, in this order
	verbose    bool     // print the provider that settled last, and those found short
}

type result struct {
	fleetSize
	coord                string
	replicas             int
	handout              time.Duration
	handoutInForce       time.Duration // the ledger: until the hand-out is in force in the current window
	retuneP50, retuneP99 time.Duration
	led                  []int     // per replica, after the hand-out
	cpu                  []float64 // per replica, CPU seconds per retune
	failover             time.Duration
	moved, movedOthers   int
	kept                 time.Duration // the ledger: until the moved providers' ledgers are written by their new owners
	short, shortOthers   int           // the ledger: providers moved, and not, whose grants fell short during the failover
}

func main() {
	var o options
	fleets := flag.String("fleets", "100x100,1000x100", "fleets as PROVIDERSxINSTANCES, comma-separated")
	flag.IntVar(&o.replicas, "replicas", 3, "configd replicas")
	flag.IntVar(&o.retunes, "retunes", 4, "retunes of every provider per fleet")
	flag.DurationVar(&o.every, "every", 3*time.Second, "time between the starts of two retunes")
	flag.DurationVar(&o.sessionTTL, "session-ttl", 5*time.Second, "the replicas' --session-ttl")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Minute, "how long a phase may take before the run fails")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (etcd data, configd logs)")
	flag.StringVar(&o.configd, "configd", "", "extra flags for configd serve, space-separated (as -configd='--log-level debug')")
	flag.IntVar(&o.txnOps, "txnops", harness.EtcdMaxTxnOps, "configd's --etcd-max-txn-ops, for the ledger's transactions (128: etcd's default)")
	flag.BoolVar(&o.verbose, "v", false, "print each phase's provider that settled last, and each provider found short in the failover")
	coord := flag.String("coordination", "shares", "the providers' coordination: shares, ledger, or both (each fleet on each)")
	flag.Parse()
	switch *coord {
	case "shares", "ledger":
		o.coords = []string{*coord}
	case "both":
		o.coords = []string{"shares", "ledger"}
	default:
		fmt.Fprintf(os.Stderr, "shards: -coordination: %q: want shares, ledger or both\n", *coord)
		os.Exit(2)
	}
	for _, f := range strings.Split(*fleets, ",") {
		p, i, ok := strings.Cut(strings.TrimSpace(f), "x")
		np, err1 := strconv.Atoi(p)
		ni, err2 := strconv.Atoi(i)
		if !ok || err1 != nil || err2 != nil || np < 1 || ni < 1 {
			fmt.Fprintf(os.Stderr, "shards: fleet %q: want PROVIDERSxINSTANCES, both positive\n", f)
			os.Exit(2)
		}
		o.fleets = append(o.fleets, fleetSize{np, ni})
	}
	if o.replicas < 1 || o.retunes < 1 {
		fmt.Fprintln(os.Stderr, "shards: -replicas and -retunes must be at least 1")
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "shards:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	fmt.Println(harness.Facts())
	dir, bins, cleanup, err := harness.WorkDir("sluice-shards-", o.keep, "./configd")
	if err != nil {
		return err
	}
	defer cleanup()
	fmt.Printf("%d configd replicas (processes, --session-ttl %v, --etcd-max-txn-ops %d), one embedded etcd and the acknowledger in this process; windows of 1s, algorithm even; coordination %s\n\n",
		o.replicas, o.sessionTTL, o.txnOps, strings.Join(o.coords, " then "))
	var rows []result
	for _, f := range o.fleets {
		for _, coord := range o.coords {
			r, err := measure(o, f, coord, filepath.Join(dir, fmt.Sprintf("%s-%dx%d", coord, f.providers, f.instances)), bins[0])
			if err != nil {
				printRows(rows) // what was measured before
				return fmt.Errorf("%dx%d, %s: %w", f.providers, f.instances, coord, err)
			}
			rows = append(rows, r)
			fmt.Fprintf(os.Stderr, "%dx%d %s done: %s\n", f.providers, f.instances, coord, harness.EtcdHealth())
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
	fmt.Fprintln(tw, "providers\tinstances\tcoordination\treplicas\thand-out\tin force\tretune p50\tretune p99\tled per replica\tCPU s per retune, per replica\tfailover\tmoved\tothers moved\tledger kept\tshort\tothers short\t")
	for _, r := range rows {
		cpu := make([]string, len(r.cpu))
		for i, c := range r.cpu {
			cpu[i] = fmt.Sprintf("%.2f", c)
		}
		fail, moved, others, kept, short, shortOthers, force := "—", "—", "—", "—", "—", "—", "—"
		if r.coord == "ledger" {
			force = r.handoutInForce.Round(10 * time.Millisecond).String()
		}
		if r.replicas > 1 {
			fail, moved, others = r.failover.Round(10*time.Millisecond).String(), strconv.Itoa(r.moved), strconv.Itoa(r.movedOthers)
			if r.coord == "ledger" {
				kept, short, shortOthers = r.kept.Round(10*time.Millisecond).String(), strconv.Itoa(r.short), strconv.Itoa(r.shortOthers)
			}
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%v\t%s\t%v\t%v\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.providers, r.instances, r.coord, r.replicas,
			r.handout.Round(10*time.Millisecond), force, r.retuneP50.Round(10*time.Millisecond), r.retuneP99.Round(10*time.Millisecond),
			strings.Trim(fmt.Sprint(r.led), "[]"), strings.Join(cpu, " "), fail, moved, others, kept, short, shortOthers)
	}
	tw.Flush()
}

// printRatios prints, for each fleet measured on both, the ledger's
// figures over the shares'; the failover's is the ledger kept over the
// shares' owners moved.
func printRatios(rows []result) {
	fmt.Println("\nledger / shares:")
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "providers\tinstances\thand-out\tretune p50\tretune p99\tCPU per retune (all replicas)\tfailover\t")
	for i, l := range rows {
		if l.coord != "ledger" || i == 0 || rows[i-1].fleetSize != l.fleetSize {
			continue
		}
		s := rows[i-1]
		fail := "—"
		if l.replicas > 1 {
			fail = fmt.Sprintf("%.2f", float64(l.kept)/float64(s.failover))
		}
		fmt.Fprintf(tw, "%d\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t\n", l.providers, l.instances, float64(l.handout)/float64(s.handout),
			float64(l.retuneP50)/float64(s.retuneP50), float64(l.retuneP99)/float64(s.retuneP99), sum(l.cpu)/sum(s.cpu), fail)
	}
	tw.Flush()
}

func sum(v []float64) (t float64) {
	for _, x := range v {
		t += x
	}
	return t
}

func name(p int) string { return fmt.Sprintf("p%04d", p) }

func instanceID(i int) string { return fmt.Sprintf("i%04d", i) }

func measure(o options, f fleetSize, coord, dir, bin string) (result, error) {
	res := result{fleetSize: f, coord: coord, replicas: o.replicas}
	led := coord == "ledger"
	etcd, url, err := harness.StartEtcd("shards", dir)
	if err != nil {
		return res, err
	}
	defer etcd.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return res, err
	}
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var cds []*harness.Configd
	defer func() {
		for _, cd := range cds {
			cd.Stop()
		}
	}()
	for r := range o.replicas {
		cd, err := harness.StartConfigd(bin, url, fmt.Sprintf("%s-configd-%d.log", dir, r),
			fmt.Sprintf("--replica-id r%d --session-ttl %v --etcd-max-txn-ops %d %s", r, o.sessionTTL, o.txnOps, o.configd))
		if err != nil {
			return res, err
		}
		cds = append(cds, cd)
	}

	ack, err := newAcker(ctx, cli, f, led)
	if err != nil {
		return res, err
	}
	defer ack.stop()
	limit := int64(f.instances) * 1000
	if err := putConfigs(ctx, cli, f.providers, limit, led); err != nil {
		return res, err
	}
	if err := register(ctx, cli, f, ack); err != nil {
		return res, err
	}
	t0 := time.Now()
	last, err := ack.wait(ctx, written, limit, o.timeout)
	if err != nil {
		return res, fmt.Errorf("hand-out: %w", err)
	}
	res.handout = time.Since(t0)
	o.lastOne(f, coord, "hand-out", last)
	if led {
		last, err := ack.wait(ctx, inForce, limit, o.timeout)
		if err != nil {
			return res, fmt.Errorf("hand-out in force: %w", err)
		}
		res.handoutInForce = time.Since(t0)
		o.lastOne(f, coord, "hand-out in force", last)
		ack.check(ctx, limit, "after the hand-out")
	}

	own, err := owners(ctx, cli)
	if err != nil {
		return res, err
	}
	for r := range o.replicas {
		n := 0
		for _, id := range own {
			if id.replica == fmt.Sprintf("r%d", r) {
				n++
			}
		}
		res.led = append(res.led, n)
	}

	cpu0 := cpus(cds)
	var lat []time.Duration
	limits := []int64{limit * 9 / 10, limit}
	for i := range o.retunes {
		next := limits[i%2]
		start := time.Now()
		if err := putConfigs(ctx, cli, f.providers, next, led); err != nil {
			return res, err
		}
		last, err := ack.wait(ctx, written, next, o.timeout)
		if err != nil {
			return res, fmt.Errorf("retune %d to %d: %w", i, next, err)
		}
		lat = append(lat, time.Since(start))
		o.lastOne(f, coord, fmt.Sprintf("retune %d", i), last)
		fmt.Fprintf(os.Stderr, "%dx%d %s: retune %d to %d in %v\n", f.providers, f.instances, coord, i, next, lat[len(lat)-1].Round(10*time.Millisecond))
		if rest := o.every - time.Since(start); rest > 0 {
			time.Sleep(rest) // the pace of the retunes, not a synchronisation
		}
	}
	cpu1 := cpus(cds)
	for r := range cds {
		res.cpu = append(res.cpu, (cpu1[r]-cpu0[r])/float64(len(lat)))
	}
	res.retuneP50, res.retuneP99 = harness.Pct(lat, 50), harness.Pct(lat, 99)

	if o.replicas > 1 {
		final := limits[(o.retunes-1)%2]
		if err := failover(ctx, cli, cds, own, ack, final, &res, o.timeout, o.verbose); err != nil {
			return res, fmt.Errorf("failover: %w", err)
		}
		if led {
			ack.check(ctx, final, "after the failover")
		}
	}
	if n := ack.bad.Load(); n > 0 {
		fmt.Fprintf(os.Stderr, "%dx%d %s: %d ledger records did not decode\n", f.providers, f.instances, coord, n)
	}
	return res, nil
}

// lastOne prints, with -v, the last look before a phase ended that found
// a provider not settled.
func (o options) lastOne(f fleetSize, coord, phase, last string) {
	if o.verbose && last != "" {
		fmt.Fprintf(os.Stderr, "%dx%d %s: %s: last found unsettled at %s\n", f.providers, f.instances, coord, phase, last)
	}
}

// failover kills the replica leading most and waits until its providers
// have other owners; on the ledger, also until each of them has its
// ledger's head written by its new owner, limit written and the grants
// of the current window in force (ledgerShort), counting the providers
// whose grants of the current window fell short of the limit in force
// for it at some look.
func failover(ctx context.Context, cli *clientv3.Client, cds []*harness.Configd, before map[string]owner, ack *acker, limit int64, res *result, timeout time.Duration, verbose bool) error {
	victim := 0
	for r, n := range res.led {
		if n > res.led[victim] {
			victim = r
		}
	}
	id := fmt.Sprintf("r%d", victim)
	start := time.Now()
	if err := cds[victim].Cmd.Process.Kill(); err != nil {
		return err
	}
	short := map[string]bool{}
	for {
		after, err := owners(ctx, cli)
		if err != nil {
			return err
		}
		done, moved, others := true, 0, 0
		for p, b := range before {
			a, ok := after[p]
			switch {
			case !ok || a.replica == id:
				done = false
			case b.replica == id:
				moved++
			case a.rev != b.rev:
				others++
			}
		}
		if done && res.failover == 0 {
			res.failover, res.moved, res.movedOthers = time.Since(start), moved, others
		}
		kept := done
		if ack.ledger {
			now := time.Now()
			for p, b := range before {
				headRev, why := ack.ledgerShort(p, inForce, 0, now)
				if why != "" && !short[p] {
					short[p] = true
					if b.replica == id {
						res.short++
					} else {
						res.shortOthers++
					}
					if verbose {
						fmt.Fprintf(os.Stderr, "%s short at %s, %v after the kill (led by %s): %s\n", p, now.UTC().Format("15:04:05.000"), now.Sub(start).Round(time.Millisecond), b.replica, why)
					}
				}
				if _, w := ack.ledgerShort(p, written, limit, now); w != "" {
					why = w
				}
				if b.replica == id && (why != "" || headRev <= after[p].rev) {
					kept = false
				}
			}
		}
		if kept {
			res.kept = time.Since(start)
			return nil
		}
		if time.Since(start) > timeout {
			if res.failover == 0 {
				return fmt.Errorf("%s's providers not led by another replica after %v", id, timeout)
			}
			return fmt.Errorf("%s's providers' ledgers not written by their new owners after %v", id, timeout)
		}
		time.Sleep(20 * time.Millisecond) // polling etcd at a measurement's resolution
	}
}

type owner struct {
	replica string
	rev     int64
}

func owners(ctx context.Context, cli *clientv3.Client) (map[string]owner, error) {
	resp, err := cli.Get(ctx, keys.Owners(), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := map[string]owner{}
	for _, kv := range resp.Kvs {
		out[strings.TrimPrefix(string(kv.Key), keys.Owners())] = owner{string(kv.Value), kv.CreateRevision}
	}
	return out, nil
}

func cpus(cds []*harness.Configd) []float64 {
	out := make([]float64, len(cds))
	for i, cd := range cds {
		out[i] = harness.CPUSeconds(cd.Cmd.Process.Pid)
	}
	return out
}

// putConfigs sets every provider's limit, 64 configs per transaction, on
// the ledger if led.
func putConfigs(ctx context.Context, cli *clientv3.Client, providers int, limit int64, led bool) error {
	var ops []clientv3.Op
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		_, err := cli.Txn(ctx).Then(ops...).Commit()
		ops = ops[:0]
		return err
	}
	for p := range providers {
		cfg := schema.ProviderConfig{Name: name(p), Limit: limit, Window: schema.Duration(time.Second), Algorithm: schema.AlgorithmEven}.WithDefaults()
		if led {
			cfg.Coordination = schema.CoordinationLedger
		}
		b, err := schema.Encode(cfg)
		if err != nil {
			return err
		}
		ops = append(ops, clientv3.OpPut(keys.Config(name(p)), string(b)))
		if len(ops) == 64 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// register writes every instance's record, each provider's on a lease of
// its own kept alive until the run ends.
func register(ctx context.Context, cli *clientv3.Client, f fleetSize, a *acker) error {
	for p := range f.providers {
		l, err := cli.Grant(ctx, 30)
		if err != nil {
			return err
		}
		ka, err := cli.KeepAlive(ctx, l.ID)
		if err != nil {
			return err
		}
		go func() {
			for range ka {
			}
		}()
		a.leases[p] = l.ID
	}
	for p := range f.providers {
		for i := range f.instances {
			a.send(ctx, ackReq{p, i, 0})
		}
	}
	return nil
}

// ackWriters is how many instance records the acknowledger writes at
// once. Each write is a round trip to etcd; with 16 at once, 10,000
// instances' acknowledgements of one retune took about 4 s to write, and
// the run measured the acknowledger rather than configd. Members each
// write their own.
const ackWriters = 128

type ackReq struct {
	p, i int
	gen  int64
}

// acker writes instance records: at registration, and acknowledging every
// share record written, as a member does. It follows every provider's
// shares; on the ledger, it writes each record once, naming a holder, and
// follows every provider's ledger.
type acker struct {
	cli    *clientv3.Client
	f      fleetSize
	ledger bool
	leases []clientv3.LeaseID
	queues []chan ackReq // an instance's writes all go through one, in order
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errs   atomic.Int64

	mu     sync.Mutex
	shares []*schema.ShareSet // per provider: its records, resolved as an instance does
	acked  []map[string]int64 // per provider, per instance: the generation acknowledged
	// On the ledger, per provider: its ledger as followed, and the
	// revision its head was last written at.
	ledgers  []*ledger.State
	headRevs []int64
	changes  []int64       // per provider: events applied to its ledger
	looked   [2][]lookedAt // per look and provider: short's last answer
	bad      atomic.Int64  // ledger records that did not decode
}

// look is what a ledger is looked at for (ledgerShort).
type look int

const (
	written look = iota // configd wrote what hands the limit out
	inForce             // and it is in force in the current window
)

// lookedAt is ledgerShort's answer for a provider's ledger as of a number
// of changes, a limit and a window: polling 1,000 ledgers of 100
// holders each took 20 ms of CPU per look without it.
type lookedAt struct {
	changes, limit, window int64
	why                    string
}

func newAcker(ctx context.Context, cli *clientv3.Client, f fleetSize, led bool) (*acker, error) {
	prefix := keys.Providers()
	if led {
		prefix = keys.Ledgers()
	}
	// The watch starts at a revision read now: a record written before
	// the goroutine gets to watching is not missed.
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	a := &acker{cli: cli, f: f, ledger: led, leases: make([]clientv3.LeaseID, f.providers), cancel: cancel,
		shares: make([]*schema.ShareSet, f.providers), acked: make([]map[string]int64, f.providers),
		ledgers: make([]*ledger.State, f.providers), headRevs: make([]int64, f.providers),
		changes: make([]int64, f.providers), looked: [2][]lookedAt{make([]lookedAt, f.providers), make([]lookedAt, f.providers)}}
	for p := range a.shares {
		a.shares[p], a.acked[p] = schema.NewShareSet(keys, name(p)), map[string]int64{}
		a.ledgers[p] = ledger.NewState()
	}
	for range ackWriters {
		q := make(chan ackReq, 1<<12)
		a.queues = append(a.queues, q)
		a.wg.Go(func() { a.write(ctx, q) })
	}
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	if led {
		a.wg.Go(func() { a.followLedgers(wch) })
	} else {
		a.wg.Go(func() { a.follow(ctx, wch) })
	}
	return a, nil
}

func (a *acker) stop() {
	a.cancel()
	a.wg.Wait()
}

// send queues r on its instance's writer.
func (a *acker) send(ctx context.Context, r ackReq) {
	select {
	case a.queues[(r.p*a.f.instances+r.i)%len(a.queues)] <- r:
	case <-ctx.Done():
	}
}

func (a *acker) write(ctx context.Context, queue chan ackReq) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-queue:
			rec := schema.InstanceRecord{ID: instanceID(r.i), Host: "shards", PID: 1, Started: time.Now().UTC(), Updated: time.Now().UTC(),
				Demand: 1000, AppliedGeneration: r.gen}
			if a.ledger {
				// A member of a ledger provider names the incarnation it
				// holds grants under; configd grants to it.
				rec.Source, rec.Holder = schema.SourceLedger, holder(r.i)
			}
			b, err := schema.Encode(rec)
			if err == nil {
				_, err = a.cli.Put(ctx, keys.Instance(name(r.p), rec.ID), string(b), clientv3.WithLease(a.leases[r.p]))
			}
			if err != nil && ctx.Err() == nil {
				a.errs.Add(1)
			}
		}
	}
}

// follow watches every share record and acknowledges each instance's
// record, resolved (the common record for those whose own says Common),
// once per generation.
func (a *acker) follow(ctx context.Context, wch clientv3.WatchChan) {
	for wr := range wch {
		if err := wr.Err(); err != nil {
			a.errs.Add(1)
			return
		}
		touched := map[int]bool{}
		a.mu.Lock()
		for _, ev := range wr.Events {
			k, err := keys.Parse(string(ev.Kv.Key))
			if err != nil || k.Kind != schema.KindShares || k.Instance == "" {
				continue
			}
			p, err := strconv.Atoi(strings.TrimPrefix(k.Provider, "p"))
			if err != nil || p >= a.f.providers {
				continue
			}
			a.shares[p].Apply(string(ev.Kv.Key), ev.Kv.Value, ev.Type == clientv3.EventTypeDelete)
			touched[p] = true
		}
		var acks []ackReq
		for p := range touched {
			for i := range a.f.instances {
				id := instanceID(i)
				if r, ok := a.shares[p].Record(id); ok && a.acked[p][id] != r.Generation {
					a.acked[p][id] = r.Generation
					acks = append(acks, ackReq{p, i, r.Generation})
				}
			}
		}
		a.mu.Unlock()
		for _, r := range acks {
			a.send(ctx, r)
		}
	}
}

// holder is the holder instance i's record names on the ledger.
func holder(i int) string { return instanceID(i) + ".shards" }

// followLedgers keeps every provider's ledger as the watch brings it,
// each record decoded as store.Read decodes it.
func (a *acker) followLedgers(wch clientv3.WatchChan) {
	for wr := range wch {
		if err := wr.Err(); err != nil {
			a.errs.Add(1)
			return
		}
		a.mu.Lock()
		for _, ev := range wr.Events {
			pname, _, ok := strings.Cut(strings.TrimPrefix(string(ev.Kv.Key), keys.Ledgers()), "/")
			p, err := strconv.Atoi(strings.TrimPrefix(pname, "p"))
			if !ok || err != nil || p < 0 || p >= a.f.providers {
				continue
			}
			lk := ledgerKeys(p)
			var value []byte
			if ev.Type == clientv3.EventTypePut {
				value = ev.Kv.Value
			}
			if err := lk.Decode(a.ledgers[p], string(ev.Kv.Key), value); err != nil {
				a.bad.Add(1)
			}
			a.changes[p]++
			if string(ev.Kv.Key) == lk.Head() {
				a.headRevs[p] = ev.Kv.ModRevision
			}
		}
		a.mu.Unlock()
	}
}

func ledgerKeys(p int) ledger.Keys { return ledger.Keys(keys.Ledger(name(p))) }

// ledgerShort returns why provider's ledger, as followed, does not hand
// out limit at now as l asks (ledgerShort), "" when it does, and the
// revision its head was last written at.
func (a *acker) ledgerShort(provider string, l look, limit int64, now time.Time) (headRev int64, why string) {
	p, err := strconv.Atoi(strings.TrimPrefix(provider, "p"))
	if err != nil || p < 0 || p >= a.f.providers {
		return 0, "not a provider of the fleet"
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.headRevs[p], a.short(p, l, limit, now)
}

// short is ledgerShort of provider p's followed ledger, computed again
// only when the ledger, the limit or the window holding now changed.
// a.mu must be held.
func (a *acker) short(p int, l look, limit int64, now time.Time) string {
	w := int64(-1)
	if e, ok := a.ledgers[p].Head.Current(); ok {
		w = ledger.WindowOf(now.UnixNano(), e.Window)
	}
	last := a.looked[l][p]
	if last.changes == a.changes[p] && last.limit == limit && last.window == w && last.changes > 0 {
		return last.why
	}
	why := ledgerShort(a.ledgers[p], l, limit, a.f.instances, now)
	a.looked[l][p] = lookedAt{a.changes[p], limit, w, why}
	return why
}

// ledgerShort returns "" when ledger s hands out limit over holders
// holders as l asks, and otherwise why not. Written: the head's current
// era has limit as its last step, and the grants of the first window in
// which both that step and the newest publish govern (or the current
// window, if later) add up to limit, each holder granted something.
// The grants before it, of earlier publishes, end at their publish's end
// or where their holders release them. In force: the grants of the
// current window add up to the era's limit for it, limit (0: whatever
// it is), over every holder.
func ledgerShort(s *ledger.State, l look, limit int64, holders int, now time.Time) string {
	e, ok := s.Head.Current()
	if !ok || len(e.Limits) == 0 {
		return "no era, or no limit in it"
	}
	k := ledger.WindowOf(now.UnixNano(), e.Window)
	want := e.Limit(k)
	if l == written {
		last := e.Limits[len(e.Limits)-1]
		if last.Limit != limit {
			return fmt.Sprintf("the head's last limit is %d from window %d", last.Limit, last.From)
		}
		k, want = max(k, last.From, newest(s, e.Seq)), limit
	} else if limit != 0 && want != limit {
		return fmt.Sprintf("the head's limit in window %d is %d", k, want)
	}
	got := s.Allowances(e.Seq, k)
	if n, sum := len(got), harness.Sum(got); n != holders || sum != want {
		return fmt.Sprintf("window %d of era %d: %d holders granted, %d in all", k, e.Seq, n, sum)
	}
	return ""
}

// newest returns the first window of era's newest publish that is not a
// top-up (0: none).
func newest(s *ledger.State, era int64) int64 {
	var seq, a int64
	for _, p := range s.Pubs {
		if p.Era == era && !p.TopUp && p.Each == 0 && p.Seq > seq {
			seq, a = p.Seq, p.A
		}
	}
	return a
}

// check reads every provider's ledger with store.Read, at a revision of
// its own, and prints each that does not hand out limit: the followed
// ledgers said they all did. It tells a fault of this program's
// following, not of configd.
func (a *acker) check(ctx context.Context, limit int64, when string) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	bad, example := 0, ""
	sem := make(chan struct{}, 8)
	for p := range a.f.providers {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			s, _, _, _, err := ledgerstore.Read(ctx, a.cli, ledgerKeys(p))
			why := ""
			if err != nil {
				why = err.Error()
			} else {
				why = ledgerShort(s, written, limit, a.f.instances, time.Now())
			}
			if why != "" {
				mu.Lock()
				bad, example = bad+1, name(p)+": "+why
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if bad > 0 {
		fmt.Fprintf(os.Stderr, "%d of %d ledgers read with store.Read %s do not hand out %d (%s)\n", bad, a.f.providers, when, limit, example)
	}
}

// settled reports whether every provider's shares add up to limit, split
// over all its instances; on the ledger, whether every provider's ledger
// hands it out as l asks (ledgerShort).
func (a *acker) settled(l look, limit int64) (bool, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	short, example := 0, ""
	if a.ledger {
		now := time.Now()
		for p := range a.ledgers {
			if why := a.short(p, l, limit, now); why != "" {
				short, example = short+1, name(p)+": "+why
			}
		}
		return short == 0, fmt.Sprintf("%d of %d providers' ledgers not handing out %d (%s)", short, len(a.ledgers), limit, example)
	}
	for p := range a.shares {
		var sum int64
		n := 0
		for i := range a.f.instances {
			r, ok := a.shares[p].Record(instanceID(i))
			if ok && r.Total == limit && !r.Held {
				sum += r.Share
				n++
			}
		}
		if sum != limit || n != a.f.instances {
			short++
			example = fmt.Sprintf("%s: %d records at %d, shares adding up to %d", name(p), n, limit, sum)
		}
	}
	return short == 0, fmt.Sprintf("%d of %d providers not at %d (%s)", short, len(a.shares), limit, example)
}

// wait waits until settled(l, limit), and returns when it last found a
// provider that was not, and why.
func (a *acker) wait(ctx context.Context, l look, limit int64, timeout time.Duration) (last string, err error) {
	deadline := time.Now().Add(timeout)
	for {
		ok, why := a.settled(l, limit)
		if ok {
			return last, nil
		}
		last = time.Now().UTC().Format("15:04:05.000 ") + why
		if n := a.errs.Load(); n > 0 {
			return "", fmt.Errorf("%d instance record writes failed", n)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", errors.New(why)
		}
		time.Sleep(20 * time.Millisecond) // polling the followed state at a measurement's resolution
	}
}
