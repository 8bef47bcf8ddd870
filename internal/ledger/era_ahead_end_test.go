package ledger

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

// TestConfigdAheadDropsTheLastWindowsEnd: configd's clock runs 0.7 s
// ahead. a holds 60 of 100 in 500 ms windows to 7.5 s, b 100 after. The
// window becomes 2 s, and configd, on its clock, starts era 2 and drops
// a's publish while a is at 7.4 s. a's idle step of 2 s governs from 8 s:
// [7.5 s, 8 s) must admit nothing, not a's 60 beside b's 100.
func TestConfigdAheadDropsTheLastWindowsEnd(t *testing.T) {
	const k Keys = "/recf/"
	base := int64(1_800_000_000) / 86400 * 86400 * int64(time.Second)
	at := func(sec float64) int64 { return base + int64(sec*float64(time.Second)) }
	const D = 0.7
	s, archive := NewState(), NewState()
	p := Policy{Limit: 100, Window: 500 * time.Millisecond, Horizon: 4, Keep: 1}
	a := NewHolder(k, "a")
	var queue []Op
	planAt := func(c float64, target map[string]int64) {
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
		ops, _ := k.Ops(ch)
		for _, o := range ops {
			if strings.HasPrefix(o.Key, k.Pubs()) || strings.HasPrefix(o.Key, k.Grants("a")) {
				queue = append(queue, o)
			}
		}
		t.Logf("configd at %.2fs (true %.2fs): %v", c, c-D, ch.Why)
	}
	deliver := func() {
		for _, o := range queue {
			if err := a.Observe(o.Key, o.Value); err != nil {
				t.Fatal(err)
			}
		}
		queue = nil
	}
	clk := &fakeClock{at(4)}
	lim, err := limiter.New(0, p.Window, limiter.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	sync := func(h float64) {
		t.Helper()
		clk.t = at(h)
		now := lim.Now().UnixNano()
		next, rels := a.Next(now, 0)
		from, err := Enforce(lim, next, "a", now, now, p.Window)
		if err != nil {
			t.Fatal(err)
		}
		kept := a.Commit(next, rels, from)
		t.Logf("a syncs at %.2fs: governs whole from %.2fs, releases %v, keeps %v", h, float64(from-base)/1e9, rels, kept)
	}
	admitted := map[int64]int64{}
	take := func(h float64) {
		clk.t = at(h)
		admitted[WindowOf(at(h), 500*time.Millisecond)] += int64(admit(lim, 1000))
	}
	planAt(5.2, map[string]int64{"a": 60, "b": 40})
	deliver()
	sync(4.6)
	planAt(6.2, map[string]int64{"b": 100})
	deliver()
	for h := 5.1; h < 7.4; h += 0.5 {
		sync(h)
		take(h)
	}
	p.Window = 2 * time.Second
	planAt(8.1, map[string]int64{"a": 50, "b": 50})
	deliver()
	sync(7.45)
	take(7.6)
	take(7.9)
	k15 := WindowOf(at(7.5), 500*time.Millisecond)
	got := admitted[k15]
	aRec, b := archive.Allowance("a", 1, k15), archive.Allowance("b", 1, k15)
	t.Logf("window [7.5s, 8s) of era 1: a admitted %d, its records allow %d, b holds %d: %d of 100", got, aRec, b, got+b)
	if got > aRec || got+b > 100 {
		t.Errorf("window [7.5s, 8s): a admitted %d where its records allow %d; with b's %d, %d of 100", got, aRec, b, got+b)
	}
}
