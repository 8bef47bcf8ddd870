package limiter

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Regression tests for the holes in the core that an independent review
// found by hand (issue 12, "holes in the limiter core", numbered as
// there) and that the core oracle (oracle_test.go) finds at random. Each
// failed before its fix.

// Hole 1: permits a window admitted beyond a lowered quota were forgotten
// when the limits changed again, so the window re-opened.
func TestHoleQuotaDropAndRaiseKeepsTheExcess(t *testing.T) {
	for _, name := range []string{"raise", "cancel"} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := mustNew(t, 10, time.Second)
				time.Sleep(100 * time.Millisecond) // mid-window
				got := drain(l)
				for range 3 {
					if name == "cancel" {
						// An unrelated reservation in the current window,
						// made before the drop and cancelled after it.
						if err := l.SetQuota(10, time.Time{}); err != nil {
							t.Fatal(err)
						}
						r, err := l.Reserve(1, 0)
						if err == nil {
							got++ // valid at once: in the window's count until cancelled
						}
						if err := l.SetQuota(2, time.Time{}); err != nil {
							t.Fatal(err)
						}
						if r != nil {
							r.Cancel()
							got--
						}
						got += drain(l)
						continue
					}
					if err := l.SetQuota(2, time.Time{}); err != nil {
						t.Fatal(err)
					}
					if err := l.SetQuota(10, time.Time{}); err != nil {
						t.Fatal(err)
					}
					got += drain(l)
				}
				if got > 10 {
					t.Errorf("one window of quota ≤ 10 admitted %d", got)
				}
			})
		})
	}
}

// Hole 2: a change of window length computed its boundary against the
// window in force before a change scheduled earlier, so windows of the
// two lengths overlapped: a 20 ms window [40, 60) and a 25 ms window
// [50, 75) both admitted.
func TestHoleTwoWindowChangesInARow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ms = time.Millisecond
		l := mustNew(t, 2, 10*ms)
		t0 := time.Now()
		if err := l.SetLimit(5, 20*ms, t0.Add(35*ms)); err != nil {
			t.Fatal(err)
		}
		if err := l.SetLimit(5, 25*ms, time.Time{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(45 * ms)
		l.TryAcquire() // enters whichever window is in force at 45 ms
		time.Sleep(10 * ms)
		got := drain(l) // at 55 ms
		time.Sleep(5 * ms)
		got += drain(l) // at 60 ms
		if got > 5 {
			t.Errorf("the aligned 25 ms window [50ms, 75ms) admitted %d of quota 5", got)
		}
	})
}

// Hole 3a: a clock correction backwards made a Reserve holder's permits,
// already valid and used, look not yet due; a Backoff then failed the
// reservation and handed its permits out again.
func TestHoleBackwardCorrectionKeepsValidReservations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 2, time.Second)
		time.Sleep(900 * time.Millisecond)
		used := int64(drain(l))
		r, err := l.Reserve(2, 200*time.Millisecond) // valid at 1s
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(r.Delay())
		if r.Delay() != 0 {
			t.Fatalf("not valid after its delay")
		}
		used = 2 // the holder uses them, in window [1s, 2s)
		l.SetClockOffset(-300 * time.Millisecond)
		l.Backoff(500 * time.Millisecond)
		if err := r.Err(); err != nil {
			t.Errorf("a reservation already valid failed later: %v", err)
		}
		time.Sleep(600 * time.Millisecond) // the backoff is over; still window [1s, 2s)
		if n := drain(l); used+int64(n) > 2 {
			t.Errorf("window [1s, 2s) of quota 2 admitted %d", used+int64(n))
		}
	})
}

// Hole 3b: an Acquire whose permit became valid, and whose timer had fired,
// slept again after a clock correction backwards that landed before it took
// the lock, and returned long after its maxWait.
func TestHoleBackwardCorrectionAtTheWakeUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 1, time.Second)
		time.Sleep(900 * time.Millisecond)
		l.TryAcquire()
		const maxWait = 150 * time.Millisecond
		t0 := time.Now()
		done := make(chan error, 1)
		go func() { done <- l.Acquire(context.Background(), maxWait) }() // due at 1s, in 100 ms
		synctest.Wait()
		time.Sleep(100*time.Millisecond - 1)
		// Hold the lock across the instant the waiter's timer fires, so
		// that the correction lands between its wake-up and its lock.
		l.mu.Lock()
		time.Sleep(1)
		l.setClockOffsetLocked(-300*time.Millisecond, time.Now())
		l.mu.Unlock()
		err := <-done
		if d := time.Since(t0); d > maxWait {
			t.Errorf("Acquire(maxWait %v) returned %v after %v", maxWait, err, d)
		}
	})
}

