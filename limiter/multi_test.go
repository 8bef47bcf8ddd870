package limiter

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func mustMulti(t *testing.T, limits ...Limit) *Multi {
	t.Helper()
	m, err := NewMulti(limits)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// remaining is what each limit's current window can still admit.
func remaining(m *Multi) []int64 {
	var r []int64
	for _, st := range m.Stats() {
		r = append(r, st.Remaining)
	}
	return r
}

func TestMultiAllOrNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := mustMulti(t, Limit{Quota: 5, Window: time.Second}, Limit{Dimension: "tokens", Quota: 100, Window: time.Minute})
		if _, ok := m.TryAcquire(Cost("tokens", 60)); !ok {
			t.Fatal("first call refused")
		}
		if _, ok := m.TryAcquire(Cost("tokens", 60)); ok {
			t.Fatal("second call of 60 tokens granted with 40 left")
		}
		if got := remaining(m); got[0] != 4 || got[1] != 40 {
			t.Fatalf("after a refusal: remaining %v, want [4 40]", got)
		}
		if _, err := m.Acquire(context.Background(), 0, Cost("tokens", 41)); !errors.Is(err, ErrTimeout) {
			t.Fatalf("Acquire of 41 tokens with 40 left and no wait: %v, want ErrTimeout", err)
		}
		if got := remaining(m); got[0] != 4 || got[1] != 40 {
			t.Fatalf("after a timeout: remaining %v, want [4 40]", got)
		}
		st := m.Stats()
		if st[1].Rejected != 60 || st[0].Rejected != 0 {
			t.Errorf("Rejected %d requests, %d tokens: want the refusal counted by the limit that had no room", st[0].Rejected, st[1].Rejected)
		}
	})
}

// TestMultiNoQuotaNamesTheLimitInForce: a refusal for want of quota
// names the limit in force, not the one the Multi was made with (a
// cluster member's is 0/1s until its share comes, and "limit tokens
// 0/1s" under a limit of 200000/1m misled).
func TestMultiNoQuotaNamesTheLimitInForce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := mustMulti(t, Limit{Window: time.Second}, Limit{Dimension: "tokens", Window: time.Second})
		for i, q := range []int64{5, 20} {
			if err := m.Limiter(i).SetLimit(q, time.Minute, time.Time{}); err != nil {
				t.Fatal(err)
			}
			m.Limiter(i).SetExpiry(time.Now().Add(2 * time.Minute))
		}
		time.Sleep(time.Minute)
		_, err := m.Acquire(context.Background(), 0, Cost("tokens", 30))
		if !errors.Is(err, ErrNoQuota) || !strings.Contains(err.Error(), "limit tokens 20/1m0s:") {
			t.Errorf("30 tokens under 20/1m: %v; want ErrNoQuota naming the limit tokens 20/1m0s", err)
		}
	})
}

// TestMultiRefusalGivesBackAtOnce: a TryAcquire refused by its second
// limit gives the first limit back what it took, in the same window. (The
// oracle found it kept them: the give-back compared the take's time, not
// yet set, with the window.)
func TestMultiRefusalGivesBackAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := mustMulti(t, Limit{Quota: 3, Window: time.Second}, Limit{Dimension: "tokens", Quota: 10, Window: time.Second})
		for range 5 {
			if _, ok := m.TryAcquire(Cost("tokens", 11)); ok {
				t.Fatal("11 tokens granted of 10")
			}
		}
		for i := range 3 {
			if _, ok := m.TryAcquire(Cost("tokens", 1)); !ok {
				t.Fatalf("call %d of 3 requests refused after refusals that should have taken nothing", i)
			}
		}
	})
}

