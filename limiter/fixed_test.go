package limiter

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// sweepWindows drains l every step from now until end (offsets from t0),
// counting admissions per aligned window of length w (true time = fake
// time: no offset), and returns them keyed by window index from t0.
func sweepWindows(l *Limiter, t0 time.Time, w, step, end time.Duration) map[int64]int64 {
	got := map[int64]int64{}
	for {
		d := time.Since(t0)
		if d >= end {
			return got
		}
		for l.TryAcquire() {
			got[int64(d/w)]++
		}
		time.Sleep(step)
	}
}

// twoWindowRig: 10 per 1s, paced, uncertainty 50ms. Window 0 filled by a
// reservation; rA (2) due 1.1s and rB (1) due 1.2s in window 1. Then the
// length becomes 200ms (quota q200) from 1s: rB's true instant may lie in
// [1.15s, 1.25s], which meets [1.0,1.2) and [1.2,1.4): charged to both.
func twoWindowRig(t *testing.T, q200 int64) (l *Limiter, t0 time.Time, rA, rB *Reservation) {
	l = mustNew(t, 10, time.Second, WithPacing(true))
	t0 = time.Now()
	l.SetClockUncertainty(50 * time.Millisecond)
	r0, err := l.Reserve(10, 3*time.Second)
	if err != nil || r0.Delay() >= time.Second {
		t.Fatalf("window 0: %v %v", err, r0.Delay())
	}
	rA, err = l.Reserve(2, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rB, err = l.Reserve(1, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rA due +%v, rB due +%v", rA.Delay(), rB.Delay())
	if err := l.SetLimit(q200, 200*time.Millisecond, time.Time{}); err != nil {
		t.Fatal(err)
	}
	l.SetPacing(false)
	l.mu.Lock()
	t.Logf("rB win %v also %v alsoSet %v", time.Unix(0, rB.win).Sub(t0), time.Unix(0, rB.also).Sub(t0), rB.alsoSet)
	l.mu.Unlock()
	return
}

// TestFixedReservationInTwoWindowsCancelledAtEveryPhase: a reservation
// whose time a change of window length left near a new boundary is
// charged to both windows its true instant may fall in; Cancel before,
// during and after them gives back what it held, and Stats count it once.
func TestFixedReservationInTwoWindowsCancelledAtEveryPhase(t *testing.T) {
	for _, phase := range []time.Duration{0, 1100 * time.Millisecond, 1300 * time.Millisecond, 1500 * time.Millisecond, -1} {
		t.Run(phase.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, t0, rA, rB := twoWindowRig(t, 5)
				var used int64 = 10 // r0
				canceled := int64(0)
				cancelB := func() {
					if phase >= 0 && time.Since(t0) >= phase && rB.Err() == nil {
						rB.Cancel()
						canceled++
					}
				}
				got := map[int64]int64{}
				for d := time.Since(t0); d < 2*time.Second; d = time.Since(t0) {
					cancelB()
					for l.TryAcquire() {
						got[int64(d/(200*time.Millisecond))]++
					}
					time.Sleep(time.Millisecond)
				}
				_ = rA
				used += 2
				if rB.Err() == nil {
					used++
				}
				var tries int64
				for _, n := range got {
					tries += n
				}
				st := l.Stats()
				t.Logf("phase %v: per 200ms window %v; stats admitted %d wasted %d canceled %d", phase, got, st.Admitted, st.Wasted, st.Canceled)
				// Windows 5 ([1.0,1.2)) and 6 ([1.2,1.4)) hold rA (2) and rB (1).
				if got[5]+2+1 > 5 && got[5]+2 > 5 {
					t.Errorf("window [1.0,1.2): %d admitted beside rA, rB", got[5])
				}
				if got[6]+1-canceled > 5 {
					t.Errorf("window [1.2,1.4): %d admitted beside rB", got[6])
				}
				if st.Admitted != used+tries {
					t.Errorf("Stats.Admitted %d, want %d used + %d tried", st.Admitted, used, tries)
				}
				if st.Canceled != canceled {
					t.Errorf("Stats.Canceled %d, want %d", st.Canceled, canceled)
				}
			})
		})
	}
}

