package cluster

import (
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestEvenSplitStopsAnInstanceThatNoLongerCounts: with no configd alive,
// a is alone on the even split, with a lease of 10 s, and is cut off from
// etcd; b joins. a's key and confirmation live on until its lease ends, so
// b counts two instances, both confirmed, and takes half after a hold. a,
// which never counted b, kept the whole limit until its lease's end.
// Found by review: 60 in each of four 1 s windows of 40. An instance on
// the even split now admits no longer than follow.MaxPoll and the
// fail_static past the last count read it sent, which ends before the
// hold of a newcomer registered after that read.
func TestEvenSplitStopsAnInstanceThatNoLongerCounts(t *testing.T) {
	const w = time.Second
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	putConfig(t, cli, schema.ProviderConfig{Name: "api", Limit: 40, Window: schema.Duration(w), FailStatic: schema.Duration(500 * time.Millisecond)})
	px, pcli := cutOffable(t, srv)
	var alog, blog logbuf.Buffer
	a := join(t, pcli, "api", "a", WithLeaseTTL(10*time.Second), WithLogger(slog.New(slog.NewTextHandler(&alog, nil))))
	enforcing(t, a, 40) // alone on the even split, after its hold

	g := newGreedy(t, w)
	g.take(a)
	px.Cut()
	b := join(t, cli, "api", "b", WithLogger(slog.New(slog.NewTextHandler(&blog, nil))))
	g.take(b)
	waitFor(t, "b's half", func() bool { return b.Status().Share == 20 })
	time.Sleep(4 * w) // b at its half, for whole windows
	count := g.stop(t, 40)
	if t.Failed() {
		t.Logf("counts %v\na: %+v\nb: %+v\na's log:\n%s\nb's log:\n%s", count, a.Status(), b.Status(), alog.From(0), blog.From(0))
	}
}