// TestMultiWaitsForEveryLimit: Acquire waits for the earliest instant at
// which every limit has room, in the window of each that contains it.
func TestMultiWaitsForEveryLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now() // synctest's clock starts on a whole second
		m := mustMulti(t, Limit{Quota: 2, Window: 100 * time.Millisecond}, Limit{Dimension: "tokens", Quota: 10, Window: time.Second})
		ctx := context.Background()
		var at []time.Duration
		for _, tokens := range []int64{4, 4, 4, 1} {
			if _, err := m.Acquire(ctx, 5*time.Second, Cost("tokens", tokens)); err != nil {
				t.Fatal(err)
			}
			at = append(at, time.Since(t0))
		}
		// The third call finds its request at 100ms but only 2 tokens in
		// the first second: it waits for the next second, when both have
		// room; the fourth fits beside it.
		want := []time.Duration{0, 0, time.Second, time.Second}
		if !slices.Equal(at, want) {
			t.Errorf("grants at %v, want %v", at, want)
		}
	})
}

// TestMultiPartWaitsForQuota: while one limit has no quota for its part,
// the acquisition waits for it, and nothing is granted at the instant
// agreed on before. (The oracle found a grant at that instant with the
// only part, moved to the waiters for quota, still there.)
func TestMultiPartWaitsForQuota(t *testing.T) {
	for _, tokens := range []int64{0, 5} {
		synctest.Test(t, func(t *testing.T) {
			t0 := time.Now()
			m := mustMulti(t, Limit{Quota: 1, Window: 100 * time.Millisecond}, Limit{Dimension: "tokens", Quota: 10, Window: 100 * time.Millisecond})
			m.TryAcquire()
			done := make(chan error, 1)
			go func() {
				_, err := m.Acquire(context.Background(), time.Second, Cost("tokens", tokens))
				done <- err
			}()
			time.Sleep(50 * time.Millisecond)
			m.SetQuota(0, 0, time.Time{}) // no requests from now on
			time.Sleep(100 * time.Millisecond)
			select {
			case err := <-done:
				t.Fatalf("tokens %d: returned %v at %v, while its requests had no quota", tokens, err, time.Since(t0))
			default:
			}
			m.SetQuota(0, 5, time.Time{})
			if err := <-done; err != nil || time.Since(t0) != 150*time.Millisecond {
				t.Fatalf("tokens %d: returned %v at %v, want nil at 150ms, when requests had quota again", tokens, err, time.Since(t0))
			}
		})
	}
}

// TestMultiPartNotValidBeforeTheInstant: a raise of one limit while an
// acquisition waits for another does not make that limit's part valid
// early, so a drop of that limit before the instant still moves it. (The
// oracle found the part, moved to "now" by the raise, kept through the
// drop, and granted at the instant in a window whose quota was 0.)
func TestMultiPartNotValidBeforeTheInstant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		m := mustMulti(t, Limit{Quota: 2, Window: time.Second}, Limit{Dimension: "tokens", Quota: 10, Window: 100 * time.Millisecond})
		m.TryAcquire(Cost("tokens", 10))
		done := make(chan error, 1)
		go func() {
			_, err := m.Acquire(context.Background(), 150*time.Millisecond, Cost("tokens", 5))
			done <- err
		}()
		time.Sleep(10 * time.Millisecond)
		m.SetQuota(0, 3, time.Time{}) // a raise: its part could be valid now
		time.Sleep(10 * time.Millisecond)
		m.SetQuota(0, 1, time.Time{}) // a drop below what the window took
		err := <-done
		if err == nil {
			t.Fatalf("granted at %v in a second whose request quota was dropped to what it had admitted", time.Since(t0))
		}
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("got %v, want ErrTimeout", err)
		}
		if st := m.Stats(); st[0].Admitted != 1 || st[1].Admitted != 10 {
			t.Errorf("admitted %d requests and %d tokens, want 1 and 10", st[0].Admitted, st[1].Admitted)
		}
	})
}

