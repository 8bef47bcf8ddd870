package metrics_test

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/metrics"
)

func TestCollectorReportsStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, err := limiter.New(2, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		reg := prometheus.NewPedanticRegistry()
		if err := metrics.Register(reg, lim, prometheus.Labels{"provider": "api"}); err != nil {
			t.Fatal(err)
		}
		lim.TryAcquireN(2)
		lim.TryAcquire() // rejected
		if err := lim.Acquire(context.Background(), 2*time.Second); err != nil {
			t.Fatal(err)
		}
		want := `
# HELP sluice_limiter_quota_permits The current window's quota (this instance's share).
# TYPE sluice_limiter_quota_permits gauge
sluice_limiter_quota_permits{provider="api"} 2
# HELP sluice_limiter_wait_seconds Time from reservation to validity of permits that had to wait.
# TYPE sluice_limiter_wait_seconds histogram
sluice_limiter_wait_seconds_bucket{provider="api",le="0.001"} 0
sluice_limiter_wait_seconds_bucket{provider="api",le="0.005"} 0
sluice_limiter_wait_seconds_bucket{provider="api",le="0.01"} 0
sluice_limiter_wait_seconds_bucket{provider="api",le="0.025"} 0
sluice_limiter_wait_seconds_bucket{provider="api",le="0.05"} 0
sluice_limiter_wait_seconds_bucket{provider="api",le="0.1"} 0
sluice_limiter_wait_seconds_bucket{provider="api",le="0.25"} 0
sluice_limiter_wait_seconds_bucket{provider="api",le="0.5"} 0
sluice_limiter_wait_seconds_bucket{provider="api",le="1"} 1
sluice_limiter_wait_seconds_bucket{provider="api",le="2.5"} 1
sluice_limiter_wait_seconds_bucket{provider="api",le="5"} 1
sluice_limiter_wait_seconds_bucket{provider="api",le="10"} 1
sluice_limiter_wait_seconds_bucket{provider="api",le="+Inf"} 1
sluice_limiter_wait_seconds_sum{provider="api"} 1
sluice_limiter_wait_seconds_count{provider="api"} 1
`
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_limiter_quota_permits", "sluice_limiter_wait_seconds"); err != nil {
			t.Error(err)
		}
		for outcome, v := range map[string]float64{"admitted": 3, "rejected": 1, "delayed": 1, "timed_out": 0} {
			m, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, f := range m {
				if f.GetName() != "sluice_limiter_permits_total" {
					continue
				}
				for _, mm := range f.GetMetric() {
					for _, lp := range mm.GetLabel() {
						if lp.GetName() == "outcome" && lp.GetValue() == outcome {
							found = true
							if got := mm.GetCounter().GetValue(); got != v {
								t.Errorf("permits_total{outcome=%q} = %v, want %v", outcome, got, v)
							}
						}
					}
				}
			}
			if !found {
				t.Errorf("no permits_total{outcome=%q}", outcome)
			}
		}
	})
}

func TestCollectorReportsClasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, err := limiter.New(10, time.Second, limiter.WithClasses(limiter.Class{Name: "critical", Reserve: 6}, limiter.Class{Name: "batch"}))
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		reg := prometheus.NewPedanticRegistry()
		if err := metrics.Register(reg, lim, prometheus.Labels{"provider": "api"}); err != nil {
			t.Fatal(err)
		}
		for lim.TryAcquire() {
		}
		want := `
# HELP sluice_limiter_class_permits_total Permits of a priority class by outcome: admitted, refused (TryAcquire refused, or timed out), canceled.
# TYPE sluice_limiter_class_permits_total counter
sluice_limiter_class_permits_total{class="batch",outcome="admitted",provider="api"} 4
sluice_limiter_class_permits_total{class="batch",outcome="canceled",provider="api"} 0
sluice_limiter_class_permits_total{class="batch",outcome="refused",provider="api"} 1
sluice_limiter_class_permits_total{class="critical",outcome="admitted",provider="api"} 0
sluice_limiter_class_permits_total{class="critical",outcome="canceled",provider="api"} 0
sluice_limiter_class_permits_total{class="critical",outcome="refused",provider="api"} 0
# HELP sluice_limiter_class_reserve_permits Permits the current window keeps for a priority class (its reserve, scaled to the quota).
# TYPE sluice_limiter_class_reserve_permits gauge
sluice_limiter_class_reserve_permits{class="batch",provider="api"} 0
sluice_limiter_class_reserve_permits{class="critical",provider="api"} 6
# HELP sluice_limiter_class_used_permits Permits a priority class took of the current window, promised ones included.
# TYPE sluice_limiter_class_used_permits gauge
sluice_limiter_class_used_permits{class="batch",provider="api"} 4
sluice_limiter_class_used_permits{class="critical",provider="api"} 0
`
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_limiter_class_permits_total", "sluice_limiter_class_reserve_permits", "sluice_limiter_class_used_permits"); err != nil {
			t.Error(err)
		}
	})
}
