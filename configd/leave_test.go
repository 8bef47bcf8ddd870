package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// TestLedgerMemberLeavingReleasesItsGrants: a member closed cleanly
// releases its grants from the first window its limiter governs whole,
// so the ledger lets it admit nothing from there on, though its grants
// reach the horizon (30 s): configd may hand its room on at once.
func TestLedgerMemberLeavingReleasesItsGrants(t *testing.T) {
	cli, c := leavingRig(t)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	left := time.Now()
	st := readLedger(t, cli, "api")
	// The window under way when it left, the next (its limiter's first
	// whole one) and one more for the clock's guard band: from there on
	// it holds nothing.
	k := ledger.WindowOf(left.UnixNano(), itWindow) + 2
	var held, reach int64
	for g := range st.Counted() {
		if !strings.HasPrefix(g.Holder, "c.") {
			continue
		}
		_, b, _ := st.Span(g)
		reach = max(reach, b)
		for win := k; win <= b; win++ {
			held = max(held, st.Effective(g, win))
		}
	}
	if reach < k+10 {
		t.Fatalf("c's grants reach window %d, the test needs them past %d", reach, k+10)
	}
	if held != 0 {
		t.Errorf("c, gone, still holds %d a window from window %d to its grants' end %d", held, k, reach)
	}
}

// TestLedgerLeaveKeepsReservedWindows: a member whose limiter has handed
// out reservations in future windows (limiter.Reserve, which is what
// sluice-agent's POST /v1/reserve returns to its callers as delay_ms)
// closes cleanly. A caller told "valid in d" calls then, so the leave
// must keep those windows' room: what the others are granted there plus
// the reserved permits stays within the limit.
func TestLedgerLeaveKeepsReservedWindows(t *testing.T) {
	cli, c := leavingRig(t)
	lim := c.Limiter()
	// Book c's whole quota in the coming windows, as the agent's callers
	// reserving ahead would.
	reserved := map[int64]int64{}
	var rs []*limiter.Reservation
	for range 200 {
		res, err := lim.Reserve(1, 20*itWindow)
		if err != nil {
			break
		}
		d := res.Delay()
		if d == 0 {
			continue // valid now: the window under way, which the leave keeps
		}
		rs = append(rs, res)
		reserved[ledger.WindowOf(time.Now().Add(d).UnixNano(), itWindow)]++
	}
	if len(reserved) == 0 {
		t.Fatal("c reserved nothing ahead")
	}
	t.Logf("c reserved ahead, by window: %v", reserved)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * itWindow)
	for time.Now().Before(deadline) {
		st := readLedger(t, cli, "api")
		e, ok := st.Head.Current()
		if ok {
			now := ledger.WindowOf(time.Now().UnixNano(), itWindow)
			for w, n := range reserved {
				if w < now {
					continue
				}
				// What the others hold there: c's own grant, if it kept
				// it, covers what its callers reserved.
				var others int64
				for g := range st.Counted() {
					if p, ok := st.Pubs[g.Pub]; ok && p.Era == e.Seq && !strings.HasPrefix(g.Holder, "c.") {
						others += st.Effective(g, w)
					}
				}
				if lim := e.Limit(w); others+n > lim {
					t.Fatalf("window %d: the ledger grants the others %d and c's callers hold %d reserved there before it left: %d of %d", w, others, n, others+n, lim)
				}
			}
		}
		time.Sleep(itWindow / 4)
	}
}

// leavingRig serves provider api, 300 a window with fail_static 30 s, to
// members a, b and c, and returns the etcd client and c once granted.
func leavingRig(t *testing.T) (*clientv3.Client, *cluster.Member) {
	srv := etcdtest.Start(t)
	cli := itClient(t, srv)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	itCLI(t, "set", "api", "--limit", "300", "--window", itWindow.String(), "--fail-static", "30s", "--server="+r.url())
	members := itJoin(t, srv, "api", "a", "b", "c")
	c := members[2]
	itWait(t, "c granted", func() (bool, string) {
		st := c.Status()
		return st.Source == schema.SourceLedger && st.Share > 0, fmt.Sprintf("%+v", st)
	})
	return cli, c
}