// TestMultiReservationKeepsItsTime: a Multi's reservation made by
// Reserve keeps its instant in every limit: a Backoff of one limit does
// not move its part, and a drop of another's quota does not fail it, since
// its holder may have told the instant to a caller who calls then. The
// window it is charged to admits nothing more while it holds more than
// the lowered quota.
func TestMultiReservationKeepsItsTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ms = time.Millisecond
		time.Sleep(time.Until(WindowStart(time.Now(), 100*ms).Add(100 * ms)))
		m := mustMulti(t, Limit{Quota: 1, Window: 10 * ms}, Limit{Dimension: "tokens", Quota: 10, Window: 100 * ms})
		m.TryAcquire() // the requests window [0, 10ms) is full
		r, err := m.Reserve(50*ms, Cost("tokens", 5))
		if err != nil {
			t.Fatal(err)
		}
		if d := r.Delay(); d != 10*ms {
			t.Fatalf("ready in %v, want 10ms, the next requests window", d)
		}
		m.Limiter(0).Backoff(15 * ms)
		time.Sleep(5 * ms)
		if err := m.SetQuota(1, 4, time.Time{}); err != nil { // below the 5 tokens the part holds
			t.Fatal(err)
		}
		if d, err := r.Delay(), r.Err(); d != 5*ms || err != nil {
			t.Fatalf("after a backoff and a drop: Delay() %v, Err() %v; want 5ms as told, nil", d, err)
		}
		if st := m.Stats()[1]; st.Remaining != 0 {
			t.Errorf("tokens remaining %d, want 0: the reservation holds 5 of a quota now 4", st.Remaining)
		}
		time.Sleep(5 * ms)
		if _, err := r.Wait(context.Background()); err != nil {
			t.Fatalf("Wait at the told instant: %v", err)
		}
		if _, ok := m.TryAcquire(Cost("tokens", 1)); ok {
			t.Error("a token admitted beside the 5 reserved, under a quota of 4")
		}
	})
}

// TestMultiWaitNotGrantedFromAClosedLimit: a wait for one limit's quota,
// holding no part of the others, fails with ErrClosed when another limit
// it takes from was closed alone (a Group's Member left, handing its
// share on), rather than being granted from it when the quota comes.
// Found by review.
func TestMultiWaitNotGrantedFromAClosedLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ms = time.Millisecond
		m := mustMulti(t, Limit{Quota: 5, Window: 10 * ms}, Limit{Dimension: "tokens", Quota: 0, Window: 100 * ms})
		done := make(chan error, 1)
		go func() {
			_, err := m.Acquire(context.Background(), 50*ms, Cost("tokens", 5))
			done <- err
		}()
		synctest.Wait() // waiting for the tokens quota
		m.Limiter(0).Close()
		time.Sleep(ms)
		if err := m.SetQuota(1, 10, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Errorf("Acquire = %v after the requests limit was closed, want ErrClosed", err)
		}
		if st := m.Stats(); st[0].Admitted != 0 || st[1].Admitted != 0 {
			t.Errorf("admitted %d requests and %d tokens, want none", st[0].Admitted, st[1].Admitted)
		}
	})
}

// TestMultiSettleAndCancelGiveBackOnce: a holder that settles its grant
// and then cancels the reservation (a deferred Cancel) gives the permits
// back once; cancelled first, the grant does not settle. Found by review:
// both gave back, and a 100 ms window of 10 tokens granted 20.
func TestMultiSettleAndCancelGiveBackOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ms = time.Millisecond
		time.Sleep(time.Until(WindowStart(time.Now(), 100*ms).Add(100 * ms)))
		m := mustMulti(t, Limit{Quota: 100, Window: 100 * ms}, Limit{Dimension: "tokens", Quota: 10, Window: 100 * ms})
		r, err := m.Reserve(0, Cost("tokens", 10))
		if err != nil {
			t.Fatal(err)
		}
		g, err := r.Wait(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Settle(Cost("tokens", 4)); err != nil {
			t.Fatal(err)
		}
		r.Cancel()
		if rem := remaining(m); rem[1] != 6 {
			t.Errorf("tokens remaining %d after settling 4 of 10 and cancelling, want 6", rem[1])
		}

		r2, err := m.Reserve(0, Cost("tokens", 6))
		if err != nil {
			t.Fatal(err)
		}
		g2, err := r2.Wait(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		r2.Cancel()
		if err := g2.Settle(Cost("tokens", 0)); !errors.Is(err, ErrInvalid) {
			t.Errorf("Settle after Cancel = %v, want ErrInvalid", err)
		}
		if rem := remaining(m); rem[1] != 6 {
			t.Errorf("tokens remaining %d after cancelling 6 and settling, want 6", rem[1])
		}
	})
}

