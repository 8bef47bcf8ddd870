package cluster

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestMemberReloadsAfterCompaction: a member whose watches fall behind a
// compaction must read everything again, never carry on without the
// changes it missed. The member reaches etcd through a proxy; the proxy
// cuts it off, the provider's keys change, and etcd is compacted past
// every revision the member has seen. When the proxy lets it through
// again, its client resumes its watches (its config and share record,
// configd's election) from where they stopped, which etcd no longer has:
// the watches end with ErrCompacted, and the member reads its keys again
// (three, whatever the fleet's size), keeps its lease, and applies what
// changed during the gap.
//
// The member's lease outlives the cut (30 s TTL) and it writes no record
// of its own meanwhile (report interval 1h; no change reaches it), so
// only the watches can notice, which the log shows.
func TestMemberReloadsAfterCompaction(t *testing.T) {
	const w = 100 * time.Millisecond
	for _, tc := range []struct {
		name   string
		gap    func(t *testing.T, cli *clientv3.Client, leader clientv3.LeaseID) // the change made during the gap
		source string                                                            // what the member then follows
		share  int64                                                             // and the share it enforces
	}{
		{
			// The provider's watch is behind: configd publishes again.
			name: "new shares",
			gap: func(t *testing.T, cli *clientv3.Client, _ clientv3.LeaseID) {
				putShares(t, cli, schema.Shares{
					Version: 1, Provider: "api", Generation: 2, EffectiveFrom: time.Now().Add(2 * w).Truncate(w).UnixNano(), Window: schema.Duration(w),
					Total: 90, Instances: 1, Shares: map[string]int64{"a": 80}, Granted: map[string]int64{"a": 80},
				})
			},
			source: "shares", share: 80,
		},
		{
			// The election's watch is behind (a quiet prefix: its resume
			// revision is the session's first): configd goes, and the
			// member, alone, goes on the even split — capped by its last
			// grant for a hold after configd went (follow.Even, rule 2).
			name: "leader gone",
			gap: func(t *testing.T, cli *clientv3.Client, leader clientv3.LeaseID) {
				if _, err := cli.Revoke(context.Background(), leader); err != nil {
					t.Fatal(err)
				}
			},
			source: "even", share: 60,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := etcdtest.Start(t)
			cli := srv.Client(t)
			putConfig(t, cli, schema.ProviderConfig{Name: "api", Limit: 90, Window: schema.Duration(w)})
			ctx := context.Background()
			leader := liveLeader(t, cli)

			px, pcli := cutOffable(t, srv)
			var logs logbuf.Buffer
			a := join(t, pcli, "api", "a", WithLeaseTTL(30*time.Second), WithReportInterval(time.Hour),
				WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			// Published once a registered, as configd does.
			putShares(t, cli, schema.Shares{
				Version: 1, Provider: "api", Generation: 1, EffectiveFrom: time.Now().Truncate(w).UnixNano(), Window: schema.Duration(w),
				Total: 90, Instances: 1, Shares: map[string]int64{"a": 60}, Granted: map[string]int64{"a": 60},
			})
			enforcing(t, a, 60)
			// Its acknowledgement written: no write of its own is under way.
			waitFor(t, "a's acknowledgement of generation 1", func() bool {
				resp, err := cli.Get(ctx, keys.Instance("api", "a"))
				if err != nil || len(resp.Kvs) == 0 {
					return false
				}
				r, err := schema.DecodeInstanceRecord(resp.Kvs[0].Value)
				return err == nil && r.AppliedGeneration == 1
			})

			px.Cut()
			tc.gap(t, cli, leader)
			// Enough writes that the compaction lies well past anything
			// the member saw, then compact at the newest revision.
			var rev int64
			for range 10 {
				resp, err := cli.Put(ctx, "/unrelated/filler", "x")
				if err != nil {
					t.Fatal(err)
				}
				rev = resp.Header.Revision
			}
			if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
				t.Fatal(err)
			}
			mark := logs.Len()
			leaseOf := func() int64 {
				t.Helper()
				resp, err := cli.Get(ctx, keys.Instance("api", "a"))
				if err != nil || len(resp.Kvs) == 0 {
					t.Fatalf("a's instance key: %v", err)
				}
				return resp.Kvs[0].Lease
			}
			lease := leaseOf()
			px.Heal()

			waitFor(t, "a to follow "+tc.source, func() bool {
				st := a.Status()
				return st.Connected && st.Source == tc.source && st.Share == tc.share
			})
			enforcing(t, a, tc.share)
			if log := logs.From(mark); !strings.Contains(log, rpctypes.ErrCompacted.Error()) {
				t.Errorf("the member did not say it read its keys again after the compacted watch; log since the cut:\n%s", log)
			}
			// It read its three keys again and kept its lease: a compaction
			// does not make every member of a fleet register again at once.
			if got := leaseOf(); got != lease {
				t.Errorf("a registered again (lease %x → %x) on a compacted watch; it should only read its keys again", lease, got)
			}
		})
	}
}
