package limiter

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// Tests of SetExpiry. Every test starts at t0, a boundary of every window
// (see limiter_test.go), and counts windows from it.

// TestExpiryTryAcquire: windows that begin at or after the expiry admit
// nothing; changes scheduled before it apply, those after it are
// overridden with 0 until the expiry moves past them.
func TestExpiryTryAcquire(t *testing.T) {
	const w = time.Second
	tests := []struct {
		name   string
		setup  func(l *Limiter, t0 time.Time) error // changes scheduled first; none if nil
		expiry time.Duration                        // from t0; none if unset
		set    bool
		paced  bool
		want   []int // admitted in windows 0, 1, ...
	}{
		{name: "none", want: []int{3, 3, 3, 3}},
		{name: "at a boundary", expiry: 2 * w, set: true, want: []int{3, 3, 0, 0}},
		{name: "inside a window: it keeps its quota", expiry: 1500 * time.Millisecond, set: true, want: []int{3, 3, 0, 0}},
		{name: "1ns after a boundary", expiry: 2*w + 1, set: true, want: []int{3, 3, 3, 0}},
		{name: "1ns before a boundary", expiry: 2*w - 1, set: true, want: []int{3, 3, 0, 0}},
		{name: "now: the current window has begun", expiry: 0, set: true, want: []int{3, 0, 0, 0}},
		{name: "in the past", expiry: -5 * w, set: true, want: []int{3, 0, 0, 0}},
		{name: "paced", expiry: 2 * w, set: true, paced: true, want: []int{1, 1, 0, 0}},
		{
			name:   "quota change before the expiry",
			setup:  func(l *Limiter, t0 time.Time) error { return l.SetQuota(5, t0.Add(w)) },
			set:    true,
			expiry: 2 * w,
			want:   []int{3, 5, 0, 0},
		},
		{
			name:   "quota change after the expiry",
			setup:  func(l *Limiter, t0 time.Time) error { return l.SetQuota(5, t0.Add(3*w)) },
			set:    true,
			expiry: 2 * w,
			want:   []int{3, 3, 0, 0, 0},
		},
		{
			// 1s → 2s windows from 2s: the expiry at 3s falls inside [2s, 4s),
			// so the first expired window begins at 4s.
			name:   "window length change before the expiry",
			setup:  func(l *Limiter, t0 time.Time) error { return l.SetLimit(20, 2*w, t0.Add(2*w)) },
			set:    true,
			expiry: 3 * w,
			want:   []int{3, 3, 20, 0, 0, 0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := mustNew(t, 3, w, WithPacing(tt.paced))
				t0 := time.Now()
				if tt.setup != nil {
					if err := tt.setup(l, t0); err != nil {
						t.Fatal(err)
					}
				}
				if tt.set {
					l.SetExpiry(t0.Add(tt.expiry))
				}
				got := drainWindows(l, w, len(tt.want))
				if !slices.Equal(got, tt.want) {
					t.Errorf("admitted per window %v, want %v", got, tt.want)
				}
			})
		})
	}
}

// The boundary itself: refused from its first nanosecond, admitted up to the
// one before.
func TestExpiryBoundaryToTheNanosecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = 100 * time.Millisecond
		l := mustNew(t, 10, w)
		t0 := time.Now()
		l.SetExpiry(t0.Add(w / 2)) // inside window 0: expires from w on
		time.Sleep(w - 1)
		if !l.TryAcquire() {
			t.Fatal("refused 1ns before the first expired window")
		}
		time.Sleep(1)
		if l.TryAcquire() {
			t.Fatal("admitted in the first window that begins after the expiry")
		}
		if st := l.Stats(); st.Quota != 0 || st.Remaining != 0 {
			t.Errorf("expired window: Stats.Quota %d, Remaining %d, want 0, 0", st.Quota, st.Remaining)
		}
		if got := l.Expiry(); !got.Equal(t0.Add(w / 2)) {
			t.Errorf("Expiry() = %v, want %v", got, t0.Add(w/2))
		}
	})
}

