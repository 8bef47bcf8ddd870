package store

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/limiter"
)

// TestAFollowerAcrossALedgerDeletedWholeKeepsTheLimit: a ledger deleted
// whole once every grant in it has ended, releases counted (configd
// empties it and keeps its head, but an operator may delete it all), may
// leave an old publish whose grants were released running for many
// windows, and a follower that lives across the deletion keeps it: it
// does not watch publishes go. A ledger begun again numbers its
// publishes past the old ones, so a grant written ahead of a new publish
// never counts under an old one's number.
func TestAFollowerAcrossALedgerDeletedWholeKeepsTheLimit(t *testing.T) {
	const win = time.Second
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	keys := ledger.Keys("/test/reuse/")
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	clk := &fixedClock{}
	at := func(k int64) { clk.t.Store(ledger.StartOf(k, win) + int64(win)/2) }
	at(10)

	lim, err := limiter.New(0, win, limiter.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	sl := &signalLim{Limiter: lim, done: make(chan struct{}, 1)}
	f, err := NewFollower(cli, keys, "y", sl, win, log)
	if err != nil {
		t.Fatal(err)
	}
	y := f.Holder().Name()
	fctx, cancel := context.WithCancel(ctx)
	ended := make(chan struct{})
	go func() { f.Run(fctx); close(ended) }()
	defer func() { cancel(); <-ended }()
	settle := func() {
		t.Helper()
		for range 3 { // Enforces after the writes arrived
			select {
			case <-sl.done:
			case <-time.After(5 * time.Second):
				t.Fatal("the follower did not enforce")
			}
		}
	}

	// The old ledger: publish 2 runs to window 60; its one grant, a's,
	// was released to 0 from window 12: the ledger ended at window 11.
	old := ledger.NewState()
	old.Head = ledger.Head{Seq: 9, Pubs: 2, Eras: []ledger.Era{{Seq: 1, Window: win, Limits: []ledger.Step{{From: 0, Limit: 100}}}}}
	p2 := ledger.Pub{Seq: 2, Era: 1, Window: win, A: 10, B: 60}
	old.Pubs[2] = p2
	old.Grants[ledger.GrantKey{Pub: 2, Holder: "a"}] = ledger.Grant{Pub: 2, Holder: "a", Quota: 100, From: 10}
	rel := ledger.Release{Pub: 2, Holder: "a", From: 12, Limit: 0}
	old.Apply(rel)
	if vs := ledger.Audit(old); len(vs) > 0 {
		t.Fatal(vs)
	}
	var ops []ledger.Op
	for _, kv := range []struct {
		key string
		v   any
	}{{keys.Head(), old.Head}, {keys.Pub(2), p2}, {keys.Grant("a", 2), old.Grants[ledger.GrantKey{Pub: 2, Holder: "a"}]}, {keys.Release(rel), rel}} {
		b, err := ledger.Encode(kv.v)
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, ledger.Op{Key: kv.key, Value: b})
	}
	if err := Put(ctx, cli, ops); err != nil {
		t.Fatal(err)
	}
	settle()
	// Window 14: the ledger goes whole, as ledgerEnded deletes it.
	at(14)
	if _, err := cli.Delete(ctx, string(keys), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	settle()

	// The new ledger, from nothing: transactions of 3, one change a
	// window once the target moves.
	pb := NewPublisher(cli, keys, clk.Now)
	p := ledger.Policy{Limit: 100, Window: win, Horizon: 10, Keep: 2, MaxOps: 3}
	for k := int64(15); k <= 23; k++ {
		at(k)
		if _, _, err := pb.Rounds(ctx, p, map[string]int64{"x": 50, y: 50}, 20); err != nil {
			t.Fatal(err)
		}
	}
	target := map[string]int64{"x": 8, y: 80}
	for i := range 12 {
		target[fmt.Sprintf("z%02d", i)] = 1
	}
	for k := int64(24); k <= 30; k++ {
		at(k)
		if _, err := pb.Round(ctx, p, target); err != nil {
			t.Fatal(err)
		}
		settle()
	}
	// Window 32, configd failing over: no change since window 30.
	at(32)
	settle()
	s, _, _, bad, err := Read(ctx, cli, keys)
	if err != nil || len(bad) > 0 {
		t.Fatal(err, bad)
	}
	if vs := ledger.Audit(s); len(vs) > 0 {
		t.Fatalf("the ledger itself is over: %v", vs)
	}
	mine := s.Allowance(y, 1, 32)
	others := s.Sum(1, 32) - mine
	got := int64(admit(lim, 1000))
	if got > mine {
		t.Errorf("window 32: y admitted %d; the ledger lets it hold %d", got, mine)
	}
	if got+others > 100 {
		t.Errorf("window 32: y admitted %d and the ledger lets the others hold %d: %d of a limit of 100", got, others, got+others)
	}
}
