package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-go/sluice/configd/round"
	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestJitteringDemandsKeepGrantsWithinTheHorizon: configd's rounds
// (round.Target of the "fair" split, round.Policy, Publisher.Rounds, as
// publishLedger runs them) over a real etcd, ten holders whose smoothed
// demands wiggle by a few percent, four rounds a window. With a slack of
// 2% of a holder's average share (1000/50/10 = 2), almost every round
// missed the open publish's quotas, and each new publish started after
// the open one ended: 104 publishes, the last grant 99 windows past now,
// with a horizon of 10. With 2% of the limit for each holder: one
// publish, within the horizon.
func TestJitteringDemandsKeepGrantsWithinTheHorizon(t *testing.T) {
	const win = time.Second
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	keys := ledger.Keys("/test/ledger/api/")
	cfg := schema.ProviderConfig{Version: 1, Name: "api", Limit: 1000, Window: schema.Duration(win),
		Algorithm: schema.Algorithm("fair"), Coordination: schema.CoordinationLedger}
	now := time.Unix(0, ledger.StartOf(1000, win))
	pb := NewPublisher(cli, keys, func() time.Time { return now })
	rng := rand.New(rand.NewPCG(9, 9))
	live := make([]schema.InstanceRecord, 10)
	for i := range live {
		live[i] = schema.InstanceRecord{ID: fmt.Sprintf("i%02d", i), Holder: fmt.Sprintf("h%02d", i), Demand: 70}
	}
	var slack int64
	for r := range 120 { // 30 windows
		for i := range live {
			live[i].Demand = 65 + rng.Int64N(10) // smoothed demand, within ±7%, all of it under the limit
		}
		target, _, err := round.Target(cfg, live)
		if err != nil {
			t.Fatal(err)
		}
		p := round.Policy(cfg)
		slack = p.Slack
		if _, _, err := pb.Rounds(context.Background(), p, target, 8); err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
		now = now.Add(round.Tick(win))
	}
	s := auditAt(t, cli, keys)
	k := ledger.WindowOf(now.UnixNano(), win)
	var end int64
	for _, pub := range s.Pubs {
		end = max(end, pub.B)
	}
	h := round.Horizon(cfg)
	t.Logf("slack %d; after 120 rounds (30 windows): %d publishes and %d grants live; the last grant ends at window %d, %d windows past now, horizon %d",
		slack, len(s.Pubs), len(s.Grants), end, end-k, h)
	if end-k > h+1 {
		t.Errorf("grants run %d windows (%v) past now, the horizon is %d windows: a cut-off holder admits that long and a lowering waits that long", end-k, time.Duration(end-k)*win, h)
	}
}
