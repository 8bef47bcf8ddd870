package limiter

import (
	"errors"
	"testing"
	"time"
)

// TestSetWindowQuota: the quota is set for the window named while it is
// the current one, and every later window admits nothing until set
// again; a window not current, or another length, changes nothing.
func TestSetWindowQuota(t *testing.T) {
	clk := &settableClock{}
	const hour = int64(time.Hour)
	clk.ns.Store(1000*hour + hour/2)
	l, err := New(0, time.Hour, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	cur := time.Unix(0, 1000*hour)
	for _, c := range []struct {
		window time.Duration
		start  time.Time
	}{
		{time.Hour, cur.Add(-time.Hour)}, // a window gone by
		{time.Hour, cur.Add(time.Hour)},  // one ahead
		{time.Minute, cur},               // another length
	} {
		if ok, err := l.SetWindowQuota(5, c.window, c.start); ok || err != nil {
			t.Errorf("SetWindowQuota(5, %v, %v) in the window from %v: %v, %v; want false, nil", c.window, c.start, cur, ok, err)
		}
	}
	if l.TryAcquire() {
		t.Fatal("admitted with no quota set")
	}
	if ok, err := l.SetWindowQuota(3, time.Hour, cur); !ok || err != nil {
		t.Fatalf("SetWindowQuota of the current window: %v, %v", ok, err)
	}
	if !l.TryAcquireN(3) || l.TryAcquire() {
		t.Error("the current window does not admit exactly its 3")
	}
	if ok, _ := l.SetWindowQuota(5, time.Hour, cur); !ok || !l.TryAcquireN(2) || l.TryAcquire() {
		t.Error("raised to 5, the window does not admit 2 more and no more")
	}
	clk.ns.Store(1001 * hour)
	if st := l.Stats(); st.Quota != 0 || l.TryAcquire() {
		t.Errorf("the next window has quota %d, want 0 until set", st.Quota)
	}
	if _, err := l.SetWindowQuota(-1, time.Hour, cur); !errors.Is(err, ErrInvalid) {
		t.Errorf("a negative quota: %v, want ErrInvalid", err)
	}
	l.Close()
	if _, err := l.SetWindowQuota(1, time.Hour, time.Unix(0, 1001*hour)); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}