// TestSetWindowQuotaRebooksFixedReservations: a change to 200ms windows
// is scheduled from 2s; Reserves are told 2.0s and 2.2s (2 permits each,
// the 200ms quota). SetWindowQuota (budget mode) drops the scheduled
// length change: both must count in the window [2s,3s) again.
func TestSetWindowQuotaRebooksFixedReservations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 10, time.Second)
		t0 := time.Now()
		if _, err := l.Schedule(2, 200*time.Millisecond, t0.Add(2*time.Second)); err != nil {
			t.Fatal(err)
		}
		for range 10 {
			l.TryAcquire()
		}
		var fixed []*Reservation
		for _, n := range []int64{10, 2, 2} { // [1s,2s), [2.0,2.2), [2.2,2.4)
			r, err := l.Reserve(n, 3*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("Reserve(%d): told +%v", n, r.Delay())
			fixed = append(fixed, r)
		}
		if ok, err := l.SetWindowQuota(10, time.Second, t0); !ok || err != nil {
			t.Fatalf("SetWindowQuota for [0,1s): %v %v", ok, err)
		}
		time.Sleep(2*time.Second + 10*time.Millisecond)
		if ok, err := l.SetWindowQuota(4, time.Second, t0.Add(2*time.Second)); !ok || err != nil {
			t.Fatalf("SetWindowQuota for [2s,3s): %v %v", ok, err)
		}
		n := int64(drain(l))
		for _, r := range fixed[1:] {
			if err := r.Err(); err != nil {
				t.Fatalf("a fixed reservation failed: %v", err)
			}
		}
		// The holders use theirs at 2.0s and 2.2s, both in [2s,3s).
		if total := n + 2 + 2; total > 4 {
			t.Errorf("window [2s,3s) of quota 4: %d admitted + 4 permits told to Reserve holders for 2.0s and 2.2s = %d", n, total)
		}
	})
}

// TestFailedMultiPartFollowsClockAndLength: a Multi.Reserve is told an
// instant; its requests lane closes alone (a Group's member left), so the
// tokens part stays charged, held and not admitted, for a remote caller
// who calls anyway. The clock offset then changes, the uncertainty
// narrows and the tokens lane moves to 40ms windows: the part must stay
// charged to the window holding the told instant.
func TestFailedMultiPartFollowsClockAndLength(t *testing.T) {
	for _, closeLane := range []bool{false, true} {
		t.Run(map[bool]string{false: "control", true: "lane closed"}[closeLane], func(t *testing.T) { fixedFailedMultiPart(t, closeLane) })
	}
}

func fixedFailedMultiPart(t *testing.T, closeLane bool) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		m := mustMulti(t, Limit{Quota: 10, Window: time.Second}, Limit{Dimension: "tokens", Quota: 100, Window: time.Second})
		m.SetClockUncertainty(40 * time.Millisecond)
		m.SetClockOffset(-40 * time.Millisecond) // corrected = true - 40ms, within the uncertainty
		time.Sleep(100 * time.Millisecond)
		for {
			if _, ok := m.TryAcquire(Cost("tokens", 10)); !ok {
				break
			}
		}
		r, err := m.Reserve(2*time.Second, Cost("tokens", 10))
		if err != nil {
			t.Fatal(err)
		}
		told := time.Since(t0) + r.Delay() // true instant the remote caller calls at
		t.Logf("told true instant +%v", told)
		if closeLane {
			m.Limiter(0).Close()
		}
		t.Logf("after the requests lane closed: %v", r.Err())
		m.SetClockOffset(0)
		tok := m.Limiter(1)
		tok.SetClockUncertainty(0)
		if _, err := tok.Schedule(10, 40*time.Millisecond, time.Time{}); err != nil {
			t.Fatal(err)
		}
		// Drain the tokens lane through the 40ms window holding the told instant.
		w := 40 * time.Millisecond
		win := told / w
		time.Sleep(win*w - time.Since(t0))
		var n int64
		for time.Since(t0) < (win+1)*w {
			for tok.TryAcquireN(1) {
				n++
			}
			time.Sleep(time.Millisecond)
		}
		if n+10 > 10 {
			t.Errorf("tokens window [%v,%v) of quota 10: the lane admits %d beside the remote caller's 10 at %v", win*w, (win+1)*w, n, told)
		}
	})
}

