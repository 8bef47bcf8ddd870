package ledger

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

// aheadRig is holder a with a real limiter, fed by hand: configd plans on
// a clock D seconds ahead, a's watch delivers when told, and a's releases
// are stored at once. archive keeps every publish and grant ever written.
type aheadRig struct {
	t          *testing.T
	k          Keys
	D          float64
	p          Policy
	s, archive *State
	a          *Holder
	queue      []Op
	clk        *fakeClock
	lim        *limiter.Limiter
	admitted   map[int64]int64 // by window of the length take counts in
}

var aheadBase = int64(1_800_000_000) / 86400 * 86400 * int64(time.Second)

func aheadAt(sec float64) int64 { return aheadBase + int64(sec*float64(time.Second)) }

func newAheadRig(t *testing.T, D float64, p Policy, start float64) *aheadRig {
	r := &aheadRig{t: t, k: "/ahead/", D: D, p: p, s: NewState(), archive: NewState(),
		a: NewHolder("/ahead/", "a"), clk: &fakeClock{aheadAt(start)}, admitted: map[int64]int64{}}
	lim, err := limiter.New(0, p.Window, limiter.WithClock(r.clk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	r.lim = lim
	return r
}

// plan runs configd's round at c on its clock and queues what a watches.
func (r *aheadRig) plan(c float64, target map[string]int64) {
	r.t.Helper()
	ch, err := Plan(r.s, r.p, target, aheadAt(c))
	if err != nil {
		r.t.Fatal(err)
	}
	apply(r.s, ch)
	if vs := Audit(r.s); len(vs) > 0 {
		r.t.Fatalf("audit: %v", vs)
	}
	r.archive.Head = ch.Head
	for _, pb := range ch.Pubs {
		r.archive.Pubs[pb.Seq] = pb
	}
	for _, g := range ch.Grants {
		r.archive.Grants[GrantKey{g.Pub, g.Holder}] = g
	}
	ops, err := r.k.Ops(ch)
	if err != nil {
		r.t.Fatal(err)
	}
	for _, o := range ops {
		if strings.HasPrefix(o.Key, r.k.Pubs()) || strings.HasPrefix(o.Key, r.k.Grants("a")) {
			r.queue = append(r.queue, o)
		}
	}
	r.t.Logf("configd at %.2fs (true %.2fs): %v", c, c-r.D, ch.Why)
}

// deliver hands a everything queued.
func (r *aheadRig) deliver() {
	for _, o := range r.queue {
		if err := r.a.Observe(o.Key, o.Value); err != nil {
			r.t.Fatal(err)
		}
	}
	r.queue = nil
}

// sync is a's round at h: enforce, then keep and store the releases.
func (r *aheadRig) sync(h float64, idle time.Duration) {
	r.t.Helper()
	r.clk.t = aheadAt(h)
	now := r.lim.Now().UnixNano()
	next, rels := r.a.Next(now, 0)
	from, err := Enforce(r.lim, next, "a", now, now, idle)
	if err != nil {
		r.t.Fatal(err)
	}
	kept := r.a.Commit(next, rels, from)
	for _, rl := range kept {
		r.s.Apply(rl)
		r.archive.Apply(rl)
	}
	r.a.Stored(kept)
	r.t.Logf("a syncs at %.2fs: governs whole from %.2fs, releases %v, keeps %v", h, float64(from-aheadBase)/1e9, rels, kept)
}

// take admits all a may at h, counted in windows of length w.
func (r *aheadRig) take(h float64, w time.Duration) {
	r.clk.t = aheadAt(h)
	r.admitted[WindowOf(aheadAt(h), w)] += int64(admit(r.lim, 1000))
}

// check fails when a admitted more in window k of era 1 than everything
// its records allowed, or more than the limit beside b's grant.
func (r *aheadRig) check(k int64) {
	r.t.Helper()
	got := r.admitted[k]
	aRec, b := r.archive.Allowance("a", 1, k), r.archive.Allowance("b", 1, k)
	if got > aRec || got+b > r.p.Limit {
		r.t.Errorf("window %d: a admitted %d where its records allow %d; with b's %d, %d of %d", k, got, aRec, b, got+b, r.p.Limit)
	}
}

// TestConfigdAheadAcrossAnEra: configd's clock runs 1.5 s ahead. Holder
// a releases its 60 to 30 from window 11 in time, and b is topped up to
// 70 there. The window becomes 2 s, and configd, on its clock, starts era
// 2 and drops publish 1 while a is still in window 10. a's next schedule
// has no piece in force, and its idle step of 2 s governs from 12 s:
// window 11, of the old length, must admit nothing, not the 60 before the
// release (60 + 70 of 100).
func TestConfigdAheadAcrossAnEra(t *testing.T) {
	for _, idle := range []time.Duration{2 * time.Second, time.Second} {
		t.Run("idle "+idle.String(), func(t *testing.T) {
			r := newAheadRig(t, 1.5, Policy{Limit: 100, Window: time.Second, Horizon: 4, Keep: 1}, 5)
			r.plan(7.5, map[string]int64{"a": 60, "b": 40}) // publish 1: windows 7..11
			r.deliver()
			r.sync(6.0, time.Second)
			for h := 7.1; h < 10; h++ {
				r.sync(h, time.Second)
				r.take(h, time.Second)
			}
			r.plan(9.5, map[string]int64{"a": 30, "b": 70}) // publish 2, late to a
			r.sync(10.05, time.Second)
			r.take(10.05, time.Second)
			r.deliver()
			r.sync(10.2, time.Second)                        // a releases publish 1 to 30 from window 11
			r.plan(11.8, map[string]int64{"a": 30, "b": 70}) // b topped up in window 11
			r.p.Window = 2 * time.Second
			r.plan(12.1, map[string]int64{"a": 30, "b": 70}) // era 2; publish 1 goes
			r.deliver()
			r.sync(10.7, idle)
			r.take(10.8, time.Second)
			r.take(11.1, time.Second)
			r.sync(11.2, idle)
			r.take(11.3, time.Second)
			r.take(11.9, time.Second)
			r.check(WindowOf(aheadAt(11), time.Second))
		})
	}
}

// TestConfigdAheadDropsTheLastWindowsEnd: configd's clock runs 0.7 s
// ahead. a holds 60 of 100 in 500 ms windows to 7.5 s, b 100 after. The
// window becomes 2 s, and configd, on its clock, starts era 2 and drops
// a's publish while a is at 7.45 s. a's idle step of 2 s governs from
// 8 s: [7.5 s, 8 s) must admit nothing, not a's 60 beside b's 100.
func TestConfigdAheadDropsTheLastWindowsEnd(t *testing.T) {
	const w = 500 * time.Millisecond
	r := newAheadRig(t, 0.7, Policy{Limit: 100, Window: w, Horizon: 4, Keep: 1}, 4)
	r.plan(5.2, map[string]int64{"a": 60, "b": 40})
	r.deliver()
	r.sync(4.6, w)
	r.plan(6.2, map[string]int64{"b": 100})
	r.deliver()
	for h := 5.1; h < 7.4; h += 0.5 {
		r.sync(h, w)
		r.take(h, w)
	}
	r.p.Window = 2 * time.Second
	r.plan(8.1, map[string]int64{"a": 50, "b": 50})
	r.deliver()
	r.sync(7.45, r.p.Window)
	r.take(7.6, w)
	r.take(7.9, w)
	r.check(WindowOf(aheadAt(7.5), w))
}
