package limiter

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Regression tests from a review of the core: each "Bug" comment names what
// a test caught before its fix; the others cover corners not tested
// elsewhere.

// admissions counts admissions per aligned window on the limiter's own
// (corrected) clock.
type admissions struct {
	mu  sync.Mutex
	l   *Limiter
	w   time.Duration
	per map[int64]int64
}

func newAdmissions(l *Limiter, w time.Duration) *admissions {
	return &admissions{l: l, w: w, per: map[int64]int64{}}
}

func (a *admissions) add(n int64) {
	ns := a.l.now()
	k := ns / int64(a.w)
	if ns < 0 && ns%int64(a.w) != 0 {
		k-- // floor for times before 1970
	}
	a.mu.Lock()
	a.per[k] += n
	a.mu.Unlock()
}

func (a *admissions) check(t *testing.T, q int64) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, n := range a.per {
		if n > q {
			t.Errorf("aligned window %d (on the limiter's clock) admitted %d > quota %d", k, n, q)
		}
	}
}

// Bug: SetClockOffset moving time forward past whole windows leaves the
// reservations of the skipped windows in place; their waiters wake at once
// and are admitted in the new current window, on top of its full quota.
func TestReviewClockOffsetForwardKeepsQuota(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = 10 * time.Millisecond
		l := mustNew(t, 1, w)
		adm := newAdmissions(l, w)
		if l.TryAcquire() {
			adm.add(1)
		}
		var wg sync.WaitGroup
		for range 2 { // windows 1 and 2
			wg.Go(func() {
				if l.Acquire(context.Background(), time.Second) == nil {
					adm.add(1)
				}
			})
			synctest.Wait()
		}
		l.SetClockOffset(35 * time.Millisecond) // an NTP step: now in window 3
		synctest.Wait()
		if l.TryAcquire() {
			adm.add(1)
		}
		wg.Wait()
		adm.check(t, 1)
	})
}

// Bug: SetClockOffset moving time backwards leaves a waiter's reservation
// (and its deadline) in corrected time, so the waiter sleeps past its
// maxWait instead of failing with ErrTimeout at once.
func TestReviewClockOffsetBackwardHonoursMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 1, time.Second)
		t0 := time.Now()
		l.TryAcquire()
		const maxWait = time.Second
		done := make(chan error, 1)
		go func() { done <- l.Acquire(context.Background(), maxWait) }() // due at 1s
		synctest.Wait()
		l.SetClockOffset(-500 * time.Millisecond) // the next window is now 1.5s away
		err := <-done
		if d := since(t0); d > maxWait {
			t.Errorf("Acquire(maxWait=%v) returned %v after %v", maxWait, err, d)
		}
	})
}

// Bug: roll deletes the book entries of windows it skips without counting
// their charged permits, so reservations admitted in a window during which
// nobody else called the limiter vanish from Stats.Admitted.
func TestReviewStatsCountsReservationsOfSkippedWindows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 1, time.Second)
		l.TryAcquire()
		if err := l.Acquire(context.Background(), time.Minute); err != nil { // admitted at 1s
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond) // window 1 ends without another call
		if st := l.Stats(); st.Admitted != 2 {
			t.Errorf("Stats.Admitted = %d, want 2", st.Admitted)
		}
	})
}

// Bug: Close clears the book, so the permits of current-window reservations
// it fails (paced or after a Backoff) are no longer subtracted as pending
// and Stats.Admitted counts them as admitted.
func TestReviewStatsAfterCloseExcludesFailedWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 10, time.Second, WithPacing(true))
		l.TryAcquire() // slot 0
		errc := make(chan error, 1)
		go func() { errc <- l.Acquire(context.Background(), time.Second) }() // slot 1, at 100ms
		synctest.Wait()
		l.Close()
		if err := <-errc; !errors.Is(err, ErrClosed) {
			t.Fatalf("waiter: %v, want ErrClosed", err)
		}
		if st := l.Stats(); st.Admitted != 1 {
			t.Errorf("Stats.Admitted = %d after Close, want 1 (the waiter failed)", st.Admitted)
		}
	})
}

// Bug: when ctx's deadline equals the permit's due time, Wait's timer and
// ctx.Done become ready together and select picks either: the caller sleeps
// the whole wait and then gets ErrTimeout (its permit given back) although
// the permit was valid.
func TestReviewCtxDeadlineEqualToDueIsGranted(t *testing.T) {
	const trials, waiters = 20, 50
	var failed atomic.Int64
	for range trials {
		synctest.Test(t, func(t *testing.T) {
			var wg sync.WaitGroup
			for range waiters {
				l := mustNew(t, 1, time.Second)
				l.TryAcquire()
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), time.Second) // = next window
					defer cancel()
					if err := l.Acquire(ctx, time.Hour); err != nil {
						failed.Add(1)
					}
				})
			}
			wg.Wait()
		})
	}
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d waits whose permit was due exactly at ctx's deadline slept and then failed", n, trials*waiters)
	}
}

