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
// SetWindowQuota, SetClasses with new reserves (counts, or parts Of the
// quota) in a new order, SetPacing on and off, and Schedule with another
// window length (500ms, 1s or 2s), at once or from a later boundary. Every
// call takes one permit. It checks every history whole, each window of
// the length in force:
//
//   - quota: at every grant, what its window granted up to and including
//     it is at most the quota in force at that grant, as TestOracle
//     checks the limiter's guarantee.
//   - kept: at every grant decided at once, to class c, with the quota q
//     and the reserves r_i in force then and u_i what class i was granted
//     in the window so far, u_c + Σ_{i≠c} max(u_i, r_i) ≤ q: no class
//     takes what another has not yet used of its reserve, paced or not,
//     whatever changed before.
//   - reserve: let class c be refused a call decided at once at instant t
//     of window w, and t0 the last change made in w before the refusal, or
//     w's start if none was. With the quota q and the classes' reserves
//     r_i (cut in proportion) in force from t0, and A and u_i what the
//     window and class i were granted before t0, c was granted from t0 to
//     the refusal at least min(r_c-u_c, q-A-Σ_{i≠c} max(0, r_i-u_i)): its
//     unused reserve, or else all the window had left beyond the other
//     classes' unused reserves. Without a change in w that is r_c: a
//     class refused was granted its whole reserve. Not checked where
//     pacing was on from a longest wait before w to the refusal: pacing
//     refuses a call whose slot's time has not come, and a waiter placed
//     while it was on keeps its slot's time.
//   - paced: in a window paced from its start with no change in it, the
//     slots taken (Stats' Quota less Remaining) that no class holds (their
//     Used) are at most the slots whose time passed: pacing loses only
//     those, so a class's reserve stays in the slots to come.
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
	asked    time.Time     // when the call was made
	wait     time.Duration // 0: decided at once
	admitted bool          // the call's outcome, at at
}

