package main

import (
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/internal/netcut"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// TestRestartWithTheSameIDFollowsTheCommonRecord: a process restarted
// with the same id (a pod's container restart: WithID(pod name)) while
// its predecessor's lease still lives overwrites the instance key, whose
// CreateRevision stays the predecessor's. The new process takes nothing
// of its pointer (written before it registered: Member.apply), and
// configd counts the pointer as fresh (e.rev >= registered), so it is
// never rewritten: retunes write the common record alone. The new
// process stays at 0 for good while configd counts it at its share.
func TestRestartWithTheSameIDFollowsTheCommonRecord(t *testing.T) {
	const w = 100 * time.Millisecond
	srv := etcdtest.Start(t)
	r1 := itServe(t, srv, "r1", "--propagation-margin", "200ms")
	itWait(t, "r1 leads", func() (bool, string) { return r1.leading(), "not yet" })
	itCLI(t, "set", "api", "--limit", "90", "--window", w.String(), "--fail-static", "1s", "--server="+r1.url())
	var alog, blog, clog, c2log logbuf.Buffer
	a := joinAPI(t, itClient(t, srv), "a", &alog)
	b := joinAPI(t, itClient(t, srv), "b", &blog)
	px := netcut.StartProxy(t, strings.TrimPrefix(srv.Endpoints()[0], "http://"))
	ccli, err := clientv3.New(clientv3.Config{Endpoints: []string{px.URL()}, DialTimeout: time.Second, Logger: zap.NewNop(), DialOptions: cluster.DialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ccli.Close() })
	c := joinAPI(t, ccli, "c", &clog, cluster.WithLeaseTTL(5*time.Second))
	itWait(t, "30 each", func() (bool, string) {
		return a.Status().Share == 30 && b.Status().Share == 30 && c.Status().Share == 30, ""
	})
	px.Cut() // c's process dies; its lease lives on for up to 5 s
	c2 := joinAPI(t, itClient(t, srv), "c", &c2log)
	itCLI(t, "set", "api", "--limit", "120", "--window", w.String(), "--fail-static", "1s", "--server="+r1.url())
	itWait(t, "a and b at 40", func() (bool, string) { return a.Status().Share == 40 && b.Status().Share == 40, "" })
	time.Sleep(5 * time.Second)
	itCLI(t, "set", "api", "--limit", "150", "--window", w.String(), "--fail-static", "1s", "--server="+r1.url())
	itWait(t, "a and b at 50", func() (bool, string) { return a.Status().Share == 50 && b.Status().Share == 50, "" })
	time.Sleep(2 * time.Second)
	if st := c2.Status(); st.Share != 50 {
		t.Errorf("the restarted c enforces %d (generation %d), the others 50: configd counts it at 50", st.Share, st.Generation)
	}
}
