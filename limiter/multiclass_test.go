package limiter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func mustNewMulti(t *testing.T, limits []Limit, opts ...Option) *Multi {
	t.Helper()
	m, err := NewMulti(limits, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestMultiReserveKeptInEveryLimit: critical keeps 6 of 10 requests and
// 600 of 1,000 tokens. Batch floods both; each limit stops it at its own
// reserve, so batch's last try, which the requests limit would still
// admit, is refused whole by the tokens limit, and critical then takes
// its reserve in both.
func TestMultiReserveKeptInEveryLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := mustNewMulti(t, []Limit{{Quota: 10, Window: time.Second}, {Dimension: "tokens", Quota: 1000, Window: time.Second}},
			WithClasses(Class{Name: "critical", Reserve: 6, Of: 10}, Class{Name: "batch"}))
		if err := m.Limiter(1).SetClasses(Class{Name: "critical", Reserve: 600}, Class{Name: "batch"}); err != nil {
			t.Fatal(err)
		}
		batch, critical := WithClass(t.Context(), "batch"), WithClass(t.Context(), "critical")
		for range 3 {
			if _, ok := m.TryAcquireContext(batch, Cost("tokens", 100)); !ok {
				t.Fatal("batch refused within the unreserved room")
			}
		}
		// 3 requests and 300 tokens taken: 1 request is left beyond
		// critical's reserve, and 100 tokens.
		if _, ok := m.TryAcquireContext(batch, Cost("tokens", 200)); ok {
			t.Fatal("batch took critical's reserve of tokens")
		}
		if _, err := m.Acquire(batch, 0, Cost("tokens", 200)); !errors.Is(err, ErrTimeout) {
			t.Fatalf("batch Acquire into critical's tokens: %v, want ErrTimeout", err)
		}
		if _, err := m.ReserveContext(batch, 0, Cost("tokens", 200)); !errors.Is(err, ErrTimeout) {
			t.Fatalf("batch ReserveContext into critical's tokens: %v, want ErrTimeout", err)
		}
		if _, ok := m.TryAcquire(Cost("tokens", 200)); ok {
			t.Fatal("TryAcquire, of the default (last) class, took critical's reserve")
		}
		if st := m.Limiter(0).Stats(); st.Admitted != 3 {
			t.Fatalf("requests admitted %d, want 3: a refusal by tokens took a request", st.Admitted)
		}
		if _, ok := m.TryAcquireContext(batch, Cost("tokens", 100)); !ok {
			t.Fatal("batch refused the last unreserved request and tokens")
		}
		if _, ok := m.TryAcquireContext(batch, Cost("tokens", 0)); ok {
			t.Fatal("batch took critical's reserve of requests")
		}
		for i := range 6 {
			if _, ok := m.TryAcquireContext(critical, Cost("tokens", 100)); !ok {
				t.Fatalf("critical refused within its reserve (call %d)", i)
			}
		}
		if _, ok := m.TryAcquireContext(critical, Cost("tokens", 0)); ok {
			t.Fatal("critical admitted over the quota")
		}
		for i, want := range []int64{6, 600} {
			st := m.Limiter(i).Stats()
			if len(st.Classes) != 2 || st.Classes[0].Used != want || st.Classes[0].Reserve != want {
				t.Errorf("limit %d classes %+v, want critical used %d of its reserve %d", i, st.Classes, want, want)
			}
		}
	})
}

// TestMultiLimitWithoutClassesKeepsNone: only the requests limit has
// classes; the tokens limit keeps no reserve, so batch may take all of
// its tokens, and critical, whose reserve of requests is intact, is then
// refused by the tokens limit alone.
func TestMultiLimitWithoutClassesKeepsNone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := mustNewMulti(t, []Limit{{Quota: 10, Window: time.Second}, {Dimension: "tokens", Quota: 1000, Window: time.Second}})
		if err := m.Limiter(0).SetClasses(Class{Name: "critical", Reserve: 6}, Class{Name: "batch"}); err != nil {
			t.Fatal(err)
		}
		batch, critical := WithClass(t.Context(), "batch"), WithClass(t.Context(), "critical")
		if _, ok := m.TryAcquireContext(batch, Cost("tokens", 1000)); !ok {
			t.Fatal("batch refused the tokens of a limit without classes")
		}
		if _, ok := m.TryAcquireContext(critical, Cost("tokens", 1)); ok {
			t.Fatal("critical admitted tokens the limit no longer has")
		}
		if _, ok := m.TryAcquireContext(critical, Cost("tokens", 0)); !ok {
			t.Fatal("critical refused a request of its reserve")
		}
	})
}

