package ledger

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

var (
	recSeeds = flag.Int("records.seeds", 200, "random histories of one holder")
	recFirst = flag.Uint64("records.first", 1, "first seed")
	recSteps = flag.Bool("records.steps", false, "step the holder's clock (SetClockOffset)")
	recTrace = flag.Bool("records.trace", false, "trace")
	recBreak = flag.Bool("records.break", false, "keep every release (oracle check)")
	recTotal int64
	recFixed = flag.Bool("records.fixed", false, "never change the window")
	recSkew  = flag.Duration("records.cskew", time.Second, "configd's clock off by up to half this, either way")
)

type recera struct {
	w            time.Duration
	start, until int64 // ns: min start seen, min start of a later era
}

// TestHolderNeverExceedsItsRecords plays one holder's real
// limiter against configd's Plan: random targets, limits, window lengths
// (500ms, 1s, 2s) and max-txn-ops, delayed watch deliveries, delayed
// release writes, random sync times and (with -records.steps) clock steps.
// The holder admits greedily. In every window of every era it must admit
// at most what its records (grants, extended ends, its own releases,
// nothing ever deleted) allow there.
func TestHolderNeverExceedsItsRecords(t *testing.T) {
	for i := range *recSeeds {
		seed := *recFirst + uint64(i)
		if msg := recplay(seed, *recSteps, *recTrace && *recSeeds == 1, t); msg != "" {
			t.Fatalf("seed %d (steps %v): %s\nreplay: go test -run '^TestHolderNeverExceedsItsRecords$' ./internal/ledger -records.seeds=1 -records.first=%d -records.steps=%v -records.cskew=%v -v -records.trace", seed, *recSteps, msg, seed, *recSteps, *recSkew)
		}
	}
	t.Logf("%d histories, %d admitted", *recSeeds, recTotal)
}

