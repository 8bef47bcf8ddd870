package plan

import (
	"maps"
	"testing"
	"time"
)

func TestHysteresis(t *testing.T) {
	tests := []struct {
		total int64
		n     int
		want  int64
	}{
		{0, 0, 1}, {1, 1, 1}, {150, 3, 1}, {199, 3, 1}, {200, 3, 2}, {300, 3, 3},
		{1_000_000, 3, 10_000}, {1_000_000, 10, 10_000}, {1_000_000, 1000, 100}, {100_000, 1000, 10},
	}
	for _, tt := range tests {
		if got := Hysteresis(tt.total, tt.n); got != tt.want {
			t.Errorf("Hysteresis(%d, %d) = %d, want %d", tt.total, tt.n, got, tt.want)
		}
	}
}

// TestDamp: what is published at once, what waits for the window, and
// what is dropped as jitter.
func TestDamp(t *testing.T) {
	w := time.Second
	last := time.Unix(1000, 0)
	const rev = 7
	cur := &Published{Total: 300, Window: w, ConfigRevision: rev, At: last,
		Shares: map[string]int64{"a": 10, "b": 40, "c": 250}}
	with := func(kv ...any) map[string]int64 {
		m := maps.Clone(cur.Shares)
		for i := 0; i < len(kv); i += 2 {
			if v := kv[i+1].(int); v < 0 {
				delete(m, kv[i].(string))
			} else {
				m[kv[i].(string)] = int64(v)
			}
		}
		return m
	}
	late, soon := last.Add(w), last.Add(w-time.Millisecond)
	cases := []struct {
		name      string
		cur       *Published
		total     int64
		window    time.Duration
		cfgRev    int64
		target    map[string]int64
		now       time.Time
		want      string
		wantRetry time.Time
	}{
		{"nothing published", nil, 300, w, rev, cur.Shares, soon, "", time.Time{}},
		{"same", cur, 300, w, rev, cur.Shares, soon, unchanged, time.Time{}},
		{"join", cur, 300, w, rev, with("c", 200, "d", 50), soon, "", time.Time{}},
		{"leave", cur, 300, w, rev, with("a", -1, "c", 260), soon, "", time.Time{}},
		{"replaced", cur, 300, w, rev, with("a", -1, "d", 10), soon, "", time.Time{}},
		{"retune", cur, 301, w, rev, with("c", 251), soon, "", time.Time{}},
		{"new window", cur, 300, 2 * w, rev, cur.Shares, soon, "", time.Time{}},
		{"config changed", cur, 300, w, rev + 1, with("a", 11, "c", 249), soon, "", time.Time{}},
		{"jitter of 3 = 1% of 300", cur, 300, w, rev, with("b", 43, "c", 247), late, DampedHysteresis, time.Time{}},
		{"move of 4, a window on", cur, 300, w, rev, with("b", 44, "c", 246), late, "", time.Time{}},
		{"move of 4, within the window", cur, 300, w, rev, with("b", 44, "c", 246), soon, DampedRate, late},
	}
	for _, c := range cases {
		got, retry := damp(c.cur, c.total, c.window, c.cfgRev, c.target, c.now)
		if got != c.want || !retry.Equal(c.wantRetry) {
			t.Errorf("%s: damp = %q, %v; want %q, %v", c.name, got, retry, c.want, c.wantRetry)
		}
	}
	// Small totals: the band is one permit.
	small := &Published{Total: 50, Window: w, ConfigRevision: rev, At: last, Shares: map[string]int64{"a": 25, "b": 25}}
	if got, _ := damp(small, 50, w, rev, map[string]int64{"a": 24, "b": 26}, late); got != DampedHysteresis {
		t.Errorf("move of 1 of 50: %q, want hysteresis", got)
	}
	if got, _ := damp(small, 50, w, rev, map[string]int64{"a": 23, "b": 27}, late); got != "" {
		t.Errorf("move of 2 of 50: %q, want published", got)
	}
}

func TestBoundsFollowAcknowledgements(t *testing.T) {
	from := time.Unix(100, 0)
	cur := &Published{
		Generation: 5, EffectiveFrom: from, Window: time.Second, Total: 100,
		Shares:  map[string]int64{"a": 50, "b": 0},
		Granted: map[string]int64{"a": 100, "b": 0},
	}
	live := map[string]int64{"a": 0, "b": 0, "new": 0}
	acked := map[string]int64{"a": 5, "b": 4}
	b := func(now time.Time) map[string]int64 { return bounds(cur, live, acked, now, Planner{}.bound()) }
	if before := b(from.Add(-time.Millisecond)); before["a"] != 100 {
		t.Errorf("acknowledged but not yet in effect: bound %d, want the grant 100", before["a"])
	}
	if after := b(from); after["a"] != 50 || after["b"] != 0 || after["new"] != 0 || len(after) != 3 {
		t.Errorf("bounds in effect = %v, want a 50, b 0, new 0", after)
	}
	acked["a"] = 4
	if got := b(from.Add(time.Hour)); got["a"] != 100 {
		t.Errorf("not acknowledged: bound %d, want the grant 100 however late", got["a"])
	}
	// A record from before grants: its shares are the grants.
	cur.Granted = nil
	if got := b(from.Add(time.Hour)); got["a"] != 50 {
		t.Errorf("no grants, not acknowledged: bound %d, want the share 50", got["a"])
	}
}

