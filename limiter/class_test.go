package limiter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestWithClassesRefusesBadLists(t *testing.T) {
	many := make([]Class, MaxClasses+1)
	for i := range many {
		many[i] = Class{Name: fmt.Sprintf("c%d", i)}
	}
	for _, cs := range [][]Class{
		{{Name: ""}}, {{Name: "Critical"}}, {{Name: "9"}}, {{Name: "a b"}},
		{{Name: "a"}, {Name: "a"}}, {{Name: "a", Reserve: -1}}, {{Name: "a", Reserve: MaxQuota + 1}}, many,
	} {
		if _, err := New(10, time.Second, WithClasses(cs...)); !errors.Is(err, ErrInvalid) {
			t.Errorf("New(WithClasses(%v)) = %v, want ErrInvalid", cs, err)
		}
	}
	if _, err := NewMulti([]Limit{{Quota: 10, Window: time.Second}}, WithClasses(Class{Name: "a"}, Class{Name: "a"})); !errors.Is(err, ErrInvalid) {
		t.Errorf("NewMulti(WithClasses(a, a)) = %v, want ErrInvalid", err)
	}
	if _, err := New(10, time.Second, WithClasses(many[:MaxClasses]...)); err != nil {
		t.Errorf("New(WithClasses(%d classes)) = %v", MaxClasses, err)
	}
}

func TestClassOf(t *testing.T) {
	ctx := context.Background()
	if _, ok := ClassOf(ctx); ok {
		t.Error("ClassOf(Background) names a class")
	}
	if c, ok := ClassOf(WithClass(ctx, "critical")); !ok || c != "critical" {
		t.Errorf("ClassOf(WithClass(critical)) = %q, %v", c, ok)
	}
	cs := newClasses([]Class{{Name: "critical"}, {Name: "default"}, {Name: "batch"}})
	for name, want := range map[string]int{"critical": 0, "default": 1, "batch": 2, "other": 1} {
		if got := cs.of(WithClass(ctx, name)); got != want {
			t.Errorf("class of %q = %d, want %d", name, got, want)
		}
	}
	if got := cs.of(ctx); got != 1 {
		t.Errorf("class of no class = %d, want default's, 1", got)
	}
	if got := newClasses([]Class{{Name: "critical"}, {Name: "batch"}}).of(ctx); got != 1 {
		t.Errorf("class of no class without default = %d, want the last, 1", got)
	}
}

// TestReserveKeptFromLowerClasses: batch floods the window first; what it
// leaves is critical's reserve, which critical then takes in full.
func TestReserveKeptFromLowerClasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 10, time.Second, WithClasses(Class{Name: "critical", Reserve: 6}, Class{Name: "batch"}))
		batch, critical := WithClass(t.Context(), "batch"), WithClass(t.Context(), "critical")
		var got int
		for l.Acquire(batch, 0) == nil {
			got++
		}
		if got != 4 {
			t.Errorf("batch took %d of 10, want 4: 6 are critical's", got)
		}
		if l.TryAcquire() {
			t.Error("TryAcquire, of the last class here, took critical's reserve")
		}
		for range 6 {
			if err := l.Acquire(critical, 0); err != nil {
				t.Fatalf("critical within its reserve: %v", err)
			}
		}
		if err := l.Acquire(critical, 0); !errors.Is(err, ErrTimeout) {
			t.Errorf("critical over the quota: %v", err)
		}
	})
}

