// Package alloc turns a provider's total and its live instances' demands into
// per-instance shares. It is pure: no I/O, no clock, no randomness, standard
// library only, so configd's leader and the simulator run the very same code.
//
// Two algorithms are offered, selected by name with ByName:
//
//   - "even" (Even): total/N each, the remainder handed out one permit at a
//     time in id order. Demand is ignored.
//   - "fair" (Fair): max-min fairness by water-filling over the demands, with a
//     floor for idle instances, and capacity that nobody wants handed out in
//     proportion to demand so that bursts are absorbed.
//
// Both return integer shares that add up to exactly the total (nothing is
// left unallocated; see each function for the rounding rule), are
// deterministic (the same set of instances in any order gets the same
// shares; ties are broken by id) and are monotonic in the total (raising the
// total never lowers anyone's share). Both run in O(N log N).
//
// Usage:
//
//	algo, err := alloc.ByName(cfg.Algorithm) // "even" or "fair"
//	if err != nil { ... }
//	in := []alloc.Instance{{ID: "a", Demand: 700}, {ID: "b", Demand: 50}}
//	shares, err := algo(1000, alloc.DefaultFloor(1000, len(in)), in)
//	// shares[i] is in[i]'s share, in permits per window.
package alloc

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrUnknownAlgorithm means ByName was given a name other than those
	// listed by Names.
	ErrUnknownAlgorithm = errors.New("alloc: unknown algorithm")

	// ErrInvalid means an argument was out of range: a negative total or
	// floor, an empty or duplicate instance id, or a demand that is negative,
	// NaN or infinite. The message says which instance and what is allowed.
	ErrInvalid = errors.New("alloc: invalid input")
)

// Instance is one live instance as the allocator sees it.
type Instance struct {
	// ID identifies the instance. It must be non-empty and unique within one
	// call; shares and tie-breaks are keyed on it, never on slice order.
	ID string

	// Demand is the number of permits per window the instance wants
	// (smoothed by the instance). It must be finite and ≥ 0. A fractional
	// demand is rounded up (0.2 permits wanted means 1 permit needed); a
	// demand above the total counts as the total.
	Demand float64
}

// Algorithm computes shares: given the provider's total (permits per window,
// ≥ 0), the floor (permits per window, ≥ 0; see DefaultFloor) and the live
// instances, it returns one share per instance, in the order of instances
// (shares[i] belongs to instances[i]). The shares are ≥ 0 and add up to
// exactly total when there is at least one instance. With no instances it
// returns an empty slice. Invalid input returns an error wrapping ErrInvalid
// and no shares. The input slice is not modified.
type Algorithm func(total, floor int64, instances []Instance) ([]int64, error)

// Algorithm names accepted by ByName.
const (
	NameEven = "even"
	NameFair = "fair"
)

// Names returns the algorithm names ByName accepts, sorted.
func Names() []string { return []string{NameEven, NameFair} }

// ByName returns the algorithm called name ("even" or "fair"; exact,
// lower-case). Any other name returns an error wrapping ErrUnknownAlgorithm
// whose message lists the allowed names.
func ByName(name string) (Algorithm, error) {
	switch name {
	case NameEven:
		return Even, nil
	case NameFair:
		return Fair, nil
	}
	return nil, fmt.Errorf("%w %q: allowed are %s", ErrUnknownAlgorithm, name,
		strings.Join(Names(), ", "))
}

// DefaultFloor is the floor this package recommends for n live instances
// sharing total: 1% of an even share, and at least 1 permit, so that an idle
// instance can always admit its first calls and show demand. It returns 0
// when n ≤ 0 or total ≤ 0.
func DefaultFloor(total int64, n int) int64 {
	if n <= 0 || total <= 0 {
		return 0
	}
	return max(1, total/int64(n)/100)
}

// Even splits total evenly: every instance gets ⌊total/N⌋, and the
// remainder (total mod N) goes one permit each to the instances with the
// smallest ids. Demand is ignored and so is floor (an even share is ≥ floor
// whenever total ≥ N·floor). Shares add up to exactly total.
//
// Handing the remainder out by id rather than by slice position keeps the
// result independent of input order, and keeps it monotonic in total: when
// total grows by one, one more instance gets the extra permit, or every
// instance's base grows by one and the extras start over.
func Even(total, floor int64, instances []Instance) ([]int64, error) {
	order, err := validate(total, floor, instances)
	if err != nil {
		return nil, err
	}
	shares := make([]int64, len(instances))
	even(total, order, shares)
	return shares, nil
}