// TestMultiSettleAndCancelGiveBackToTheClass: what critical gives back,
// by Settle or by Cancel, is its reserve again, not room for batch.
func TestMultiSettleAndCancelGiveBackToTheClass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := mustNewMulti(t, []Limit{{Dimension: "tokens", Quota: 1000, Window: time.Second}},
			WithClasses(Class{Name: "critical", Reserve: 600}, Class{Name: "batch"}))
		batch, critical := WithClass(t.Context(), "batch"), WithClass(t.Context(), "critical")
		g, err := m.Acquire(critical, 0, Cost("tokens", 600))
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Settle(Cost("tokens", 100)); err != nil {
			t.Fatal(err)
		}
		r, err := m.ReserveContext(critical, 0, Cost("tokens", 100))
		if err != nil {
			t.Fatal(err)
		}
		r.Cancel()
		if _, ok := m.TryAcquireContext(batch, Cost("tokens", 401)); ok {
			t.Fatal("batch took what critical gave back of its reserve")
		}
		if _, ok := m.TryAcquireContext(batch, Cost("tokens", 400)); !ok {
			t.Fatal("batch refused the unreserved room")
		}
		if _, ok := m.TryAcquireContext(critical, Cost("tokens", 500)); !ok {
			t.Fatal("critical refused the rest of its reserve")
		}
		st := m.Limiter(0).Stats().Classes
		if st[0].Used != 600 || st[1].Used != 400 {
			t.Errorf("classes %+v, want critical 600 used and batch 400", st)
		}
	})
}

// TestMultiHigherClassWaiterGoesFirst: batch's waiters hold the next
// window's permits of both limits; a critical waiter that asks after them
// is placed ahead, and the last batch waiter moves to the window after,
// in both limits at once.
func TestMultiHigherClassWaiterGoesFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := mustNewMulti(t, []Limit{{Quota: 2, Window: time.Second}, {Dimension: "tokens", Quota: 20, Window: time.Second}},
			WithClasses(Class{Name: "critical"}, Class{Name: "batch"}))
		batch, critical := WithClass(t.Context(), "batch"), WithClass(t.Context(), "critical")
		for {
			if _, err := m.Acquire(batch, 0, Cost("tokens", 10)); err != nil {
				break
			}
		}
		start := time.Now()
		at := make(map[string]time.Duration)
		var mu sync.Mutex
		var wg sync.WaitGroup
		acquire := func(ctx context.Context, name string) {
			wg.Go(func() {
				if _, err := m.Acquire(ctx, 10*time.Second, Cost("tokens", 10)); err != nil {
					t.Errorf("%s: %v", name, err)
				}
				mu.Lock()
				at[name] = time.Since(start)
				mu.Unlock()
			})
			synctest.Wait() // placed before the next one asks
		}
		acquire(batch, "batch1")
		acquire(batch, "batch2")
		acquire(critical, "critical")
		wg.Wait()
		want := map[string]time.Duration{"critical": time.Second, "batch1": time.Second, "batch2": 2 * time.Second}
		for name, d := range want {
			if at[name] != d {
				t.Errorf("%s admitted after %v, want %v (all: %v)", name, at[name], d, at)
			}
		}
		for i, want := range []int64{5, 50} {
			if st := m.Limiter(i).Stats(); st.Admitted != want {
				t.Errorf("limit %d admitted %d, want %d", i, st.Admitted, want)
			}
		}
	})
}

// TestMultiWaitersKeepTheirClassOrderWhenMovedAgain: a critical waiter
// moved batch's to the window after its own; a top-class Reserve that
// fits nowhere moves both out and back, and they go back in class order,
// not in the order they asked (found by TestMultiClassOracle, seed
// 5681559323012474086).
func TestMultiWaitersKeepTheirClassOrderWhenMovedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := mustNewMulti(t, []Limit{{Quota: 1, Window: time.Second}, {Dimension: "tokens", Quota: 10, Window: time.Second}},
			WithClasses(Class{Name: "top"}, Class{Name: "critical"}, Class{Name: "batch"}))
		ctx := func(name string) context.Context { return WithClass(t.Context(), name) }
		if _, err := m.Acquire(ctx("batch"), 0); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		at := make(map[string]time.Duration)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, name := range []string{"batch", "critical"} {
			wg.Go(func() {
				if _, err := m.Acquire(ctx(name), 10*time.Second); err != nil {
					t.Errorf("%s: %v", name, err)
				}
				mu.Lock()
				at[name] = time.Since(start)
				mu.Unlock()
			})
			synctest.Wait()
		}
		if _, err := m.ReserveContext(ctx("top"), 0); !errors.Is(err, ErrTimeout) {
			t.Fatalf("top's Reserve within 0: %v, want ErrTimeout", err)
		}
		wg.Wait()
		if at["critical"] != time.Second || at["batch"] != 2*time.Second {
			t.Errorf("critical admitted after %v and batch after %v, want 1s and 2s", at["critical"], at["batch"])
		}
	})
}

