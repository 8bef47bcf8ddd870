package follow

import (
	"testing"
	"time"
)

// TestEvenShare: the even split's rules (even.go), one step at a
// time. Each instance knows only the counts it polls and its own grant.
func TestEvenShare(t *testing.T) {
	const limit, hold = 90, 10 * time.Second
	t0 := time.Unix(1000, 0)
	longAgo := t0.Add(-time.Hour)
	cases := []struct {
		name       string
		polls      [][3]int64 // seconds after t0, live, confirmed
		grant      int64
		registered time.Time
		at         time.Duration // after t0
		want       int64
	}{
		{"no poll yet: the grant", nil, 60, longAgo, 0, 60},
		{"not everyone confirmed: capped by the grant", [][3]int64{{0, 3, 2}, {10, 3, 2}}, 20, longAgo, 10 * time.Second, 20},
		{"not everyone confirmed, a grant above limit/n", [][3]int64{{0, 3, 2}, {10, 3, 2}}, 60, longAgo, 10 * time.Second, 30},
		{"configd gone less than a hold: capped", [][3]int64{{0, 3, 3}}, 0, longAgo, 9 * time.Second, 0},
		{"everyone confirmed for a hold: limit/n", [][3]int64{{0, 3, 3}}, 0, longAgo, 10 * time.Second, 30},
		{"an unconfirmed poll within the hold: capped", [][3]int64{{0, 3, 2}, {5, 2, 2}}, 0, longAgo, 10 * time.Second, 0},
		{"an unconfirmed poll before the hold: limit/n", [][3]int64{{0, 3, 2}, {5, 2, 2}, {12, 2, 2}}, 0, longAgo, 12 * time.Second, 45},
		{"a newcomer waits a hold", [][3]int64{{0, 3, 3}, {10, 3, 3}}, 0, t0.Add(5 * time.Second), 10 * time.Second, 0},
		{"a newcomer after a hold", [][3]int64{{0, 3, 3}, {10, 3, 3}}, 0, t0, 10 * time.Second, 30},
		{"a count that fell is held up", [][3]int64{{0, 3, 3}, {5, 2, 2}}, 0, longAgo, 10 * time.Second, 30},
		{"a count that fell, then held up no more", [][3]int64{{0, 3, 3}, {5, 2, 2}, {11, 2, 2}}, 0, longAgo, 11 * time.Second, 45},
		{"a count that rose counts at once", [][3]int64{{0, 2, 2}, {10, 3, 3}}, 90, longAgo, 10 * time.Second, 30},
	}
	for _, tc := range cases {
		var e Even
		for _, p := range tc.polls {
			e.Observe(t0.Add(time.Duration(p[0])*time.Second), p[1], p[2], hold)
		}
		if got := e.Share(limit, tc.grant, tc.registered, t0.Add(tc.at), hold); got != tc.want {
			t.Errorf("%s: share %d, want %d", tc.name, got, tc.want)
		}
	}
	// configd back: everything forgotten.
	var e Even
	e.Observe(t0, 3, 3, hold)
	e.Reset()
	if !e.since.IsZero() || e.Count() != 1 {
		t.Errorf("after reset: %+v", e)
	}
}
