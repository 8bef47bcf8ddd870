package share

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestIn(t *testing.T) {
	const s, ms = time.Second, time.Millisecond
	tests := []struct {
		q      int64
		per, w time.Duration
		want   int64
	}{
		{100, s, s, 100},
		{100, s, 10 * s, 1000},         // ten windows of 1 s in one of 10 s
		{100, 10 * s, s, 100},          // a 10 s share may land in one second
		{100, 200 * ms, 250 * ms, 300}, // 250 ms overlaps at most 3 windows of 200 ms
		{100, 250 * ms, 200 * ms, 200}, // and 200 ms at most 2 of 250 ms
		{0, s, 10 * s, 0},              // nothing stays nothing
		{math.MaxInt64 / 2, s, time.Hour, math.MaxInt64},
	}
	for _, tt := range tests {
		if got := In(tt.q, tt.per, tt.w); got != tt.want {
			t.Errorf("In(%d, %v, %v) = %d, want %d", tt.q, tt.per, tt.w, got, tt.want)
		}
	}
}

// TestInBoundsEveryPlacement checks In against brute force: q permits per
// aligned window of per, placed anywhere in each, never put more than
// In(q, per, w) into an aligned window of w.
func TestInBoundsEveryPlacement(t *testing.T) {
	lengths := []time.Duration{10, 20, 25, 40, 50, 100} // in ms; all divide 24 h
	r := rand.New(rand.NewPCG(1, 2))
	for _, per := range lengths {
		for _, w := range lengths {
			const q = 7
			span := 20 * lcmInt(int64(per), int64(w)) // whole ms
			// Worst placement: every window of per puts its q permits at one
			// instant; try many random instants per window, and both ends.
			for trial := range 200 {
				count := map[int64]int64{}
				for start := int64(0); start < span; start += int64(per) {
					at := start + r.Int64N(int64(per))
					switch trial % 3 {
					case 0:
						at = start
					case 1:
						at = start + int64(per) - 1
					}
					count[at/int64(w)] += q
				}
				bound := In(q, per*time.Millisecond, w*time.Millisecond)
				for k, n := range count {
					if n > bound {
						t.Fatalf("per %vms, w %vms: aligned window %d holds %d > In = %d", int64(per), int64(w), k, n, bound)
					}
				}
			}
		}
	}
}

func lcmInt(a, b int64) int64 {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return a / x * b
}

func TestWithin(t *testing.T) {
	const s, ms = time.Second, time.Millisecond
	for _, c := range []struct {
		b      int64
		per, w time.Duration
		want   int64
	}{
		{6000, s, 10 * s, 600},        // 600 per second is 6000 per 10 s
		{6000, 10 * s, s, 6000},       // a 10 s share may fall whole into one second
		{100, 200 * ms, 250 * ms, 33}, // three 200 ms windows can meet one of 250 ms
		{0, s, 10 * s, 0},
	} {
		got := Within(c.b, c.per, c.w)
		if got != c.want || In(got, c.per, c.w) > c.b || In(got+1, c.per, c.w) <= c.b && c.b > 0 {
			t.Errorf("Within(%d, %v, %v) = %d, want %d (the largest q with In(q) ≤ b)", c.b, c.per, c.w, got, c.want)
		}
	}
}

func TestBound(t *testing.T) {
	tests := []struct {
		s    Standing
		want int64
	}{
		{Standing{Share: 5, Grant: 9}, 0},                                           // not named: new
		{Standing{Share: 5, Grant: 9, Named: true}, 9},                              // no ack yet
		{Standing{Share: 5, Grant: 9, Named: true, Acked: true}, 9},                 // acked, not in force
		{Standing{Share: 5, Grant: 9, Named: true, InEffect: true}, 9},              // in force, not acked
		{Standing{Share: 5, Grant: 9, Named: true, Acked: true, InEffect: true}, 5}, // applied
		{Standing{Share: 5, Grant: 0, Named: true}, 5},                              // grant below share: share
	}
	for _, tt := range tests {
		if got := Bound(tt.s); got != tt.want {
			t.Errorf("Bound(%+v) = %d, want %d", tt.s, got, tt.want)
		}
	}
}

func TestInForce(t *testing.T) {
	if got := InForce(100, 0); got != 100 {
		t.Errorf("InForce(100, unknown) = %d", got)
	}
	if got := InForce(100, 300); got != 300 {
		t.Errorf("InForce(100, applied late at 300) = %d", got)
	}
}
