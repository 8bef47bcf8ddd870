package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/ledger"
)

// TestWhatAPublisherKeepsIsTheLedger: a publisher decides from the ledger
// it kept, with its own writes and the releases written since, while the
// head is the one it wrote. Over random rounds, moving targets, holders'
// releases, a second publisher's writes and a record deleted by hand,
// what it would decide from is, before every round, what a whole read
// returns, unless its periodic whole read is still to come after a hand
// edit, which changes no head.
func TestWhatAPublisherKeepsIsTheLedger(t *testing.T) {
	const win = time.Second
	seed := rand.Uint64()
	if v, err := strconv.ParseUint(os.Getenv("SLUICE_KEPT_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (replay: SLUICE_KEPT_SEED=%d go test -run TestWhatAPublisherKeepsIsTheLedger ./internal/ledger/store)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	keys := ledger.Keys("/test/kept/")
	ctx := context.Background()
	now := time.Unix(0, ledger.StartOf(1000, win))
	clock := func() time.Time { return now }
	pb, other := NewPublisher(cli, keys, clock), NewPublisher(cli, keys, clock)
	p := ledger.Policy{Limit: 1000, Window: win, Horizon: 6, Keep: 2, Slack: 5, MaxOps: 16}
	var edited bool // a hand edit the whole read has not seen yet
	var kept, whole int
	for r := range 400 {
		target := map[string]int64{}
		for i := range 3 + rng.IntN(8) {
			target[fmt.Sprintf("h%02d", i)] = 20 + rng.Int64N(100)
		}
		switch x := rng.IntN(11); {
		case x < 6:
			if _, err := pb.Round(ctx, p, target); err != nil && err != ErrMoved {
				t.Fatalf("seed %d, round %d: %v", seed, r, err)
			}
		case x == 10:
			// A fence that no longer holds: the write is refused, the
			// head is not moved, and what was kept stays.
			if _, err := pb.Round(ctx, p, target, refused); err != nil && err != ErrMoved {
				t.Fatalf("seed %d, round %d, refused: %v", seed, r, err)
			}
		case x < 7:
			if _, err := other.Round(ctx, p, target); err != nil && err != ErrMoved {
				t.Fatalf("seed %d, round %d, the other publisher: %v", seed, r, err)
			}
		case x < 9:
			release(t, ctx, cli, keys, now, rng)
		default:
			now = now.Add(win / 2)
		}
		if r%97 == 96 {
			s, _, _, _, _ := Read(ctx, cli, keys)
			if gs := slices.Collect(maps.Keys(s.Grants)); len(gs) > 0 {
				g := gs[rng.IntN(len(gs))]
				if _, err := cli.Delete(ctx, keys.Grant(g.Holder, g.Pub)); err != nil {
					t.Fatal(err)
				}
				edited = true
			}
		}
		if pb.kept == nil {
			continue
		}
		got, _, err := pb.read(ctx)
		if err != nil {
			t.Fatalf("seed %d, round %d: %v", seed, r, err)
		}
		want, _, _, _, err := Read(ctx, cli, keys)
		if err != nil {
			t.Fatal(err)
		}
		if pb.rounds == 0 { // a whole read
			whole++
			edited = false
		} else {
			kept++
		}
		if !edited && !reflect.DeepEqual(normal(got), normal(want)) {
			t.Fatalf("seed %d, round %d: the publisher would decide from\n%+v\nthe ledger is\n%+v", seed, r, normal(got), normal(want))
		}
	}
	t.Logf("%d reads from what was kept, %d whole", kept, whole)
	if kept == 0 {
		t.Error("the publisher never decided from what it kept")
	}
}

// refused is a condition that never holds: a fence that moved.
var refused = clientv3.Compare(clientv3.CreateRevision("/test/no-such-fence"), ">", 0)

// TestARefusedRoundKeepsWhatItRead: a round whose write is refused by an
// extra condition alone (the config moved, the fence) keeps the ledger
// it decided from, since the head did not move, and the next round
// decides from it: at N = 2,000 every round refused while configd's
// watch caught up with a new config read all of the ledger again.
func TestARefusedRoundKeepsWhatItRead(t *testing.T) {
	cli, keys, clock, p := refusalLedger(t, "/test/refused/")
	ctx := context.Background()
	pb := NewPublisher(cli, keys, clock)
	if _, err := pb.Round(ctx, p, map[string]int64{"a": 50, "b": 50}); err != nil {
		t.Fatal(err)
	}
	if pb.kept == nil {
		t.Fatal("nothing kept after a round written")
	}
	for i := range 3 {
		if _, err := pb.Round(ctx, p, map[string]int64{"a": 70, "b": 30}, refused); !errors.Is(err, ErrMoved) {
			t.Fatalf("a round whose fence failed: %v, want ErrMoved", err)
		}
		if pb.kept == nil || pb.rounds != i+1 {
			t.Fatalf("after %d rounds refused by their fence alone: kept %v, %d rounds since a whole read; want it kept and %d", i+1, pb.kept != nil, pb.rounds, i+1)
		}
	}
	ch, err := pb.Round(ctx, p, map[string]int64{"a": 70, "b": 30})
	if err != nil || ch.Empty() {
		t.Fatalf("the round after: %v, %v", ch.Why, err)
	}
	if pb.rounds != 4 {
		t.Errorf("the round after read the whole ledger: %d rounds since, want 4", pb.rounds)
	}
}

// TestARoundRefusedWithTheHeadMovedKeepsNothing: another writer moves
// the head between a round's read and its write, whose fence fails too:
// what was kept is no longer the ledger, and goes.
func TestARoundRefusedWithTheHeadMovedKeepsNothing(t *testing.T) {
	cli, keys, clock, p := refusalLedger(t, "/test/moved/")
	ctx := context.Background()
	hk := &beforeTxn{KV: cli}
	pb, other := NewPublisher(hk, keys, clock), NewPublisher(cli, keys, clock)
	if _, err := pb.Round(ctx, p, map[string]int64{"a": 50, "b": 50}); err != nil {
		t.Fatal(err)
	}
	hk.before = func() {
		if _, err := other.Round(ctx, p, map[string]int64{"a": 40, "c": 60}); err != nil {
			t.Fatalf("the other writer: %v", err)
		}
	}
	if _, err := pb.Round(ctx, p, map[string]int64{"a": 70, "b": 30}, refused); !errors.Is(err, ErrMoved) {
		t.Fatalf("a round refused with the head moved: %v, want ErrMoved", err)
	}
	if hk.before != nil {
		t.Fatal("the other writer did not write between the round's read and its write")
	}
	if pb.kept != nil {
		t.Errorf("a round refused with the head moved kept what it had read")
	}
}

// refusalLedger starts an etcd for the refusal tests and returns its
// client, a ledger's keys under prefix, a clock standing still and a
// policy of 100 per second.
func refusalLedger(t *testing.T, prefix string) (*clientv3.Client, ledger.Keys, func() time.Time, ledger.Policy) {
	const win = time.Second
	now := time.Unix(0, ledger.StartOf(1000, win))
	return etcdtest.Start(t).Client(t), ledger.Keys(prefix), func() time.Time { return now },
		ledger.Policy{Limit: 100, Window: win, Horizon: 6, Keep: 2}
}

// beforeTxn runs before, once, just before the next conditioned
// transaction commits: another writer between a round's read and write.
type beforeTxn struct {
	clientv3.KV
	before func()
}

type hookedTxn struct {
	clientv3.Txn
	kv   *beforeTxn
	cond bool
}

func (h *beforeTxn) Txn(ctx context.Context) clientv3.Txn {
	return &hookedTxn{Txn: h.KV.Txn(ctx), kv: h}
}

func (t *hookedTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cond = len(cs) > 0
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *hookedTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *hookedTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *hookedTxn) Commit() (*clientv3.TxnResponse, error) {
	if f := t.kv.before; t.cond && f != nil {
		t.kv.before = nil
		f()
	}
	return t.Txn.Commit()
}

// release writes the releases one holder of the ledger would write now.
func release(t *testing.T, ctx context.Context, kv clientv3.KV, keys ledger.Keys, now time.Time, rng *rand.Rand) {
	t.Helper()
	s, _, _, _, err := Read(ctx, kv, keys)
	if err != nil {
		t.Fatal(err)
	}
	var hs []string
	for g := range s.Grants {
		hs = append(hs, g.Holder)
	}
	if len(hs) == 0 {
		return
	}
	slices.Sort(hs)
	var ops []ledger.Op
	for _, r := range s.ToRelease(hs[rng.IntN(len(hs))], now.UnixNano(), 0) {
		b, err := ledger.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, ledger.Op{Key: keys.Release(r), Value: b})
	}
	if len(ops) > 0 {
		if err := Put(ctx, kv, ops); err != nil {
			t.Fatal(err)
		}
	}
}

// normal returns s with its releases' steps in order, so that two reads
// of the same records compare equal.
func normal(s *ledger.State) *ledger.State {
	s = s.Clone()
	for k, rs := range s.Releases {
		rs.Steps = slices.Clone(rs.Steps)
		slices.SortFunc(rs.Steps, func(a, b ledger.Step) int {
			if a.From != b.From {
				return int(a.From - b.From)
			}
			return int(a.Limit - b.Limit)
		})
		s.Releases[k] = rs
	}
	return s
}