// TestMultiSetClasses gives every limit the classes, and none takes them
// all away: the hot path serves the Multi again.
func TestMultiSetClasses(t *testing.T) {
	m := mustNewMulti(t, []Limit{{Quota: 10, Window: time.Hour}, {Dimension: "tokens", Quota: 100, Window: time.Hour}})
	if err := m.SetClasses(Class{Name: "critical", Reserve: 5}, Class{Name: "default"}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if cs := m.Limiter(i).Classes(); len(cs) != 2 || cs[0].Name != "critical" {
			t.Errorf("limit %d classes %v", i, cs)
		}
	}
	n := 0
	for {
		if _, ok := m.TryAcquire(); !ok {
			break
		}
		n++
	}
	if n != 5 {
		t.Errorf("the default class took %d of 10, want 5", n)
	}
	if err := m.SetClasses(); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.TryAcquire(); !ok {
		t.Error("refused after the classes were removed")
	}
	m.Close()
	if err := m.SetClasses(Class{Name: "a"}); !errors.Is(err, ErrClosed) {
		t.Errorf("SetClasses after Close = %v, want ErrClosed", err)
	}
}

// multiClassOp is one call in a history of TestMultiClassOracle.
type multiClassOp struct {
	class     int
	kind      int // 0 TryAcquireContext, 1 Acquire, 2 ReserveContext (then waited for)
	cost      []Amount
	ns        [MaxLimits]int64
	wait      time.Duration // 0: decided at once
	asked     time.Time
	admitted  time.Time // zero: refused
	refusedAt time.Time
}

// TestMultiClassOracle runs random histories of calls of random classes
// and costs against a Multi of 1 to 3 limits, each with classes of its
// own reserves or none, and checks every history whole:
//
//   - quota: no window of any limit admits more than its quota;
//   - all or nothing: every limit's Stats.Admitted is what the granted
//     calls took from it, so a refused call took nothing anywhere;
//   - reserves: a call decided at once and refused was, in some limit it
//     takes from, beyond what its class had left of its reserve there (what
//     the class was admitted in that limit's window, plus the call, is over
//     the reserve): a lower class never took a higher class's unused
//     reserve in any limit;
//   - order: in histories without reserves where every call takes one
//     permit of every limit, a waiter of a higher class that asked before
//     an Acquire of a lower class was admitted is admitted no later (a
//     Reserve's time is fixed: no class moves it).
//
// The seed is printed; SLUICE_MULTICLASS_SEED=N replays one history.
func TestMultiClassOracle(t *testing.T) {
	classSeeds(t, "SLUICE_MULTICLASS_SEED", multiClassHistory)
}

