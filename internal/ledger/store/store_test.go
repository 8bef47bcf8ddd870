package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/netcut"
	"github.com/sluice-go/sluice/limiter"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, etcdtest.IgnoreLeaks()...)
}

// clock is true time, held still while a counter admits and records, so
// a permit is counted in the window the limiter admitted it in.
type clock struct {
	t    atomic.Int64
	hold sync.RWMutex
}

func (c *clock) Now() time.Time { return time.Unix(0, c.t.Load()) }

func (c *clock) run(ctx context.Context) {
	for ctx.Err() == nil {
		c.hold.Lock()
		c.t.Store(time.Now().UnixNano())
		c.hold.Unlock()
		time.Sleep(time.Millisecond) // the clock's resolution, not a wait for an event
	}
}

// tally counts admissions per aligned window of the clock.
type tally struct {
	mu sync.Mutex
	n  map[int64]int64
}

func (ta *tally) admit(clk *clock, lim *limiter.Limiter, w time.Duration) bool {
	clk.hold.RLock()
	defer clk.hold.RUnlock()
	if !lim.TryAcquire() {
		return false
	}
	ta.mu.Lock()
	ta.n[ledger.WindowOf(clk.t.Load(), w)]++
	ta.mu.Unlock()
	return true
}

// TestLedgerOverEtcdHoldsTheLimit runs two publishers, deciding at once
// and each on its own clock, and four followers with real limiters over
// a real etcd, through shares that move, a lowered limit, a follower cut
// off for longer than a window and one whose watch runs late. Every
// aligned window admits at most the limit the ledger puts in force for
// it, the ledger is never over, and the followers use what they hold.
func TestLedgerOverEtcdHoldsTheLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for seconds of real time")
	}
	const win = 100 * time.Millisecond
	srv := etcdtest.Start(t)
	keys := ledger.Keys("/test/ledger/")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	clk := &clock{}
	clk.t.Store(time.Now().UnixNano())
	wg.Go(func() { clk.run(ctx) })

	names := []string{"a", "b", "c", "d"}
	proxies := make([]*netcut.Proxy, len(names))
	holders := map[string]string{} // name → its follower's holder name
	ta := &tally{n: map[int64]int64{}}
	var admitted atomic.Int64
	for i, name := range names {
		proxies[i] = netcut.StartProxy(t, srv.Endpoints()[0][len("http://"):])
		cfg := srv.Config(t)
		cfg.Endpoints = []string{proxies[i].URL()}
		cli, err := clientv3.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		lim, err := limiter.New(0, win, limiter.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lim.Close() })
		f, err := NewFollower(cli, keys, name, lim, win, log)
		if err != nil {
			t.Fatal(err)
		}
		holders[name] = f.Holder().Name()
		wg.Go(func() { f.Run(ctx) })
		wg.Go(func() {
			for ctx.Err() == nil {
				if ta.admit(clk, lim, win) {
					admitted.Add(1)
				} else {
					time.Sleep(time.Millisecond) // demand: a call a millisecond when refused
				}
			}
		})
	}

	var at atomic.Int64 // the phase under way
	var moved, written atomic.Int64
	for r := range 2 {
		cli := srv.Client(t)
		off := time.Duration(r) * 7 * time.Millisecond // each replica's clock a little off
		pb := NewPublisher(cli, keys, func() time.Time { return clk.Now().Add(off) })
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(at.Load())
				p := ledger.Policy{Limit: phases[i].limit, Window: win, Horizon: 10, Keep: 3, Slack: 2}
				ch, err := pb.Round(ctx, p, rename(stale(i, r), holders))
				switch {
				case errors.Is(err, ErrMoved):
					moved.Add(1)
				case err == nil && !ch.Empty():
					written.Add(1)
				case err == nil:
				case ctx.Err() == nil:
					t.Errorf("replica %d: %v", r, err)
				}
				time.Sleep(win / 4) // the publisher's cadence
			}
		})
	}

	audit := func() {
		s, _, _, bad, err := Read(ctx, srv.Client(t), keys)
		if err != nil || len(bad) > 0 {
			t.Fatalf("reading the ledger: %v %v", err, bad)
		}
		if vs := ledger.Audit(s); len(vs) > 0 {
			t.Fatalf("the ledger is over: %v", vs)
		}
	}
	for i, ph := range phases {
		at.Store(int64(i))
		switch ph.fault {
		case "cut":
			proxies[0].Cut()
		case "late":
			proxies[0].Heal()
			proxies[1].SetDelay(3 * win / 2)
		case "":
			proxies[1].SetDelay(0)
		}
		time.Sleep(ph.last) // the phase's length in real time
		audit()
	}
	cancel()
	wg.Wait()

	s, _, _, _, err := Read(context.Background(), srv.Client(t), keys)
	if err != nil {
		t.Fatal(err)
	}
	over, full := 0, 0
	ta.mu.Lock()
	defer ta.mu.Unlock()
	for k, n := range ta.n {
		bound := limitAt(s, k, win)
		if n > bound {
			over++
			t.Errorf("window %d admitted %d, over the limit of %d the ledger put in force", k, n, bound)
		}
		if n >= bound*9/10 {
			full++
		}
	}
	t.Logf("%d windows, %d admitted, %d at 90%% of the limit or more; %d writes, %d refused for a moved head", len(ta.n), admitted.Load(), full, written.Load(), moved.Load())
	if full < len(ta.n)/3 {
		t.Errorf("only %d of %d windows used 90%% of the limit: the followers do not get the room", full, len(ta.n))
	}
}

