package limiter

import (
	"errors"
	"testing"
	"time"
)

// TestSetSchedule: the step in force at the limiter's own clock governs
// the current window at once, later steps take effect at their times,
// windows from the expiry on admit nothing, and an invalid schedule
// changes nothing.
func TestSetSchedule(t *testing.T) {
	const sec = int64(time.Second)
	clk := &settableClock{}
	clk.ns.Store(100*sec + sec/2)
	l, err := New(7, time.Second, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	at := func(s int64) time.Time { return time.Unix(s, 0) }
	steps := []Step{
		{Quota: 0, Window: time.Second},
		{At: at(99), Quota: 4, Window: time.Second}, // in force at 100.5
		{At: at(101), Quota: 2, Window: time.Second},
		{At: at(102), Quota: 6, Window: 2 * time.Second},
	}
	if err := l.SetSchedule(steps, at(106)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		t    int64
		want int
	}{{100, 4}, {101, 2}, {102, 6}, {104, 6}, {106, 0}} {
		clk.ns.Store(c.t*sec + sec/4)
		got := 0
		for l.TryAcquire() {
			got++
		}
		if got != c.want {
			t.Errorf("the window at %ds admitted %d, want %d", c.t, got, c.want)
		}
	}

	clk.ns.Store(200 * sec)
	for _, bad := range [][]Step{
		nil,
		{{Quota: -1, Window: time.Second}},
		{{Quota: 1, Window: 7 * time.Second}},
		{{At: at(201), Quota: 1, Window: time.Second}, {At: at(200), Quota: 1, Window: time.Second}},
	} {
		if err := l.SetSchedule(bad, time.Time{}); !errors.Is(err, ErrInvalid) {
			t.Errorf("SetSchedule(%v): %v, want ErrInvalid", bad, err)
		}
	}
	if l.TryAcquire() {
		t.Error("an invalid schedule changed the expiry")
	}
	l.Close()
	if err := l.SetSchedule(steps, time.Time{}); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}