// TestFixedReservationValidAfterACorrectionBackwardsCountsOnClose:
// uncertainty 40ms, clock 40ms ahead of true time. A Reserve is placed in
// window [1s,2s) at its open, 1.04s corrected = true 1.00s. The clock is
// then corrected to 40ms behind (honest both times): the reservation is
// valid once its window has begun on the limiter's clock, and counts as
// admitted after Close.
func TestFixedReservationValidAfterACorrectionBackwardsCountsOnClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		l := mustNew(t, 10, time.Second)
		l.SetClockUncertainty(40 * time.Millisecond)
		l.SetClockOffset(40 * time.Millisecond)
		if n := drain(l); n != 10 {
			t.Fatalf("window 0 admitted %d", n)
		}
		r, err := l.Reserve(3, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		told := time.Since(t0) + r.Delay()
		l.SetClockOffset(-40 * time.Millisecond)
		if err := r.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Logf("told true +%v, valid at true +%v (limiter at %v)", told, time.Since(t0), l.Now().Sub(t0))
		time.Sleep(10 * time.Millisecond)
		l.Close()
		if st := l.Stats(); st.Admitted != 13 {
			t.Errorf("Stats.Admitted %d after Close, want 13 (10 taken, 3 reserved and used at +%v)", st.Admitted, told)
		}
	})
}

// TestSettleOfAFixedMultiReservationAfterACorrectionBackwards: as above
// for a Multi: Wait returns once the window is open on the limiter's
// clock, so Settle gives back to the window the tokens were charged to.
func TestSettleOfAFixedMultiReservationAfterACorrectionBackwards(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		m := mustMulti(t, Limit{Quota: 10, Window: time.Second}, Limit{Dimension: "tokens", Quota: 100, Window: time.Second})
		m.SetClockUncertainty(40 * time.Millisecond)
		m.SetClockOffset(40 * time.Millisecond)
		tok := m.Limiter(1)
		for tok.TryAcquire() {
		}
		r, err := m.Reserve(2*time.Second, Cost("tokens", 25))
		if err != nil {
			t.Fatal(err)
		}
		told := time.Since(t0) + r.Delay()
		m.SetClockOffset(-40 * time.Millisecond)
		g, err := r.Wait(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("told true +%v, granted at true +%v", told, time.Since(t0))
		time.Sleep(100 * time.Millisecond) // corrected 1.06s: window [1s,2s) open
		if err := g.Settle(Cost("tokens", 11)); err != nil {
			t.Fatal(err)
		}
		n := 0
		for tok.TryAcquire() {
			n++
		}
		if n != 100-11 {
			t.Errorf("tokens window [1s,2s): %d admitted after the grant settled at 11 of 25 charged, want %d: the 14 given back were lost", n, 100-11)
		}
	})
}

// TestHigherClassDoesNotMoveAFixedReservation: a Reserve of the lower
// class told 1s keeps 1s when a higher class's Acquire wants that
// window.
func TestHigherClassDoesNotMoveAFixedReservation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 2, time.Second, WithClasses(Class{Name: "hi"}, Class{Name: "lo"}))
		for l.TryAcquire() {
		}
		r, err := l.Reserve(2, 3*time.Second) // class lo: window 1
		if err != nil {
			t.Fatal(err)
		}
		told := r.Delay()
		done := make(chan time.Duration, 1)
		t0 := time.Now()
		go func() {
			if err := l.AcquireN(WithClass(context.Background(), "hi"), 2, 3*time.Second); err == nil {
				done <- time.Since(t0)
			}
			close(done)
		}()
		synctest.Wait()
		if d := r.Delay(); d != told || r.Err() != nil {
			t.Errorf("the lower class's Reserve told %v now says %v (%v)", told, d, r.Err())
		}
		if d := <-done; d < 2*time.Second {
			t.Errorf("the higher class was admitted at %v, in the window the Reserve holds whole", d)
		}
	})
}