// Hole 4: a wait for quota that timed out read the schedule and the quota
// to build its error after it had released the lock (go test -race).
func TestHoleNoQuotaTimeoutRace(t *testing.T) {
	for range 20 {
		synctest.Test(t, func(t *testing.T) {
			l := mustNew(t, 0, time.Second)
			done := make(chan error, 1)
			go func() { done <- l.AcquireN(context.Background(), 2, 10*time.Millisecond) }()
			synctest.Wait()
			time.Sleep(10 * time.Millisecond) // the waiter's deadline
			_ = l.SetQuota(1, time.Time{})    // still too small for it
			if err := <-done; !errors.Is(err, ErrNoQuota) {
				t.Fatalf("got %v, want ErrNoQuota", err)
			}
		})
	}
}

// Hole 5: shadow mode counted a request that enforcing refuses at once
// (maxWait 0, more than the quota) as delayed.
func TestHoleShadowCountsWhatEnforcingDoes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		enforcing := mustNew(t, 5, time.Second)
		err := enforcing.AcquireN(context.Background(), 100, 0)
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("enforcing: %v, want ErrTimeout at once", err)
		}
		shadow := mustNew(t, 5, time.Second, WithShadow(true))
		if err := shadow.AcquireN(context.Background(), 100, 0); err != nil {
			t.Fatal(err)
		}
		if st := shadow.Stats(); st.ShadowRejected != 100 || st.ShadowDelayed != 0 {
			t.Errorf("shadow rejected %d, delayed %d; want 100, 0", st.ShadowRejected, st.ShadowDelayed)
		}
	})
}

// A Reservation that shadow mode admitted beyond the quota and whose
// holder then cancelled it was still counted as admitted (found by the
// oracle).
func TestHoleShadowReservationCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 0, time.Second, WithShadow(true))
		r, err := l.Reserve(3, 0)
		if err != nil {
			t.Fatal(err)
		}
		r.Cancel()
		if st := l.Stats(); st.Admitted != 0 || st.ShadowAdmitted != 0 || st.ShadowRejected != 0 || st.Canceled != 3 {
			t.Errorf("admitted %d, shadow admitted %d, shadow rejected %d, cancelled %d; want 0, 0, 0, 3",
				st.Admitted, st.ShadowAdmitted, st.ShadowRejected, st.Canceled)
		}
	})
}

// settableClock is a Clock tests move by hand.
type settableClock struct{ ns atomic.Int64 }