func multiClassHistory(t *testing.T, seed uint64) (ok bool) {
	ok = true
	synctest.Test(t, func(t *testing.T) {
		fail := func(format string, args ...any) {
			t.Errorf("seed %d: "+format, append([]any{seed}, args...)...)
			ok = false
		}
		rng := rand.New(rand.NewPCG(seed, seed>>1))
		reserves := rng.IntN(2) == 0 // else: the order check, unit costs
		nc := 1 + rng.IntN(4)
		dims := []string{Requests, "tokens", "bytes"}
		windows := []time.Duration{time.Second, 2 * time.Second, 500 * time.Millisecond}
		limits := make([]Limit, 1+rng.IntN(3))
		classes := make([][]Class, len(limits))
		for i := range limits {
			limits[i] = Limit{Dimension: dims[i], Quota: 1 + rng.Int64N(20), Window: windows[rng.IntN(len(windows))]}
			if !reserves {
				limits[i].Window = time.Second
			}
			if reserves && i > 0 && rng.IntN(4) == 0 {
				continue // a limit without classes keeps no reserve
			}
			classes[i] = make([]Class, nc)
			for c := range classes[i] {
				classes[i][c].Name = fmt.Sprintf("c%d", c)
				if reserves {
					classes[i][c].Reserve = rng.Int64N(limits[i].Quota/2 + 1)
				}
			}
		}
		m := mustNewMulti(t, limits)
		for i, cs := range classes {
			if err := m.Limiter(i).SetClasses(cs...); err != nil {
				t.Fatal(err)
			}
		}
		ctxs := make([]context.Context, nc)
		for c := range ctxs {
			ctxs[c] = WithClass(t.Context(), fmt.Sprintf("c%d", c))
		}
		var mu sync.Mutex
		var ops []*multiClassOp
		var wg sync.WaitGroup
		for range 40 + rng.IntN(80) {
			time.Sleep(time.Duration(rng.Int64N(int64(time.Second) / 4)))
			synctest.Wait()
			op := &multiClassOp{class: rng.IntN(nc), kind: rng.IntN(3), asked: time.Now()}
			for i, lm := range limits {
				n := int64(1)
				if reserves {
					n = rng.Int64N(lm.Quota/3 + 2)
				}
				if i == 0 && n == 0 {
					n = 1 // every call takes something
				}
				op.cost = append(op.cost, Cost(lm.Dimension, n))
				op.ns[i] = n
			}
			if op.kind != 0 && rng.IntN(3) == 0 {
				op.wait = time.Duration(1 + rng.Int64N(int64(3*time.Second)))
			}
			mu.Lock()
			ops = append(ops, op)
			mu.Unlock()
			done := func(err error) {
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					op.admitted = time.Now()
				} else {
					op.refusedAt = time.Now()
				}
			}
			switch op.kind {
			case 0:
				_, got := m.TryAcquireContext(ctxs[op.class], op.cost...)
				var err error
				if !got {
					err = ErrTimeout
				}
				done(err)
			case 1:
				wg.Go(func() {
					_, err := m.Acquire(ctxs[op.class], op.wait, op.cost...)
					done(err)
				})
			case 2:
				r, err := m.ReserveContext(ctxs[op.class], op.wait, op.cost...)
				if err != nil {
					done(err)
					break
				}
				wg.Go(func() {
					_, err := r.Wait(context.Background())
					done(err)
				})
			}
			synctest.Wait() // decided, or placed, before the next call
		}
		wg.Wait()

		for i, lm := range limits {
			win := func(at time.Time) int64 { return at.UnixNano() / int64(lm.Window) }
			admitted := map[int64]int64{}
			var total int64
			for _, op := range ops {
				if !op.admitted.IsZero() {
					admitted[win(op.admitted)] += op.ns[i]
					total += op.ns[i]
				}
			}
			for w, n := range admitted {
				if n > lm.Quota {
					fail("limit %v: window %d admitted %d, over the quota", lm, w, n)
				}
			}
			if st := m.Limiter(i).Stats(); st.Admitted != total {
				fail("limit %v: Stats.Admitted %d, but the granted calls took %d", lm, st.Admitted, total)
			}
		}
		for _, op := range ops {
			if op.wait != 0 || !op.admitted.IsZero() {
				continue
			}
			// Refused at once: in some limit it takes from, what its class
			// was admitted in that window and the call are over the
			// class's reserve there.
			beyond := false
			for j, lj := range limits {
				if op.ns[j] == 0 {
					continue
				}
				if classes[j] == nil {
					beyond = true // no reserve there: any class may fill it
					break
				}
				wj := op.refusedAt.UnixNano() / int64(lj.Window)
				var got int64
				for _, o := range ops {
					if o.class == op.class && !o.admitted.IsZero() && o.admitted.UnixNano()/int64(lj.Window) == wj {
						got += o.ns[j]
					}
				}
				if got+op.ns[j] > classReserve(classes[j], op.class, lj.Quota) {
					beyond = true
					break
				}
			}
			if !beyond {
				fail("class %d refused %v at %v within its reserve in every limit (limits %v, classes %v)",
					op.class, op.ns, op.refusedAt, limits, classes)
			}
		}
		defer func() {
			if !ok {
				t.Logf("limits %v, classes %v", limits, classes)
				for _, op := range ops {
					t.Logf("class %d kind %d cost %v wait %v: asked %v, admitted %v, refused %v",
						op.class, op.kind, op.ns[:len(limits)], op.wait, op.asked.Format("05.000000"), op.admitted.Format("05.000000"), op.refusedAt.Format("05.000000"))
				}
			}
		}()
		if reserves {
			return
		}
		for _, a := range ops {
			for _, b := range ops {
				if a.wait == 0 || b.wait == 0 || a.class >= b.class || a.admitted.IsZero() || b.admitted.IsZero() {
					continue
				}
				if b.kind == 2 {
					continue // a Reserve's time is fixed (Reservation.fixed): a higher class never moves it
				}
				if a.asked.Before(b.admitted) && a.admitted.After(b.admitted) {
					fail("class %d asked at %v and was admitted at %v, after class %d admitted at %v (asked %v)",
						a.class, a.asked, a.admitted, b.class, b.admitted, b.asked)
				}
			}
		}
	})
	return ok
}

// classReserve is what class c keeps of a window of quota q under cs:
// its reserve, cut in proportion when they add up to more than q.
func classReserve(cs []Class, c int, q int64) int64 {
	var sum int64
	for _, x := range cs {
		sum += x.Reserve
	}
	r := cs[c].Reserve
	if sum > q {
		r = mulDiv(r, q, sum)
	}
	return r
}
