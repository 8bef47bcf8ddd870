package main

import (
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var ownerSeed = flag.Uint64("owner.seed", 0, "replay TestBalance with this seed (0: a new one)")

// converge runs every replica's balance, in random order, on one view of
// the owner keys until none of them changes anything: what the replicas
// reach once their views agree.
func converge(t *testing.T, rng *rand.Rand, replicas []int64, providers []string, owners map[string]int64) {
	t.Helper()
	for round := 0; ; round++ {
		if round > 10*len(providers)+10 {
			t.Fatalf("no fixpoint after %d rounds: owners %v", round, owners)
		}
		changed := false
		for _, i := range rng.Perm(len(replicas)) {
			self := replicas[i]
			acquire, release := balance(self, replicas, providers, owners)
			for _, p := range release {
				if owners[p] != self {
					t.Fatalf("replica %d releases %s, owned by %d", self, p, owners[p])
				}
				delete(owners, p)
				changed = true
			}
			for _, p := range acquire {
				if _, taken := owners[p]; !taken { // the owner key's create-if-absent
					owners[p] = self
					changed = true
				}
			}
		}
		if !changed {
			return
		}
	}
}

// checkBalanced: every provider led by one live replica, each leading its
// fair share, rounded down or up.
func checkBalanced(t *testing.T, replicas []int64, providers []string, owners map[string]int64) {
	t.Helper()
	count := map[int64]int{}
	for _, p := range providers {
		o, ok := owners[p]
		if !ok || !slices.Contains(replicas, o) {
			t.Fatalf("provider %s has no live owner (%d, %v)", p, o, ok)
		}
		count[o]++
	}
	lo, hi := len(providers)/len(replicas), (len(providers)+len(replicas)-1)/len(replicas)
	for _, r := range replicas {
		if n := count[r]; n > hi || n < lo {
			t.Fatalf("replica %d leads %d providers, outside its fair share [%d, %d]: %v", r, n, lo, hi, count)
		}
	}
}

// TestBalance: over random fleets, the replicas' assignment converges to
// every provider led by exactly one live replica, none over its fair
// share; a lone provider goes to the oldest replica; a new replica takes
// providers only from others to itself; a replica's failure moves only
// its providers.
func TestBalance(t *testing.T) {
	seed := *ownerSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test ./configd -run TestBalance -owner.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	for round := range 300 {
		nr, np := 1+rng.IntN(5), rng.IntN(80)
		replicas := make([]int64, nr)
		for i := range replicas {
			replicas[i] = int64(100 + i) // the oldest first
		}
		providers := make([]string, np)
		for i := range providers {
			providers[i] = fmt.Sprintf("p%03d", rng.IntN(1000))
		}
		slices.Sort(providers)
		providers = slices.Compact(providers)
		owners := map[string]int64{}
		converge(t, rng, replicas, providers, owners)
		checkBalanced(t, replicas, providers, owners)
		if len(providers) == 1 && owners[providers[0]] != replicas[0] {
			t.Fatalf("round %d: the lone provider went to %d, not the oldest replica %d", round, owners[providers[0]], replicas[0])
		}

		// A replica joins.
		before := maps.Clone(owners)
		joined := int64(100 + nr)
		replicas = append(replicas, joined)
		converge(t, rng, replicas, providers, owners)
		checkBalanced(t, replicas, providers, owners)
		for p, o := range owners {
			if o != before[p] && o != joined {
				t.Fatalf("round %d: %s moved from %d to %d, not to the new replica %d", round, p, before[p], o, joined)
			}
		}

		// A replica fails: its owner keys go with its session.
		gone := replicas[rng.IntN(len(replicas))]
		replicas = slices.DeleteFunc(replicas, func(r int64) bool { return r == gone })
		if len(replicas) == 0 {
			continue
		}
		before = maps.Clone(owners)
		maps.DeleteFunc(owners, func(_ string, o int64) bool { return o == gone })
		converge(t, rng, replicas, providers, owners)
		checkBalanced(t, replicas, providers, owners)
		for p, o := range owners {
			if before[p] != gone && o != before[p] {
				t.Fatalf("round %d: %s moved from %d to %d though only %d failed", round, p, before[p], o, gone)
			}
		}
	}
}

// A replica not in the election yet acquires nothing.
func TestBalanceNotLive(t *testing.T) {
	if a, r := balance(7, []int64{1, 2}, []string{"x", "y"}, nil); a != nil || r != nil {
		t.Fatalf("acquire %v release %v", a, r)
	}
}