// even fills shares with total split evenly, the remainder going to the
// first instances of order (indexes sorted by id).
func even(total int64, order []int, shares []int64) {
	n := int64(len(shares))
	if n == 0 {
		return
	}
	base, rem := total/n, total%n
	for i := range shares {
		shares[i] = base
	}
	for _, i := range order[:rem] {
		shares[i]++
	}
}

// Fair computes a max-min fair allocation by water-filling, in three steps.
//
//  1. Wants. Instance i wants w_i = min(total, max(⌈Demand_i⌉, floor)): its
//     demand, raised to the floor. The floor is treated as demand, so an idle
//     instance keeps floor permits and can start; nobody gets more than it
//     wants (unless spare capacity is handed out in step 3).
//  2. Water-filling (when Σw_i > total). A level L rises from 0; every
//     instance gets min(w_i, L), L being the largest integer whose
//     allocation fits in total. The remaining permits (fewer than the number
//     of instances still below their wants) go one each to those instances
//     in id order. So an instance that gets less than it wants gets L or L+1,
//     and nobody gets more than L+1: no instance is short while another has
//     more than an equal share. When total ≥ N·floor the level is ≥ floor,
//     so nobody is below the floor.
//  3. Spare (when Σw_i ≤ total). Everyone gets its wants, and the spare
//     capacity is handed out too, in proportion to wants: the shares are
//     total apportioned in proportion to w by the D'Hondt (Jefferson)
//     divisor method, ties by id. Each share is then ≥ w_i. Proportional
//     spare goes where traffic is, which is where a smoothed demand
//     underestimates the next burst (a busy instance's bursts scale with its
//     rate); idle instances still get floor·(total/Σw) ≥ floor. A divisor
//     method is used rather than largest remainders because it is
//     house-monotone (no Alabama paradox): raising total never lowers a
//     share. If every want is 0 (floor 0 and no demand), total is split as by
//     Even.
//
// Shares add up to exactly total; nothing is left unallocated. The result
// depends only on the set of (ID, Demand) pairs, never on their order, and
// is monotonic in total for a given floor (a floor that grows with the
// total, as DefaultFloor's does, can take a permit from a busy instance to
// raise an idle one to its new floor). Time O(N log N), space O(N).
func Fair(total, floor int64, instances []Instance) ([]int64, error) {
	order, err := validate(total, floor, instances)
	if err != nil {
		return nil, err
	}
	n := len(instances)
	shares := make([]int64, n)
	if n == 0 {
		return shares, nil
	}
	// rank[i] is instance i's position in id order: ties compare ranks, not
	// strings.
	rank := make([]int, n)
	for pos, i := range order {
		rank[i] = pos
	}
	wants := make([]int64, n)
	var sum int64 // Σwants while it fits in total
	short := false
	for i, in := range instances {
		wants[i] = want(in.Demand, floor, total)
		if !short {
			if wants[i] > total-sum {
				short = true
			} else {
				sum += wants[i]
			}
		}
	}
	switch {
	case short:
		waterFill(total, wants, rank, shares)
	case sum == 0:
		even(total, order, shares)
	default:
		apportion(total, sum, wants, rank, shares)
	}
	return shares, nil
}

// want converts a demand to an integer want: ⌈demand⌉ raised to floor,
// capped at total.
func want(demand float64, floor, total int64) int64 {
	var w int64
	if demand >= float64(total) {
		w = total
	} else {
		w = int64(math.Ceil(demand))
	}
	return min(max(w, floor), total)
}

// waterFill fills shares with the integer water-filling allocation of total
// over wants, which must add up to more than total.
func waterFill(total int64, wants []int64, rank []int, shares []int64) {
	n := len(wants)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		if c := cmp.Compare(wants[a], wants[b]); c != 0 {
			return c
		}
		return cmp.Compare(rank[a], rank[b])
	})
	rest := total
	for k, i := range order {
		left := int64(n - k)
		level := rest / left
		if wants[i] <= level {
			shares[i] = wants[i]
			rest -= wants[i]
			continue
		}
		// Everyone from here on wants more than the level: give each the
		// level, and the remainder one permit each in id order.
		unsat := order[k:]
		for _, j := range unsat {
			shares[j] = level
		}
		extra := rest - level*left // < left
		if extra > 0 {
			slices.SortFunc(unsat, func(a, b int) int {
				return cmp.Compare(rank[a], rank[b])
			})
			for _, j := range unsat[:extra] {
				shares[j]++
			}
		}
		return
	}
}

