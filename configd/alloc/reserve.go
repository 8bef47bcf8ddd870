package alloc

import (
	"fmt"
	"math"
)

// Reserve splits each priority class's reserve over the instances that
// want the class, and raises their shares to hold what they reserve.
//
// reserves[c] is class c's reserve, in permits per window; wants[c][i]
// is what instance i wants of class c (its reported demand by class).
// Class c's reserve goes to the instances max-min fairly by what each
// wants of it (water-filling), up to what they want in all: a reserve
// nobody wants is not held, so the shares lend it. Fair rather than in
// proportion, a part moves only when a demand below the level moves, not
// with every jitter of the demands above it. got[c][i] is what instance
// i keeps for class c.
//
// shares (one per instance, adding up to at most total) are raised where
// an instance keeps more than its share: from the room total leaves, then
// from the instances whose shares exceed what they keep, in proportion
// to the excess. So the result adds up to at most total, as shares did,
// and each instance's share holds its reserves, as long as the reserves
// add up to at most total. ids, unique, break ties as the algorithms do.
func Reserve(total int64, shares []int64, ids []string, reserves []int64, wants [][]int64) (raised []int64, got [][]int64, err error) {
	n := len(shares)
	if len(ids) != n || len(wants) != len(reserves) {
		return nil, nil, fmt.Errorf("%w: %d shares, %d ids, %d reserves, %d classes of wants", ErrInvalid, n, len(ids), len(reserves), len(wants))
	}
	in := make([]Instance, n)
	for i, id := range ids {
		in[i] = Instance{ID: id}
	}
	order, err := validate(total, 0, in)
	if err != nil {
		return nil, nil, err
	}
	rank := make([]int, n)
	for pos, i := range order {
		rank[i] = pos
	}
	keep := make([]int64, n)
	got = make([][]int64, len(reserves))
	for c, r := range reserves {
		got[c] = make([]int64, n)
		if len(wants[c]) != n || r < 0 {
			return nil, nil, fmt.Errorf("%w: class %d reserves %d for %d wants of %d instances", ErrInvalid, c, r, len(wants[c]), n)
		}
		w, sum := make([]int64, n), int64(0)
		for i, x := range wants[c] {
			w[i] = min(max(x, 0), total) // at most total each: the sum fits
			sum += w[i]
		}
		switch {
		case r >= sum:
			copy(got[c], w)
		case r > 0:
			waterFill(r, w, rank, got[c])
		}
		for i, g := range got[c] {
			keep[i] = min(keep[i]+g, math.MaxInt64/2)
		}
	}
	return lift(total, shares, keep, rank), got, nil
}

// lift raises each share below keep to keep, as far as the room total
// leaves and the excess of the others over their keep allow, taking the
// excess in proportion.
func lift(total int64, shares, keep []int64, rank []int) []int64 {
	out := make([]int64, len(shares))
	var used, need, excess int64
	for i, s := range shares {
		out[i] = s
		used += s
		if s < keep[i] {
			need += keep[i] - s
		} else {
			excess += s - keep[i]
		}
	}
	free := max(total-used, 0)
	take := max(min(need-free, excess), 0) // what the others give up
	room := min(need, free+take)           // what the short ones get
	if room == 0 {
		return out
	}
	if take > 0 {
		over, cut := make([]int64, len(out)), make([]int64, len(out))
		for i, s := range out {
			over[i] = max(s-keep[i], 0)
		}
		apportion(take, excess, over, rank, cut)
		for i := range out {
			out[i] -= cut[i]
		}
	}
	short, add := make([]int64, len(out)), make([]int64, len(out))
	for i, s := range shares {
		short[i] = max(keep[i]-s, 0)
	}
	apportion(room, need, short, rank, add)
	for i := range out {
		out[i] += add[i]
	}
	return out
}