// Moving the expiry earlier takes back no permit of the window already
// begun, even though that window begins after the new expiry; moving it
// later gives no quota to a window already begun expired.
func TestExpiryWindowAlreadyBegunKeepsItsQuota(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		l := mustNew(t, 3, w)
		t0 := time.Now()
		time.Sleep(w + w/4)
		if !l.TryAcquire() {
			t.Fatal("refused with no expiry")
		}
		l.SetExpiry(t0) // window 1 began after t0, but has begun
		if got := drain(l); got != 2 {
			t.Errorf("window 1 admitted %d more after an earlier expiry, want its 2 left", got)
		}
		time.Sleep(w)
		if got := drain(l); got != 0 {
			t.Errorf("window 2 admitted %d, want 0 (expired)", got)
		}
		// Later: window 2 has begun expired and stays so; window 3 is back.
		l.SetExpiry(t0.Add(10 * w))
		if got := drain(l); got != 0 {
			t.Errorf("window 2 admitted %d after the expiry moved later, want 0", got)
		}
		time.Sleep(w)
		if got := drain(l); got != 3 {
			t.Errorf("window 3 admitted %d, want its quota back (3)", got)
		}
	})
}

func TestExpiryRemoved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		l := mustNew(t, 3, w)
		t0 := time.Now()
		l.SetExpiry(t0.Add(w))
		time.Sleep(w + w/2)
		if l.TryAcquire() {
			t.Fatal("admitted after the expiry")
		}
		l.SetExpiry(time.Time{})
		if !l.Expiry().IsZero() {
			t.Errorf("Expiry() = %v after removing it, want the zero Time", l.Expiry())
		}
		if l.TryAcquire() {
			t.Error("removing the expiry gave quota to the window already begun")
		}
		time.Sleep(w / 2)
		if got := drainWindows(l, w, 3); got[0] != 3 || got[1] != 3 || got[2] != 3 {
			t.Errorf("after removing the expiry windows admitted %v, want 3 each", got)
		}
	})
}

// An Acquire that finds no room before the expiry waits for quota, as
// under a quota of 0, and is served in order when the expiry moves later.
func TestExpiryWaiterServedWhenExtended(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		l := mustNew(t, 1, w)
		t0 := time.Now()
		l.SetExpiry(t0.Add(2 * w))
		l.TryAcquire()
		at := make([]chan time.Duration, 3)
		for i := range at { // window 1, then two waiting for quota
			at[i] = make(chan time.Duration, 1)
			go func() {
				if err := l.Acquire(context.Background(), 10*w); err != nil {
					t.Errorf("waiter %d: %v", i, err)
				}
				at[i] <- since(t0)
			}()
			synctest.Wait()
		}
		if st := l.Stats(); st.Waiting != 3 || st.Delayed != 1 {
			t.Fatalf("Stats: %d waiting, %d delayed; want 3 waiting, 1 delayed (placed)", st.Waiting, st.Delayed)
		}
		time.Sleep(w + w/2)
		l.SetExpiry(t0.Add(5 * w))
		want := []time.Duration{w, 2 * w, 3 * w}
		for i := range want {
			if got := <-at[i]; got != want[i] {
				t.Errorf("waiter %d admitted at %v, want %v", i, got, want[i])
			}
		}
	})
}

// Waiters that no change could serve in time fail at once; others wait for
// their deadline, as under a quota of 0.
func TestExpiryTimesOut(t *testing.T) {
	const w = time.Second
	tests := []struct {
		name    string
		expiry  time.Duration // from t0
		sleep   time.Duration // from t0, before asking
		maxWait time.Duration
		waits   time.Duration // before the error
	}{
		// Window 1 is expired: only window 2 (at 2s) could be given quota.
		{"expired window, deadline before the next", w, 1200 * time.Millisecond, 500 * time.Millisecond, 0},
		{"expired window, deadline after the next", w, 1200 * time.Millisecond, 900 * time.Millisecond, 900 * time.Millisecond},
		// Window 0 is full but not expired: a SetQuota at once could serve it.
		{"full window before the expiry", w, 200 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond},
		{"no wait", w, 1200 * time.Millisecond, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := mustNew(t, 1, w)
				t0 := time.Now()
				l.SetExpiry(t0.Add(tt.expiry))
				l.TryAcquire()
				time.Sleep(tt.sleep)
				t1 := time.Now()
				err := l.Acquire(context.Background(), tt.maxWait)
				if !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrNoQuota) {
					t.Fatalf("Acquire: %v, want ErrTimeout and ErrNoQuota", err)
				}
				if d := since(t1); d != tt.waits {
					t.Errorf("failed after %v, want %v", d, tt.waits)
				}
				if _, err := l.Reserve(1, time.Hour); !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrNoQuota) || since(t1) != tt.waits {
					t.Errorf("Reserve: %v, want ErrTimeout and ErrNoQuota at once", err)
				}
				if st := l.Stats(); st.TimedOut != 2 || st.Waiting != 0 {
					t.Errorf("Stats: TimedOut %d, Waiting %d; want 2, 0", st.TimedOut, st.Waiting)
				}
			})
		})
	}
}

