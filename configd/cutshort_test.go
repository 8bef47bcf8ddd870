package main

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/sluice-go/sluice/configd/plan"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/internal/share"
)

// TestCutShortWindowChangeCountsTheOldRecords: a publish that changes the
// window is written in transactions of 100 records, and can be cut short
// after some of them (an etcd error, a lost leader, a config changed
// meanwhile). The records it did not get to are of the old length. The
// next decision — the same leader retrying, a new leader, another retune
// — must count their instances at what they may admit per window of the
// old length; it read them as the new length (found by review: over by
// 100 in a 2 s window). With the real publisher records, share state and
// plan.
func TestCutShortWindowChangeCountsTheOldRecords(t *testing.T) {
	for _, next := range []string{"retry", "new leader", "another retune"} {
		t.Run(next, func(t *testing.T) { cutShortWindowChange(t, next) })
	}
}

func cutShortWindowChange(t *testing.T, next string) {
	const name = "pay"
	var many []string // a000..a099: the first transaction; y, z: the second
	for i := range 100 {
		many = append(many, fmt.Sprintf("a%03d", i))
	}
	split := func(a, y, z int64) map[string]int64 {
		m := map[string]int64{"y": y, "z": z}
		for _, id := range many {
			m[id] = a
		}
		return m
	}
	cfg := func(limit int64, w time.Duration) schema.ProviderConfig {
		return schema.ProviderConfig{Version: 1, Name: name, Limit: limit, Window: schema.Duration(w)}.WithDefaults()
	}
	p := &publisher{replica: "r1"}
	st := newShareState()
	acks := map[string]plan.Ack{}
	var gen, rev int64
	var published time.Time
	decide := func(c schema.ProviderConfig, cfgRev int64, target, moving map[string]int64, now time.Time) plan.Decision {
		return plan.Decide(plan.Input{Total: c.Limit, Window: c.Window.D(), ConfigRevision: cfgRev, Margin: 200 * time.Millisecond,
			Target: target, Acked: maps.Clone(acks), Cur: st.published(name, published), Moving: moving, Now: now})
	}
	// publish writes d's records, those written() lets through.
	publish := func(c schema.ProviderConfig, cfgRev int64, d plan.Decision, now time.Time, written func(string) bool) {
		gen++
		published = now
		for id, r := range p.records(name, c, cfgRev, d, gen, now) {
			if st.needsWrite(id, r) && written(id) {
				rev++
				st.set(id, shareEntry{r, rev})
			}
		}
	}
	all := func(string) bool { return true }
	ackAll := func() {
		for id, e := range st.records {
			acks[id] = plan.Ack{Generation: e.rec.Generation, From: e.rec.EffectiveFrom}
		}
	}

	// 1100 per 1 s: the a's 9 each, y and z 100.
	now := time.Unix(1_000_000, 0)
	r1 := cfg(1100, time.Second)
	d := decide(r1, 1, split(9, 100, 100), nil, now)
	publish(r1, 1, d, now, all)
	ackAll()
	now = now.Add(5 * time.Second)
	if d := decide(r1, 1, split(9, 100, 100), d.Target, now); d.Publish {
		publish(r1, 1, d, now, all)
		ackAll()
	}

	// 2200 per 2 s, demand moved to z. Only the first transaction is
	// written: y and z keep their records of 100 per 1 s.
	now = now.Add(time.Minute)
	r2 := cfg(2200, 2*time.Second)
	d = decide(r2, 2, split(2, 100, 1900), nil, now)
	if !d.Publish {
		t.Fatalf("the window change: %+v", d)
	}
	publish(r2, 2, d, now, func(id string) bool { return id != "y" && id != "z" })

	// The a's have not acknowledged the new records yet (late records or
	// acknowledgements): each may still admit 9 per 1 s.
	now = now.Add(50 * time.Millisecond)
	limit := int64(2200)
	switch next {
	case "retry":
		d = decide(r2, 2, split(2, 100, 1900), d.Target, now)
	case "new leader":
		now = now.Add(2500 * time.Millisecond)
		d = decide(r2, 2, split(2, 100, 1900), nil, now)
	case "another retune":
		limit = 2300
		d = decide(cfg(limit, 2*time.Second), 3, split(2, 100, 2000), nil, now)
	}
	if !d.Publish {
		t.Fatalf("%s: %+v", next, d)
	}
	// A 2 s window: each a 18, y 200 (its 1 s record), z its new share.
	sum := int64(len(many))*share.In(9, time.Second, 2*time.Second) + share.In(100, time.Second, 2*time.Second) + d.Shares["z"]
	if allowance := max(share.In(1100, time.Second, 2*time.Second), limit); sum > allowance {
		t.Errorf("%s: z grows to %d per 2 s: %d in a 2 s window, over %d by %d", next, d.Shares["z"], sum, allowance, sum-allowance)
	}
}
