package main

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-go/sluice/configd/alloc"
	"github.com/sluice-go/sluice/configd/plan"
	"github.com/sluice-go/sluice/internal/schema"
)

// BenchmarkPublish is the leader's work for one publish at fleet sizes this
// machine cannot run as processes: a retune that moves every share of N
// instances (the allocation, the plan's decision, the layout of the
// writes and the records encoded), from a fleet whose last publish is in
// etcd as configd would have written it, with what the publish writes to
// etcd reported per publish (keys, bytes, transactions). With equal
// shares (even) the instances follow the common record and a retune
// writes it alone; with shares by demand (fair) most differ. Run with
// go test -run XXX -bench Publish -benchtime 5x ./configd.
func BenchmarkPublish(b *testing.B) {
	for _, algo := range []schema.Algorithm{schema.AlgorithmEven, schema.AlgorithmFair} {
		for _, n := range []int{1_000, 10_000, 100_000} {
			b.Run(fmt.Sprintf("%s/N=%d", algo, n), func(b *testing.B) { benchPublish(b, algo, n) })
		}
	}
}

func benchPublish(b *testing.B, algo schema.Algorithm, n int) {
	const window = time.Second
	limit := int64(100 * n)
	now := time.Unix(1_800_000_000, 0)
	p := &publisher{keys: schema.DefaultKeys(), log: slog.New(slog.DiscardHandler), replica: "bench"}
	cfg := schema.ProviderConfig{Name: "bench", Limit: limit, Window: schema.Duration(window), Algorithm: algo}.WithDefaults()
	recs := make([]schema.InstanceRecord, n)
	acked := map[string]plan.Ack{}
	for i := range recs {
		recs[i] = schema.InstanceRecord{ID: fmt.Sprintf("inst-%06d", i), Demand: int64(50 + i%100), AppliedGeneration: 7, ReadsCommon: true}
		acked[recs[i].ID] = plan.Ack{Generation: 7, From: now.Add(-time.Minute).UnixNano()}
	}
	// The fleet as the last publish left it: every share in force and
	// acknowledged, the records in etcd as its layout wrote them.
	split, err := alloc.Split(cfg, recs)
	if err != nil {
		b.Fatal(err)
	}
	last := plan.Decision{Shares: split, Granted: split, EffectiveFrom: now.Add(-time.Minute)}
	s := newShareState()
	w := s.layout(p.records("bench", cfg, 3, last, 7, now.Add(-time.Minute)), func(string) bool { return true })
	for _, x := range w.first {
		s.landed(x, 10)
	}
	if w.common != nil {
		s.commonLanded(*w.common, 11)
	}
	for _, x := range w.then {
		s.landed(x, 12)
	}
	cur := s.published("bench", now.Add(-time.Minute))
	retuned := cfg
	retuned.Limit = limit * 11 / 10
	var keys, bytes, txns int
	b.ResetTimer()
	for range b.N {
		target, err := alloc.Split(retuned, recs)
		if err != nil {
			b.Fatal(err)
		}
		d := plan.Decide(plan.Input{Total: retuned.Limit, Window: window, ConfigRevision: 4, Margin: 100 * time.Millisecond,
			Target: target, Acked: acked, Cur: cur, Now: now})
		if !d.Publish {
			b.Fatal("no publish")
		}
		w := s.layout(p.records("bench", retuned, 4, d, 8, now), func(string) bool { return true })
		keys, bytes, txns = w.ops(), 0, 0
		for _, step := range [][]shareWrite{w.first, w.then} {
			for _, x := range step {
				if x.rec != nil {
					v, err := schema.Encode(*x.rec)
					if err != nil {
						b.Fatal(err)
					}
					bytes += len(v)
				}
			}
			txns += (len(step) + recordsPerTxn - 1) / recordsPerTxn
		}
		if w.common != nil {
			v, err := schema.Encode(*w.common)
			if err != nil {
				b.Fatal(err)
			}
			bytes += len(v)
			txns++
		}
	}
	b.ReportMetric(float64(keys), "keys/publish")
	b.ReportMetric(float64(bytes), "bytes/publish")
	b.ReportMetric(float64(txns), "txns/publish")
}
