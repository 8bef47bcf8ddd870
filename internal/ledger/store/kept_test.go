package store

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/ledger"
)

// TestAReleaseDeletedIsNotRoomTheKeptLedgerGivesAway: instances may
// write, and so delete, their provider's releases (configd/access.go). A
// deletion is no write that a read of the releases since shows, and the
// grant counts its whole quota again: a publisher deciding from what it
// kept must see it went, or it gives the released room away and configd
// itself writes a ledger over its limit.
func TestAReleaseDeletedIsNotRoomTheKeptLedgerGivesAway(t *testing.T) {
	const win = time.Second
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	keys := ledger.Keys("/test/deleted/")
	ctx := context.Background()
	now := time.Unix(0, ledger.StartOf(1000, win))
	pb := NewPublisher(cli, keys, func() time.Time { return now })
	p := ledger.Policy{Limit: 100, Window: win, Horizon: 6, Keep: 2, Slack: 2}
	rounds := func(target map[string]int64) {
		t.Helper()
		for range 8 {
			ch, err := pb.Round(ctx, p, target)
			if err != nil {
				t.Fatal(err)
			}
			if ch.Empty() {
				return
			}
		}
	}
	rounds(map[string]int64{"a": 50, "b": 50})
	// a's target falls to 20: a releases 30 from the next window.
	now = now.Add(win / 4)
	rounds(map[string]int64{"a": 20, "b": 50}) // nothing to write: the same open publish, within what a releases
	s, _, _, _, _ := Read(ctx, cli, keys)
	var rels []ledger.Op
	for _, r := range s.ToRelease("a", now.UnixNano(), 0) {
		b, _ := ledger.Encode(r)
		rels = append(rels, ledger.Op{Key: keys.Release(r), Value: b})
	}
	if len(rels) == 0 {
		t.Fatal("a has nothing to release")
	}
	if err := Put(ctx, cli, rels); err != nil {
		t.Fatal(err)
	}
	rounds(map[string]int64{"a": 20, "b": 50}) // the kept ledger reads the releases
	// An instance's credentials delete a's releases: a's grant counts 50 again.
	if _, err := cli.Delete(ctx, keys.AllReleases(), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	// b's target grows into the room a released.
	rounds(map[string]int64{"a": 20, "b": 80})
	s, _, _, bad, err := Read(ctx, cli, keys)
	if err != nil || len(bad) > 0 {
		t.Fatal(err, bad)
	}
	if vs := ledger.Audit(s); len(vs) > 0 {
		t.Errorf("configd wrote a ledger over its limit from a release deleted since it kept it: %v", vs)
	}
}