// TestHeldPartCancelledAfterCloseIsNotAdmitted: a Multi.Reserve
// for the next window; its requests lane closes alone, so the tokens part
// is held (wasted). The tokens lane is then closed too (Close counts the
// held charge as closed), and the holder cancels: nobody used the tokens,
// yet Stats.Admitted of the tokens lane must stay what was really used.
func TestHeldPartCancelledAfterCloseIsNotAdmitted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := mustMulti(t, Limit{Quota: 10, Window: time.Second}, Limit{Dimension: "tokens", Quota: 100, Window: time.Second})
		tok := m.Limiter(1)
		for range 100 {
			if _, ok := m.TryAcquire(Cost("tokens", 1)); !ok {
				break
			}
		}
		before := tok.Stats().Admitted
		r, err := m.Reserve(2*time.Second, Cost("tokens", 30))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("reserved, delay %v", r.Delay())
		m.Limiter(0).Close()
		err1 := r.Err()
		st1 := tok.Stats()
		t.Logf("after lane 0 closed: err %v; tokens stats %+v", err1, pick(st1))
		if st1.Admitted < before {
			t.Errorf("tokens Stats.Admitted fell from %d to %d when the part became held: a Prometheus counter going down", before, st1.Admitted)
		}
		tok.Close()
		t.Logf("after tokens closed: %+v", pick(tok.Stats()))
		r.Cancel()
		st := tok.Stats()
		t.Logf("after Cancel: %+v", pick(st))
		if st.Admitted != before {
			t.Errorf("tokens Stats.Admitted %d after the held part was cancelled, want %d (the 30 reserved were never used)", st.Admitted, before)
		}
	})
}

func pick(st Stats) map[string]int64 {
	return map[string]int64{"admitted": st.Admitted, "wasted": st.Wasted, "canceled": st.Canceled}
}

// TestValidTwoWindowReservationCancelledAfterClose: rB of the
// two-window rig is valid in [1.0,1.2) and still charged to [1.2,1.4).
// Close, then the holder cancels (it did not use it): Admitted must not
// count rB.
func TestValidTwoWindowReservationCancelledAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, t0, _, rB := twoWindowRig(t, 5)
		time.Sleep(1250*time.Millisecond - time.Since(t0))
		if d := rB.Delay(); d != 0 {
			t.Fatalf("rB not valid at 1.25s: %v", d)
		}
		l.mu.Lock()
		also := rB.alsoSet
		l.mu.Unlock()
		if !also {
			t.Fatal("rB not charged to two windows")
		}
		st0 := l.Stats()
		t.Logf("before Close: %v", pick(st0))
		l.Close()
		t.Logf("after Close: %v", pick(l.Stats()))
		rB.Cancel()
		st := l.Stats()
		t.Logf("after Cancel: %v", pick(st))
		// r0 (10) and rA (2) are used; rB (1) is cancelled.
		if st.Admitted != 12 || st.Canceled != 1 {
			t.Errorf("Stats.Admitted %d, Canceled %d after rB was cancelled; want 12, 1", st.Admitted, st.Canceled)
		}
	})
}

// TestRebookDoesNotLowerAdmitted: right after a change of window
// length charges rB to a second window, Stats.Admitted must still count
// r0's 10 permits, valid and in use in window 0: the second charge is
// counted as wasted only once its window is under way, so Admitted (a
// Prometheus counter) never goes down.
func TestRebookDoesNotLowerAdmitted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 10, time.Second, WithPacing(true))
		l.SetClockUncertainty(50 * time.Millisecond)
		if _, err := l.Reserve(10, 3*time.Second); err != nil {
			t.Fatal(err)
		}
		for _, n := range []int64{2, 1} {
			if _, err := l.Reserve(n, 3*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(500 * time.Millisecond)
		before := l.Stats().Admitted
		if err := l.SetLimit(5, 200*time.Millisecond, time.Time{}); err != nil {
			t.Fatal(err)
		}
		st := l.Stats()
		t.Logf("Admitted %d before the change, %d after (wasted %d)", before, st.Admitted, st.Wasted)
		if st.Admitted < before {
			t.Errorf("Stats.Admitted fell from %d to %d on a change of window length", before, st.Admitted)
		}
	})
}