// Bug (FIFO): raising the quota does not move queued waiters up; a caller
// that arrives after them is admitted first.
func TestReviewQuotaRaiseServesQueuedWaitersFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 1, time.Second)
		t0 := time.Now()
		l.TryAcquire()
		at := make([]chan time.Duration, 3)
		for i := range at { // windows 1, 2, 3
			at[i] = make(chan time.Duration, 1)
			go func() {
				if err := l.Acquire(context.Background(), time.Minute); err != nil {
					t.Error(err)
				}
				at[i] <- since(t0)
			}()
			synctest.Wait()
		}
		if err := l.SetQuota(10, time.Time{}); err != nil { // 9 free now
			t.Fatal(err)
		}
		if err := l.Acquire(context.Background(), time.Minute); err != nil {
			t.Fatal(err)
		}
		late := since(t0)
		for i := range at {
			if d := <-at[i]; d > late {
				t.Errorf("waiter %d, queued before the raise, admitted at %v; a later caller at %v", i, d, late)
			}
		}
	})
}

// Bug (pacing bursts): a future window's reservations are placed by
// bw.charged only, so when a Backoff puts t inside that window every
// reservation gets the same slot, and the fast path then takes that slot
// again: several permits at one instant.
func TestReviewPacedBackoffDoesNotBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 10, time.Second, WithPacing(true))
		t0 := time.Now()
		l.TryAcquire() // slot 0
		l.Backoff(1550 * time.Millisecond)
		var mu sync.Mutex
		perInstant := map[time.Duration]int{}
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				if err := l.Acquire(context.Background(), 5*time.Second); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				perInstant[since(t0)]++
				mu.Unlock()
			})
			synctest.Wait()
		}
		wg.Wait()
		if l.TryAcquire() {
			perInstant[since(t0)]++
		}
		for at, n := range perInstant {
			if n > 1 {
				t.Errorf("%d permits at %v in a paced window of 10/s", n, at)
			}
		}
	})
}

// Bug (hang): with a Backoff that reaches the end of int64 time, a wait of
// "forever" makes placeLocked walk windows past math.MaxInt64, where
// span.end overflows; the loop never ends and holds mu.
func TestReviewHugeBackoffHugeWaitReturns(t *testing.T) {
	l, err := New(10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l.Backoff(math.MaxInt64)
	done := make(chan error, 1)
	go func() { done <- l.Acquire(context.Background(), math.MaxInt64) }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("admitted during an endless backoff")
		}
		l.Close()
	case <-time.After(5 * time.Second): // liveness guard, not a timing check
		t.Fatal("Acquire after Backoff(MaxInt64) with maxWait MaxInt64 never returned (placeLocked loops under mu)")
	}
}

// Bug (hang / never admitted): with pacing and a quota above the window's
// length in ns the interval rounds to 1ns, so slots beyond W ns lie past
// the window's end and an n above W never fits anywhere; with a long wait
// placeLocked walks every window to the end of time.
func TestReviewPacedQuotaAboveWindowNs(t *testing.T) {
	const w = 10 * time.Millisecond // 1e7 ns
	l, err := New(2e7, w, WithPacing(true))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.AcquireN(context.Background(), 15e6, math.MaxInt64) }()
	select {
	case <-done:
		l.Close()
	case <-time.After(5 * time.Second): // liveness guard, not a timing check
		t.Fatal("paced AcquireN(15e6) with quota 2e7 per 10ms never returned (placeLocked loops under mu)")
	}
}

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