func TestNextBoundary(t *testing.T) {
	w := time.Second
	cases := []struct{ t, want int64 }{
		{0, 0}, {1, int64(w)}, {int64(w), int64(w)}, {int64(w) + 1, 2 * int64(w)},
	}
	for _, c := range cases {
		if got := NextBoundary(time.Unix(0, c.t), w); got.UnixNano() != c.want {
			t.Errorf("NextBoundary(%d) = %d, want %d", c.t, got.UnixNano(), c.want)
		}
	}
}

// TestDecideHandover follows one move through its publishes: the first
// shrinks a and leaves b waiting; a later demand jitter within the band
// does not replace the target; once a has acknowledged and the publish is
// in effect, b grows, although its growth alone is within the band and
// comes within a window of the last publish.
func TestDecideHandover(t *testing.T) {
	w, margin := time.Second, 200*time.Millisecond
	t0 := time.Unix(1000, 0)
	in := Input{
		Total: 1000, Window: w, ConfigRevision: 1, Margin: margin,
		Target: map[string]int64{"a": 900, "b": 100},
		Acked:  map[string]int64{},
		Now:    t0,
	}
	// 1. Nothing published: the target at once (no bounds yet).
	d := Decide(in)
	if !d.Publish || !maps.Equal(d.Shares, in.Target) || !d.EffectiveFrom.Equal(t0.Add(w)) {
		t.Fatalf("first publish: %+v", d)
	}
	cur := &Published{Generation: 1, EffectiveFrom: d.EffectiveFrom, Total: 1000, Window: w, ConfigRevision: 1,
		Shares: d.Shares, Granted: d.Granted, At: t0}
	in.Cur, in.Moving, in.Acked = cur, d.Target, map[string]int64{"a": 1, "b": 1}

	// 2. Demand moves, two and a half windows later (in effect,
	// acknowledged): a shrinks at once, b waits for a's acknowledgement.
	in.Now = t0.Add(2*w + w/2)
	in.Target = map[string]int64{"a": 100, "b": 900}
	d = Decide(in)
	if !d.Publish || d.Shares["a"] != 100 || d.Shares["b"] != 100 || d.Granted["a"] != 900 || d.Due != (time.Time{}) {
		t.Fatalf("shrink: %+v", d)
	}
	if !d.EffectiveFrom.Equal(t0.Add(3 * w)) {
		t.Errorf("shrink effective from %v, want the next boundary %v", d.EffectiveFrom, t0.Add(3*w))
	}
	cur = &Published{Generation: 2, EffectiveFrom: d.EffectiveFrom, Total: 1000, Window: w, ConfigRevision: 1,
		Shares: d.Shares, Granted: d.Granted, At: in.Now}
	in.Cur, in.Moving = cur, d.Target

	// 3. a acknowledges before the boundary; the target jitters within the
	// band meanwhile: nothing to publish yet, due at the boundary, and the
	// target under way is kept.
	in.Acked = map[string]int64{"a": 2, "b": 2}
	in.Now = t0.Add(2*w + w/2 + 100*time.Millisecond)
	in.Target = map[string]int64{"a": 105, "b": 895}
	d = Decide(in)
	if d.Publish || d.Damped != "" || !d.Due.Equal(cur.EffectiveFrom) || !maps.Equal(d.Target, in.Moving) {
		t.Fatalf("waiting for the boundary: %+v", d)
	}

	// 4. At the boundary, within a window of the last publish: b grows to
	// the target under way.
	in.Now = cur.EffectiveFrom
	d = Decide(in)
	if !d.Publish || d.Shares["a"] != 100 || d.Shares["b"] != 900 || d.Damped != "" {
		t.Fatalf("growth: %+v", d)
	}
	cur = &Published{Generation: 3, EffectiveFrom: d.EffectiveFrom, Total: 1000, Window: w, ConfigRevision: 1,
		Shares: d.Shares, Granted: d.Granted, At: in.Now}
	in.Cur, in.Moving = cur, d.Target

	// 5. The same jitter again, now nothing is under way: dropped as
	// hysteresis; a move beyond the band within the window waits for it.
	in.Now = cur.At.Add(w / 2)
	if d = Decide(in); d.Publish || d.Damped != DampedHysteresis {
		t.Errorf("jitter after the move: %+v, want hysteresis", d)
	}
	in.Target = map[string]int64{"a": 300, "b": 700}
	if d = Decide(in); d.Publish || d.Damped != DampedRate || !d.Due.Equal(cur.At.Add(w)) || !maps.Equal(d.Target, in.Moving) {
		t.Errorf("move within the window: %+v, want rate_limit due %v", d, cur.At.Add(w))
	}
	// A malformed record in etcd is rewritten even when nothing moved.
	in.Target = cur.Shares
	if d = Decide(in); d.Publish {
		t.Errorf("unchanged: %+v", d)
	}
	in.Rewrite = true
	if d = Decide(in); !d.Publish || !maps.Equal(d.Shares, cur.Shares) {
		t.Errorf("rewrite: %+v", d)
	}
}