// TestValidReservationWithFutureSecondWindowCancelledAfterClose:
// 20 per 1s paced (50ms slots), uncertainty 50ms. A Reserve is told 1.15s;
// the length becomes 200ms from 1s: its instant may lie in [1.10s,1.20s],
// so it is charged to [1.0,1.2) and [1.2,1.4). At 1.16s it is valid; the
// limiter is closed, then the holder cancels (did not use it).
func TestValidReservationWithFutureSecondWindowCancelledAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		l := mustNew(t, 20, time.Second, WithPacing(true))
		l.SetClockUncertainty(50 * time.Millisecond)
		var r *Reservation
		for i := 0; ; i++ {
			x, err := l.Reserve(1, 3*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if d := time.Since(t0) + x.Delay(); d == 1150*time.Millisecond {
				r = x
				break
			} else if d > 1150*time.Millisecond {
				t.Fatalf("no slot at 1.15s: %v", d)
			}
		}
		if err := l.SetLimit(5, 200*time.Millisecond, time.Time{}); err != nil {
			t.Fatal(err)
		}
		l.SetPacing(false)
		l.mu.Lock()
		t.Logf("r win %v also %v (%v)", time.Unix(0, r.win).Sub(t0), time.Unix(0, r.also).Sub(t0), r.alsoSet)
		also := r.alsoSet
		l.mu.Unlock()
		if !also {
			t.Fatal("r not charged to two windows")
		}
		time.Sleep(1160*time.Millisecond - time.Since(t0))
		if d := r.Delay(); d != 0 {
			t.Fatalf("r not valid at 1.16s: %v", d)
		}
		t.Logf("at 1.16s: %v", pick(l.Stats()))
		l.Close()
		used := l.Stats().Admitted
		t.Logf("after Close: %v", pick(l.Stats()))
		r.Cancel()
		st := l.Stats()
		t.Logf("after Cancel: %v", pick(st))
		if st.Admitted != used-1 || st.Canceled != 1 {
			t.Errorf("Stats.Admitted %d, Canceled %d after r was cancelled; want %d, 1", st.Admitted, st.Canceled, used-1)
		}
	})
}

// TestClassAdmittedCountsSecondWindowOnce: as above with one
// class; the reservation told 1.15s is used. Once both its windows have
// closed, Stats.Admitted counts it once (its second charge is wasted), so
// must the class's Admitted.
func TestClassAdmittedCountsSecondWindowOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		l := mustNew(t, 20, time.Second, WithPacing(true), WithClasses(Class{Name: "a"}))
		l.SetClockUncertainty(50 * time.Millisecond)
		for {
			x, err := l.Reserve(1, 3*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if time.Since(t0)+x.Delay() >= 1150*time.Millisecond {
				break
			}
		}
		if err := l.SetLimit(5, 200*time.Millisecond, time.Time{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		st := l.Stats()
		var sum int64
		for _, c := range st.Classes {
			sum += c.Admitted
		}
		t.Logf("Stats.Admitted %d, wasted %d; classes' Admitted %d", st.Admitted, st.Wasted, sum)
		if sum != st.Admitted {
			t.Errorf("the classes admitted %d in all, Stats.Admitted %d", sum, st.Admitted)
		}
	})
}

// TestFixedReservationIsUsedInItsWindowAfterCorrections: 100 per
// 1s, paced (10ms slots), uncertainty 50ms, clock 40ms behind true time
// (honest). A Reserve is told corrected 1.94s = true 1.98s, in window
// [1s,2s). The clock is corrected to 40ms ahead (honest): the reservation
// keeps its real time, corrected 2.02s. Window [1s,2s) closes on the
// limiter's clock at corrected 2.0s (true 1.96s). At true 1.97s the
// clock is corrected back to 40ms behind (honest): the holder's Wait must
// return in true window [1s,2s), the one its permit is charged to, not in
// [2s,3s), which the limiter fills to its quota besides.
func TestFixedReservationIsUsedInItsWindowAfterCorrections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		l := mustNew(t, 100, time.Second, WithPacing(true))
		l.SetClockUncertainty(50 * time.Millisecond)
		l.SetClockOffset(-40 * time.Millisecond)
		time.Sleep(500 * time.Millisecond)
		var r *Reservation
		for {
			x, err := l.Reserve(1, 3*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			told := time.Since(t0) + x.Delay()
			if told == 1980*time.Millisecond {
				r = x
				break
			}
			if told > 1980*time.Millisecond {
				t.Fatalf("no slot told at true 1.98s: %v", told)
			}
		}
		l.SetPacing(false) // window [2s,3s) admits its quota at its open
		l.SetClockOffset(40 * time.Millisecond)
		time.Sleep(1970*time.Millisecond - time.Since(t0))
		l.SetClockOffset(-40 * time.Millisecond)
		if err := r.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		used := time.Since(t0)
		t.Logf("told true 1.98s; Wait returned at true %v", used)
		// Count true window [2s,3s): the limiter's own admissions there.
		time.Sleep(2*time.Second - time.Since(t0))
		var n int64
		for time.Since(t0) < 3*time.Second {
			for l.TryAcquire() {
				n++
			}
			time.Sleep(time.Millisecond)
		}
		if used >= 2*time.Second {
			n++
		}
		t.Logf("true window [2s,3s): %d permits", n)
		if used < time.Second || used >= 2*time.Second {
			t.Errorf("the holder was told true 1.98s, in true window [1s,2s), and its Wait returned at true %v", used)
		}
		if n > 100 {
			t.Errorf("true window [2s,3s) of quota 100 held %d permits", n)
		}
	})
}

