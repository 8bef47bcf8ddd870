package loadgen_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/examples/loadgen"
	"github.com/sluice-go/sluice/limiter"
)

// In a synctest bubble time is virtual: the paced loop, the limiter's
// windows and maxWait all run on it, so the counts are exact.
func TestGeneratorCountsAndRateChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Start on a window boundary so that windows are whole.
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		lim, err := limiter.New(30, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		var calls atomic.Int64
		g := loadgen.New(lim, func(context.Context) error { calls.Add(1); return nil }, loadgen.WithMaxWait(0))
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- g.Run(ctx) }()

		g.SetRate(100)
		// Read just before the third window opens: at its exact boundary
		// the generator's tick and this goroutine wake at the same
		// instant, in no fixed order.
		time.Sleep(2*time.Second - time.Millisecond)
		st := g.Stats()
		if st.Offered < 190 || st.Offered > 201 {
			t.Errorf("offered %d in 2s at 100/s, want about 200", st.Offered)
		}
		if st.Admitted != 60 {
			t.Errorf("admitted %d in 2 windows of 30, want 60", st.Admitted)
		}
		if st.Refused != st.Offered-st.Admitted-st.InFlight {
			t.Errorf("refused %d, want offered-admitted-inflight: %+v", st.Refused, st)
		}

		g.SetRate(2000) // several requests per tick
		time.Sleep(time.Second)
		if n := g.Stats().Offered - st.Offered; n < 1900 || n > 2100 {
			t.Errorf("offered %d in 1s at 2000/s", n)
		}
		g.SetRate(0)
		time.Sleep(100 * time.Millisecond)
		paused := g.Stats().Offered
		time.Sleep(time.Second)
		if n := g.Stats().Offered; n != paused {
			t.Errorf("offered %d while paused", n-paused)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
		if st := g.Stats(); st.InFlight != 0 || calls.Load() != st.Admitted {
			t.Errorf("after Run: %+v, calls %d", st, calls.Load())
		}
	})
}

func TestGeneratorWithoutLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		g := loadgen.New(nil, func(context.Context) error {
			if n.Add(1)%2 == 0 {
				return loadgen.ErrRefused
			}
			return nil
		})
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		g.SetRate(10)
		g.Run(ctx)
		st := g.Stats()
		if st.Offered < 9 || st.Admitted+st.Refused != st.Offered || st.Refused != st.Offered/2 {
			t.Errorf("%+v", st)
		}
	})
}