// Bug (race): SetQuota/SetLimit with an at not after now reads the
// consumption, then stores an absolute remaining (setRemainingLocked); a
// hot-path admission between the two is overwritten and the window admits
// more than its quota. The quota never changes here, so admissions must
// stay ≤ q.
func TestReviewSetQuotaNowRacesHotPath(t *testing.T) {
	const q = 2_000_000
	clk := fixedClock{time.Date(2030, 1, 1, 0, 30, 0, 0, time.UTC)} // mid-hour, forever
	l, err := New(q, time.Hour, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var admitted atomic.Int64
	var stop atomic.Bool
	var setter sync.WaitGroup
	setter.Go(func() {
		for !stop.Load() {
			if err := l.SetQuota(q, time.Time{}); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for l.TryAcquire() {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	stop.Store(true)
	setter.Wait()
	if n := admitted.Load(); n > q {
		t.Errorf("one window with quota %d admitted %d while SetQuota(%d, now) ran", q, n, q)
	}
}

// Bug: a Reservation returned in shadow mode has win = 0 (never set); Cancel
// treats it as a real reservation of the window starting at the epoch. With
// the clock before 1970 that window is a future one, and Cancel uncharges a
// permit another waiter holds there: the window admits 2 with quota 1.
func TestReviewShadowReservationCancelTouchesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		epoch := time.Until(time.Unix(0, 0))                      // offset that puts the limiter at 1970-01-01
		l := mustNew(t, 1, w, WithClockOffset(epoch-time.Second)) // 1969-12-31T23:59:59
		adm := newAdmissions(l, w)
		if l.TryAcquire() {
			adm.add(1)
		}
		var wg sync.WaitGroup
		acquire := func() {
			wg.Go(func() {
				if l.Acquire(context.Background(), 2*w) == nil {
					adm.add(1)
				}
			})
			synctest.Wait()
		}
		acquire() // A: the window starting at Unix 0
		l.SetShadow(true)
		r, err := l.Reserve(1, 0) // would be refused; shadow admits it
		if err != nil {
			t.Fatal(err)
		}
		l.SetShadow(false)
		r.Cancel()
		acquire() // B: must go to the window after A's
		wg.Wait()
		adm.check(t, 1)
	})
}

// Regression: with a window change scheduled, SetQuota(q, zero Time) still
// changes the current window at once (it once took the pending window's
// length and so only applied at the next common boundary).
func TestReviewSetQuotaNowWithPendingWindowChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 10, time.Second)
		t0 := time.Now()
		if err := l.SetLimit(10, 2*time.Second, t0.Add(10*time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := l.SetQuota(0, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if l.TryAcquire() {
			t.Error("admitted after SetQuota(0, now)")
		}
	})
}

// Bug: at the ends of int64 time span arithmetic overflowed: in the last
// window before math.MaxInt64 span.end wrapped negative and nothing was
// ever admitted; in the first after math.MinInt64 span.start wrapped
// positive. Now the limiter's time is the whole days int64 holds: outside
// them nothing is admitted (see TestHoleEndOfTime), inside them windows
// align and admit to the very last and from the very first.
func TestReviewExtremeTimes(t *testing.T) {
	t.Run("2262", func(t *testing.T) {
		l, err := New(1, time.Second, WithClock(fixedClock{time.Unix(0, timeEnd-int64(100*time.Millisecond))}))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if !l.TryAcquire() {
			t.Error("the last window refused its permit")
		}
		if _, err := l.Reserve(1, 2*time.Second); !errors.Is(err, ErrNoQuota) {
			t.Errorf("a permit past the end of time: %v, want ErrNoQuota", err)
		}
	})
	t.Run("1677", func(t *testing.T) {
		l, err := New(1, time.Second, WithClock(fixedClock{time.Unix(0, timeStart+int64(100*time.Millisecond))}))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		l.TryAcquire()
		now := l.now()
		if ws := l.Stats().WindowStart.UnixNano(); ws > now || now-ws >= int64(time.Second) {
			t.Errorf("window starts at %d for time %d", ws, now)
		}
		r, err := l.Reserve(1, 2*time.Second)
		if err != nil {
			t.Fatalf("next window's permit not found: %v", err)
		}
		r.Cancel()
		before, err := New(1, time.Second, WithClock(fixedClock{time.Unix(0, math.MinInt64+int64(100*time.Millisecond))}))
		if err != nil {
			t.Fatal(err)
		}
		defer before.Close()
		if before.TryAcquire() {
			t.Error("admitted before the limiter's time begins")
		}
	})
}

// Bug: backoffUntil and scanFrom start at 0 (the zero value) instead of
// math.MinInt64, so on a clock before 1970 the limiter is "backing off"
// until the Unix epoch (nothing admitted, Stats.BackoffUntil = 1970) and
// placeLocked skips every window before Unix 0. (floorMod aligns fine.)
func TestReviewWindowsBefore1970(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		epoch := time.Until(time.Unix(0, 0))
		l := mustNew(t, 2, time.Second, WithClockOffset(epoch-1500*time.Millisecond)) // Unix -1.5s
		t0 := time.Now()
		if !l.TryAcquireN(2) || l.TryAcquire() {
			t.Fatal("window [-2s,-1s) did not admit exactly 2")
		}
		if err := l.Acquire(context.Background(), time.Second); err != nil {
			t.Fatal(err)
		}
		if d := since(t0); d != 500*time.Millisecond {
			t.Errorf("admitted after %v, want 500ms (the boundary at Unix -1s)", d)
		}
		if ws := l.Stats().WindowStart.UnixNano(); ws != -int64(time.Second) {
			t.Errorf("WindowStart = %d, want -1s", ws)
		}
	})
}

// --- Passing regression tests for corners not covered elsewhere. ---