// TestMultiTryAcquireShadowOnlyWhereEveryLimitIs: TryAcquire passes a
// shadow limit's quota only when every limit it takes from is in shadow,
// as Acquire does; with another enforcing, it is refused. Found by
// review: TryAcquire honoured each limit's mode alone.
func TestMultiTryAcquireShadowOnlyWhereEveryLimitIs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ms = time.Millisecond
		time.Sleep(time.Until(WindowStart(time.Now(), 100*ms).Add(100 * ms)))
		m := mustMulti(t, Limit{Quota: 1, Window: 100 * ms}, Limit{Dimension: "tokens", Quota: 100, Window: 100 * ms})
		m.Limiter(0).SetShadow(true)
		if _, ok := m.TryAcquire(Cost("tokens", 1)); !ok {
			t.Fatal("the first acquisition was refused")
		}
		if _, ok := m.TryAcquire(Cost("tokens", 1)); ok {
			t.Error("a second request admitted past the shadow requests limit while the tokens limit enforces")
		}
		if rem := remaining(m); rem[1] != 99 {
			t.Errorf("tokens remaining %d, want 99: the refusal takes nothing", rem[1])
		}
		m.Limiter(1).SetShadow(true)
		if _, ok := m.TryAcquire(Cost("tokens", 1)); !ok {
			t.Error("refused with every limit in shadow")
		}
	})
}

// TestMultiValidStaysValidAcrossABackwardCorrection: a reservation whose
// instant has come stays valid, Delay 0, when the clock is then corrected
// backwards, as a Reservation does. Found by review: Delay said the
// holder had to wait again.
func TestMultiValidStaysValidAcrossABackwardCorrection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ms = time.Millisecond
		time.Sleep(time.Until(WindowStart(time.Now(), 100*ms).Add(100 * ms)))
		m := mustMulti(t, Limit{Quota: 1, Window: 10 * ms}, Limit{Dimension: "tokens", Quota: 10, Window: 100 * ms})
		m.TryAcquire() // the requests window is full: the reservation waits for the next
		r, err := m.Reserve(50*ms, Cost("tokens", 5))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(r.Delay())
		m.SetClockOffset(-5 * ms)
		if d := r.Delay(); d != 0 {
			t.Errorf("Delay() = %v after a backward correction of a valid reservation, want 0", d)
		}
		if err := r.Err(); err != nil {
			t.Errorf("Err() = %v", err)
		}
	})
}

// TestMultiDeadlineFollowsTheClock: a wait's deadline is an instant of
// real time, so a clock correction does not stretch or cut it. (The oracle
// found a wait for quota ending after its maxWait, the deadline left on
// the old clock.)
func TestMultiDeadlineFollowsTheClock(t *testing.T) {
	for _, off := range []time.Duration{-30 * time.Millisecond, 30 * time.Millisecond} {
		synctest.Test(t, func(t *testing.T) {
			t0 := time.Now()
			m := mustMulti(t, Limit{Quota: 0, Window: time.Second}, Limit{Dimension: "tokens", Quota: 10, Window: time.Second})
			done := make(chan error, 1)
			go func() {
				_, err := m.Acquire(context.Background(), 50*time.Millisecond)
				done <- err
			}()
			time.Sleep(10 * time.Millisecond)
			m.SetClockOffset(off)
			err := <-done
			if !errors.Is(err, ErrNoQuota) || time.Since(t0) != 50*time.Millisecond {
				t.Errorf("offset %v: returned %v after %v, want ErrNoQuota after 50ms", off, err, time.Since(t0))
			}
		})
	}
}

func TestMultiCancelGivesEveryLimitBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := mustMulti(t, Limit{Quota: 1, Window: 100 * time.Millisecond}, Limit{Dimension: "tokens", Quota: 10, Window: time.Second})
		m.TryAcquire()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := m.Acquire(ctx, time.Second, Cost("tokens", 7))
			done <- err
		}()
		time.Sleep(50 * time.Millisecond)
		cancel()
		if err := <-done; !errors.Is(err, ErrCanceled) || !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want ErrCanceled and context.Canceled", err)
		}
		time.Sleep(60 * time.Millisecond) // into the next 100ms window
		if got := remaining(m); got[0] != 1 || got[1] != 10 {
			t.Fatalf("remaining %v after the cancel, want [1 10]", got)
		}
	})
}

func TestMultiReserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := mustMulti(t, Limit{Quota: 1, Window: 100 * time.Millisecond}, Limit{Dimension: "tokens", Quota: 10, Window: time.Second})
		m.TryAcquire()
		r, err := m.Reserve(time.Second, Cost("tokens", 3))
		if err != nil {
			t.Fatal(err)
		}
		if d := r.Delay(); d != 100*time.Millisecond {
			t.Fatalf("Delay %v, want 100ms", d)
		}
		if _, ok := m.TryAcquire(Cost("tokens", 8)); ok {
			t.Fatal("8 tokens granted beside 3 reserved of 10 left")
		}
		r.Cancel()
		if _, ok := m.TryAcquire(Cost("tokens", 8), Cost(Requests, 0)); !ok {
			t.Fatal("8 tokens refused after the reservation of 3 was cancelled")
		}
		if _, err := m.Reserve(999*time.Millisecond, Cost("tokens", 3)); !errors.Is(err, ErrTimeout) {
			t.Fatalf("Reserve of 3 tokens with 2 left this second and a wait of 999ms: %v, want ErrTimeout", err)
		}
		if r, err := m.Reserve(time.Second, Cost("tokens", 3)); err != nil || r.Delay() != time.Second {
			t.Fatalf("Reserve of 3 tokens with 2 left this second and a wait of 1s: %v, want ready at the next second", err)
		}
	})
}

func TestMultiSettle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := mustMulti(t, Limit{Quota: 10, Window: time.Second}, Limit{Dimension: "tokens", Quota: 100, Window: time.Second})
		g, ok := m.TryAcquire(Cost("tokens", 50))
		if !ok {
			t.Fatal("refused")
		}
		if err := g.Settle(Cost("tokens", 20)); err != nil {
			t.Fatal(err)
		}
		if got := remaining(m); got[0] != 9 || got[1] != 80 {
			t.Fatalf("after settling 50 down to 20: remaining %v, want [9 80]", got)
		}
		if err := g.Settle(Cost("tokens", 10)); !errors.Is(err, ErrInvalid) {
			t.Fatalf("second Settle: %v, want ErrInvalid", err)
		}

		// Up, within the window's room and beyond it.
		g, _ = m.TryAcquire(Cost("tokens", 10))
		g.Settle(Cost("tokens", 30)) // 70 left before: 50 after
		g2, _ := m.TryAcquire(Cost("tokens", 40))
		g2.Settle(Cost("tokens", 60)) // 10 left: 10 taken, 10 over
		st := m.Stats()[1]
		if st.Remaining != 0 || st.Overdrawn != 10 || st.Admitted != 20+30+60 || st.Settled != -30+20+20 {
			t.Fatalf("tokens: remaining %d, overdrawn %d, admitted %d, settled %d; want 0, 10, 110, 10", st.Remaining, st.Overdrawn, st.Admitted, st.Settled)
		}
		if _, ok := m.TryAcquire(Cost("tokens", 1)); ok {
			t.Fatal("a token granted in a window overdrawn by Settle")
		}

		// Down, once the window has closed: nothing goes back to any
		// window, but Admitted counts what was used.
		time.Sleep(time.Second)
		g3, _ := m.TryAcquire(Cost("tokens", 40))
		time.Sleep(time.Second)
		g3.Settle(Cost("tokens", 5))
		st = m.Stats()[1]
		if st.Remaining != 100 || st.Admitted != 110+5 {
			t.Fatalf("after settling in a later window: remaining %d, admitted %d; want 100, 115", st.Remaining, st.Admitted)
		}
	})
}

