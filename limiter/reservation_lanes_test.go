package limiter

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestAnotherLaneDoesNotFreeAReservedWindow: a Multi over two lanes
// (cluster.Group: each lane its own Follower enforcing its own grants).
// A Reserve promises 1 request and 100 tokens in window 1 (sluice-agent's
// /v1/reserve tells the remote caller that delay). The tokens lane's
// schedule is lowered (its grant released to 50 from window 1): the
// Multi fails, so the requests lane gives its part back in window 1 and
// admits its whole quota there, beside the remote caller's request. The
// requests lane's grant (10) was never lowered.
func TestAnotherLaneDoesNotFreeAReservedWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := mustMulti(t, Limit{Quota: 10, Window: time.Second}, Limit{Dimension: "tokens", Quota: 100, Window: time.Second})
		for range 10 {
			if _, ok := m.TryAcquire(Cost("tokens", 10)); !ok {
				t.Fatal("window 0 not filled")
			}
		}
		r, err := m.Reserve(2*time.Second, Cost("tokens", 100))
		if err != nil {
			t.Fatal(err)
		}
		told := r.Delay()
		start := m.Stats()[0].WindowStart
		reqLane, tokLane := m.Limiter(0), m.Limiter(1)
		if _, err := tokLane.SetSchedule([]Step{{Quota: 100, Window: time.Second}, {At: start.Add(time.Second), Quota: 50, Window: time.Second}}, time.Time{}); err != nil {
			t.Fatal(err)
		}
		t.Logf("told delay %v; reservation now %v", told, r.Err())
		time.Sleep(told)
		n := 0
		for reqLane.TryAcquire() {
			n++
		}
		if n+1 > 10 {
			t.Errorf("requests window 1: the lane admits %d beside the remote caller's 1: %d of 10", n, n+1)
		}
	})
}
