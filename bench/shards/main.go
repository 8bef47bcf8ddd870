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
//     go run ./bench/shards
//     go run ./bench/shards -replicas 1 -fleets 100x100,300x100,1000x100
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
}

type result struct {
	fleetSize
	replicas             int
	handout              time.Duration
	retuneP50, retuneP99 time.Duration
	led                  []int     // per replica, after the hand-out
	cpu                  []float64 // per replica, CPU seconds per retune
	failover             time.Duration
	moved, movedOthers   int
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
	flag.Parse()
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
	fmt.Printf("%d configd replicas (processes, --session-ttl %v), one embedded etcd and the acknowledger in this process; windows of 1s, algorithm even\n\n",
		o.replicas, o.sessionTTL)
	var rows []result
	for _, f := range o.fleets {
		r, err := measure(o, f, filepath.Join(dir, fmt.Sprintf("%dx%d", f.providers, f.instances)), bins[0])
		if err != nil {
			return fmt.Errorf("%dx%d: %w", f.providers, f.instances, err)
		}
		rows = append(rows, r)
	}
	printRows(rows)
	return nil
}

func printRows(rows []result) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "providers\tinstances\treplicas\thand-out\tretune p50\tretune p99\tled per replica\tCPU s per retune, per replica\tfailover\tmoved\tothers moved\t")
	for _, r := range rows {
		cpu := make([]string, len(r.cpu))
		for i, c := range r.cpu {
			cpu[i] = fmt.Sprintf("%.2f", c)
		}
		fail, moved, others := "—", "—", "—"
		if r.replicas > 1 {
			fail, moved, others = r.failover.Round(10*time.Millisecond).String(), strconv.Itoa(r.moved), strconv.Itoa(r.movedOthers)
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%v\t%v\t%v\t%s\t%s\t%s\t%s\t%s\t\n", r.providers, r.instances, r.replicas,
			r.handout.Round(10*time.Millisecond), r.retuneP50.Round(10*time.Millisecond), r.retuneP99.Round(10*time.Millisecond),
			strings.Trim(fmt.Sprint(r.led), "[]"), strings.Join(cpu, " "), fail, moved, others)
	}
	tw.Flush()
}

func name(p int) string { return fmt.Sprintf("p%04d", p) }

func instanceID(i int) string { return fmt.Sprintf("i%04d", i) }

func measure(o options, f fleetSize, dir, bin string) (result, error) {
	res := result{fleetSize: f, replicas: o.replicas}
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
			fmt.Sprintf("--replica-id r%d --session-ttl %v", r, o.sessionTTL))
		if err != nil {
			return res, err
		}
		cds = append(cds, cd)
	}

	ack, err := newAcker(ctx, cli, f)
	if err != nil {
		return res, err
	}
	defer ack.stop()
	limit := int64(f.instances) * 1000
	if err := putConfigs(ctx, cli, f.providers, limit); err != nil {
		return res, err
	}
	if err := register(ctx, cli, f, ack); err != nil {
		return res, err
	}
	t0 := time.Now()
	if err := ack.wait(ctx, limit, o.timeout); err != nil {
		return res, fmt.Errorf("hand-out: %w", err)
	}
	res.handout = time.Since(t0)

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
		if err := putConfigs(ctx, cli, f.providers, next); err != nil {
			return res, err
		}
		if err := ack.wait(ctx, next, o.timeout); err != nil {
			return res, fmt.Errorf("retune %d to %d: %w", i, next, err)
		}
		lat = append(lat, time.Since(start))
		fmt.Fprintf(os.Stderr, "%dx%d: retune %d to %d in %v\n", f.providers, f.instances, i, next, lat[len(lat)-1].Round(10*time.Millisecond))
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
		if err := failover(ctx, cli, cds, own, &res, o.timeout); err != nil {
			return res, fmt.Errorf("failover: %w", err)
		}
	}
	return res, nil
}

// failover kills the replica leading most and waits until its providers
// have other owners.
func failover(ctx context.Context, cli *clientv3.Client, cds []*harness.Configd, before map[string]owner, res *result, timeout time.Duration) error {
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
		if done {
			res.failover, res.moved, res.movedOthers = time.Since(start), moved, others
			return nil
		}
		if time.Since(start) > timeout {
			return fmt.Errorf("%s's providers not led by another replica after %v", id, timeout)
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

// putConfigs sets every provider's limit, 64 configs per transaction.
func putConfigs(ctx context.Context, cli *clientv3.Client, providers int, limit int64) error {
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
// shares.
type acker struct {
	cli    *clientv3.Client
	f      fleetSize
	leases []clientv3.LeaseID
	queues []chan ackReq // an instance's writes all go through one, in order
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errs   atomic.Int64

	mu     sync.Mutex
	shares []*schema.ShareSet // per provider: its records, resolved as an instance does
	acked  []map[string]int64 // per provider, per instance: the generation acknowledged
}

func newAcker(ctx context.Context, cli *clientv3.Client, f fleetSize) (*acker, error) {
	// The watch starts at a revision read now: a share record written
	// before the goroutine gets to watching is not missed.
	resp, err := cli.Get(ctx, keys.Providers(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	a := &acker{cli: cli, f: f, leases: make([]clientv3.LeaseID, f.providers), cancel: cancel,
		shares: make([]*schema.ShareSet, f.providers), acked: make([]map[string]int64, f.providers)}
	for p := range a.shares {
		a.shares[p], a.acked[p] = schema.NewShareSet(keys, name(p)), map[string]int64{}
	}
	for range ackWriters {
		q := make(chan ackReq, 1<<12)
		a.queues = append(a.queues, q)
		a.wg.Go(func() { a.write(ctx, q) })
	}
	wch := cli.Watch(ctx, keys.Providers(), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	a.wg.Go(func() { a.follow(ctx, wch) })
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

// settled reports whether every provider's shares add up to limit, split
// over all its instances.
func (a *acker) settled(limit int64) (bool, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	short, example := 0, ""
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

func (a *acker) wait(ctx context.Context, limit int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, why := a.settled(limit)
		if ok {
			return nil
		}
		if n := a.errs.Load(); n > 0 {
			return fmt.Errorf("%d instance record writes failed", n)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.New(why)
		}
		time.Sleep(20 * time.Millisecond) // polling the followed state at a measurement's resolution
	}
}
