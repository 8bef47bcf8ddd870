package alloc

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestReserveGoesWhereTheClassIsWanted: critical wants part of its
// reserve of 600 on two of four instances, which a batch flood gave 250
// each: the reserve is split max-min fairly over what they want, and a
// share too small to hold what its instance keeps is raised.
func TestReserveGoesWhereTheClassIsWanted(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	shares := []int64{250, 250, 250, 250}
	wants := [][]int64{{200, 100, 0, 0}, {1000, 1000, 1000, 1000}} // critical, batch
	raised, got, err := Reserve(1000, shares, ids, []int64{600, 0}, wants)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got[0]) != "[200 100 0 0]" {
		t.Errorf("critical keeps %v, want what each wants of it: [200 100 0 0]", got[0])
	}
	if fmt.Sprint(raised) != "[250 250 250 250]" {
		t.Errorf("shares %v, want unchanged: each already holds what it keeps", raised)
	}
	wants[0] = []int64{900, 300, 0, 0}
	raised, got, _ = Reserve(1000, shares, ids, []int64{600, 0}, wants)
	if fmt.Sprint(got[0]) != "[300 300 0 0]" {
		t.Errorf("critical keeps %v, want its 600 split fairly: [300 300 0 0]", got[0])
	}
	// a and b need 50 more each; c and d give it up.
	if fmt.Sprint(raised) != "[300 300 200 200]" {
		t.Errorf("shares %v, want a and b raised to 300 from the others: [300 300 200 200]", raised)
	}
	// Demands that jitter above the fair level move no part.
	for _, w := range [][]int64{{850, 330, 0, 0}, {960, 310, 0, 0}} {
		wants[0] = w
		if _, got, _ = Reserve(1000, shares, ids, []int64{600, 0}, wants); fmt.Sprint(got[0]) != "[300 300 0 0]" {
			t.Errorf("critical wanting %v keeps %v, want [300 300 0 0]", w, got[0])
		}
	}
}

// TestReserveProperties: over random fleets, every class keeps
// min(reserve, wanted) split no more than each instance wants, the
// raised shares add up to at most the total, and each holds what its
// instance keeps when the reserves fit within the total.
func TestReserveProperties(t *testing.T) {
	seed := uint64(rand.Int64())
	rng := rand.New(rand.NewPCG(seed, 1))
	for run := range 2000 {
		n, classes := 1+rng.IntN(12), 1+rng.IntN(4)
		total := rng.Int64N(5000)
		ids := make([]string, n)
		shares := make([]int64, n)
		left := total
		for i := range n {
			ids[i] = fmt.Sprintf("i%02d", rng.IntN(1000)*100+i)
			shares[i] = rng.Int64N(left + 1)
			left -= shares[i]
		}
		if rng.IntN(2) == 0 {
			shares[0] += left // the algorithms hand out the whole total
		}
		reserves := make([]int64, classes)
		rleft := total
		wants := make([][]int64, classes)
		for c := range classes {
			reserves[c] = rng.Int64N(rleft + 1)
			rleft -= reserves[c]
			wants[c] = make([]int64, n)
			for i := range n {
				if rng.IntN(3) > 0 {
					wants[c][i] = rng.Int64N(total + 1)
				}
			}
		}
		raised, got, err := Reserve(total, shares, ids, reserves, wants)
		if err != nil {
			t.Fatalf("seed %d run %d: %v", seed, run, err)
		}
		var sum int64
		keep := make([]int64, n)
		for c := range classes {
			var kept, wanted int64
			for i := range n {
				if got[c][i] > wants[c][i] {
					t.Fatalf("seed %d run %d: class %d keeps %d on %s, which wants %d", seed, run, c, got[c][i], ids[i], wants[c][i])
				}
				kept += got[c][i]
				wanted += wants[c][i]
				keep[i] += got[c][i]
			}
			if kept != min(reserves[c], wanted) {
				t.Fatalf("seed %d run %d: class %d keeps %d, want min(%d, %d)", seed, run, c, kept, reserves[c], wanted)
			}
		}
		for i, r := range raised {
			sum += r
			if r < keep[i] {
				t.Fatalf("seed %d run %d: %s's share %d does not hold the %d it keeps (shares %v, raised %v)", seed, run, ids[i], r, keep[i], shares, raised)
			}
		}
		if sum > total {
			t.Fatalf("seed %d run %d: raised shares add up to %d, over the total %d", seed, run, sum, total)
		}
	}
}