func TestNewMultiBadInput(t *testing.T) {
	s := time.Second
	cases := []struct {
		limits []Limit
		want   string
	}{
		{nil, "1 to 4 limits, got 0"},
		{make([]Limit, 5), "1 to 4 limits, got 5"},
		{[]Limit{{Dimension: "Tokens", Quota: 1, Window: s}}, `got "Tokens"`},
		{[]Limit{{Dimension: "9lives", Quota: 1, Window: s}}, "starting with a letter"},
		{[]Limit{{Dimension: strings.Repeat("a", 33), Quota: 1, Window: s}}, "1 to 32"},
		{[]Limit{{Quota: -1, Window: s}}, "quota must be between 0"},
		{[]Limit{{Quota: 1, Window: 7 * time.Hour}}, "divide 24h"},
		{[]Limit{{Quota: 1, Window: 48 * time.Hour}}, "between 10ms and 24h0m0s"},
	}
	for _, c := range cases {
		_, err := NewMulti(c.limits)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewMulti(%v) = %v, want ErrInvalid saying %q", c.limits, err, c.want)
		}
	}
}

func TestMultiBadCost(t *testing.T) {
	m := mustMulti(t, Limit{Quota: 10, Window: time.Second}, Limit{Dimension: "tokens", Quota: 100, Window: time.Second})
	cases := []struct {
		cost []Amount
		want string
	}{
		{[]Amount{Cost("bytes", 1)}, `dimension "bytes" is none of the limits' (requests, tokens)`},
		{[]Amount{Cost("tokens", 1), Cost("tokens", 2)}, `"tokens" named twice`},
		{[]Amount{Cost("tokens", -1)}, "tokens must be between 0"},
		{[]Amount{Cost(Requests, MaxQuota+1)}, "requests must be between 0"},
		{[]Amount{Cost(Requests, 0)}, "takes nothing from any limit"},
	}
	for _, c := range cases {
		if _, err := m.Acquire(context.Background(), time.Second, c.cost...); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Acquire(%v) = %v, want ErrInvalid saying %q", c.cost, err, c.want)
		}
		if _, ok := m.TryAcquire(c.cost...); ok {
			t.Errorf("TryAcquire(%v) granted", c.cost)
		}
		if _, err := m.Reserve(time.Second, c.cost...); !errors.Is(err, ErrInvalid) {
			t.Errorf("Reserve(%v) = %v, want ErrInvalid", c.cost, err)
		}
	}
	if got := remaining(m); got[0] != 10 || got[1] != 100 {
		t.Errorf("bad costs took something: remaining %v", got)
	}
	if _, err := m.Schedule(2, 1, time.Second, time.Time{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Schedule of limit 2 of 2: %v, want ErrInvalid", err)
	}
}

func TestMultiClosed(t *testing.T) {
	m := mustMulti(t, Limit{Quota: 10, Window: time.Second})
	m.Close()
	if _, ok := m.TryAcquire(); ok {
		t.Error("TryAcquire granted after Close")
	}
	if _, err := m.Acquire(context.Background(), time.Second); !errors.Is(err, ErrClosed) {
		t.Errorf("Acquire after Close: %v", err)
	}
}

// The hot path of several limits takes no allocation either.
func TestMultiHotPathAllocations(t *testing.T) {
	m := mustMulti(t, Limit{Quota: MaxQuota, Window: time.Hour}, Limit{Dimension: "tokens", Quota: MaxQuota, Window: time.Hour})
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() {
		if _, ok := m.TryAcquire(Cost("tokens", 7)); !ok {
			t.Fatal("refused")
		}
	}); n != 0 {
		t.Errorf("TryAcquire: %v allocations", n)
	}
	if n := testing.AllocsPerRun(1000, func() {
		g, err := m.Acquire(ctx, time.Second, Cost("tokens", 7))
		if err != nil {
			t.Fatal(err)
		}
		g.Settle(Cost("tokens", 3))
	}); n != 0 {
		t.Errorf("Acquire and Settle: %v allocations", n)
	}
}