// TestHigherClassWaiterGoesFirst: batch's waiters hold the next window's
// permits; a critical waiter that asks after them is placed ahead, and the
// last batch waiter moves to the window after.
func TestHigherClassWaiterGoesFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 2, time.Second, WithClasses(Class{Name: "critical"}, Class{Name: "batch"}))
		batch, critical := WithClass(t.Context(), "batch"), WithClass(t.Context(), "critical")
		for l.Acquire(batch, 0) == nil {
		}
		start := time.Now()
		at := make(map[string]time.Duration)
		var mu sync.Mutex
		var wg sync.WaitGroup
		acquire := func(ctx context.Context, name string) {
			wg.Go(func() {
				if err := l.Acquire(ctx, 10*time.Second); err != nil {
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
	})
}

// classOp is one call in a history of TestClassOracle.
type classOp struct {
	class     int
	wait      time.Duration // 0: decided at once
	asked     time.Time
	admitted  time.Time // zero: refused
	refusedAt time.Time
}

// TestClassOracle runs random histories of calls of random classes, some
// decided at once and some waiting, against a limiter with classes, and
// checks every history whole: no window admits more than its quota; in a
// window where a class was refused a call decided at once, it was admitted
// at least its reserve; and, in histories without reserves where every
// call takes one permit, a waiter of a higher class that asked before a
// waiter of a lower class was admitted is admitted no later than it.
//
// The seed is printed; SLUICE_CLASS_SEED=N replays one history exactly.
func TestClassOracle(t *testing.T) {
	classSeeds(t, "SLUICE_CLASS_SEED", classHistory)
}

// classSeeds runs 300 histories (50 with -short) from a random seed, or
// the one seed the environment variable env names, and stops at the
// first that fails, printing how to replay it.
func classSeeds(t *testing.T, env string, history func(*testing.T, uint64) bool) {
	seeds := 300
	if testing.Short() {
		seeds = 50
	}
	base := rand.Uint64()
	if s := os.Getenv(env); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seeds, base = 1, n
	}
	seed := base
	// A failed history ends the test from inside its bubble
	// (synctest.Test calls FailNow): say how to replay it on the way out.
	defer func() {
		if t.Failed() {
			t.Logf("history failed: replay with %s=%d", env, seed)
		}
	}()
	for i := range seeds {
		seed = base + uint64(i)
		if !history(t, seed) {
			t.FailNow()
		}
	}
	t.Logf("%d histories checked from seed %d", seeds, base)
}