func (c *settableClock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// Hole 6: the window cut short at the end of int64 time was taken, at its
// end, for a window of its own and admitted its quota twice. Time now
// ends with the last whole day int64 nanoseconds hold: nothing is admitted
// from 2262-04-11T00:00:00Z on, and waiters are told why.
func TestHoleEndOfTime(t *testing.T) {
	clk := &settableClock{}
	clk.ns.Store(math.MaxInt64 - int64(50*time.Millisecond))
	l, err := New(2, time.Hour, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := drain(l)
	clk.ns.Store(math.MaxInt64)
	got += drain(l)
	clk.ns.Store(math.MaxInt64 - int64(time.Second)) // and back
	got += drain(l)
	if got > 2 {
		t.Errorf("the last window admitted %d of quota 2", got)
	}
	if got != 0 {
		t.Errorf("admitted %d past the end of the limiter's time", got)
	}
	err = l.Acquire(context.Background(), time.Second)
	if !errors.Is(err, ErrNoQuota) {
		t.Errorf("Acquire past the end of time: %v, want ErrNoQuota", err)
	}
	// The last whole day's last window still admits.
	clk.ns.Store(timeEnd - int64(time.Minute))
	last, err := New(2, time.Hour, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer last.Close()
	if n := drain(last); n != 2 {
		t.Errorf("the last window before the end of time admitted %d of 2", n)
	}
}

// SetQuota read the window length in force before bringing the schedule up
// to now: made at the boundary where a scheduled change of length takes
// effect, with no call since, it took the old length, and so became a
// change of window length for later instead of a quota for now (found by
// the oracle).
func TestSetQuotaAtTheBoundaryOfAScheduledWindowChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 5, 250*time.Millisecond)
		if err := l.SetLimit(5, 200*time.Millisecond, time.Time{}); err != nil { // from 1s, both lengths' boundary
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if err := l.SetQuota(0, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if l.TryAcquire() {
			t.Errorf("admitted after SetQuota(0, now)")
		}
		if st := l.Stats(); st.Window != 200*time.Millisecond || st.Quota != 0 {
			t.Errorf("window %v quota %d; want 200ms, 0", st.Window, st.Quota)
		}
		time.Sleep(time.Second)
		if st := l.Stats(); st.Window != 200*time.Millisecond {
			t.Errorf("a second later: window %v; want 200ms", st.Window)
		}
	})
}

// expiringCtx ends with context.DeadlineExceeded when end is closed,
// without announcing a deadline: its end reaches a waiter only through
// Done, as a context's deadline does when it fires first.
type expiringCtx struct {
	context.Context
	end chan struct{}
}

func (c expiringCtx) Done() <-chan struct{} { return c.end }

func (c expiringCtx) Err() error {
	select {
	case <-c.end:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// A wait ended by its context's deadline answers ErrTimeout (and
// context.DeadlineExceeded) and must count it as timed out: it was
// counted as cancelled (found by the oracle, at random, when a context's
// deadline fired at the same instant as the wait's own).
func TestDeadlineCountsAsTimedOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, q := range []int64{0, 1} { // waiting for quota; waiting for the next window
			l := mustNew(t, q, time.Second)
			l.TryAcquire()
			ctx := expiringCtx{context.Background(), make(chan struct{})}
			time.AfterFunc(10*time.Millisecond, func() { close(ctx.end) })
			err := l.Acquire(ctx, 2*time.Second)
			if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("quota %d: got %v, want ErrTimeout and context.DeadlineExceeded", q, err)
			}
			if st := l.Stats(); st.TimedOut != 1 || st.Canceled != 0 {
				t.Errorf("quota %d: timed out %d, cancelled %d; want 1, 0", q, st.TimedOut, st.Canceled)
			}
		}
	})
}

// A holder that cancels valid permits after their window has closed gets
// nothing back (the window is over), but did not use them: Stats counted
// them as admitted (found by the oracle, when a clock correction closed
// the window at the instant the holder cancelled).
func TestCancelAfterTheWindowClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 1, time.Second)
		r, err := l.Reserve(1, 0)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond)
		r.Cancel()
		if st := l.Stats(); st.Admitted != 0 || st.Canceled != 1 {
			t.Errorf("admitted %d, cancelled %d; want 0, 1", st.Admitted, st.Canceled)
		}
		if n := drain(l); n != 1 {
			t.Errorf("the next window admitted %d of 1", n)
		}
	})
}

// Schedule says from when a change governs whole windows: its boundary
// when ahead, the end of the current window when it takes effect at once,
// and the shared boundary of two lengths.
func TestScheduleSaysWhenWholeWindowsBegin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ms = time.Millisecond
		l := mustNew(t, 5, time.Second)
		t0 := time.Now()
		time.Sleep(300 * ms)
		tests := []struct {
			q      int64
			w      time.Duration
			at     time.Time
			wantIn time.Duration // after t0
		}{
			{4, time.Second, time.Time{}, time.Second},                 // now: from the end of the current window
			{3, time.Second, t0.Add(2 * time.Second), 2 * time.Second}, // a boundary ahead
			{3, 250 * ms, t0.Add(1100 * ms), 2 * time.Second},          // another length: from its first boundary both share at or after at, after this window
			{3, 10 * time.Second, time.Time{}, 10 * time.Second},       // the first 10 s boundary after this window
		}
		for _, tt := range tests {
			from, err := l.Schedule(tt.q, tt.w, tt.at)
			if err != nil {
				t.Fatal(err)
			}
			if got := from.Sub(t0); got != tt.wantIn {
				t.Errorf("Schedule(%d, %v, %v): from +%v, want +%v", tt.q, tt.w, tt.at.Sub(t0), got, tt.wantIn)
			}
		}
	})
}
