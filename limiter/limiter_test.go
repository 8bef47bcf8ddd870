package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Inside a synctest bubble time starts at 2000-01-01T00:00:00Z, a boundary
// of every valid window.

func mustNew(t *testing.T, q int64, w time.Duration, opts ...Option) *Limiter {
	t.Helper()
	l, err := New(q, w, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// drain takes permits one at a time until the limiter refuses, and returns
// how many it took.
func drain(l *Limiter) (n int) {
	for l.TryAcquire() {
		n++
	}
	return n
}

// drainWindows drains the limiter at the start of each window from now on,
// one window of length w after the other, and returns what each admitted.
func drainWindows(l *Limiter, w time.Duration, windows int) []int {
	got := make([]int, windows)
	for i := range got {
		got[i] = drain(l)
		time.Sleep(w)
	}
	return got
}

// elapsed returns the fake time since t0.
func since(t0 time.Time) time.Duration { return time.Since(t0) }

func TestNewRejectsBadArguments(t *testing.T) {
	tests := []struct {
		name   string
		q      int64
		w      time.Duration
		wantOK bool
	}{
		{"ok", 10, time.Second, true},
		{"zero quota", 0, time.Second, true},
		{"max quota", MaxQuota, time.Second, true},
		{"negative quota", -3, time.Second, false},
		{"quota too large", MaxQuota + 1, time.Second, false},
		{"min window", 1, 10 * time.Millisecond, true},
		{"an hour", 1, time.Hour, true},
		{"two hours", 1, 2 * time.Hour, true},
		{"max window: a day", 1, 24 * time.Hour, true},
		{"window too short", 1, 5 * time.Millisecond, false},
		{"window too long", 1, 48 * time.Hour, false},
		{"window not dividing a day", 1, 7 * time.Hour, false},
		{"window not dividing a day", 1, 7 * time.Millisecond * 10, false},
		{"zero window", 1, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := New(tt.q, tt.w)
			if (err == nil) != tt.wantOK {
				t.Fatalf("New(%d, %v) error = %v, want ok=%v", tt.q, tt.w, err, tt.wantOK)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			if l != nil {
				l.Close()
			}
		})
	}
}

func TestWindowsAlignToWallClock(t *testing.T) {
	for _, w := range []time.Duration{10 * time.Millisecond, 250 * time.Millisecond, time.Second, time.Hour} {
		t.Run(w.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				time.Sleep(w * 3 / 10) // start mid-window
				l := mustNew(t, 5, w)
				for i := range 5 {
					if !l.TryAcquire() {
						t.Fatalf("permit %d refused in a fresh window", i)
					}
				}
				if l.TryAcquire() {
					t.Fatal("6th permit admitted in a window of 5")
				}
				st := l.Stats()
				if got := st.WindowStart.UnixNano() % int64(w); got != 0 {
					t.Fatalf("window starts %v after a multiple of %v", time.Duration(got), w)
				}
				// Just before the boundary: still refused; at it: admitted.
				time.Sleep(w*7/10 - time.Nanosecond)
				if l.TryAcquire() {
					t.Fatal("admitted 1ns before the boundary")
				}
				time.Sleep(time.Nanosecond)
				if !l.TryAcquire() {
					t.Fatal("refused at the boundary")
				}
			})
		})
	}
}

// TestExactUnderConcurrency hammers one limiter from many goroutines over
// many windows and counts admissions per aligned window two ways: by the
// limiter's own window (Stats) and by bucketing fake wall-clock time.
func TestExactUnderConcurrency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			q       = 1000
			w       = 100 * time.Millisecond
			windows = 20
			workers = 8
		)
		l := mustNew(t, q, w)
		var mu sync.Mutex
		perWindow := map[int64]int64{}
		var wg sync.WaitGroup
		for g := range workers {
			wg.Go(func() {
				local := map[int64]int64{}
				for range windows {
					for {
						n := int64(1 + g%3) // mix of single and batch asks
						if !l.TryAcquireN(n) {
							break
						}
						local[time.Now().UnixNano()/int64(w)] += n
					}
					time.Sleep(w - time.Duration(time.Now().UnixNano()%int64(w)))
				}
				mu.Lock()
				for k, v := range local {
					perWindow[k] += v
				}
				mu.Unlock()
			})
		}
		wg.Wait()
		if len(perWindow) != windows {
			t.Fatalf("admissions in %d windows, want %d", len(perWindow), windows)
		}
		var total int64
		for k, v := range perWindow {
			// Demand exceeds q in every window: the batch asks can leave at
			// most 2 permits unused (a 3-permit ask refused with 2 left).
			if v > q || v < q-2 {
				t.Errorf("window %d admitted %d, want %d..%d", k, v, q-2, q)
			}
			total += v
		}
		if st := l.Stats(); st.Admitted != total {
			t.Errorf("Stats.Admitted = %d, counted %d", st.Admitted, total)
		}
	})
}