func classHistory(t *testing.T, seed uint64) (ok bool) {
	ok = true
	synctest.Test(t, func(t *testing.T) {
		fail := func(format string, args ...any) {
			t.Errorf("seed %d: "+format, append([]any{seed}, args...)...)
			ok = false
		}
		rng := rand.New(rand.NewPCG(seed, seed>>1))
		const window = time.Second
		quota := 1 + rng.Int64N(20)
		reserves := rng.IntN(2) == 0 // else: the order check
		classes := make([]Class, 1+rng.IntN(4))
		for i := range classes {
			classes[i].Name = fmt.Sprintf("c%d", i)
			if reserves {
				classes[i].Reserve = rng.Int64N(quota/2 + 1)
			}
		}
		l := mustNew(t, quota, window, WithClasses(classes...))
		ctxs := make([]context.Context, len(classes))
		for i, c := range classes {
			ctxs[i] = WithClass(t.Context(), c.Name)
		}
		var mu sync.Mutex
		var ops []*classOp
		var wg sync.WaitGroup
		for range 40 + rng.IntN(80) {
			time.Sleep(time.Duration(rng.Int64N(int64(window) / 4)))
			synctest.Wait()
			op := &classOp{class: rng.IntN(len(classes)), asked: time.Now()}
			if rng.IntN(3) == 0 {
				op.wait = time.Duration(1 + rng.Int64N(int64(3*window)))
			}
			mu.Lock()
			ops = append(ops, op)
			mu.Unlock()
			wg.Go(func() {
				err := l.Acquire(ctxs[op.class], op.wait)
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					op.admitted = time.Now()
				} else {
					op.refusedAt = time.Now()
				}
			})
			synctest.Wait() // decided, or placed, before the next call
		}
		wg.Wait()

		winOf := func(at time.Time) int64 { return at.UnixNano() / int64(window) }
		admitted := map[int64]int64{}
		byClass := map[[2]int64]int64{}
		for _, op := range ops {
			if !op.admitted.IsZero() {
				admitted[winOf(op.admitted)]++
				byClass[[2]int64{winOf(op.admitted), int64(op.class)}]++
			}
		}
		for w, n := range admitted {
			if n > quota {
				fail("window %d admitted %d, over the quota %d", w, n, quota)
			}
		}
		if reserves {
			for _, op := range ops {
				if op.wait != 0 || !op.admitted.IsZero() {
					continue
				}
				w := winOf(op.refusedAt)
				r := classes[op.class].Reserve
				var sum int64
				for _, c := range classes {
					sum += c.Reserve
				}
				if sum > quota {
					r = mulDiv(r, quota, sum)
				}
				if got := byClass[[2]int64{w, int64(op.class)}]; got < r {
					fail("class %d refused at %v in window %d, admitted %d there, below its reserve %d (classes %v, quota %d)",
						op.class, op.refusedAt, w, got, r, classes, quota)
				}
			}
			return
		}
		for _, a := range ops {
			for _, b := range ops {
				if a.wait == 0 || b.wait == 0 || a.class >= b.class || a.admitted.IsZero() || b.admitted.IsZero() {
					continue
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

func classStats(t *testing.T, l *Limiter) map[string]ClassStats {
	t.Helper()
	out := map[string]ClassStats{}
	for _, c := range l.Stats().Classes {
		out[c.Name] = c
	}
	return out
}

func TestSetClassesRefusesBadLists(t *testing.T) {
	l, err := New(10, time.Second, WithClasses(Class{Name: "a", Reserve: 2}))
	if err != nil {
		t.Fatal(err)
	}
	for _, cs := range [][]Class{
		{{Name: "A"}}, {{Name: "a"}, {Name: "a"}}, {{Name: "a", Reserve: -1}},
		{{Name: "a", Reserve: 3, Of: 2}}, {{Name: "a", Of: -1}}, {{Name: "a", Of: MaxQuota + 1}},
	} {
		if err := l.SetClasses(cs...); !errors.Is(err, ErrInvalid) {
			t.Errorf("SetClasses(%v) = %v, want ErrInvalid", cs, err)
		}
	}
	if got := l.Classes(); len(got) != 1 || got[0] != (Class{Name: "a", Reserve: 2}) {
		t.Errorf("classes after refusals = %v, want a=2 unchanged", got)
	}
	m, err := NewMulti([]Limit{{Quota: 10, Window: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Limiter(0).SetClasses(Class{Name: "A"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("SetClasses(A) on a Multi's limit = %v, want ErrInvalid", err)
	}
	if err := m.SetClasses(Class{Name: "a", Reserve: -1}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Multi.SetClasses(a=-1) = %v, want ErrInvalid", err)
	}
	l.Close()
	if err := l.SetClasses(); !errors.Is(err, ErrClosed) {
		t.Errorf("SetClasses after Close = %v, want ErrClosed", err)
	}
}

// TestSetClassesKeepsWhatEachClassUsed: batch took 4 of the window under
// critical=6; with critical=3, batch's 4 still count, so it takes 3 more,
// and a class no longer listed hands what it took to the default class.
func TestSetClassesKeepsWhatEachClassUsed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 10, time.Second, WithClasses(Class{Name: "critical", Reserve: 6}, Class{Name: "batch"}))
		batch, critical := WithClass(t.Context(), "batch"), WithClass(t.Context(), "critical")
		for l.Acquire(batch, 0) == nil {
		}
		if err := l.Acquire(critical, 0); err != nil {
			t.Fatal(err)
		}
		if err := l.SetClasses(Class{Name: "critical", Reserve: 3}, Class{Name: "batch"}); err != nil {
			t.Fatal(err)
		}
		var more int
		for l.Acquire(batch, 0) == nil {
			more++
		}
		if more != 3 {
			t.Errorf("batch took %d more after critical's reserve went to 3, want 3", more)
		}
		got := classStats(t, l)
		if c := got["critical"]; c.Used != 1 || c.Reserve != 3 || c.Admitted != 1 {
			t.Errorf("critical = %+v, want used 1 of a reserve of 3, admitted 1", c)
		}
		if b := got["batch"]; b.Used != 7 || b.Admitted != 7 || b.Refused != 2 {
			t.Errorf("batch = %+v, want used and admitted 7, refused 2", b)
		}
		// batch goes: its 7 are the default class's now.
		if err := l.SetClasses(Class{Name: "critical", Reserve: 3}, Class{Name: "default"}); err != nil {
			t.Fatal(err)
		}
		got = classStats(t, l)
		if d := got["default"]; d.Used != 7 || d.Refused != 0 {
			t.Errorf("default = %+v, want batch's 7 used, no counters carried", d)
		}
		if c := got["critical"]; c.Used != 1 || c.Admitted != 1 {
			t.Errorf("critical = %+v after the second change, want used and admitted 1", c)
		}
		for range 2 {
			if err := l.Acquire(critical, 0); err != nil {
				t.Fatalf("critical within its reserve: %v", err)
			}
		}
		if l.TryAcquire() {
			t.Error("the window is full, and TryAcquire took a permit")
		}
	})
}

// TestSetClassesFromNone: what a limiter without classes admitted is the
// default class's; the hot path stops, reserves hold, and without classes
// again the hot path takes over.
func TestSetClassesFromNone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 10, time.Second)
		for range 3 {
			if !l.TryAcquire() {
				t.Fatal("TryAcquire refused below the quota")
			}
		}
		if err := l.SetClasses(Class{Name: "critical", Reserve: 5}, Class{Name: "default"}); err != nil {
			t.Fatal(err)
		}
		if d := classStats(t, l)["default"]; d.Used != 3 || d.Admitted != 3 {
			t.Errorf("default = %+v, want the 3 admitted before classes", d)
		}
		var more int
		for l.TryAcquire() {
			more++
		}
		if more != 2 {
			t.Errorf("TryAcquire took %d more, want 2: 5 are critical's", more)
		}
		if l.state.Load()&slowBit == 0 {
			t.Error("a limiter with classes left the hot path open")
		}
		if err := l.SetClasses(); err != nil {
			t.Fatal(err)
		}
		if st := l.Stats(); st.Classes != nil || st.Remaining != 5 {
			t.Errorf("without classes: classes %v, remaining %d, want none and 5", st.Classes, st.Remaining)
		}
		if l.state.Load()&slowBit != 0 {
			t.Error("a limiter without classes again kept the hot path shut")
		}
		if !l.fast(1) {
			t.Error("the hot path refused a permit the window has")
		}
	})
}

// TestSetClassesMovesWaiters: waiters of a class that goes are the
// default class's, placed again behind a class now higher.
func TestSetClassesMovesWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 1, time.Second, WithClasses(Class{Name: "a"}, Class{Name: "b"}))
		a, b := WithClass(t.Context(), "a"), WithClass(t.Context(), "b")
		for l.Acquire(a, 0) == nil {
		}
		start := time.Now()
		at := map[string]time.Duration{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		acquire := func(ctx context.Context, name string) {
			wg.Go(func() {
				if err := l.Acquire(ctx, 10*time.Second); err != nil {
					t.Errorf("%s: %v", name, err)
				}
				mu.Lock()
				at[name] = time.Since(start)
				mu.Unlock()
			})
			synctest.Wait()
		}
		acquire(a, "a")
		acquire(b, "b")
		// b is now the highest class: placed ahead of a's waiter.
		if err := l.SetClasses(Class{Name: "b"}, Class{Name: "a"}); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if at["b"] != time.Second || at["a"] != 2*time.Second {
			t.Errorf("admitted at %v, want b after 1s and a after 2s", at)
		}
		st := classStats(t, l)
		if st["a"].Admitted != 2 || st["b"].Admitted != 1 {
			t.Errorf("classes %+v, want a admitted 2, b 1", st)
		}
	})
}