// TestPlannerHooks: a Planner's functions replace alloc's.
func TestPlannerHooks(t *testing.T) {
	greedy := func(total int64, target, bound map[string]int64) (map[string]int64, map[string]int64) {
		return maps.Clone(target), maps.Clone(target)
	}
	cur := &Published{Generation: 1, EffectiveFrom: time.Unix(10, 0), Total: 10, Window: time.Second, ConfigRevision: 1,
		Shares: map[string]int64{"a": 10, "b": 0}, Granted: map[string]int64{"a": 10, "b": 0}, At: time.Unix(9, 0)}
	in := Input{Total: 10, Window: time.Second, ConfigRevision: 1, Cur: cur, Now: time.Unix(20, 0),
		Target: map[string]int64{"a": 0, "b": 10}}
	if d := Decide(in); d.Shares["b"] != 0 {
		t.Errorf("alloc's handover grew b before a acknowledged: %v", d.Shares)
	}
	if d := (Planner{Handover: greedy}).Decide(in); d.Shares["b"] != 10 {
		t.Errorf("the greedy handover was not used: %v", d.Shares)
	}
}

// TestHeld: the share of an instance whose lease expired stays taken while
// it is held, is published in Granted (so a new leader holds it too), and
// is handed out once the hold ends.
func TestHeld(t *testing.T) {
	w := time.Second
	now := time.Unix(1000, 0).Add(300 * time.Millisecond)
	cur := &Published{Generation: 4, EffectiveFrom: time.Unix(990, 0), Total: 300, Window: w, ConfigRevision: 7,
		At: time.Unix(989, 0), Shares: map[string]int64{"a": 100, "b": 100, "c": 100}, Granted: map[string]int64{"a": 100, "b": 100, "c": 100}}
	in := Input{Total: 300, Window: w, ConfigRevision: 7, Margin: 200 * time.Millisecond,
		Target: map[string]int64{"a": 150, "b": 150}, Acked: map[string]int64{"a": 4, "b": 4}, Cur: cur, Now: now}

	held := in
	held.Held = map[string]int64{"c": 100, "a": 7} // a is live: ignored
	d := Decide(held)
	if !d.Publish || !maps.Equal(d.Shares, map[string]int64{"a": 100, "b": 100}) ||
		!maps.Equal(d.Granted, map[string]int64{"a": 100, "b": 100, "c": 100}) {
		t.Fatalf("while c is held: %+v; want shares a=b=100 and c's 100 still granted", d)
	}

	// The same hold again, once that is published: nothing to do.
	after := &Published{Generation: 5, EffectiveFrom: d.EffectiveFrom, Total: 300, Window: w, ConfigRevision: 7,
		At: now, Shares: d.Shares, Granted: d.Granted}
	again := held
	again.Cur, again.Acked, again.Moving, again.Now = after, map[string]int64{"a": 5, "b": 5}, d.Target, d.EffectiveFrom.Add(time.Millisecond)
	if d2 := Decide(again); d2.Publish {
		t.Errorf("the same hold republished: %+v", d2)
	}

	// The hold ends: c's share goes to the others.
	free := again
	free.Held = nil
	d3 := Decide(free)
	if !d3.Publish || !maps.Equal(d3.Shares, map[string]int64{"a": 150, "b": 150}) || d3.Granted["c"] != 0 {
		t.Errorf("after the hold: %+v; want a=b=150 and nothing granted to c", d3)
	}

	// The hold ends while every target stays what is published (nobody
	// wants c's share yet): the grants are published all the same, so
	// that the share is free for a later move and a new leader does not
	// hold it again (a review finding).
	idle := again
	idle.Held = nil
	idle.Target = map[string]int64{"a": 100, "b": 100}
	idle.Moving = nil
	if d := Decide(idle); !d.Publish || d.Granted["c"] != 0 || !maps.Equal(d.Shares, map[string]int64{"a": 100, "b": 100}) {
		t.Errorf("a hold ending with the targets unchanged: %+v; want a publish without c's grant", d)
	}

	// Without any hold (a graceful leave), c's share is handed out at once.
	if d := Decide(in); !d.Publish || !maps.Equal(d.Shares, map[string]int64{"a": 150, "b": 150}) {
		t.Errorf("without a hold: %+v; want a=b=150 at once", d)
	}
}