// TestExactUnderRealConcurrency runs on the real clock with real
// parallelism; windows are attributed by the limiter's own clock read before
// and after each admission, and an admission whose two readings straddle a
// boundary is counted in both, which can only make the check stricter.
func TestExactUnderRealConcurrency(t *testing.T) {
	const (
		q = 50
		w = 10 * time.Millisecond
	)
	l := mustNew(t, q, w)
	stop := time.Now().Add(20 * w)
	var mu sync.Mutex
	perWindow := map[int64]int64{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				before := l.Now().UnixNano() / int64(w)
				if l.TryAcquire() {
					after := l.Now().UnixNano() / int64(w)
					if before == after {
						mu.Lock()
						perWindow[before]++
						mu.Unlock()
					}
				}
			}
		})
	}
	wg.Wait()
	for k, v := range perWindow {
		if v > q {
			t.Errorf("window %d admitted %d > quota %d", k, v, q)
		}
	}
}

func TestAcquireServesWaitersInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 2, time.Second)
		t0 := time.Now()
		l.TryAcquireN(2)
		got := make([]time.Duration, 5)
		var wg sync.WaitGroup
		for i := range 5 {
			wg.Go(func() {
				if err := l.Acquire(context.Background(), time.Minute); err != nil {
					t.Errorf("waiter %d: %v", i, err)
				}
				got[i] = since(t0)
			})
			synctest.Wait() // waiter i has queued before i+1 asks
		}
		wg.Wait()
		want := []time.Duration{time.Second, time.Second, 2 * time.Second, 2 * time.Second, 3 * time.Second}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("waiter %d admitted at %v, want %v", i, got[i], want[i])
			}
		}
		// Window 3 has one permit left after waiter 4; not two.
		if !l.TryAcquire() || l.TryAcquire() {
			t.Error("window 3 did not have exactly one permit left")
		}
	})
}

func TestAcquireTimesOutAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 1, time.Second)
		time.Sleep(200 * time.Millisecond)
		l.TryAcquire()
		t0 := time.Now()
		err := l.Acquire(context.Background(), 500*time.Millisecond) // next permit in 800ms
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("err = %v, want ErrTimeout", err)
		}
		if d := since(t0); d != 0 {
			t.Fatalf("returned after %v of sleep, want none", d)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if err := l.Acquire(ctx, time.Hour); !errors.Is(err, ErrTimeout) || since(t0) != 0 {
			t.Fatalf("ctx deadline shorter than the wait: err = %v after %v", err, since(t0))
		}
		// The refused reservations were not kept: the next window's permit
		// is still free.
		if err := l.Acquire(context.Background(), time.Second); err != nil || since(t0) != 800*time.Millisecond {
			t.Fatalf("err = %v after %v, want nil after 800ms", err, since(t0))
		}
		if st := l.Stats(); st.TimedOut != 2 {
			t.Errorf("Stats.TimedOut = %d, want 2", st.TimedOut)
		}
	})
}

func TestCancelGivesThePermitBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 1, time.Second)
		t0 := time.Now()
		l.TryAcquire()
		ctxA, cancelA := context.WithCancel(context.Background())
		errA := make(chan error, 1)
		go func() { errA <- l.Acquire(ctxA, time.Minute) }() // window 1
		synctest.Wait()
		doneB := make(chan time.Duration, 1)
		go func() { l.Acquire(context.Background(), time.Minute); doneB <- since(t0) }() // window 2
		synctest.Wait()
		time.Sleep(100 * time.Millisecond)
		cancelA()
		err := <-errA
		if !errors.Is(err, ErrCanceled) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled wait returned %v, want ErrCanceled and context.Canceled", err)
		}
		// C asks after the cancel: it gets A's permit in window 1, not window 3.
		if err := l.Acquire(context.Background(), time.Minute); err != nil {
			t.Fatal(err)
		}
		if d := since(t0); d != time.Second {
			t.Errorf("next waiter admitted at %v, want 1s (the returned permit)", d)
		}
		if d := <-doneB; d != 2*time.Second {
			t.Errorf("B admitted at %v, want 2s", d)
		}
		if st := l.Stats(); st.Canceled != 1 {
			t.Errorf("Stats.Canceled = %d, want 1", st.Canceled)
		}
	})
}

