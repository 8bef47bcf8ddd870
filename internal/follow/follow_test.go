package follow

import (
	"testing"
	"time"
)

func TestSchedule(t *testing.T) {
	const w = int64(time.Second)
	margin := 200 * time.Millisecond
	shares := func(q int64) Applied { return Applied{Source: "shares", Quota: q, Window: time.Second} }
	even := func(q int64) Applied { return Applied{Source: "even", Quota: q, Window: time.Second} }
	now := 10*w + 900*int64(time.Millisecond) // the next boundary is closer than the margin
	cases := []struct {
		name       string
		prev, next Applied
		at         int64
		want       Step
	}{
		{"a share at its own boundary", shares(10), shares(20), 11 * w, Step{From: 11 * w}},
		{"a share without a boundary", shares(10), shares(20), 0, Step{From: 12 * w}},
		{"even to even", even(10), even(20), 0, Step{From: 12 * w}},
		{"the first quota", Applied{}, shares(20), 11 * w, Step{From: 11 * w}},
		{"even to shares: the smaller at once, the share from a boundary the margin ahead",
			even(100), shares(300), 11 * w, Step{Cut: true, Interim: 100, From: 12 * w}},
		{"shares to even", shares(300), even(100), 0, Step{Cut: true, Interim: 100, From: 12 * w}},
		{"a share published further ahead keeps its boundary", even(100), shares(50), 15 * w, Step{Cut: true, Interim: 50, From: 15 * w}},
		{"fallback to shares in another window", Applied{Source: "fallback", Quota: 5, Window: time.Minute}, shares(20), 11 * w, Step{From: 11 * w}},
		// Late: the boundary has passed (issue 12, hole 7).
		{"a late shrink applies at once", shares(20), shares(10), 10 * w, Step{From: 10 * w}},
		{"a late growth waits for the next boundary", shares(10), shares(20), 10 * w, Step{From: 11 * w}},
		{"a late growth at the very boundary waits too", shares(10), shares(20), now, Step{From: 11 * w}},
		// Found by the protocol search: a restarted process of the same id
		// applied its late share at once, on top of what the process
		// before it had spent in the window.
		{"a new process's first quota, late", Applied{}, shares(20), 10 * w, Step{From: 11 * w}},
		// Found by the protocol search: on the even split, an instance
		// took the grant of a record published from 14 s at 12 s, while
		// the others enforced the shares it replaced until 13 s.
		{"even capped by a grant: not before the grant's boundary", even(10), even(20), 14 * w, Step{From: 14 * w}},
		{"even capped by an old grant: the margin still holds", even(10), even(20), 3 * w, Step{From: 12 * w}},
		{"shares to even, growing, capped by a grant ahead", shares(10), even(20), 14 * w, Step{Cut: true, Interim: 10, From: 14 * w}},
		// Found by the protocol search on the first fix: a grant from a
		// configd whose clock was minutes ahead held the even split's
		// shrink back until its boundary.
		{"an even shrink never waits for its grant's boundary", even(30), even(20), 354 * w, Step{From: 12 * w}},
		{"shares to even, shrinking, capped by a grant ahead", shares(30), even(20), 354 * w, Step{Cut: true, Interim: 20, From: 12 * w}},
	}
	for _, c := range cases {
		cur := InForce{Quota: c.prev.Quota, Window: c.prev.Window}
		if got := Schedule(c.prev, c.next, cur, c.at, now, margin); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	// Found by the protocol search: with configd's clock ahead, 498 was
	// applied from a boundary minutes away while the limiter still
	// enforced 3; a late 303 was taken for a shrink of 498 and applied at
	// once, 300 more in the window under way. What counts is what is in
	// force now.
	cur := InForce{Quota: 3, Window: time.Second}
	if got := Schedule(shares(498), shares(303), cur, 10*w, now, margin); got != (Step{From: 11 * w}) {
		t.Errorf("a late 303 over 3 in force (498 scheduled ahead): %+v, want from the next boundary", got)
	}
	if got := Schedule(shares(498), even(400), cur, 0, now, margin); got.Interim != 3 {
		t.Errorf("a switch of source with 3 in force and 498 scheduled: interim %d, want 3", got.Interim)
	}
}

// Next picks the source as the member's rules say.
func TestNext(t *testing.T) {
	fb := Applied{Source: SourceFallback, Quota: 3, Window: time.Minute}
	cfg := &Config{Limit: 100, Window: time.Second}
	sh := &Shares{Generation: 4, EffectiveFrom: 7, Window: time.Second, Share: 30}
	cases := []struct {
		name string
		v    View
		want Applied
	}{
		{"no config", View{Leader: true, Shares: sh}, fb},
		{"configd's share", View{Config: cfg, Leader: true, Shares: sh}, Applied{Source: SourceShares, Quota: 30, Window: time.Second, Generation: 4, At: 7}},
		{"configd alive, nothing published", View{Config: cfg, Leader: true}, Applied{Source: SourceShares, Window: time.Second}},
		{"no configd: the even split", View{Config: cfg, Shares: sh, Even: 25}, Applied{Source: SourceEven, Quota: 25, Window: time.Second}},
		{"no configd: the even split, capped by a grant from 9", View{Config: cfg, Shares: sh, Even: 25, EvenFrom: 9}, Applied{Source: SourceEven, Quota: 25, Window: time.Second, At: 9}},
		// Found by the protocol search: scaled to 10 s at the same rate, a
		// 1 s share of 30 became 300 per 10 s, all of which could fall
		// into one second, on every instance at once.
		{"window changed, not republished: the record as it is", View{Config: &Config{Limit: 1000, Window: 10 * time.Second}, Leader: true, Shares: sh},
			Applied{Source: SourceShares, Quota: 30, Window: time.Second, Generation: 4, At: 7}},
	}
	for _, c := range cases {
		if got := Next(c.v, fb); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestNextBoundary(t *testing.T) {
	for _, c := range []struct{ t, w, want int64 }{
		{0, 10, 0}, {1, 10, 10}, {10, 10, 10}, {11, 10, 20}, {-1, 10, 0}, {-11, 10, -10},
	} {
		if got := NextBoundary(c.t, c.w); got != c.want {
			t.Errorf("NextBoundary(%d, %d) = %d, want %d", c.t, c.w, got, c.want)
		}
	}
}

func TestDue(t *testing.T) {
	base := Record{Demand: 1000, Generation: 3}
	with := func(f func(*Record)) Record { r := base; f(&r); return r }
	cases := []struct {
		name string
		cur  Record
		want bool
	}{
		{"unchanged", base, false},
		{"demand +2%", with(func(r *Record) { r.Demand = 1020 }), false},
		{"demand +2.1%", with(func(r *Record) { r.Demand = 1021 }), true},
		{"demand −3%", with(func(r *Record) { r.Demand = 970 }), true},
		{"generation", with(func(r *Record) { r.Generation = 4 }), true},
		{"offset 1ms", with(func(r *Record) { r.ClockOffset = time.Millisecond }), false},
		{"offset 2ms", with(func(r *Record) { r.ClockOffset = -2 * time.Millisecond }), true},
		{"clock known", with(func(r *Record) { r.ClockKnown = true }), true},
		{"enforced (a clock cut)", with(func(r *Record) { r.Enforced = 1 }), true},
		{"source", with(func(r *Record) { r.Source = SourceEven }), true},
	}
	for _, c := range cases {
		if got := Due(base, c.cur, time.Second, time.Second); got != c.want {
			t.Errorf("%s: Due = %v, want %v", c.name, got, c.want)
		}
	}
	// One permit is never meaningful, however small the demand.
	if Meaningful(Record{Demand: 1}, Record{Demand: 2}) || !Meaningful(Record{Demand: 1}, Record{Demand: 3}) {
		t.Errorf("small demands: a change of one permit counts, or one of two does not")
	}
	if !Due(base, base, RefreshEvery*time.Second, time.Second) || Due(base, base, RefreshEvery*time.Second-1, time.Second) {
		t.Errorf("an unchanged record is not refreshed after exactly %d intervals", RefreshEvery)
	}
}
