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

// Found by review: with no configd alive, an instance cut off from etcd past its
// lease (its share lapsed) comes back with the same process. Its old
// share record still caps it at its grant, and it is not a newcomer
// (registeredAt is its first registration), so it enforces its grant from
// the next boundary a margin ahead, while the other instance, which grew
// into its room after a hold, keeps the whole limit until its next poll
// (60 in a window of 40). A process whose share lapsed now registers as a
// new one: older share records give it nothing, and the even split makes
// it wait a hold, by which the others have counted it.
func TestLapsedShareReturnsAsANewcomerUnderTheEvenSplit(t *testing.T) {
	const w = time.Second
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	putConfig(t, cli, schema.ProviderConfig{Name: "api", Limit: 40, Window: schema.Duration(w), FailStatic: schema.Duration(500 * time.Millisecond)})
	ctx := context.Background()
	leader := liveLeader(t, cli)
	px, pcli := cutOffable(t, srv)
	var alog, blog logbuf.Buffer
	a := join(t, pcli, "api", "a", WithLogger(slog.New(slog.NewTextHandler(&alog, nil))))
	// b polls the counts every 6 s (a legal report interval).
	b := join(t, cli, "api", "b", WithReportInterval(6*time.Second), WithLogger(slog.New(slog.NewTextHandler(&blog, nil))))
	putShares(t, cli, schema.Shares{
		Version: 1, Provider: "api", Generation: 1, EffectiveFrom: time.Now().Truncate(w).UnixNano(), Window: schema.Duration(w),
		Total: 40, Instances: 2, Shares: map[string]int64{"a": 20, "b": 20}, Granted: map[string]int64{"a": 20, "b": 20},
	})
	enforcing(t, a, 20)
	enforcing(t, b, 20)
	if _, err := cli.Revoke(ctx, leader); err != nil { // configd gone for good
		t.Fatal(err)
	}
	waitFor(t, "a on the even split", func() bool { return a.Status().Source == "even" })
	waitFor(t, "b on the even split", func() bool { return b.Status().Source == "even" })

	px.Cut()
	waitFor(t, "a disconnected", func() bool { return !a.Status().Connected })
	until := a.Status().AdmitsUntil
	waitFor(t, "a past its horizon", func() bool { return !a.Limiter().Now().Before(until.Truncate(w).Add(w)) })
	waitFor(t, "b takes the whole limit", func() bool { return b.Status().Share == 40 && b.Limiter().Stats().Quota == 40 })

	// Both take whatever they are allowed, counted per aligned window.
	g := newGreedy(t, w)
	g.take(a)
	g.take(b)
	time.Sleep(w)
	px.Heal()
	waitFor(t, "a reconnected", func() bool { return a.Status().Connected })
	time.Sleep(4 * w) // the windows around a's return, judged by the count
	count := g.stop(t, 40)
	if t.Failed() {
		t.Logf("counts %v\na's log:\n%s\nb's log:\n%s", count, alog.From(0), blog.From(0))
	}
}