// TestBoundaryWakesOnlyDueWaiters queues one waiter per window and checks
// that each boundary wakes exactly the waiter whose permit is due.
func TestBoundaryWakesOnlyDueWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 50
		l := mustNew(t, 1, 100*time.Millisecond)
		l.TryAcquire()
		var done atomic.Int64
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				if err := l.Acquire(context.Background(), time.Hour); err != nil {
					t.Error(err)
				}
				done.Add(1)
			})
		}
		synctest.Wait()
		for i := range int64(n) {
			time.Sleep(100 * time.Millisecond)
			synctest.Wait()
			if got := done.Load(); got != i+1 {
				t.Fatalf("after %d boundaries %d waiters returned", i+1, got)
			}
		}
		wg.Wait()
		if w := l.wakeups.Load(); w != n {
			t.Errorf("%d wake-ups for %d waiters, want one each", w, n)
		}
	})
}

func TestSetQuotaAtBoundary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		l := mustNew(t, 10, w)
		t0 := time.Now()
		if err := l.SetQuota(3, t0.Add(2*w)); err != nil {
			t.Fatal(err)
		}
		if err := l.SetQuota(3, t0.Add(2*w)); err != nil {
			t.Fatal(err)
		}
		want := []int{10, 10, 3}
		for i, q := range want {
			if got := drain(l); got != q {
				t.Errorf("window %d admitted %d, want %d", i, got, q)
			}
			time.Sleep(w)
		}
		// Upwards, named by a time inside a window: from the next one.
		if err := l.SetQuota(20, time.Now().Add(w/2)); err != nil {
			t.Fatal(err)
		}
		if got := drain(l); got != 3 {
			t.Errorf("window before the raise admitted %d, want 3", got)
		}
		time.Sleep(w)
		if got := drain(l); got != 20 {
			t.Errorf("window after the raise admitted %d, want 20", got)
		}
	})
}

func TestSetQuotaMovesQueuedWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		l := mustNew(t, 2, w)
		t0 := time.Now()
		l.TryAcquireN(2)
		// Four waiters: two for window 1, two for window 2.
		at := make([]chan time.Duration, 4)
		for i := range at {
			at[i] = make(chan time.Duration, 1)
			go func() {
				if err := l.Acquire(context.Background(), 10*time.Second); err != nil {
					t.Errorf("waiter %d: %v", i, err)
				}
				at[i] <- since(t0)
			}()
			synctest.Wait()
		}
		// Window 1 drops to 1 permit: the newest waiter there moves, and the
		// waiters behind it keep their order.
		if err := l.SetQuota(1, t0.Add(w)); err != nil {
			t.Fatal(err)
		}
		want := []time.Duration{w, 2 * w, 3 * w, 4 * w}
		for i := range want {
			if got := <-at[i]; got != want[i] {
				t.Errorf("waiter %d admitted at %v, want %v", i, got, want[i])
			}
		}
	})
}

func TestZeroQuotaWaitsForAQuota(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 0, time.Second)
		t0 := time.Now()
		if l.TryAcquire() {
			t.Fatal("admitted with quota 0")
		}
		if _, err := l.Reserve(1, time.Hour); !errors.Is(err, ErrNoQuota) {
			t.Fatalf("Reserve with quota 0: %v, want ErrNoQuota", err)
		}
		errc := make(chan error, 1)
		go func() { errc <- l.Acquire(context.Background(), 5*time.Second) }()
		synctest.Wait()
		time.Sleep(1500 * time.Millisecond)
		if err := l.SetQuota(1, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("waiter: %v", err)
		}
		if d := since(t0); d != 1500*time.Millisecond {
			t.Errorf("admitted at %v, want as soon as the quota came (1.5s)", d)
		}
		// A waiter that never gets a quota times out at its deadline.
		if err := l.SetQuota(0, time.Time{}); err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		err := l.Acquire(context.Background(), 2*time.Second)
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrNoQuota) {
			t.Fatalf("err = %v, want ErrTimeout and ErrNoQuota", err)
		}
		if d := since(t1); d != 2*time.Second {
			t.Errorf("timed out after %v, want 2s", d)
		}
	})
}