// phase is one stretch of the run: a limit, its shares, a fault.
type phase struct {
	limit  int64
	target map[string]int64
	fault  string
	last   time.Duration
}

var phases = []phase{
	{limit: 100, target: map[string]int64{"a": 25, "b": 25, "c": 25, "d": 25}, last: 1500 * time.Millisecond},
	{limit: 100, target: map[string]int64{"a": 10, "b": 10, "c": 10, "d": 70}, last: 1500 * time.Millisecond},
	{limit: 100, target: map[string]int64{"a": 40, "b": 20, "c": 20, "d": 20}, fault: "cut", last: 700 * time.Millisecond},
	{limit: 60, target: map[string]int64{"a": 15, "b": 15, "c": 15, "d": 15}, fault: "late", last: 2 * time.Second},
	{limit: 60, target: map[string]int64{"a": 30, "b": 10, "c": 10, "d": 10}, last: 1500 * time.Millisecond},
}

// stale returns the shares replica r decides from in phase i: replica 1
// is a phase behind where the limit allows, as a replica that has not
// yet read the newest demands.
func stale(i, r int) map[string]int64 {
	if r == 0 || i == 0 {
		return phases[i].target
	}
	var sum int64
	for _, q := range phases[i-1].target {
		sum += q
	}
	if sum > phases[i].limit {
		return phases[i].target
	}
	return phases[i-1].target
}

// rename returns target with each name replaced by its holder name.
func rename(target map[string]int64, holders map[string]string) map[string]int64 {
	out := make(map[string]int64, len(target))
	for name, q := range target {
		out[holders[name]] = q
	}
	return out
}

// limitAt returns the limit the ledger's head puts in force for window k
// (the largest limit of the run where no era covers k).
func limitAt(s *ledger.State, k int64, w time.Duration) int64 {
	for _, e := range s.Head.Eras {
		if e.Window == w && k >= e.Start {
			return e.Limit(k)
		}
	}
	return 100
}

// fixedClock is a clock that stands still unless moved.
type fixedClock struct{ t atomic.Int64 }

func (c *fixedClock) Now() time.Time { return time.Unix(0, c.t.Load()) }

// signalLim tells when an Enforce has finished (it makes one SetSchedule).
type signalLim struct {
	*limiter.Limiter
	done chan struct{}
}

func (l *signalLim) SetSchedule(steps []limiter.Step, expiry time.Time) (time.Time, error) {
	from, err := l.Limiter.SetSchedule(steps, expiry)
	select {
	case l.done <- struct{}{}:
	default:
	}
	return from, err
}