// maxWait = math.MaxInt64 (wait "forever") with ordinary quota works: the
// deadline clamps instead of overflowing.
func TestReviewMaxWaitForever(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 1, time.Hour)
		t0 := time.Now()
		l.TryAcquire()
		if err := l.Acquire(context.Background(), math.MaxInt64); err != nil {
			t.Fatal(err)
		}
		if d := since(t0); d != time.Hour {
			t.Errorf("admitted after %v, want 1h", d)
		}
		r, err := l.Reserve(1, math.MaxInt64)
		if err != nil || r.Delay() != time.Hour {
			t.Fatalf("Reserve forever: %v, delay %v", err, r.Delay())
		}
		r.Cancel()
	})
}

// MaxQuota and n = MaxQuota work on the hot path and in a later window.
func TestReviewMaxQuotaAndMaxN(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, MaxQuota, time.Second)
		t0 := time.Now()
		if !l.TryAcquireN(MaxQuota) || l.TryAcquire() {
			t.Fatal("a MaxQuota window did not admit exactly MaxQuota")
		}
		if err := l.AcquireN(context.Background(), MaxQuota, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		if d := since(t0); d != time.Second {
			t.Errorf("admitted after %v, want 1s", d)
		}
		if st := l.Stats(); st.Admitted != 2*MaxQuota {
			t.Errorf("Stats.Admitted = %d, want %d", st.Admitted, 2*int64(MaxQuota))
		}
	})
}

// A scheduled raise reaches waiters that waited for quota, at its boundary;
// a waiter asked after the raise was scheduled gets the same boundary.
func TestReviewScheduledRaiseFromZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 0, time.Second)
		t0 := time.Now()
		errc := make(chan error, 2)
		go func() { errc <- l.Acquire(context.Background(), 5*time.Second) }()
		synctest.Wait()
		if err := l.SetQuota(2, t0.Add(3*time.Second)); err != nil {
			t.Fatal(err)
		}
		go func() { errc <- l.Acquire(context.Background(), 5*time.Second) }()
		for range 2 {
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		}
		if d := since(t0); d != 3*time.Second {
			t.Errorf("admitted at %v, want 3s", d)
		}
		if l.TryAcquire() {
			t.Error("window at 3s admitted a third permit")
		}
	})
}

// A window-length change takes effect only at a common boundary, and
// reservations in old windows beyond it keep their times: each counts in
// the new window that holds its time, which admits nothing more while
// they hold its quota or more.
func TestReviewWindowChangeKeepsReservations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 1, time.Second)
		l.TryAcquire()
		rs := make([]*Reservation, 4)
		for i := range rs { // windows 1..4
			r, err := l.Reserve(1, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			rs[i] = r
		}
		// From 2s on: 1 permit per 2s window.
		from, err := l.Schedule(1, 2*time.Second, time.Now().Add(1500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if want := time.Now().Add(4 * time.Second); !from.Equal(want) {
			t.Errorf("Schedule governs whole from %v, want %v: the window [2s, 4s) holds 2 reservations", from, want)
		}
		for i, r := range rs {
			if err := r.Err(); err != nil {
				t.Fatalf("reservation %d: %v", i, err)
			}
			if d, want := r.Delay(), time.Duration(i+1)*time.Second; d != want {
				t.Errorf("reservation %d valid in %v, want %v as told", i, d, want)
			}
		}
		for i := range 6 {
			time.Sleep(time.Second)
			if i < 4 {
				if err := rs[i].Wait(context.Background()); err != nil {
					t.Fatalf("reservation %d: %v", i, err)
				}
			}
			if i < 5 && l.TryAcquire() {
				t.Errorf("at %ds a permit beside the reservations", i+1)
			}
		}
		if !l.TryAcquire() {
			t.Error("at 6s the 2s window admits nothing")
		}
	})
}

// Pacing under real concurrency: every aligned window stays within quota and
// no paced slot is handed out twice in a row at one reading of the clock.
func TestReviewPacedExactUnderRealConcurrency(t *testing.T) {
	const (
		q = 20
		w = 20 * time.Millisecond
	)
	l := mustNew(t, q, w, WithPacing(true))
	stop := time.Now().Add(15 * w)
	var mu sync.Mutex
	perWindow := map[int64]int64{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				before := l.Now().UnixNano() / int64(w)
				if l.TryAcquire() {
					if after := l.Now().UnixNano() / int64(w); before == after {
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

// A cancelled Reserve in a future window returns its permit there, and
// Stats balances: nothing counted admitted for it.
func TestReviewReserveCancelBalancesStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 2, time.Second)
		l.TryAcquireN(2)
		r, err := l.Reserve(2, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		r.Cancel()
		time.Sleep(time.Second)
		if !l.TryAcquireN(2) {
			t.Fatal("cancelled permits not back in window 1")
		}
		st := l.Stats()
		if st.Admitted != 4 || st.Canceled != 2 || st.Waiting != 0 || st.Remaining != 0 {
			t.Errorf("stats %+v", st)
		}
	})
}
