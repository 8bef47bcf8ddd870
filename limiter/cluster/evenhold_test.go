package cluster

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestEvenSplitRemembersAReplacedFailStatic is
// TestEvenSplitHoldsForALoweredFailStatic with one more thing, each found
// by an adversarial review of 2078e09: b's own session restarts (b loses
// etcd for a moment, or its watch falls behind a compaction) while
// fail_static is lowered, or the provider is deleted and created again,
// or a's lease is longer than b's. The Member forgot the old value on a
// reload or a deletion (it kept only the config in force) and remembered
// it for its own lease, not a's; b's even split held for the new 1 s
// while a, cut off before the change, admitted its 60 for 10 s past its
// lease: 150 in a window of 90.
func TestEvenSplitRemembersAReplacedFailStatic(t *testing.T) {
	for _, how := range []string{"b's session restarts", "deleted and created again", "a's lease is longer than b's"} {
		t.Run(how, func(t *testing.T) {
			const w = 100 * time.Millisecond
			srv := etcdtest.Start(t)
			cli := srv.Client(t)
			putConfig(t, cli, schema.ProviderConfig{Name: "api", Limit: 90, Window: schema.Duration(w), FailStatic: schema.Duration(10 * time.Second)})
			ctx := context.Background()
			leader := liveLeader(t, cli)
			pxa, acli := cutOffable(t, srv)
			pxb, bcli := cutOffable(t, srv)
			var aopts []Option
			if how == "a's lease is longer than b's" {
				// replaced.until counts b's own lease TTL (1 s), not a's.
				aopts = append(aopts, WithLeaseTTL(5*time.Second))
			}
			a := join(t, acli, "api", "a", aopts...)
			var logs logbuf.Buffer
			b := join(t, bcli, "api", "b", WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			putShares(t, cli, schema.Shares{
				Version: 1, Provider: "api", Generation: 7, EffectiveFrom: time.Now().Add(2 * w).Truncate(w).UnixNano(), Window: schema.Duration(w),
				Total: 90, Instances: 2, Shares: map[string]int64{"a": 60, "b": 30}, Granted: map[string]int64{"a": 60, "b": 30},
			})
			enforcing(t, a, 60)
			enforcing(t, b, 30)

			pxa.Cut()
			horizon := a.Status().AdmitsUntil
			lowered := schema.ProviderConfig{Name: "api", Limit: 90, Window: schema.Duration(w), FailStatic: schema.Duration(time.Second)}
			switch how {
			case "b's session restarts":
				pxb.Cut()
				putConfig(t, cli, lowered)
				waitFor(t, "b's session to end", func() bool { return !b.Status().Connected })
				pxb.Heal()
				waitFor(t, "b's session back", func() bool { return b.Status().Connected })
			case "a's lease is longer than b's":
				putConfig(t, cli, lowered)
			default:
				if _, err := cli.Delete(ctx, keys.Config("api")); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "b on the fallback", func() bool { return b.Status().Source == "fallback" })
				putConfig(t, cli, lowered)
				waitFor(t, "b on the shares again", func() bool { return b.Status().Source == "shares" })
			}
			if _, err := cli.Revoke(ctx, leader); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "b on the even split", func() bool { return b.Status().Source == "even" })
			for {
				if !time.Now().Before(horizon.Add(-time.Second)) {
					t.Logf("b stayed within 30 until a's horizon")
					return
				}
				if b.Limiter().Stats().Quota > 30 {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			for {
				n := b.Limiter().Now()
				if n.Sub(n.Truncate(w)) < 20*time.Millisecond {
					break
				}
				time.Sleep(time.Millisecond)
			}
			start := b.Limiter().Now().Truncate(w)
			var got int64
			for _, m := range []*Member{a, b} {
				q := m.Limiter().Stats().Quota
				if m.Limiter().TryAcquireN(q) {
					got += q
				}
			}
			end := b.Limiter().Now().Truncate(w)
			if start.Equal(end) && got > 90 {
				t.Errorf("admitted %d in the 100 ms window at %s, limit 90: a (cut off, fail_static 10 s, admits until %s) and b (even split)",
					got, start.Format("15:04:05.000"), horizon.Format("15:04:05.000"))
			}
			t.Logf("admitted %d in one window", got)
		})
	}
}