// TestARestartedProcessDoesNotInheritItsGrants: a member process uses up
// its grant of 60 in a window, dies and starts again within the window
// under the same name. Its new limiter has admitted nothing; were the
// grant still its own, the window would admit 120 of a limit of 100.
func TestARestartedProcessDoesNotInheritItsGrants(t *testing.T) {
	const win = time.Second
	srv := etcdtest.Start(t)
	keys := ledger.Keys("/test/ledger/")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	clk := &fixedClock{}
	clk.t.Store(ledger.StartOf(1000, win) + int64(win)/2)
	pb := NewPublisher(srv.Client(t), keys, clk.Now)
	p := ledger.Policy{Limit: 100, Window: win, Horizon: 4, Keep: 1}
	var got []int
	var names []string
	for inc := range 2 {
		lim, err := limiter.New(0, win, limiter.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		sl := &signalLim{Limiter: lim, done: make(chan struct{}, 1)}
		f, err := NewFollower(srv.Client(t), keys, "a", sl, win, log)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, f.Holder().Name())
		if inc == 0 {
			if _, err := pb.Round(context.Background(), p, map[string]int64{f.Holder().Name(): 60, "b": 40}); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		ended := make(chan struct{})
		go func() { f.Run(ctx); close(ended) }()
		<-sl.done // the first Enforce after the first read
		got = append(got, admit(lim, 1000))
		cancel() // the process dies
		<-ended
		lim.Close()
	}
	if names[0] == names[1] {
		t.Errorf("both incarnations of a are holder %s", names[0])
	}
	if got[0] != 60 || got[1] != 0 {
		t.Errorf("a admitted %v in one window as incarnations %v under a grant of 60 to the first (b holds the other 40 of 100), want [60 0]", got, names)
	}
}

// TestAFollowerReadsThroughASlowEtcd: with windows of 10 ms a follower's
// reads timed out after 20 ms, so behind an etcd 60 ms away it never read
// its grant and admitted nothing, for good.
func TestAFollowerReadsThroughASlowEtcd(t *testing.T) {
	const win = 10 * time.Millisecond
	srv := etcdtest.Start(t)
	px := netcut.StartProxy(t, srv.Endpoints()[0][len("http://"):])
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{px.URL()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	keys := ledger.Keys("/test/ledger/")
	clk := &fixedClock{}
	clk.t.Store(ledger.StartOf(1000, win) + int64(win)/2)
	lim, err := limiter.New(0, win, limiter.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	sl := &signalLim{Limiter: lim, done: make(chan struct{}, 1)}
	f, err := NewFollower(cli, keys, "a", sl, win, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	p := ledger.Policy{Limit: 100, Window: win, Horizon: 4, Keep: 1}
	if _, err := NewPublisher(srv.Client(t), keys, clk.Now).Round(context.Background(), p, map[string]int64{f.Holder().Name(): 60, "b": 40}); err != nil {
		t.Fatal(err)
	}
	px.SetDelay(30 * time.Millisecond) // each way
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	go func() { f.Run(ctx); close(ended) }()
	defer func() { cancel(); <-ended }()
	select {
	case <-sl.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the follower read nothing in 10 s through an etcd 60 ms away")
	}
	if got := admit(lim, 1000); got != 60 {
		t.Errorf("admitted %d under a grant of 60", got)
	}
}

// TestAFollowerNeedsAName: a holder name is a key's segment.
func TestAFollowerNeedsAName(t *testing.T) {
	for _, name := range []string{"", "a/b"} {
		if _, err := NewFollower(nil, "/l/", name, nil, time.Second, nil); !errors.Is(err, ErrName) {
			t.Errorf("NewFollower(%q): %v, want ErrName", name, err)
		}
	}
}

func admit(lim *limiter.Limiter, most int) int {
	n := 0
	for n < most && lim.TryAcquire() {
		n++
	}
	return n
}

// holders returns a target of n holders with quota q each.
func holders(n int, q int64) map[string]int64 {
	m := map[string]int64{}
	for i := range n {
		m[fmt.Sprintf("h%03d", i)] = q
	}
	return m
}

// auditAt reads the ledger and fails t when it breaks its invariant.
func auditAt(t *testing.T, kv clientv3.KV, keys ledger.Keys) *ledger.State {
	t.Helper()
	s, _, _, bad, err := Read(context.Background(), kv, keys)
	if err != nil || len(bad) > 0 {
		t.Fatalf("reading the ledger: %v %v", err, bad)
	}
	if vs := ledger.Audit(s); len(vs) > 0 {
		t.Fatalf("the ledger is over: %v", vs)
	}
	return s
}

// TestACollectOfMoreThanATransactionTakesSeveralRounds: 40 holders whose
// shares move leave publishes of 40 grants each; once they end below the
// floor, deleting them all takes more operations than etcd's 128 a
// transaction. Every round is written, the open publish is extended, and
// the ended publishes go over several rounds.
func TestACollectOfMoreThanATransactionTakesSeveralRounds(t *testing.T) {
	const win = time.Second
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	keys := ledger.Keys("/test/ledger/")
	now := time.Unix(0, ledger.StartOf(1000, win))
	pb := NewPublisher(cli, keys, func() time.Time { return now })
	p := ledger.Policy{Limit: 100, Window: win, Horizon: 4, Keep: 1}
	round := func(q int64) ledger.Change {
		t.Helper()
		ch, err := pb.Round(context.Background(), p, holders(40, q))
		if err != nil {
			t.Fatalf("round at window %d: %v: %v", ledger.WindowOf(now.UnixNano(), win), ch.Why, err)
		}
		if ch.Size() > ledger.DefaultMaxOps {
			t.Fatalf("a change of %d operations", ch.Size())
		}
		auditAt(t, cli, keys)
		return ch
	}
	for _, q := range []int64{2, 1, 2, 1} {
		round(q)
		now = now.Add(win)
	}
	now = now.Add(4 * win)
	for range 6 {
		round(1)
	}
	s := auditAt(t, cli, keys)
	k := ledger.WindowOf(now.UnixNano(), win)
	e, _ := s.Head.Current()
	if got := s.Sum(e.Seq, k+1); got != 40 {
		t.Errorf("the holders hold %d in window %d, want 40", got, k+1)
	}
	for _, pub := range s.Pubs {
		if pub.B < e.Floor {
			t.Errorf("publish %d ended at window %d, below the floor %d, is still there", pub.Seq, pub.B, e.Floor)
		}
	}
}

// TestAPublishToMoreHoldersThanATransactionHolds: a publish to 300
// holders is 302 operations, more than etcd's 128 a transaction. Two
// publishers deciding different quotas take turns writing its grants
// ahead of it; none counts until the publish is written, the ledger is
// never over, and the publish after it has the last decision's quotas.
func TestAPublishToMoreHoldersThanATransactionHolds(t *testing.T) {
	const win = time.Second
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	keys := ledger.Keys("/test/ledger/")
	now := time.Unix(0, ledger.StartOf(1000, win))
	clock := func() time.Time { return now }
	a, b := NewPublisher(cli, keys, clock), NewPublisher(srv.Client(t), keys, clock)
	p := ledger.Policy{Limit: 1000, Window: win, Horizon: 4, Keep: 1}
	k := ledger.WindowOf(now.UnixNano(), win)
	rounds := 0
	for i := 0; i < 40; i++ {
		pb, q := a, int64(1)
		if i < 6 && i%2 == 1 {
			pb, q = b, 3 // another decision between a's rounds
		}
		ch, err := pb.Round(context.Background(), p, holders(300, q))
		if err != nil {
			t.Fatalf("round %d: %v: %v", i, ch.Why, err)
		}
		s := auditAt(t, cli, keys)
		if e, ok := s.Head.Current(); ok && len(s.Pubs) == 0 && s.Sum(e.Seq, k) != 0 {
			t.Fatalf("round %d: grants of no publish count %d", i, s.Sum(e.Seq, k))
		}
		if rounds = i + 1; i >= 6 && ch.Empty() {
			break
		}
	}
	t.Logf("%d rounds until nothing was left to write", rounds)
	// The grants written ahead keep the quotas they were written with;
	// the next publish, past the horizon, has a's.
	for range p.Horizon + 2 {
		now = now.Add(win)
		if _, _, err := a.Rounds(context.Background(), p, holders(300, 1), 20); err != nil {
			t.Fatal(err)
		}
	}
	k = ledger.WindowOf(now.UnixNano(), win)
	s := auditAt(t, cli, keys)
	e, _ := s.Head.Current()
	if got := s.Sum(e.Seq, k); got != 300 {
		t.Errorf("the 300 holders hold %d in window %d, want 300", got, k)
	}
	for h := range holders(300, 1) {
		if got := s.Allowance(h, e.Seq, k); got != 1 {
			t.Fatalf("%s holds %d, want 1", h, got)
		}
	}
	for key := range s.Grants {
		if _, ok := s.Pubs[key.Pub]; !ok {
			t.Errorf("grant of %s in publish %d, never written, is still there", key.Holder, key.Pub)
		}
	}
}

// TestReadNamesTheKeyOfABadRecord: a record that does not decode adds no
// room, and Read says which key it is at, so an operator can find it.
func TestReadNamesTheKeyOfABadRecord(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	keys := ledger.Keys("/test/ledger/")
	key := keys.Grant("h1", 1)
	resp, err := cli.Put(context.Background(), key, "not json")
	if err != nil {
		t.Fatal(err)
	}
	s, _, _, bad, err := Read(context.Background(), cli, keys)
	if err != nil {
		t.Fatal(err)
	}
	var re *RecordError
	if len(bad) != 1 || !errors.As(bad[0], &re) || re.Key != key || re.Rev != resp.Header.Revision || !errors.Is(bad[0], ledger.ErrInvalid) {
		t.Fatalf("Read reports %v, want one *RecordError at %s, revision %d, wrapping ledger.ErrInvalid", bad, key, resp.Header.Revision)
	}
	if len(s.Grants) != 0 {
		t.Errorf("the bad record added grants: %v", s.Grants)
	}
}
