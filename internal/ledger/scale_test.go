package ledger

import (
	"fmt"
	"testing"
)

// steady returns a ledger of n holders sharing a limit of 10·n evenly,
// published and extended for a few rounds, and the targets it follows.
func steady(b *testing.B, n int) (*State, Policy, map[string]int64, int64) {
	b.Helper()
	s := NewState()
	p := Policy{Limit: int64(10 * n), Window: w, Horizon: 8, Keep: 2}
	target := make(map[string]int64, n)
	for i := range n {
		target[fmt.Sprintf("i%06d", i)] = 10
	}
	k := int64(1000)
	for ; k < 1004; k++ {
		for { // a publish staged over several changes, as configd's rounds write it
			c, err := Plan(s, p, target, StartOf(k, w))
			if err != nil {
				b.Fatal(err)
			}
			if c.Empty() {
				break
			}
			apply(s, c)
		}
	}
	if got := s.Sum(1, k+1); got != p.Limit {
		b.Fatalf("window %d holds %d, want %d", k+1, got, p.Limit)
	}
	return s, p, target, k
}

// The costs of one round at n holders: configd's Plan that extends a
// publish, and one that publishes and tops up a raise; Audit over the
// whole ledger; and one holder's Next.
func BenchmarkLedgerAtScale(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		s, p, target, k := steady(b, n)
		b.Run(fmt.Sprintf("Plan/n=%d", n), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				c, err := Plan(s, p, target, StartOf(k+int64(i%2), w))
				if err != nil {
					b.Fatal(err)
				}
				_ = c
			}
		})
		// A raise: the open publish no longer matches, and the windows
		// before the new one are topped up for every holder.
		raised, more := p, make(map[string]int64, n)
		raised.Limit *= 2
		for h, q := range target {
			more[h] = 2 * q
		}
		b.Run(fmt.Sprintf("PlanRaise/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				c, err := Plan(s, raised, more, StartOf(k, w))
				if err != nil || len(c.Grants) == 0 {
					b.Fatal(err, c.Why)
				}
			}
		})
		b.Run(fmt.Sprintf("Audit/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				if vs := Audit(s); len(vs) > 0 {
					b.Fatal(vs)
				}
			}
		})
		h := NewHolder("/l/", "i000000")
		for g := range s.Grants {
			if g.Holder == "i000000" {
				h.View().Grants[g] = s.Grants[g]
			}
		}
		h.View().Head = s.Head
		for seq, pb := range s.Pubs {
			h.View().Pubs[seq] = pb
		}
		b.Run(fmt.Sprintf("HolderNext/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				h.Next(StartOf(k, w), 0)
			}
		})
	}
}
