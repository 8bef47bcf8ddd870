package limiter

import (
	"testing"
	"time"
)

func TestObserve(t *testing.T) {
	clk := &settableClock{}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk.ns.Store(t0.UnixNano())
	l, err := New(10, time.Second, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Observe(Signal{HasRemaining: true, Remaining: 7, Reset: 500 * time.Millisecond})
	l.Pushback(3 * time.Second)
	l.Pushback(time.Second) // an earlier end keeps the later
	clk.ns.Add(int64(100 * time.Millisecond))
	l.Observe(Signal{HasRemaining: true, Remaining: -4}) // the freshest wins; negative is none left
	st := l.Stats()
	if st.Pushbacks != 2 {
		t.Errorf("Pushbacks = %d, want 2", st.Pushbacks)
	}
	if want := t0.Add(3 * time.Second); !st.RetryUntil.Equal(want) || !st.BackoffUntil.Equal(want) {
		t.Errorf("RetryUntil %v, BackoffUntil %v, want both %v", st.RetryUntil, st.BackoffUntil, want)
	}
	if at := t0.Add(100 * time.Millisecond); st.ProviderRemaining != 0 || !st.ProviderRemainingAt.Equal(at) || !st.ProviderReset.IsZero() {
		t.Errorf("remaining %d at %v reset %v, want 0 at %v, no reset", st.ProviderRemaining, st.ProviderRemainingAt, st.ProviderReset, at)
	}
	if l.TryAcquire() {
		t.Error("TryAcquire admitted during the pushback's pause")
	}
}

func TestMultiPushback(t *testing.T) {
	m, err := NewMulti([]Limit{{Quota: 10, Window: time.Second}, {Quota: 100, Window: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.Pushback(time.Hour)
	sts := m.Stats()
	if sts[0].Pushbacks != 1 || sts[1].Pushbacks != 0 {
		t.Errorf("Pushbacks = %d, %d; want 1 on the first limit only", sts[0].Pushbacks, sts[1].Pushbacks)
	}
	for i, st := range sts {
		if st.BackoffUntil.IsZero() {
			t.Errorf("limit %d not paused", i)
		}
	}
}
