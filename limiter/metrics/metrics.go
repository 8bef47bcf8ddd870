// Package metrics exposes a limiter's Stats as Prometheus metrics.
//
// The limiter itself keeps plain counters and knows nothing of Prometheus;
// this package reads them when Prometheus scrapes, so the hot path pays
// nothing for metrics. Nothing is registered globally: pass your registry.
//
//	reg := prometheus.NewRegistry()
//	if err := metrics.Register(reg, lim, prometheus.Labels{"provider": "payments-api"}); err != nil {
//		return err
//	}
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice/limiter"
)

// Namespace prefixes every metric name.
const Namespace = "sluice"

// Collector is a prometheus.Collector over one Limiter's Stats.
type Collector struct {
	lim   *limiter.Limiter
	descs map[string]*prometheus.Desc
}

// Metric names, without the namespace; deploy/ alerts and dashboards use
// them.
const (
	PermitsTotal   = "permits_total"             // counter, label outcome
	WaitSeconds    = "wait_seconds"              // histogram of reservation waits
	Waiting        = "waiting_permits"           // gauge
	Quota          = "quota_permits"             // gauge: the current window's quota
	Remaining      = "remaining_permits"         // gauge
	WindowSeconds  = "window_seconds"            // gauge
	ClockOffset    = "clock_offset_seconds"      // gauge
	Shadow         = "shadow_mode"               // gauge 0/1
	BackoffSeconds = "backoff_remaining_seconds" // gauge

	// Per priority class (limiter.WithClasses), label class; none for a
	// limiter without classes.
	ClassPermitsTotal = "class_permits_total"   // counter, labels class and outcome (ClassOutcomes)
	ClassReserve      = "class_reserve_permits" // gauge: what the current window keeps for the class
	ClassUsed         = "class_used_permits"    // gauge: what the class took of the current window
)

// Outcomes are the values of the outcome label of PermitsTotal.
var Outcomes = []string{"admitted", "delayed", "rejected", "timed_out", "canceled", "shadow_delayed", "shadow_rejected", "wasted"}

// ClassOutcomes are the values of the outcome label of ClassPermitsTotal:
// admitted, refused (TryAcquire refused, or timed out) and canceled.
var ClassOutcomes = []string{"admitted", "refused", "canceled"}

// New returns a Collector for lim whose metrics carry the constant labels
// given (for example the provider and instance).
func New(lim *limiter.Limiter, labels prometheus.Labels) *Collector {
	d := func(name, help string, variable ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "limiter", name), help, variable, labels)
	}
	return &Collector{lim: lim, descs: map[string]*prometheus.Desc{
		PermitsTotal:   d(PermitsTotal, "Permits by outcome: admitted (at once or after waiting), delayed (had to wait), rejected (TryAcquire refused), timed_out, canceled, shadow_delayed and shadow_rejected (admitted by shadow mode), wasted (paced slots unused).", "outcome"),
		WaitSeconds:    d(WaitSeconds, "Time from reservation to validity of permits that had to wait."),
		Waiting:        d(Waiting, "Permits reserved by waiters and not yet valid."),
		Quota:          d(Quota, "The current window's quota (this instance's share)."),
		Remaining:      d(Remaining, "Permits the current window can still admit."),
		WindowSeconds:  d(WindowSeconds, "Window length."),
		ClockOffset:    d(ClockOffset, "Correction added to the clock (NTP offset)."),
		Shadow:         d(Shadow, "1 in shadow mode (admit everything, count what would be refused), else 0."),
		BackoffSeconds: d(BackoffSeconds, "Time left of a provider-requested backoff; 0 if none."),

		ClassPermitsTotal: d(ClassPermitsTotal, "Permits of a priority class by outcome: admitted, refused (TryAcquire refused, or timed out), canceled.", "class", "outcome"),
		ClassReserve:      d(ClassReserve, "Permits the current window keeps for a priority class (its reserve, scaled to the quota).", "class"),
		ClassUsed:         d(ClassUsed, "Permits a priority class took of the current window, promised ones included.", "class"),
	}}
}

// Register registers a Collector for lim on reg.
func Register(reg prometheus.Registerer, lim *limiter.Limiter, labels prometheus.Labels) error {
	return reg.Register(New(lim, labels))
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.lim.Stats()
	counter := func(v int64, outcome string) {
		ch <- prometheus.MustNewConstMetric(c.descs[PermitsTotal], prometheus.CounterValue, float64(v), outcome)
	}
	counter(st.Admitted, "admitted")
	counter(st.Delayed, "delayed")
	counter(st.Rejected, "rejected")
	counter(st.TimedOut, "timed_out")
	counter(st.Canceled, "canceled")
	counter(st.ShadowDelayed, "shadow_delayed")
	counter(st.ShadowRejected, "shadow_rejected")
	counter(st.Wasted, "wasted")

	buckets := map[float64]uint64{}
	var cum, count uint64
	for i, ub := range limiter.WaitBuckets() {
		cum += uint64(st.WaitHistogram[i])
		buckets[ub.Seconds()] = cum
	}
	for _, n := range st.WaitHistogram {
		count += uint64(n)
	}
	ch <- prometheus.MustNewConstHistogram(c.descs[WaitSeconds], count, st.WaitTotal.Seconds(), buckets)

	gauge := func(name string, v float64) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.GaugeValue, v)
	}
	gauge(Waiting, float64(st.WaitingPermits))
	gauge(Quota, float64(st.Quota))
	gauge(Remaining, float64(st.Remaining))
	gauge(WindowSeconds, st.Window.Seconds())
	gauge(ClockOffset, st.ClockOffset.Seconds())
	shadow := 0.0
	if st.Shadow {
		shadow = 1
	}
	gauge(Shadow, shadow)
	backoff := 0.0
	if !st.BackoffUntil.IsZero() {
		backoff = max(0, st.BackoffUntil.Sub(c.lim.Now()).Seconds())
	}
	gauge(BackoffSeconds, backoff)

	for _, cs := range st.Classes {
		for outcome, v := range map[string]int64{"admitted": cs.Admitted, "refused": cs.Refused, "canceled": cs.Canceled} {
			ch <- prometheus.MustNewConstMetric(c.descs[ClassPermitsTotal], prometheus.CounterValue, float64(v), cs.Name, outcome)
		}
		ch <- prometheus.MustNewConstMetric(c.descs[ClassReserve], prometheus.GaugeValue, float64(cs.Reserve), cs.Name)
		ch <- prometheus.MustNewConstMetric(c.descs[ClassUsed], prometheus.GaugeValue, float64(cs.Used), cs.Name)
	}
}
