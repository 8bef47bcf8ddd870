package limiter

import (
	"math"
	"testing"
	"time"
)

// TestClockOffsetOutOfRange: a clock offset that would take the limiter's
// time beyond what Unix nanoseconds in an int64 hold (years 1678 to 2262)
// is clamped to the documented ±100 years, however it is set, so that the
// limiter's time moves the way the offset says and a fresh limiter admits.
// A wrapped offset would move time centuries the other way, behind the
// window already open, and admit nothing from then on.
func TestClockOffsetOutOfRange(t *testing.T) {
	const bound = 100 * 365 * 24 * time.Hour // as SetClockOffset documents
	type clock interface {
		Now() time.Time
		ClockOffset() time.Duration
		TryAcquire() bool
	}
	ways := []struct {
		name string
		make func(t *testing.T, d time.Duration) clock
	}{
		{"SetClockOffset", func(t *testing.T, d time.Duration) clock {
			l := mustNew(t, 5, time.Second)
			l.SetClockOffset(d)
			return l
		}},
		{"WithClockOffset", func(t *testing.T, d time.Duration) clock {
			return mustNew(t, 5, time.Second, WithClockOffset(d))
		}},
		{"Multi.SetClockOffset", func(t *testing.T, d time.Duration) clock {
			m, err := NewMulti([]Limit{{Quota: 5, Window: time.Second}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { m.Close() })
			m.SetClockOffset(d)
			return multiClock{m}
		}},
	}
	for _, d := range []time.Duration{math.MaxInt64, math.MinInt64, 290 * 365 * 24 * time.Hour, -290 * 365 * 24 * time.Hour} {
		want := min(max(d, -bound), bound)
		for _, w := range ways {
			t.Run(w.name+"/"+d.String(), func(t *testing.T) {
				before := time.Now()
				c := w.make(t, d)
				now := c.Now()
				after := time.Now()
				if got := c.ClockOffset(); got != want {
					t.Errorf("ClockOffset() = %v, want %v (clamped to ±%v)", got, want, bound)
				}
				if now.Before(before.Add(want)) || now.After(after.Add(want)) {
					t.Errorf("Now() = %v, want from %v to %v: the clock plus the clamped offset", now.UTC(), before.Add(want).UTC(), after.Add(want).UTC())
				}
				if !c.TryAcquire() {
					t.Errorf("TryAcquire() = false in a fresh limiter of quota 5 at %v", now.UTC())
				}
			})
		}
	}
}

// multiClock gives a Multi the methods TestClockOffsetOutOfRange reads.
type multiClock struct{ *Multi }

func (m multiClock) ClockOffset() time.Duration { return m.lims[0].ClockOffset() }
func (m multiClock) TryAcquire() bool           { _, ok := m.Multi.TryAcquire(); return ok }