// Moving the expiry earlier places reservations again, in order: an
// Acquire waiter moves to room left before the new expiry, a Reserve
// holder that cannot stay before it fails, and the window that straddles
// the expiry keeps its permit.
func TestExpiryEarlierMovesWaitersKeepsReservations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		l := mustNew(t, 1, w)
		t0 := time.Now()
		l.TryAcquire()
		r1, err := l.Reserve(1, 5*w) // window 1
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan time.Duration, 1)
		go func() { // window 2
			if err := l.Acquire(context.Background(), 10*w); err != nil {
				t.Errorf("waiter: %v", err)
			}
			done <- since(t0)
		}()
		synctest.Wait()
		r3, err := l.Reserve(1, 5*w) // window 3
		if err != nil {
			t.Fatal(err)
		}
		told := r3.Delay()
		r1.Cancel() // window 1 free; the waiter keeps window 2 until a change
		l.SetExpiry(t0.Add(2*w + w/2))
		if d := <-done; d != w {
			t.Errorf("waiter admitted at %v, want moved to window 1 (1s)", d)
		}
		// A reservation's time is fixed: its holder may have told it on.
		if err := r3.Err(); err != nil {
			t.Errorf("reservation past the new expiry: Err() = %v, want nil", err)
		}
		if d := r3.Delay(); d != told-w {
			t.Errorf("reservation past the new expiry: Delay() = %v, want %v as told", d, told-w)
		}
		if st := l.Stats(); st.TimedOut != 0 {
			t.Errorf("Stats.TimedOut = %d, want 0", st.TimedOut)
		}
		time.Sleep(w)
		if got := drain(l); got != 1 {
			t.Errorf("window 2, which straddles the expiry, admitted %d, want 1", got)
		}
		time.Sleep(w)
		if got := drain(l); got != 0 {
			t.Errorf("window 3 admitted %d, want 0", got)
		}
	})
}

// SetLimit replaces the schedule, not the expiry: a quota set at once or
// later is 0 from the expiry on, and a SetQuota at once cannot reopen an
// expired window.
func TestExpirySurvivesSetLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		l := mustNew(t, 3, w)
		t0 := time.Now()
		l.SetExpiry(t0.Add(2 * w))
		if err := l.SetQuota(5, time.Time{}); err != nil { // at once
			t.Fatal(err)
		}
		if err := l.SetQuota(7, t0.Add(w)); err != nil {
			t.Fatal(err)
		}
		got := drainWindows(l, w, 3)
		if want := []int{5, 7, 0}; !slices.Equal(got, want) {
			t.Errorf("admitted per window %v, want %v", got, want)
		}
		if err := l.SetQuota(9, time.Time{}); err != nil { // in window 3, expired
			t.Fatal(err)
		}
		if l.TryAcquire() {
			t.Error("SetQuota at once reopened an expired window")
		}
		if got := l.Expiry(); !got.Equal(t0.Add(2 * w)) {
			t.Errorf("Expiry() = %v after SetQuota, want %v", got, t0.Add(2*w))
		}
		// Re-arming, then raising at once: the current window is no longer
		// past the expiry, so the raise reaches it.
		l.SetExpiry(t0.Add(10 * w))
		if err := l.SetQuota(2, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if got := drain(l); got != 2 {
			t.Errorf("re-armed, then raised at once: admitted %d, want 2", got)
		}
	})
}