func TestInvalidN(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 10, time.Second)
		for _, n := range []int64{0, -1, MaxQuota + 1} {
			if l.TryAcquireN(n) {
				t.Errorf("TryAcquireN(%d) admitted", n)
			}
			if err := l.AcquireN(context.Background(), n, time.Second); !errors.Is(err, ErrInvalid) {
				t.Errorf("AcquireN(%d) = %v, want ErrInvalid", n, err)
			}
			if _, err := l.Reserve(n, time.Second); !errors.Is(err, ErrInvalid) {
				t.Errorf("Reserve(%d) = %v, want ErrInvalid", n, err)
			}
		}
		// More than the quota, but possible: waits for a larger quota.
		if err := l.AcquireN(context.Background(), 11, 0); !errors.Is(err, ErrNoQuota) {
			t.Errorf("AcquireN(11) with quota 10 = %v, want ErrNoQuota", err)
		}
	})
}

func TestShadowAdmitsAndCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 2, time.Second, WithShadow(true))
		for i := range 5 {
			if !l.TryAcquire() {
				t.Fatalf("shadow TryAcquire %d refused", i)
			}
		}
		if err := l.Acquire(context.Background(), 0); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := l.Acquire(context.Background(), 2*time.Second); err != nil || since(t0) != 0 {
			t.Fatalf("shadow Acquire: %v after %v", err, since(t0))
		}
		st := l.Stats()
		if st.ShadowRejected != 4 || st.ShadowDelayed != 1 || st.Admitted != 7 {
			t.Errorf("shadow stats %+v, want 4 rejected, 1 delayed, 7 admitted", st)
		}
		l.SetShadow(false)
		if l.TryAcquire() {
			t.Error("enforcing again, but admitted past the quota")
		}
	})
}

func TestBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 10, time.Second)
		t0 := time.Now()
		l.TryAcquireN(10)
		short := make(chan error, 1)
		go func() { short <- l.Acquire(context.Background(), 1500*time.Millisecond) }() // window 1
		synctest.Wait()
		l.Backoff(2500 * time.Millisecond)
		if err := <-short; !errors.Is(err, ErrTimeout) || since(t0) != 0 {
			t.Fatalf("waiter with a shorter wait than the backoff: %v after %v, want ErrTimeout at once", err, since(t0))
		}
		time.Sleep(1100 * time.Millisecond)
		if l.TryAcquire() {
			t.Fatal("admitted during the backoff")
		}
		if err := l.Acquire(context.Background(), time.Second); !errors.Is(err, ErrTimeout) {
			t.Fatalf("Acquire shorter than the backoff: %v", err)
		}
		if err := l.Acquire(context.Background(), 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if d := since(t0); d != 2500*time.Millisecond {
			t.Errorf("admitted at %v, want when the backoff ended (2.5s)", d)
		}
		if !l.TryAcquire() {
			t.Error("refused after the backoff with permits left")
		}
	})
}

func TestPacingSpreadsPermits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		l := mustNew(t, 10, w, WithPacing(true))
		t0 := time.Now()
		if !l.TryAcquire() || l.TryAcquire() {
			t.Fatal("a paced window admits exactly one permit at its start")
		}
		var got []time.Duration
		for range 9 {
			if err := l.Acquire(context.Background(), time.Second); err != nil {
				t.Fatal(err)
			}
			got = append(got, since(t0))
		}
		for i, d := range got {
			if want := time.Duration(i+1) * 100 * time.Millisecond; d != want {
				t.Errorf("permit %d at %v, want %v", i+1, d, want)
			}
		}
		// Idle slots are not saved up: after a pause, one permit at a time.
		time.Sleep(w + 450*time.Millisecond)
		if !l.TryAcquire() || l.TryAcquire() {
			t.Error("pacing let a burst through after an idle spell")
		}
		if err := l.Acquire(context.Background(), 0); !errors.Is(err, ErrTimeout) {
			t.Errorf("paced Acquire with no wait: %v", err)
		}
	})
}

func TestCloseReleasesWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 1, time.Second)
		l.TryAcquire()
		errc := make(chan error, 2)
		go func() { errc <- l.Acquire(context.Background(), time.Minute) }()
		go func() { errc <- l.Acquire(context.Background(), time.Minute) }()
		synctest.Wait()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := <-errc; !errors.Is(err, ErrClosed) {
				t.Errorf("waiter got %v, want ErrClosed", err)
			}
		}
		if l.Close() != nil || l.TryAcquire() {
			t.Error("closed limiter admitted, or second Close failed")
		}
		if err := l.Acquire(context.Background(), time.Second); !errors.Is(err, ErrClosed) {
			t.Errorf("Acquire after Close: %v", err)
		}
	})
}

func TestClockOffsetMovesBoundaries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 1, time.Second, WithClockOffset(300*time.Millisecond))
		t0 := time.Now()
		l.TryAcquire()
		if err := l.Acquire(context.Background(), time.Second); err != nil {
			t.Fatal(err)
		}
		if d := since(t0); d != 700*time.Millisecond {
			t.Errorf("next window began after %v on the system clock, want 700ms", d)
		}
		// A waiter follows a new offset: the boundary moves 200ms earlier.
		done := make(chan time.Duration, 1)
		t1 := time.Now()
		go func() { l.Acquire(context.Background(), 2*time.Second); done <- since(t1) }()
		synctest.Wait()
		l.SetClockOffset(500 * time.Millisecond)
		if d := <-done; d != 800*time.Millisecond {
			t.Errorf("waiter woke after %v, want 800ms", d)
		}
	})
}

// TestBackwardOffsetOnANewLimiter: a limiter that has opened no window
// admits at once on a clock set back; one that has keeps its window until
// that window's end on the new clock.
func TestBackwardOffsetOnANewLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fresh := mustNew(t, 1, time.Second)
		used := mustNew(t, 2, time.Second)
		if !used.TryAcquire() {
			t.Fatal("used: the first permit refused")
		}
		fresh.SetClockOffset(-2 * time.Second)
		used.SetClockOffset(-2 * time.Second)
		if !fresh.TryAcquire() {
			t.Errorf("fresh: refused after a backward offset; nothing had been admitted")
		}
		if used.TryAcquire() {
			t.Errorf("used: admitted 2 s back, inside a window already counted")
		}
	})
}

func TestReserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 1, time.Second)
		r, err := l.Reserve(1, 0)
		if err != nil || r.Delay() != 0 {
			t.Fatalf("first Reserve: %v, delay %v", err, r.Delay())
		}
		r2, err := l.Reserve(1, 2*time.Second)
		if err != nil || r2.Delay() != time.Second {
			t.Fatalf("second Reserve: %v, delay %v, want 1s", err, r2.Delay())
		}
		r3, err := l.Reserve(1, 3*time.Second)
		if err != nil || r3.Delay() != 2*time.Second {
			t.Fatalf("third Reserve: %v, delay %v, want 2s", err, r3.Delay())
		}
		r2.Cancel()
		r2.Cancel() // idempotent
		if !errors.Is(r2.Err(), ErrCanceled) {
			t.Errorf("cancelled reservation Err = %v", r2.Err())
		}
		r4, err := l.Reserve(1, 2*time.Second)
		if err != nil || r4.Delay() != time.Second {
			t.Fatalf("Reserve after a cancel: %v, delay %v, want the returned 1s slot", err, r4.Delay())
		}
		if err := r3.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Reserve(1, 0); !errors.Is(err, ErrTimeout) {
			t.Errorf("Reserve with nothing free: %v", err)
		}
	})
}

func TestStatsCountsEveryOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 3, time.Second)
		l.TryAcquireN(3)
		l.TryAcquire() // rejected
		go l.Acquire(context.Background(), 2*time.Second)
		synctest.Wait()
		st := l.Stats()
		if st.Admitted != 3 || st.Rejected != 1 || st.Delayed != 1 || st.Waiting != 1 || st.Remaining != 0 {
			t.Fatalf("stats %+v", st)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		st = l.Stats()
		if st.Admitted != 4 || st.Waiting != 0 || st.Remaining != 2 || st.WaitTotal != time.Second {
			t.Fatalf("after the boundary: %+v", st)
		}
	})
}

func TestScheduledChangesTakeEffectInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		l := mustNew(t, 10, w)
		t0 := time.Now()
		// A shrink at window 1 and a growth at window 2, sent in a row: the
		// growth must not swallow the shrink.
		if err := l.SetQuota(5, t0.Add(w)); err != nil {
			t.Fatal(err)
		}
		if err := l.SetQuota(8, t0.Add(2*w)); err != nil {
			t.Fatal(err)
		}
		// A change named earlier than one already scheduled replaces it.
		if err := l.SetQuota(3, t0.Add(4*w)); err != nil {
			t.Fatal(err)
		}
		if err := l.SetQuota(6, t0.Add(3*w)); err != nil {
			t.Fatal(err)
		}
		for i, want := range []int{10, 5, 8, 6, 6} {
			if got := drain(l); got != want {
				t.Errorf("window %d admitted %d, want %d", i, got, want)
			}
			time.Sleep(w)
		}
	})
}

func TestWindowLengthChangesAtASharedBoundary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 10, time.Second)
		t0 := time.Now()
		time.Sleep(1500 * time.Millisecond)
		// 1s → 3s asked from 1.5s: the first shared boundary is 3s.
		if err := l.SetLimit(30, 3*time.Second, time.Now()); err != nil {
			t.Fatal(err)
		}
		if st := l.Stats(); st.Window != time.Second {
			t.Fatalf("window changed mid-window: %v", st.Window)
		}
		time.Sleep(t0.Add(3 * time.Second).Sub(time.Now()))
		st := l.Stats()
		if st.Window != 3*time.Second || st.Quota != 30 || !st.WindowStart.Equal(t0.Add(3*time.Second)) {
			t.Fatalf("at 3s: window %v quota %d start %v", st.Window, st.Quota, st.WindowStart.Sub(t0))
		}
	})
}

func TestClockUncertaintyKeepsABandAtBoundaries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		l := mustNew(t, 10, w)
		t0 := time.Now()
		l.SetClockUncertainty(100 * time.Millisecond)
		if l.TryAcquire() {
			t.Fatal("admitted at the window's start, inside the band")
		}
		errc := make(chan error, 1)
		go func() { errc <- l.Acquire(context.Background(), time.Second) }()
		synctest.Wait()
		if err := <-errc; err != nil || since(t0) != 100*time.Millisecond {
			t.Fatalf("waiter: %v at %v, want admitted when the band ends (100ms)", err, since(t0))
		}
		time.Sleep(799 * time.Millisecond)
		if !l.TryAcquire() {
			t.Fatal("refused 1ms before the closing band")
		}
		time.Sleep(time.Millisecond)
		if l.TryAcquire() {
			t.Fatal("admitted inside the closing band")
		}
		if st := l.Stats(); st.ClockUncertainty != 100*time.Millisecond {
			t.Errorf("Stats.ClockUncertainty = %v", st.ClockUncertainty)
		}
	})
}

// TestClockUncertaintyBoundsSkew runs two instances whose clocks are off by
// ±u from true time, each asking for permits every millisecond (so they
// bunch at their window starts), and counts admissions by true time: with
// the band the aligned windows hold at most the total; without it, a window
// gets one instance's next share early.
func TestClockUncertaintyBoundsSkew(t *testing.T) {
	for _, guarded := range []bool{true, false} {
		t.Run(fmt.Sprintf("guard=%v", guarded), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const (
					w = 100 * time.Millisecond
					u = 5 * time.Millisecond
					q = 10
				)
				var mu sync.Mutex
				perWindow := map[int64]int64{}
				var wg sync.WaitGroup
				for _, off := range []time.Duration{u, -u} {
					l := mustNew(t, q, w, WithClockOffset(off))
					if guarded {
						l.SetClockUncertainty(u)
					}
					wg.Go(func() {
						for range 1000 {
							if l.TryAcquire() {
								mu.Lock()
								perWindow[time.Now().UnixNano()/int64(w)]++
								mu.Unlock()
							}
							time.Sleep(time.Millisecond)
						}
					})
				}
				wg.Wait()
				var most int64
				for _, n := range perWindow {
					most = max(most, n)
				}
				if guarded && most > 2*q {
					t.Errorf("with the band an aligned window admitted %d > %d", most, 2*q)
				}
				if !guarded && most <= 2*q {
					t.Errorf("without the band the test saw no overshoot (most %d): it cannot tell the band works", most)
				}
			})
		})
	}
}