// TestCorrectionThenRebookKeepsTheSecondWindow: the two-window rig (10 per
// 1s, uncertainty 50ms, offset 0 = honest); rB is told true 1.2s, and the
// change to 200ms windows charges it to [1.0,1.2) and [1.2,1.4). An honest
// correction of +10ms clamps rB's time for its holder in the process into
// [1.0,1.2)'s band; a later rebook must still keep the charge in
// [1.2,1.4), where a remote holder calls at the told true 1.2s.
func TestCorrectionThenRebookKeepsTheSecondWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, t0, _, rB := twoWindowRig(t, 5)
		told := time.Since(t0) + rB.Delay()
		l.SetClockOffset(10 * time.Millisecond) // corrected = true + 10ms: within 50ms
		if err := l.SetLimit(5, 200*time.Millisecond, time.Time{}); err != nil {
			t.Fatal(err)
		}
		l.mu.Lock()
		also := rB.alsoSet
		t.Logf("rB told true +%v; after correction and rebook: due +%v win +%v alsoSet %v tLo +%v tHi +%v",
			told, time.Unix(0, rB.due).Sub(t0), time.Unix(0, rB.win).Sub(t0), also,
			time.Unix(0, rB.tLo).Sub(t0), time.Unix(0, rB.tHi).Sub(t0))
		l.mu.Unlock()
		time.Sleep(1200*time.Millisecond - time.Since(t0))
		var n int64
		for time.Since(t0) < 1400*time.Millisecond {
			for l.TryAcquire() {
				n++
			}
			time.Sleep(time.Millisecond)
		}
		if told >= 1200*time.Millisecond && told < 1400*time.Millisecond {
			n++ // the remote holder calls at the told instant
		}
		t.Logf("true window [1.2s,1.4s) (quota 5): %d permits (rB's remote use included: told %v)", n, told)
		if n > 5 {
			t.Errorf("true window [1.2s,1.4s) of quota %d held %d permits; rB alsoSet=%v", 5, n, also)
		}
	})
}

// TestMultiLaneCloseAfterToldInstantKeepsThePart: a Multi.Reserve of 30
// tokens is told 1.0s (the sluice-agent case: nobody calls Wait; the remote caller
// calls at 1.0s regardless). At 1.5s the tokens window [1s,2s) is drained
// (70 more) and the requests lane closes alone (a Group's member left).
//
//   - "quota change": a routine change of the tokens limit (Enforce's
//     SetSchedule, here SetQuota to the same 100) finds the part valid and
//     marks it done; failLocked must hold it still.
//   - "no change": the part is still pending, so it is held.
func TestMultiLaneCloseAfterToldInstantKeepsThePart(t *testing.T) {
	for _, change := range []bool{true, false} {
		t.Run(map[bool]string{true: "quota change", false: "no change"}[change], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				t0 := time.Now()
				m := mustMulti(t, Limit{Quota: 10, Window: time.Second}, Limit{Dimension: "tokens", Quota: 100, Window: time.Second})
				tok := m.Limiter(1)
				for tok.TryAcquire() {
				}
				r, err := m.Reserve(2*time.Second, Cost("tokens", 30))
				if err != nil {
					t.Fatal(err)
				}
				told := time.Since(t0) + r.Delay()
				time.Sleep(1500*time.Millisecond - time.Since(t0))
				if change {
					if err := tok.SetQuota(100, time.Time{}); err != nil {
						t.Fatal(err)
					}
				}
				n := int64(0)
				for tok.TryAcquire() {
					n++
				}
				before := tok.Stats()
				m.Limiter(0).Close()
				err = r.Err()
				for tok.TryAcquire() {
					n++
				}
				st := tok.Stats()
				t.Logf("told +%v; window [1s,2s): %d admitted by the lane + 30 used by the remote caller; Err %v; tokens stats before close %v, after %v",
					told, n, err, pick(before), pick(st))
				if n+30 > 100 {
					t.Errorf("tokens window [1s,2s) of quota 100 held %d (the lane admitted %d besides the 30 told for +%v)", n+30, n, told)
				}
			})
		})
	}
}