// TestMultiClockMovesAtTheInstant: the clock is corrected forward, and its
// guard band widened, at the very instant an acquisition becomes valid,
// before its waiter runs. Its parts are valid already and stay so: each
// stays charged once, to its window. (The oracle found the part of the
// shorter window given up in its closed window and charged again in the
// next: one request admitted twice.)
func TestMultiClockMovesAtTheInstant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		m := mustMulti(t, Limit{Quota: 10, Window: 10 * time.Millisecond}, Limit{Dimension: "tokens", Quota: 10, Window: 100 * time.Millisecond})
		m.SetClockUncertainty(2 * time.Millisecond)
		time.Sleep(5 * time.Millisecond)
		m.TryAcquire(Cost("tokens", 10))
		done := make(chan error, 1)
		go func() {
			_, err := m.Acquire(context.Background(), time.Second, Cost("tokens", 5))
			done <- err
		}()
		synctest.Wait()
		time.Sleep(102*time.Millisecond - 1 - time.Since(t0))
		m.lock() // across the instant: the waiter wakes and waits for the locks
		time.Sleep(1)
		anchor := time.Now()
		for _, l := range m.lims {
			l.setClockUncertaintyLocked(5 * time.Millisecond)
			l.setClockOffsetLocked(9*time.Millisecond, anchor)
		}
		m.unlock()
		if err := <-done; err != nil {
			t.Fatalf("got %v, want the permits valid at the instant", err)
		}
		if st := m.Stats(); st[0].Admitted != 1+1 || st[1].Admitted != 10+5 {
			t.Errorf("admitted %d requests and %d tokens, want 2 and 15", st[0].Admitted, st[1].Admitted)
		}
	})
}

// Two limits of one dimension and window both hold: the smaller binds.
// (cluster.JoinGroup starts every limit on the fallback window.)
func TestMultiSameDimensionSameWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := mustMulti(t, Limit{Quota: 3, Window: time.Second}, Limit{Quota: 2, Window: time.Second})
		for i, want := range []bool{true, true, false} {
			if _, ok := m.TryAcquire(); ok != want {
				t.Errorf("acquisition %d: %v, want %v", i, ok, want)
			}
		}
		if m.Limiter(1) == nil || m.Limiter(2) != nil || m.Limiter(-1) != nil {
			t.Errorf("Limiter(1), (2), (-1) = %p, %p, %p; want one, nil, nil", m.Limiter(1), m.Limiter(2), m.Limiter(-1))
		}
	})
}

// One limit in shadow mode does not switch off another that enforces: a
// cluster.Group sets each limit's mode from its own provider. Found by
// review: with the requests limit in shadow, Acquire granted 10 of 10
// acquisitions of 30 tokens against an enforcing 100 tokens per second.
func TestMultiShadowOfOneLimitLeavesTheOthersEnforcing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := mustMulti(t, Limit{Quota: 1000, Window: time.Second}, Limit{Dimension: "tokens", Quota: 100, Window: time.Second})
		m.Limiter(0).SetShadow(true)
		granted := 0
		for range 10 {
			if _, err := m.Acquire(context.Background(), 0, Cost("tokens", 30)); err == nil {
				granted++
			}
		}
		if granted != 3 {
			t.Errorf("Acquire granted %d of 10 acquisitions of 30 tokens against 100 tokens enforced, want 3", granted)
		}
		time.Sleep(time.Second) // the next window, in fake time
		granted = 0
		for range 10 {
			if _, ok := m.TryAcquire(Cost("tokens", 30)); ok {
				granted++
			}
		}
		if granted != 3 {
			t.Errorf("TryAcquire granted %d of 10, want 3", granted)
		}
	})
}