// apportion fills shares with total apportioned in proportion to wants by
// the D'Hondt method; sum = Σwants > 0. With total ≤ sum no share exceeds
// its want (a seat goes to the largest quotient, which is ≥ 1 while some
// share is below its want).
//
// D'Hondt hands out seats one by one, each to the instance with the largest
// quotient w_i/(s_i+1) (ties by id). Done naively that is O(total·log N); we
// jump ahead: every quotient ≥ λ = sum/total is among the first total seats,
// which gives s_i = ⌊w_i·total/sum⌋ at once and leaves fewer than N seats,
// handed out by the same greedy rule from a heap.
func apportion(total, sum int64, wants []int64, rank []int, shares []int64) {
	given := int64(0)
	for i, w := range wants {
		shares[i] = mulDiv(w, total, sum)
		given += shares[i]
	}
	rest := total - given // < N
	if rest == 0 {
		return
	}
	h := &seatHeap{idx: make([]int, 0, len(wants)), wants: wants, shares: shares, rank: rank}
	for i, w := range wants {
		if w > 0 {
			h.idx = append(h.idx, i)
		}
	}
	h.init()
	for ; rest > 0; rest-- {
		i := h.idx[0]
		shares[i]++
		h.down(0) // its quotient fell; restore the heap
	}
}

// mulDiv returns ⌊a·b/c⌋ for 0 ≤ a ≤ c, b ≥ 0, c > 0, without overflow.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	q, _ := bits.Div64(hi, lo, uint64(c)) // hi < c because a ≤ c
	return int64(q)
}

// seatHeap is a max-heap of instances by D'Hondt quotient
// wants[i]/(shares[i]+1), ties by smaller id first. Hand-rolled rather than
// container/heap to avoid boxing every comparison through an interface.
type seatHeap struct {
	idx    []int
	wants  []int64
	shares []int64
	rank   []int
}

// before reports whether instance a takes the next seat before b.
func (h *seatHeap) before(a, b int) bool {
	// wants[a]/(shares[a]+1) > wants[b]/(shares[b]+1), in 128-bit integers.
	ah, al := bits.Mul64(uint64(h.wants[a]), uint64(h.shares[b]+1))
	bh, bl := bits.Mul64(uint64(h.wants[b]), uint64(h.shares[a]+1))
	if ah != bh {
		return ah > bh
	}
	if al != bl {
		return al > bl
	}
	return h.rank[a] < h.rank[b]
}

func (h *seatHeap) init() {
	for i := len(h.idx)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *seatHeap) down(i int) {
	n := len(h.idx)
	for {
		best := i
		if l := 2*i + 1; l < n && h.before(h.idx[l], h.idx[best]) {
			best = l
		}
		if r := 2*i + 2; r < n && h.before(h.idx[r], h.idx[best]) {
			best = r
		}
		if best == i {
			return
		}
		h.idx[i], h.idx[best] = h.idx[best], h.idx[i]
		i = best
	}
}

// byID returns the indexes of instances sorted by id.
func byID(instances []Instance) []int {
	order := make([]int, len(instances))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		return strings.Compare(instances[a].ID, instances[b].ID)
	})
	return order
}

// validate checks the arguments common to every algorithm and returns the
// instances' indexes sorted by id.
func validate(total, floor int64, instances []Instance) ([]int, error) {
	if total < 0 {
		return nil, fmt.Errorf("%w: total %d is negative; allowed is ≥ 0 permits per window", ErrInvalid, total)
	}
	if floor < 0 {
		return nil, fmt.Errorf("%w: floor %d is negative; allowed is ≥ 0 permits per window", ErrInvalid, floor)
	}
	for _, in := range instances {
		if in.ID == "" {
			return nil, fmt.Errorf("%w: an instance has an empty id; ids must be non-empty and unique", ErrInvalid)
		}
		if d := in.Demand; math.IsNaN(d) || math.IsInf(d, 0) || d < 0 {
			return nil, fmt.Errorf("%w: instance %q has demand %v; allowed is a finite number ≥ 0", ErrInvalid, in.ID, d)
		}
	}
	order := byID(instances)
	for k := 1; k < len(order); k++ {
		if id := instances[order[k]].ID; id == instances[order[k-1]].ID {
			return nil, fmt.Errorf("%w: instance id %q appears more than once; ids must be unique", ErrInvalid, id)
		}
	}
	return order, nil
}
