package limiter

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestClassChangeOracle runs random histories of calls of random classes,
// as TestClassOracle does, with changes made at random instants inside
// windows: SetQuota and SetLimit at once or from a later boundary,
// SetWindowQuota, and SetClasses with new reserves (counts, or parts Of
// the quota) in a new order. Every call takes one permit. It checks every
// history whole:
//
//   - quota: at every grant, what its window granted up to and including
//     it is at most the quota in force at that grant, as TestOracle
//     checks the limiter's guarantee.
//   - reserve: let class c be refused a call decided at once at instant t
//     of window w, and t0 the last change made in w before the refusal, or
//     w's start if none was. With the quota q and the classes' reserves
//     r_i (cut in proportion) in force from t0, and A and u_i what the
//     window and class i were granted before t0, c was granted from t0 to
//     the refusal at least min(r_c-u_c, q-A-Σ_{i≠c} max(0, r_i-u_i)): its
//     unused reserve, or else all the window had left beyond the other
//     classes' unused reserves. Without a change in w that is r_c: a
//     class refused was granted its whole reserve.
//
// The seed is printed; SLUICE_CLASS_CHANGE_SEED=N replays one history.
func TestClassChangeOracle(t *testing.T) {
	classSeeds(t, "SLUICE_CLASS_CHANGE_SEED", classChangeHistory)
}

// classEvent is a change in a history of TestClassChangeOracle, recorded
// as it is made, or a call, recorded at its outcome; events of one
// instant happened in the order of seq.
type classEvent struct {
	seq  int64
	at   time.Time
	what string // the change made; "" for a call

	class    string        // a call's class
	wait     time.Duration // 0: decided at once
	admitted bool          // the call's outcome, at at
}

// quotaStep is a quota in force from an instant on; seq 0 takes effect
// before every event of that instant, as a change scheduled for a
// boundary does.
type quotaStep struct {
	from time.Time
	seq  int64
	q    int64
}

type classStep struct {
	from time.Time
	seq  int64
	cs   []Class
}

// earlier reports whether (at, seq) comes before (at2, seq2).
func earlier(at time.Time, seq int64, at2 time.Time, seq2 int64) bool {
	return at.Before(at2) || at.Equal(at2) && seq < seq2
}

func randomClasses(rng *rand.Rand, names []string) []Class {
	cs := make([]Class, len(names))
	for i, name := range names {
		cs[i].Name = name
		if rng.IntN(2) == 0 {
			cs[i].Reserve = rng.Int64N(12)
		} else {
			cs[i].Of = 1 + rng.Int64N(100)
			cs[i].Reserve = rng.Int64N(cs[i].Of*3/4 + 1)
		}
	}
	rng.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
	return cs
}

// modelReserves is what each class named keeps of a window of quota q,
// computed as WithClasses documents it.
func modelReserves(cs []Class, q int64) map[string]int64 {
	out := map[string]int64{}
	var sum int64
	for _, c := range cs {
		r := c.Reserve
		if c.Of > 0 {
			r = c.Reserve * q / c.Of
		}
		out[c.Name] = r
		sum += r
	}
	if sum > q {
		for name, r := range out {
			out[name] = r * q / sum
		}
	}
	return out
}

