package ledger

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

// TestConfigdAheadAcrossAnEra: configd's clock runs 1.5 s ahead. Holder
// a releases its 60 to 30 from window 11 in time, and b is topped up to
// 70 there. The window becomes 2 s, and configd, on its clock, starts era
// 2 and drops publish 1 while a is still in window 10. a's next schedule
// has no piece in force, and its idle step of 2 s governs from 12 s:
// window 11, of the old length, must admit nothing, not the 60 before the
// release (60 + 70 of 100).
func TestConfigdAheadAcrossAnEra(t *testing.T) {
	for _, idleOld := range []bool{false, true} {
		name := map[bool]string{false: "idle is the policy's window (world)", true: "idle is the old window"}[idleOld]
		t.Run(name, func(t *testing.T) {
			const k Keys = "/rece/"
			base := int64(1_800_000_000) / 86400 * 86400 * int64(time.Second)
			at := func(sec float64) int64 { return base + int64(sec*float64(time.Second)) }
			wk := func(sec float64, w time.Duration) int64 { return WindowOf(at(sec), w) }
			const D = 1.5 // configd ahead, seconds
			s := NewState()
			archive := NewState()
			p := Policy{Limit: 100, Window: time.Second, Horizon: 4, Keep: 1}
			a := NewHolder(k, "a")
			var queue []Op
			planAt := func(c float64, target map[string]int64) Change {
				t.Helper()
				ch, err := Plan(s, p, target, at(c))
				if err != nil {
					t.Fatal(err)
				}
				apply(s, ch)
				if vs := Audit(s); len(vs) > 0 {
					t.Fatalf("audit: %v", vs)
				}
				archive.Head = ch.Head
				for _, pb := range ch.Pubs {
					archive.Pubs[pb.Seq] = pb
				}
				for _, g := range ch.Grants {
					archive.Grants[GrantKey{g.Pub, g.Holder}] = g
				}
				ops, err := k.Ops(ch)
				if err != nil {
					t.Fatal(err)
				}
				for _, o := range ops {
					if strings.HasPrefix(o.Key, k.Pubs()) || strings.HasPrefix(o.Key, k.Grants("a")) {
						queue = append(queue, o)
					}
				}
				t.Logf("configd at %.1fs (true %.1fs): %v", c, c-D, ch.Why)
				return ch
			}
			deliver := func() {
				for _, o := range queue {
					if err := a.Observe(o.Key, o.Value); err != nil {
						t.Fatal(err)
					}
				}
				queue = nil
			}
			clk := &fakeClock{at(5)}
			lim, err := limiter.New(0, p.Window, limiter.WithClock(clk))
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			idle := func() time.Duration {
				if idleOld {
					return time.Second
				}
				return p.Window
			}
			sync := func(h float64) {
				t.Helper()
				clk.t = at(h)
				now := lim.Now().UnixNano()
				next, rels := a.Next(now, 0)
				from, err := Enforce(lim, next, "a", now, now, idle())
				if err != nil {
					t.Fatal(err)
				}
				kept := a.Commit(next, rels, from)
				for _, r := range kept {
					s.Apply(r) // written and stored at once
					archive.Apply(r)
				}
				a.Stored(kept)
				t.Logf("a syncs at %.1fs: governs whole from %.1fs, releases %v, keeps %v", h, float64(from-base)/1e9, rels, kept)
			}
			admitted := map[int64]int64{} // 1 s windows
			take := func(h float64) {
				clk.t = at(h)
				admitted[wk(h, time.Second)] += int64(admit(lim, 1000))
			}

			planAt(7.5, map[string]int64{"a": 60, "b": 40}) // publish 1: windows 7..11
			deliver()
			sync(6.0)
			for h := 7.1; h < 10; h += 1 {
				sync(h)
				take(h)
			}
			planAt(9.5, map[string]int64{"a": 30, "b": 70}) // publish 2: windows 12..13
			// its delivery to a lags; a admits in window 10 meanwhile
			sync(10.05)
			take(10.05)
			deliver()
			sync(10.2)                                       // true 10.2, configd 11.7: a releases publish 1 to 30 from window 11
			planAt(11.8, map[string]int64{"a": 30, "b": 70}) // b topped up in window 11
			p.Window = 2 * time.Second
			planAt(12.1, map[string]int64{"a": 30, "b": 70}) // era 2; publish 1 ends below the floor
			deliver()
			sync(10.7)
			take(10.8)
			take(11.1)
			sync(11.2)
			take(11.3)
			take(11.9)

			k11 := wk(11, time.Second)
			e1 := int64(1)
			aRec := archive.Allowance("a", e1, k11)
			b := archive.Allowance("b", e1, k11)
			got := admitted[k11]
			t.Logf("window 11 (1 s, era 1): a admitted %d, a's records allow %d, the ledger gave b %d: %d of %d", got, aRec, b, got+b, int64(100))
			if got > aRec {
				t.Errorf("a admitted %d in window 11 where its records (its own release) allow %d", got, aRec)
			}
			if got+b > 100 {
				t.Errorf("window 11: a admitted %d and the ledger lets b hold %d: %d of 100", got, b, got+b)
			}
		})
	}
}