// TestClassReserveOfQuota: a reserve with Of follows the quota window by
// window.
func TestClassReserveOfQuota(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 10, time.Second, WithClasses(Class{Name: "critical", Reserve: 600, Of: 1000}, Class{Name: "batch"}))
		batch := WithClass(t.Context(), "batch")
		count := func() (n int) {
			for l.Acquire(batch, 0) == nil {
				n++
			}
			return n
		}
		if n := count(); n != 4 {
			t.Errorf("batch took %d of 10, want 4: 60%% is critical's", n)
		}
		if err := l.SetQuota(50, time.Now().Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if n := count(); n != 20 {
			t.Errorf("batch took %d of 50, want 20", n)
		}
		if c := classStats(t, l)["critical"]; c.Reserve != 30 {
			t.Errorf("critical's reserve of 50 = %d, want 30", c.Reserve)
		}
	})
}

// TestReserveCancelCountsItsClass: a Reserve taken at once and cancelled
// gives its permits back to its own class, not to the highest.
func TestReserveCancelCountsItsClass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 10, time.Second, WithClasses(Class{Name: "critical", Reserve: 4}, Class{Name: "batch"}))
		r, err := l.Reserve(2, 0)
		if err != nil {
			t.Fatal(err)
		}
		r.Cancel()
		st := classStats(t, l)
		if st["critical"].Used != 0 || st["batch"].Used != 0 || st["batch"].Canceled != 2 {
			t.Errorf("after Cancel: %+v, want nothing used, batch canceled 2", st)
		}
	})
}

