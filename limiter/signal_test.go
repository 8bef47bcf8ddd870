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
	l.Observe(Signal{HasRemaining: true, Remaining: 99}) // no reset: which window is not known
	if st := l.Stats(); !st.ProviderWindowEnd.IsZero() {
		t.Errorf("a window reported before its reset passed: %v", st.ProviderWindowEnd)
	}
	l.Pushback(3 * time.Second)
	l.Pushback(time.Second) // an earlier end keeps the later
	clk.ns.Add(int64(100 * time.Millisecond))
	l.Observe(Signal{HasRemaining: true, Remaining: 3, Reset: 400 * time.Millisecond})
	clk.ns.Add(int64(450 * time.Millisecond)) // past the reset: the next window
	l.Observe(Signal{HasRemaining: true, Remaining: -4, Reset: time.Second})
	st := l.Stats()
	if st.Pushbacks != 2 {
		t.Errorf("Pushbacks = %d, want 2", st.Pushbacks)
	}
	if want := t0.Add(3 * time.Second); !st.RetryUntil.Equal(want) || !st.BackoffUntil.Equal(want) {
		t.Errorf("RetryUntil %v, BackoffUntil %v, want both %v", st.RetryUntil, st.BackoffUntil, want)
	}
	if end := t0.Add(500 * time.Millisecond); st.ProviderRemaining != 3 || !st.ProviderWindowEnd.Equal(end) {
		t.Errorf("remaining %d at %v, want the window's least, 3, at its end %v", st.ProviderRemaining, st.ProviderWindowEnd, end)
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

// TestProviderNews: a pushback and the end of the provider's window each
// leave one value on ProviderNews, however many came; a remaining within
// the window is no news, nor a window end already told.
func TestProviderNews(t *testing.T) {
	clk := &settableClock{}
	clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	l, err := New(10, time.Second, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	news := func() bool {
		select {
		case <-l.ProviderNews():
			return true
		default:
			return false
		}
	}
	l.Observe(Signal{HasRemaining: true, Remaining: 7, Reset: 500 * time.Millisecond})
	if news() {
		t.Error("news of a remaining within the window")
	}
	l.Pushback(time.Second)
	l.Pushback(time.Second)
	if !news() || news() {
		t.Error("two pushbacks: want one value of news")
	}
	clk.ns.Add(int64(600 * time.Millisecond))
	l.Stats() // rolls the window: the next answer still tells
	l.Observe(Signal{HasRemaining: true, Remaining: 9, Reset: 900 * time.Millisecond})
	if !news() {
		t.Error("no news of the window's end")
	}
	l.Observe(Signal{HasRemaining: true, Remaining: 8, Reset: 800 * time.Millisecond})
	if news() {
		t.Error("news of the same window's end twice")
	}
}
