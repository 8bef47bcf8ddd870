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
	from, err := l.SetSchedule(steps, at(106))
	if err != nil {
		t.Fatal(err)
	}
	if !from.Equal(at(101)) {
		t.Errorf("SetSchedule at 100.5s governs whole the windows from %v, want 101s", from)
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
		if _, err := l.SetSchedule(bad, time.Time{}); !errors.Is(err, ErrInvalid) {
			t.Errorf("SetSchedule(%v): %v, want ErrInvalid", bad, err)
		}
	}
	if l.TryAcquire() {
		t.Error("an invalid schedule changed the expiry")
	}
	l.Close()
	if _, err := l.SetSchedule(steps, time.Time{}); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}

// TestSetScheduleAfterTheClockStepsBack: a clock set back leaves the
// limiter in window [10s,11s) while it reads 9.7s. The step of that
// window governs it, not the step of the window its clock reads, and the
// schedule governs whole only the windows from 11s on.
func TestSetScheduleAfterTheClockStepsBack(t *testing.T) {
	const sec = int64(time.Second)
	for _, viaOffset := range []bool{false, true} {
		t.Run(map[bool]string{false: "clock steps back", true: "SetClockOffset back"}[viaOffset], func(t *testing.T) {
			clk := &settableClock{}
			clk.ns.Store(10*sec + sec/5)
			l, err := New(0, time.Second, WithClock(clk))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if l.TryAcquire() { // opens window [10s,11s)
				t.Fatal("quota 0 admitted")
			}
			if viaOffset {
				l.SetClockOffset(-time.Second / 2)
			} else {
				clk.ns.Store(9*sec + 7*sec/10)
			}
			from, err := l.SetSchedule([]Step{
				{Quota: 0, Window: time.Second},
				{At: time.Unix(0, 0), Quota: 60, Window: time.Second},
				{At: time.Unix(10, 0), Quota: 30, Window: time.Second},
			}, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			if want := time.Unix(11, 0); !from.Equal(want) {
				t.Errorf("SetSchedule governs whole the windows from %v, want %v: window [10s,11s) was under way", from, want)
			}
			got := 0
			for _, at := range []int64{10*sec + sec/10, 10*sec + 9*sec/10} {
				if viaOffset {
					at += sec / 2
				}
				clk.ns.Store(at)
				got += drain(l)
			}
			if got != 30 {
				t.Errorf("window [10s,11s) admitted %d after SetSchedule, the schedule gives it 30", got)
			}
		})
	}
}

// TestSetScheduleOfAnotherLength: a step of 10 per 4s, set at 100.5s
// under 100 per 1s, governs from 104s, the first boundary both lengths
// share, and SetSchedule says so. The 1s windows until then admit
// nothing, not the 100 in force nor the 30 an earlier call scheduled.
func TestSetScheduleOfAnotherLength(t *testing.T) {
	const sec = int64(time.Second)
	clk := &settableClock{}
	clk.ns.Store(100*sec + sec/2)
	l, err := New(100, time.Second, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.SetSchedule([]Step{{Quota: 100, Window: time.Second}, {At: time.Unix(101, 0), Quota: 30, Window: time.Second}}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	from, err := l.SetSchedule([]Step{{Quota: 10, Window: 4 * time.Second}}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Unix(104, 0); !from.Equal(want) {
		t.Errorf("SetSchedule governs whole the windows from %v, want %v", from, want)
	}
	for _, c := range []struct {
		t    int64
		want int
	}{{100, 100}, {101, 0}, {103, 0}, {104, 10}, {107, 0}, {108, 10}} {
		clk.ns.Store(c.t*sec + sec/2)
		if got := drain(l); got != c.want {
			t.Errorf("at %ds admitted %d, want %d", c.t, got, c.want)
		}
	}
}