// TestClassUsesOwnReserveWhenCoverBroken: a change in the middle of a
// window can leave fewer permits than the classes' unused reserves. A
// class then still takes its own unused reserve while permits are left,
// at once and as a waiter: what it takes is kept for it anyway.
func TestClassUsesOwnReserveWhenCoverBroken(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before func(l *Limiter, batch context.Context) error // fills the window, then changes it
		want   int                                           // critical's permits left
	}{{
		// batch took 90 of 100; the quota rises to 200 with critical=60%
		// (reserve 120): 110 are left, all of them critical's to take.
		name: "raised quota, reserve of it",
		before: func(l *Limiter, batch context.Context) error {
			for range 90 {
				if err := l.Acquire(batch, 0); err != nil {
					return err
				}
			}
			if err := l.SetQuota(200, time.Time{}); err != nil {
				return err
			}
			return l.SetClasses(Class{Name: "critical", Reserve: 600, Of: 1000}, Class{Name: "batch"})
		},
		want: 110,
	}, {
		// critical=60% of 100 leaves batch 40; the quota drops to 50
		// (reserve 30): 10 are left, critical's.
		name: "lowered quota",
		before: func(l *Limiter, batch context.Context) error {
			if err := l.SetClasses(Class{Name: "critical", Reserve: 600, Of: 1000}, Class{Name: "batch"}); err != nil {
				return err
			}
			for l.Acquire(batch, 0) == nil {
			}
			return l.SetQuota(50, time.Time{})
		},
		want: 10,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := mustNew(t, 100, time.Second, WithClasses(Class{Name: "critical"}, Class{Name: "batch"}))
				batch, critical := WithClass(t.Context(), "batch"), WithClass(t.Context(), "critical")
				if err := tc.before(l, batch); err != nil {
					t.Fatal(err)
				}
				if err := l.Acquire(batch, 0); !errors.Is(err, ErrTimeout) {
					t.Errorf("batch took critical's reserve: %v", err)
				}
				var got int
				for got < tc.want-1 && l.Acquire(critical, 0) == nil {
					got++
				}
				if got != tc.want-1 {
					t.Errorf("critical took %d at once, want %d: every permit left is its reserve", got, tc.want-1)
				}
				start := time.Now()
				if err := l.Acquire(critical, time.Minute); err != nil || time.Since(start) != 0 {
					t.Errorf("critical's waiter for the last permit: %v after %v, want admitted at once", err, time.Since(start))
				} else if err := l.Acquire(critical, 0); !errors.Is(err, ErrTimeout) {
					t.Errorf("critical over the quota: %v", err)
				}
			})
		})
	}
}

// TestClassUsesOwnReservePaced: in a paced window, slots whose time passed
// are gone, so the slots left can fall short of the reserves without any
// change. A class that asks late still takes the slots left of its own
// reserve in that window.
func TestClassUsesOwnReservePaced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 10, time.Second, WithPacing(true), WithClasses(Class{Name: "critical", Reserve: 6}, Class{Name: "batch"}))
		critical := WithClass(t.Context(), "critical")
		start := time.Now()
		time.Sleep(550 * time.Millisecond) // slots 0 to 4 are gone
		for i := range 5 {
			if err := l.Acquire(critical, time.Second); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d >= time.Second {
				t.Fatalf("critical's permit %d of the 5 slots left admitted after %v, in the next window", i+1, d)
			}
		}
	})
}

// TestPacedWaitersAheadLeaveNoHoles: in a paced window ahead, batch's
// waiters hold slots 0 to 3 and critical's waiters, asking after them,
// are placed ahead one by one, batch's placed again behind each. The
// slots batch gives up stay usable: critical is admitted its reserve of
// 6 in that window and batch the 4 left, all 10 in the window. When a
// displaced waiter's slots were left behind as used, critical had 4 and
// batch none there, and batch waited two windows more.
func TestPacedWaitersAheadLeaveNoHoles(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, 10, time.Second, WithPacing(true), WithClasses(Class{Name: "critical", Reserve: 6}, Class{Name: "batch", Reserve: 2}))
		batch, critical := WithClass(t.Context(), "batch"), WithClass(t.Context(), "critical")
		start := time.Now()
		// Nothing now, 10 from the next window on: every waiter waits for it.
		if err := l.SetQuota(0, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if err := l.SetQuota(10, start.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		in := map[string]int{} // admitted in the window from 1s to 2s
		for i := range 10 {
			name, ctx := "batch", batch
			if i >= 4 {
				name, ctx = "critical", critical
			}
			wg.Go(func() {
				if err := l.Acquire(ctx, 5*time.Second); err != nil {
					t.Errorf("%s: %v", name, err)
					return
				}
				if d := time.Since(start); d >= time.Second && d < 2*time.Second {
					mu.Lock()
					in[name]++
					mu.Unlock()
				}
			})
			synctest.Wait() // placed before the next one asks
		}
		wg.Wait()
		if in["critical"] != 6 || in["batch"] != 4 {
			t.Errorf("admitted in the window they waited for: %v, want critical 6 (its reserve) and batch 4", in)
		}
	})
}