func recplay(seed uint64, steps, trace bool, t *testing.T) string {
	rng := rand.New(rand.NewPCG(seed, seed*7+1))
	const k Keys = "/rec/"
	const day = int64(24 * time.Hour)
	t0 := int64(1_800_000_000) / 86400 * 86400 * int64(time.Second)
	lens := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}
	tr := func(f string, a ...any) {
		if trace {
			t.Logf("%.3f "+f, append([]any{float64(0)}, a...)...)
		}
	}
	_ = day
	clk := &fakeClock{t0}
	s := NewState()
	archive := NewState()
	p := Policy{Limit: 100, Window: lens[rng.IntN(3)], Horizon: int64(2 + rng.IntN(5)), Keep: int64(1 + rng.IntN(2))}
	if rng.IntN(2) == 0 {
		p.MaxOps = MinOps + rng.IntN(6)
	}
	others := 1 + rng.IntN(8)
	hold := NewHolder(k, "a")
	lim, err := limiter.New(0, p.Window, limiter.WithClock(clk))
	if err != nil {
		return err.Error()
	}
	defer lim.Close()
	var queue []Op            // to the holder, in order
	var pendingRels []Release // kept, not yet stored
	eras := map[int64]*recera{}
	target := map[string]int64{}
	newTarget := func() {
		clear(target)
		left := p.Limit
		target["a"] = rng.Int64N(left + 1)
		left -= target["a"]
		for i := range others {
			if left <= 0 {
				break
			}
			q := rng.Int64N(left + 1)
			target[fmt.Sprintf("b%d", i)] = q
			left -= q
		}
	}
	newTarget()
	cskew := int64(0)
	if rng.IntN(3) == 0 {
		cskew = rng.Int64N(int64(*recSkew)) - int64(*recSkew)/2
	}
	// admitted per window length, per window, attributed to the window
	// the limiter is in: that of the latest time it has read.
	adm := map[time.Duration]map[int64]int64{}
	maxSeen := int64(-1 << 63)
	var offset time.Duration
	record := func(n int64) {
		recTotal += n
		if n > 0 {
			tr("admit %d at lim %d (true %d) attributed to 500ms window %d", n, lim.Now().UnixNano(), clk.t, WindowOf(maxSeen, 500*time.Millisecond))
		}
		if n > 0 {
			for _, l := range lens {
				m := adm[l]
				if m == nil {
					m = map[int64]int64{}
					adm[l] = m
				}
				m[WindowOf(maxSeen, l)] += n
			}
		}
	}
	end := t0 + int64(40*time.Second)
	for clk.t < end {
		clk.t += int64(time.Millisecond) + rng.Int64N(int64(150*time.Millisecond))
		// configd
		if rng.IntN(4) == 0 {
			switch r := rng.IntN(30); {
			case r == 0 && !*recFixed:
				p.Window = lens[rng.IntN(3)]
			case r < 3:
				p.Limit = 20 + rng.Int64N(200)
				newTarget()
			case r < 8:
				newTarget()
			}
			c, err := Plan(s, p, target, clk.t+cskew)
			if err != nil {
				return "plan: " + err.Error()
			}
			if !c.Empty() {
				apply(s, c)
				if vs := Audit(s); len(vs) > 0 {
					return fmt.Sprintf("audit: %v", vs)
				}
				tr("plan %v", c.Why)
				// archive: never delete
				archive.Head = c.Head
				for _, pb := range c.Pubs {
					archive.Pubs[pb.Seq] = pb
				}
				for _, g := range c.Grants {
					archive.Grants[GrantKey{g.Pub, g.Holder}] = g
				}
				for _, e := range c.Head.Eras {
					r, ok := eras[e.Seq]
					if !ok {
						r = &recera{w: e.Window, start: StartOf(e.Start, e.Window), until: 1<<62 - 1}
						eras[e.Seq] = r
					}
					r.start = min(r.start, StartOf(e.Start, e.Window))
					for seq, o := range eras {
						if seq < e.Seq {
							o.until = min(o.until, StartOf(e.Start, e.Window))
						}
					}
				}
				ops, err := k.Ops(c)
				if err != nil {
					return err.Error()
				}
				for _, o := range ops {
					if strings.HasPrefix(o.Key, k.Pubs()) || strings.HasPrefix(o.Key, k.Grants("a")) {
						queue = append(queue, o)
					}
				}
			}
		}
		// watch delivery: a prefix of what is queued
		if len(queue) > 0 && rng.IntN(3) == 0 {
			n := 1 + rng.IntN(len(queue))
			for _, o := range queue[:n] {
				if err := hold.Observe(o.Key, o.Value); err != nil {
					return err.Error()
				}
			}
			queue = queue[n:]
		}
		// stored releases
		if len(pendingRels) > 0 && rng.IntN(3) == 0 {
			for _, r := range pendingRels {
				s.Apply(r)
			}
			hold.Stored(pendingRels)
			pendingRels = nil
		}
		if steps && rng.IntN(40) == 0 {
			offset += time.Duration(rng.Int64N(int64(1500*time.Millisecond)) - int64(750*time.Millisecond))
			lim.SetClockOffset(offset)
			tr("offset %v", offset)
		}
		// holder sync
		if rng.IntN(2) == 0 {
			now := lim.Now().UnixNano()
			maxSeen = max(maxSeen, now)
			next, rels := hold.Next(now, 0)
			if rng.IntN(3) == 0 {
				// a pause between reading and enforcing; others admit meanwhile
				clk.t += rng.Int64N(int64(800 * time.Millisecond))
				n := int64(admit(lim, 1<<20))
				t := lim.Now().UnixNano()
				maxSeen = max(maxSeen, t)
				record(n)
			}
			from, err := Enforce(lim, next, "a", now, lim.Now().UnixNano(), p.Window)
			if err != nil {
				return err.Error()
			}
			if *recBreak {
				from = -1 << 62
			}
			kept := hold.Commit(next, rels, from)
			for _, r := range kept {
				archive.Apply(r)
				pendingRels = append(pendingRels, r)
			}
			tr("sync now=%d from=%d rels=%v kept=%v", now, from, rels, kept)
		}
		// greedy admission
		n := int64(admit(lim, 1<<20))
		maxSeen = max(maxSeen, lim.Now().UnixNano())
		record(n)
	}
	// check
	seqs := make([]int64, 0, len(eras))
	for s := range eras {
		seqs = append(seqs, s)
	}
	slices.Sort(seqs)
	for _, seq := range seqs {
		e := eras[seq]
		for w, n := range adm[e.w] {
			if StartOf(w, e.w) < e.start || StartOf(w+1, e.w) > e.until {
				continue
			}
			if al := archive.Allowance("a", seq, w); n > al {
				return fmt.Sprintf("era %d (%v): window %d admitted %d, a's records allow %d", seq, e.w, w, n, al)
			}
		}
	}
	return ""
}
