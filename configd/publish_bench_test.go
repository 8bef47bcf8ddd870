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
// instances (the fair allocation over their demands, the plan's decision,
// and the share records encoded), with what it writes to etcd reported
// per publish (records, bytes, transactions). Run with
// go test -run XXX -bench Publish -benchtime 5x ./configd.
func BenchmarkPublish(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) { benchPublish(b, n) })
	}
}

func benchPublish(b *testing.B, n int) {
	const window = time.Second
	limit := int64(100 * n)
	now := time.Unix(1_800_000_000, 0)
	insts := make([]alloc.Instance, n)
	cur := &plan.Published{Generation: 7, EffectiveFrom: now.Add(-time.Minute), Total: limit, Window: window, ConfigRevision: 3,
		Shares: map[string]int64{}, Granted: map[string]int64{}, Generations: map[string]int64{}, From: map[string]int64{}, At: now.Add(-time.Minute)}
	acked := map[string]plan.Ack{}
	for i := range insts {
		id := fmt.Sprintf("inst-%06d", i)
		insts[i] = alloc.Instance{ID: id, Demand: float64(50 + i%100)}
		cur.Shares[id], cur.Granted[id], cur.Generations[id], cur.From[id] = 100, 100, 7, cur.EffectiveFrom.UnixNano()
		acked[id] = plan.Ack{Generation: 7, From: cur.EffectiveFrom.UnixNano()}
	}
	p := &publisher{keys: schema.DefaultKeys(), log: slog.New(slog.DiscardHandler), replica: "bench"}
	cfg := schema.ProviderConfig{Name: "bench", Limit: limit * 11 / 10, Window: schema.Duration(window)}.WithDefaults()
	var records, bytes int
	b.ResetTimer()
	for range b.N {
		split, err := alloc.Fair(cfg.Limit, 0, insts)
		if err != nil {
			b.Fatal(err)
		}
		target := make(map[string]int64, n)
		for i, in := range insts {
			target[in.ID] = split[i]
		}
		d := plan.Decide(plan.Input{Total: cfg.Limit, Window: window, ConfigRevision: 4, Margin: 100 * time.Millisecond,
			Target: target, Acked: acked, Cur: cur, Now: now})
		if !d.Publish {
			b.Fatal("no publish")
		}
		records, bytes = 0, 0
		for _, r := range p.records("bench", cfg, 4, d, 8, now) {
			v, err := schema.Encode(r)
			if err != nil {
				b.Fatal(err)
			}
			records++
			bytes += len(v)
		}
	}
	b.ReportMetric(float64(records), "records/publish")
	b.ReportMetric(float64(bytes), "bytes/publish")
	b.ReportMetric(float64((records+recordsPerTxn-1)/recordsPerTxn), "txns/publish")
}