func classChangeHistory(t *testing.T, seed uint64) (ok bool) {
	ok = true
	synctest.Test(t, func(t *testing.T) {
		fail := func(format string, args ...any) {
			t.Errorf("seed %d: "+format, append([]any{seed}, args...)...)
			ok = false
		}
		rng := rand.New(rand.NewPCG(seed, seed>>1))
		const window = time.Second
		names := make([]string, 1+rng.IntN(4))
		for i := range names {
			names[i] = fmt.Sprintf("c%d", i)
		}
		quota := 1 + rng.Int64N(20)
		cs := randomClasses(rng, names)
		l, err := New(quota, window, WithClasses(cs...))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		quotas := []quotaStep{{from: time.Now(), q: quota}}
		classSteps := []classStep{{from: time.Now(), cs: cs}}

		var mu sync.Mutex
		var seq int64
		var events []*classEvent
		record := func(e *classEvent) { // with mu held
			seq++
			e.seq, e.at = seq, time.Now()
			events = append(events, e)
		}
		var wg sync.WaitGroup
		for range 60 + rng.IntN(100) {
			time.Sleep(time.Duration(rng.Int64N(int64(window) / 4)))
			if time.Now().UnixNano()%int64(window) == 0 {
				// Waiters are admitted at a boundary: keep the
				// driver's events off it, so their order is known.
				time.Sleep(time.Nanosecond)
			}
			synctest.Wait()
			if rng.IntN(5) > 0 {
				e := &classEvent{class: names[rng.IntN(len(names))]}
				if rng.IntN(3) == 0 {
					e.wait = time.Duration(1 + rng.Int64N(int64(3*window)))
				}
				wg.Go(func() {
					err := l.Acquire(WithClass(t.Context(), e.class), e.wait)
					mu.Lock()
					defer mu.Unlock()
					e.admitted = err == nil
					record(e)
				})
				synctest.Wait() // decided, or placed, before the next event
				continue
			}
			now := time.Now()
			start := now.Truncate(window)
			q := rng.Int64N(31)
			e := &classEvent{}
			mu.Lock()
			record(e)
			mu.Unlock()
			// quotas holds the steps of the limiter's schedule that took
			// effect or are still to: a change drops those it replaces.
			dropFrom := func(from time.Time) {
				quotas = slices.DeleteFunc(quotas, func(s quotaStep) bool { return !s.from.Before(from) })
			}
			switch k := rng.IntN(5); k {
			case 0, 1:
				if k == 0 {
					e.what, err = fmt.Sprintf("SetQuota(%d, now)", q), l.SetQuota(q, time.Time{})
				} else {
					e.what, err = fmt.Sprintf("SetLimit(%d, %v, now)", q, window), l.SetLimit(q, window, time.Time{})
				}
				dropFrom(now)
				quotas = append(quotas, quotaStep{from: now, seq: e.seq, q: q})
			case 2:
				at := start.Add(time.Duration(1+rng.IntN(2)) * window)
				e.what, err = fmt.Sprintf("SetQuota(%d, %v)", q, at.Sub(start)), l.SetQuota(q, at)
				dropFrom(at)
				quotas = append(quotas, quotaStep{from: at, q: q})
			case 3:
				var set bool
				set, err = l.SetWindowQuota(q, window, start)
				if !set && err == nil {
					err = fmt.Errorf("SetWindowQuota did not set the current window")
				}
				e.what = fmt.Sprintf("SetWindowQuota(%d)", q)
				dropFrom(now)
				quotas = append(quotas, quotaStep{from: now, seq: e.seq, q: q}, quotaStep{from: start.Add(window), q: 0})
			case 4:
				ncs := randomClasses(rng, names)
				e.what, err = fmt.Sprintf("SetClasses(%v)", ncs), l.SetClasses(ncs...)
				classSteps = append(classSteps, classStep{from: now, seq: e.seq, cs: ncs})
			}
			if err != nil {
				t.Fatalf("%s: %v", e.what, err)
			}
			synctest.Wait() // waiters it moved have their answer
		}
		wg.Wait()

		quotaAt := func(at time.Time, seq int64) int64 {
			var q int64
			for _, s := range quotas {
				if !earlier(at, seq, s.from, s.seq) {
					q = s.q
				}
			}
			return q
		}
		classesAt := func(at time.Time, seq int64) []Class {
			var cs []Class
			for _, s := range classSteps {
				if !earlier(at, seq, s.from, s.seq) {
					cs = s.cs
				}
			}
			return cs
		}
		slices.SortFunc(events, func(a, b *classEvent) int { return int(a.seq - b.seq) })
		logText := func() string {
			var b []byte
			for _, e := range events {
				switch {
				case e.what != "":
					b = fmt.Appendf(b, "\n  %d %v %s", e.seq, e.at.Sub(classSteps[0].from), e.what)
				default:
					b = fmt.Appendf(b, "\n  %d %v %s wait %v admitted %v", e.seq, e.at.Sub(classSteps[0].from), e.class, e.wait, e.admitted)
				}
			}
			return string(b)
		}

		count := map[time.Time]int64{}
		for _, e := range events {
			if e.what != "" || !e.admitted {
				continue
			}
			w := e.at.Truncate(window)
			count[w]++
			if q := quotaAt(e.at, e.seq); count[w] > q {
				fail("window at %v has %d permits after grant %d; the quota in force is %d%s",
					w.Sub(classSteps[0].from), count[w], e.seq, q, logText())
				return
			}
		}

		for _, r := range events {
			if r.what != "" || r.admitted || r.wait != 0 {
				continue
			}
			w := r.at.Truncate(window)
			t0, seq0 := w, int64(0)
			for _, e := range events {
				if e.what != "" && !e.at.Before(w) && e.seq < r.seq {
					t0, seq0 = e.at, e.seq
				}
			}
			q := quotaAt(t0, seq0)
			res := modelReserves(classesAt(t0, seq0), q)
			var taken, since int64
			used := map[string]int64{}
			for _, e := range events {
				if e.what != "" || !e.admitted || e.at.Truncate(window) != w || e.seq > r.seq {
					continue
				}
				if e.seq < seq0 {
					taken++
					used[e.class]++
				} else if e.class == r.class {
					since++
				}
			}
			left := q - taken
			for name, rs := range res {
				if name != r.class {
					left -= max(0, rs-used[name])
				}
			}
			if want := min(res[r.class]-used[r.class], left); since < want {
				fail("%s refused at %d, granted %d since %d, want at least %d: reserve %d, used %d before; quota %d, %d taken before, %d left beyond the others' reserves%s",
					r.class, r.seq, since, seq0, want, res[r.class], used[r.class], q, taken, left, logText())
				return
			}
		}
	})
	return ok
}