// A change scheduled after the expiry takes effect once the expiry moves
// past it, and a waiter for quota is placed at that change.
func TestExpiryExtendedPastAScheduledChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		l := mustNew(t, 0, w)
		t0 := time.Now()
		l.SetExpiry(t0.Add(2 * w))
		if err := l.SetQuota(4, t0.Add(3*w)); err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- l.AcquireN(context.Background(), 4, 10*w) }()
		synctest.Wait()
		time.Sleep(w / 2)
		l.SetExpiry(t0.Add(4 * w))
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if d := since(t0); d != 3*w {
			t.Errorf("admitted at %v, want at the change (3s)", d)
		}
		time.Sleep(w)
		if l.TryAcquire() {
			t.Error("admitted past the moved expiry")
		}
	})
}

// An instance without a share yet (quota 0) and with an expiry far ahead
// still waits for its share rather than failing at once.
func TestExpiryZeroQuotaStillWaitsForAShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		l := mustNew(t, 0, w)
		t0 := time.Now()
		l.SetExpiry(t0.Add(time.Hour))
		errc := make(chan error, 1)
		go func() { errc <- l.Acquire(context.Background(), 5*w) }()
		synctest.Wait()
		time.Sleep(w / 2)
		if err := l.SetQuota(1, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil || since(t0) != w/2 {
			t.Errorf("waiter: %v at %v, want admitted when the share came (500ms)", err, since(t0))
		}
	})
}

// The expiry is in corrected time: it moves with the clock offset, like
// window boundaries.
func TestExpiryInCorrectedTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		l := mustNew(t, 1, w, WithClockOffset(300*time.Millisecond))
		t0 := time.Now()
		l.SetExpiry(l.Now().Add(w / 2)) // corrected 800ms: expired from corrected 1s
		l.TryAcquire()
		if _, err := l.Reserve(1, time.Hour); !errors.Is(err, ErrNoQuota) {
			t.Errorf("Reserve: %v, want ErrNoQuota", err)
		}
		time.Sleep(700 * time.Millisecond) // corrected 1s
		if l.TryAcquire() {
			t.Errorf("admitted at %v on the system clock, past the corrected expiry", since(t0))
		}
		// The clock steps back 500ms: corrected 500ms is before the expiry,
		// but the window already begun stays expired until its end.
		l.SetClockOffset(-200 * time.Millisecond)
		if l.TryAcquire() {
			t.Error("a backward clock step reopened an expired window")
		}
	})
}

// TestExpiryMovesWithTheClockOffset: the expiry is an instant of real
// time (a lease's end): a correction of the clock backwards moves it with
// the clock, so the limiter never admits past that instant (a review
// finding: the expiry stayed put in corrected time and admitted 3s late).
func TestExpiryMovesWithTheClockOffset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		time.Sleep(time.Until(time.Now().Truncate(w).Add(w)))
		l := mustNew(t, 100, w)
		t0 := l.Now()
		l.SetExpiry(t0.Add(2 * w))
		l.SetClockOffset(-3 * w)
		if got, want := l.Expiry(), t0.Add(-w); !got.Equal(want) {
			t.Errorf("expiry %v after a -3s correction, want %v", got, want)
		}
		time.Sleep(4*w + w/10) // real t0+4.1s: corrected t0+1.1s
		if l.TryAcquire() {
			t.Error("admitted 2s of real time past the expiry after a backward correction")
		}
		l.SetClockOffset(0) // and forward again: the same real instant
		if got, want := l.Expiry(), t0.Add(2*w); !got.Equal(want) {
			t.Errorf("expiry %v after correcting back, want %v", got, want)
		}
	})
}

func TestExpiryShadowCountsWhatItWouldRefuse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		l := mustNew(t, 2, w, WithShadow(true))
		t0 := time.Now()
		l.SetExpiry(t0.Add(w))
		time.Sleep(w + w/4)
		if !l.TryAcquire() {
			t.Fatal("shadow TryAcquire refused")
		}
		// Fails at once when enforcing (the deadline is before the next
		// window), waits for quota with a longer one.
		if err := l.Acquire(context.Background(), w/2); err != nil || since(t0) != w+w/4 {
			t.Fatalf("shadow Acquire: %v after %v", err, since(t0))
		}
		if err := l.Acquire(context.Background(), 2*w); err != nil || since(t0) != w+w/4 {
			t.Fatalf("shadow Acquire: %v after %v", err, since(t0))
		}
		st := l.Stats()
		if st.ShadowAdmitted != 3 || st.ShadowRejected != 2 || st.ShadowDelayed != 1 {
			t.Errorf("shadow stats: admitted %d, rejected %d, delayed %d; want 3, 2, 1", st.ShadowAdmitted, st.ShadowRejected, st.ShadowDelayed)
		}
	})
}

func TestExpiryBackoffAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = time.Second
		l := mustNew(t, 1, w)
		t0 := time.Now()
		l.SetExpiry(t0.Add(2 * w))
		l.TryAcquire()
		// A backoff past the expiry leaves no window to place in: the
		// waiter waits for quota.
		l.Backoff(2*w + w/2)
		errc := make(chan error, 1)
		go func() { errc <- l.Acquire(context.Background(), time.Minute) }()
		synctest.Wait()
		if st := l.Stats(); st.Waiting != 1 || st.Delayed != 0 {
			t.Fatalf("Stats: %d waiting, %d delayed; want 1 waiting for quota", st.Waiting, st.Delayed)
		}
		l.Close()
		if err := <-errc; !errors.Is(err, ErrClosed) {
			t.Errorf("waiter for quota after Close: %v, want ErrClosed", err)
		}
		l.SetExpiry(time.Time{}) // after Close: recorded, nothing else
		if !l.Expiry().IsZero() || l.TryAcquire() {
			t.Error("SetExpiry after Close")
		}
	})
}

// The expiry is applied when a window begins; the hot path does not look
// at it and allocates nothing.
func TestExpiryHotPathAllocatesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, MaxQuota, time.Hour)
		l.SetExpiry(time.Now().Add(time.Minute))
		l.TryAcquire()
		if a := testing.AllocsPerRun(1000, func() { l.TryAcquire() }); a != 0 {
			t.Errorf("TryAcquire with an expiry set: %v allocs, want 0", a)
		}
	})
}

// The schedule treats the first window that begins at or after the expiry
// as its last change: to quota 0, for good.
func TestScheduleExpiry(t *testing.T) {
	const s = int64(time.Second)
	sc := schedule{cur: params{quota: 3, window: s}}
	sc.setFrom(2*s, params{quota: 5, window: 2 * s}) // 2s windows from 2s
	sc.setFrom(6*s, params{quota: 7, window: 2 * s})
	sc.expires, sc.expiry = true, 3*s // inside [2s, 4s)
	if e, ok := sc.expiryStart(); !ok || e != 4*s {
		t.Fatalf("expiryStart() = %d, %v; want 4s, true", e, ok)
	}
	tests := []struct {
		t         int64
		quota     int64
		next      int64
		changes   bool
		aheadFor5 bool
	}{
		{t: 0, quota: 3, next: 2 * s, changes: true, aheadFor5: true},
		{t: 2 * s, quota: 5, next: 4 * s, changes: true}, // the change at 6s is past the expiry
		{t: 3 * s, quota: 5, next: 4 * s, changes: true},
		{t: 4 * s, quota: 0},
		{t: 7 * s, quota: 0},
	}
	for _, tt := range tests {
		sp := sc.spanAt(tt.t, false)
		next, changes := sc.nextChange(tt.t)
		if sp.quota != tt.quota || next != tt.next || changes != tt.changes || sc.quotaAhead(tt.t, 5) != tt.aheadFor5 {
			t.Errorf("at %v: quota %d, nextChange %v, %v, quotaAhead(5) %v; want %d, %v, %v, %v",
				time.Duration(tt.t), sp.quota, time.Duration(next), changes, sc.quotaAhead(tt.t, 5),
				tt.quota, time.Duration(tt.next), tt.changes, tt.aheadFor5)
		}
	}
	sc.expiry = 4 * s // a boundary: it is the first expired window's start
	if e, ok := sc.expiryStart(); !ok || e != 4*s {
		t.Errorf("expiryStart() = %d, %v; want 4s, true", e, ok)
	}
	sc.expires = false
	if next, changes := sc.nextChange(3 * s); !changes || next != 6*s {
		t.Errorf("without expiry nextChange(3s) = %v, %v; want 6s, true", time.Duration(next), changes)
	}
}