// quotaStep is a quota in force from an instant on; seq 0 takes effect
// before every event of that instant, as a change scheduled for a
// boundary does.
type quotaStep struct {
	from   time.Time
	seq    int64
	q      int64
	window time.Duration
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
		// Every length divides 2s: a boundary of 2s is one of all.
		lengths := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}
		const every = 2 * time.Second
		const maxWait = 3 * time.Second // a waiter's longest wait
		names := make([]string, 1+rng.IntN(4))
		for i := range names {
			names[i] = fmt.Sprintf("c%d", i)
		}
		quota := 1 + rng.Int64N(20)
		cs := randomClasses(rng, names)
		pacing := rng.IntN(3) == 0
		l, err := New(quota, time.Second, WithClasses(cs...), WithPacing(pacing))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		quotas := []quotaStep{{from: time.Now(), q: quota, window: time.Second}}
		classSteps := []classStep{{from: time.Now(), cs: cs}}
		pacingSteps := []pacingStep{{from: time.Now(), on: pacing}}

		var mu sync.Mutex
		var seq int64
		var events []*classEvent
		var probes []classProbe
		record := func(e *classEvent) { // with mu held
			seq++
			e.seq, e.at = seq, time.Now()
			events = append(events, e)
		}
		// probe notes what the limiter says of its current window, after
		// every step of the driver.
		probe := func() {
			st := l.Stats()
			p := classProbe{at: time.Now(), start: st.WindowStart, window: st.Window, quota: st.Quota, taken: st.Quota - st.Remaining}
			for _, c := range st.Classes {
				p.used += c.Used
			}
			mu.Lock()
			p.seq = seq
			probes = append(probes, p)
			mu.Unlock()
		}
		quotaAt := func(at time.Time, seq int64) quotaStep {
			var q quotaStep
			for _, s := range quotas {
				if !earlier(at, seq, s.from, s.seq) {
					q = s
				}
			}
			return q
		}
		windowOf := func(at time.Time, seq int64) (time.Time, time.Duration) {
			w := quotaAt(at, seq).window
			return at.Truncate(w), w
		}
		var wg sync.WaitGroup
		for range 60 + rng.IntN(100) {
			time.Sleep(time.Duration(rng.Int64N(int64(time.Second) / 4)))
			if time.Now().UnixNano()%int64(lengths[0]) == 0 {
				// Waiters are admitted at a boundary: keep the
				// driver's events off it, so their order is known.
				time.Sleep(time.Nanosecond)
			}
			synctest.Wait()
			if rng.IntN(5) > 0 {
				e := &classEvent{class: names[rng.IntN(len(names))]}
				if rng.IntN(3) == 0 {
					e.wait = time.Duration(1 + rng.Int64N(int64(maxWait)))
				}
				e.asked = time.Now()
				wg.Go(func() {
					err := l.Acquire(WithClass(t.Context(), e.class), e.wait)
					mu.Lock()
					defer mu.Unlock()
					e.admitted = err == nil
					record(e)
				})
				synctest.Wait() // decided, or placed, before the next event
				probe()
				continue
			}
			now := time.Now()
			mu.Lock()
			start, window := windowOf(now, seq+1)
			mu.Unlock()
			end := start.Add(window)
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
			switch k := rng.IntN(7); k {
			case 0, 1:
				if k == 0 {
					e.what, err = fmt.Sprintf("SetQuota(%d, now)", q), l.SetQuota(q, time.Time{})
				} else {
					e.what, err = fmt.Sprintf("SetLimit(%d, %v, now)", q, window), l.SetLimit(q, window, time.Time{})
				}
				dropFrom(now)
				quotas = append(quotas, quotaStep{from: now, seq: e.seq, q: q, window: window})
			case 2:
				// A boundary of every length, past the current window.
				at := now.Truncate(every).Add(time.Duration(1+rng.IntN(2)) * every)
				w := quotaAt(at, 0).window
				e.what, err = fmt.Sprintf("SetQuota(%d, %v)", q, at.Sub(quotas[0].from)), l.SetQuota(q, at)
				dropFrom(at)
				quotas = append(quotas, quotaStep{from: at, q: q, window: w})
			case 3:
				var set bool
				set, err = l.SetWindowQuota(q, window, start)
				if !set && err == nil {
					err = fmt.Errorf("SetWindowQuota did not set the current window")
				}
				e.what = fmt.Sprintf("SetWindowQuota(%d)", q)
				dropFrom(now)
				quotas = append(quotas, quotaStep{from: now, seq: e.seq, q: q, window: window}, quotaStep{from: end, q: 0, window: window})
			case 4:
				ncs := randomClasses(rng, names)
				e.what, err = fmt.Sprintf("SetClasses(%v)", ncs), l.SetClasses(ncs...)
				classSteps = append(classSteps, classStep{from: now, seq: e.seq, cs: ncs})
			case 5:
				pacing = !pacing
				e.what = fmt.Sprintf("SetPacing(%v)", pacing)
				l.SetPacing(pacing)
				pacingSteps = append(pacingSteps, pacingStep{from: now, seq: e.seq, on: pacing})
			case 6:
				// Another window length, from now or from a boundary of
				// every length ahead: it takes effect at the first
				// boundary of both lengths past the current window.
				w := lengths[rng.IntN(len(lengths))]
				for w == window {
					w = lengths[rng.IntN(len(lengths))]
				}
				var at time.Time
				if rng.IntN(2) == 0 {
					at = now.Truncate(every).Add(every)
				}
				var from time.Time
				from, err = l.Schedule(q, w, at)
				e.what = fmt.Sprintf("Schedule(%d, %v, %v) from %v", q, w, at.Sub(quotas[0].from), from.Sub(quotas[0].from))
				after := end
				if at.After(after) {
					after = at
				}
				dropFrom(after)
				quotas = append(quotas, quotaStep{from: from, q: q, window: w})
			}
			if err != nil {
				t.Fatalf("%s: %v", e.what, err)
			}
			synctest.Wait() // waiters it moved have their answer
			probe()
		}
		wg.Wait()

		classesAt := func(at time.Time, seq int64) []Class {
			var cs []Class
			for _, s := range classSteps {
				if !earlier(at, seq, s.from, s.seq) {
					cs = s.cs
				}
			}
			return cs
		}
		pacedAt := func(at time.Time, seq int64) bool {
			var on bool
			for _, s := range pacingSteps {
				if !earlier(at, seq, s.from, s.seq) {
					on = s.on
				}
			}
			return on
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
		// changedIn reports whether a change was made after from and up
		// to (at, seq): a window's start is a boundary, where the driver
		// makes none.
		changedIn := func(from, at time.Time, seq int64) bool {
			for _, e := range events {
				if e.what != "" && e.at.After(from) && earlier(e.at, e.seq, at, seq+1) {
					return true
				}
			}
			return false
		}
		// pacedSince reports whether pacing was on at any instant from w
		// up to (at, seq).
		pacedSince := func(w, at time.Time, seq int64) bool {
			if pacedAt(w, 0) {
				return true
			}
			for _, s := range pacingSteps {
				if s.on && !s.from.Before(w) && earlier(s.from, s.seq, at, seq+1) {
					return true
				}
			}
			return false
		}

		count := map[time.Time]int64{}
		used := map[time.Time]map[string]int64{}
		for _, e := range events {
			if e.what != "" || !e.admitted {
				continue
			}
			w, _ := windowOf(e.at, e.seq)
			count[w]++
			if used[w] == nil {
				used[w] = map[string]int64{}
			}
			used[w][e.class]++
			q := quotaAt(e.at, e.seq).q
			if count[w] > q {
				fail("window at %v has %d permits after grant %d; the quota in force is %d%s",
					w.Sub(classSteps[0].from), count[w], e.seq, q, logText())
				return
			}
			if e.wait != 0 {
				continue
			}
			// Kept: a grant decided at once leaves the window room for
			// what every other class has not yet used of its reserve.
			// The window's grants so far are all the limiter may count
			// (promised permits it counts too can only add to the sum).
			res := modelReserves(classesAt(e.at, e.seq), q)
			sum := used[w][e.class]
			for name, r := range res {
				if name != e.class {
					sum += max(used[w][name], r)
				}
			}
			if sum > q {
				fail("%s granted at %d took another class's reserve: %v used of the window, reserves %v, quota %d%s",
					e.class, e.seq, used[w], res, q, logText())
				return
			}
		}

		for _, r := range events {
			if r.what != "" || r.admitted || r.wait != 0 {
				continue
			}
			w, _ := windowOf(r.at, r.seq)
			if pacedSince(w.Add(-maxWait), r.at, r.seq) {
				// Pacing refuses a call whose slot's time has not come,
				// and slots whose time passed are gone: the probes check
				// those windows. A waiter placed while pacing was on, up
				// to its longest wait before the window, keeps its
				// slot's time even once pacing is off: the limiter
				// counts its permits before the history shows them.
				continue
			}
			t0, seq0 := w, int64(0)
			for _, e := range events {
				if e.what != "" && !e.at.Before(w) && e.seq < r.seq {
					t0, seq0 = e.at, e.seq
				}
			}
			q := quotaAt(t0, seq0).q
			res := modelReserves(classesAt(t0, seq0), q)
			var taken, since int64
			used := map[string]int64{}
			for _, e := range events {
				if e.what != "" || !e.admitted || e.seq > r.seq {
					continue
				}
				if ew, _ := windowOf(e.at, e.seq); ew != w {
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

		// In a window paced from its start, with no change in it, the
		// permits taken that no class holds are slots whose time passed
		// unused: at most the slots before the one valid now. A slot a
		// waiter gave up to a higher class's waiter stays free.
		for _, p := range probes {
			if p.quota <= 0 || !pacedAt(p.start, 0) || changedIn(p.start, p.at, p.seq) {
				continue
			}
			if w, _ := windowOf(p.at, p.seq); !w.Equal(p.start) {
				fail("at %v the limiter's window starts at %v, the model's at %v%s", p.at.Sub(classSteps[0].from),
					p.start.Sub(classSteps[0].from), w.Sub(classSteps[0].from), logText())
				return
			}
			passed := min(int64(p.at.Sub(p.start))*p.quota/int64(p.window), p.quota-1)
			if lost := p.taken - p.used; lost > passed {
				fail("paced window at %v: %d of its %d slots taken, %d held by classes: %d lost, but only %d slots' time passed (at %v)%s",
					p.start.Sub(classSteps[0].from), p.taken, p.quota, p.used, lost, passed, p.at.Sub(classSteps[0].from), logText())
				return
			}
		}
	})
	return ok
}

// classProbe is what Stats says of the current window after a step of a
// TestClassChangeOracle history: its bounds and quota, the slots taken
// (Quota less Remaining), and those the classes hold (their Used).
type classProbe struct {
	at          time.Time
	seq         int64 // the last event recorded by then
	start       time.Time
	window      time.Duration
	quota       int64
	taken, used int64
}

type pacingStep struct {
	from time.Time
	seq  int64
	on   bool
}
