package cluster

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names of a Member's collector; deploy/ alerts and dashboards use
// them. Pair it with limiter/metrics for the limiter's own counters.
const (
	MetricConnected        = "sluice_member_connected"                 // 1 while etcd is reachable and the view current
	MetricShare            = "sluice_member_share_permits"             // the share enforced
	MetricTotal            = "sluice_member_total_permits"             // the provider's limit
	MetricInstances        = "sluice_member_instances"                 // live instances the even split counts
	MetricGeneration       = "sluice_member_generation"                // shares generation applied
	MetricDemand           = "sluice_member_demand_permits"            // smoothed permits wanted per window
	MetricClockKnown       = "sluice_member_clock_known"               // 1 while the NTP offset is known
	MetricClockUncertainty = "sluice_member_clock_uncertainty_seconds" // the measurement's uncertainty
	MetricMalformed        = "sluice_member_malformed_records"         // records in etcd ignored as malformed
	MetricSource           = "sluice_member_source"                    // 1 for the share's source (label source)
)

// Sources are the values of the source label of MetricSource: every
// source a Member's Status may name.
var Sources = []string{"fallback", "even", "shares", "budget", "ledger", "lapsed"}

type collector struct {
	m     *Member
	descs map[string]*prometheus.Desc
}

// NewCollector returns a Prometheus collector over m's Status, with the
// constant labels given. Register it on your own registry; nothing is
// registered globally.
func NewCollector(m *Member, labels prometheus.Labels) prometheus.Collector {
	d := func(name, help string, variable ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, variable, labels)
	}
	return &collector{m: m, descs: map[string]*prometheus.Desc{
		MetricConnected:        d(MetricConnected, "1 while the member has a live etcd lease and a current view; 0 while etcd is unreachable and the last share is kept (fail-static)."),
		MetricShare:            d(MetricShare, "The share enforced, in permits per window."),
		MetricTotal:            d(MetricTotal, "The provider's limit, in permits per window."),
		MetricInstances:        d(MetricInstances, "Live instances of the provider the even split counts (0 while following configd's shares)."),
		MetricGeneration:       d(MetricGeneration, "The shares generation applied (0: none)."),
		MetricDemand:           d(MetricDemand, "Smoothed permits per window this instance asked for, as reported."),
		MetricClockKnown:       d(MetricClockKnown, "1 while the clock offset is known from NTP, else 0."),
		MetricClockUncertainty: d(MetricClockUncertainty, "Uncertainty of the clock offset measurement."),
		MetricMalformed:        d(MetricMalformed, "Records found malformed in etcd and ignored (the last good value is kept), and foreign keys in configd's election, not taken for a live configd."),
		MetricSource:           d(MetricSource, "1 for where the share comes from: fallback, even (no configd alive), shares (published by configd), budget (taken from a counter), ledger (granted in the provider's ledger) or lapsed (the last share lapsed while etcd was out of reach).", "source"),
	}}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.m.Status()
	g := func(name string, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.GaugeValue, v, lv...)
	}
	b := func(ok bool) float64 {
		if ok {
			return 1
		}
		return 0
	}
	g(MetricConnected, b(st.Connected))
	g(MetricShare, float64(st.Share))
	g(MetricTotal, float64(st.Total))
	g(MetricInstances, float64(st.Instances))
	g(MetricGeneration, float64(st.Generation))
	g(MetricDemand, float64(st.Demand))
	if c.m.cfg.clock != nil {
		// Without a monitor the clock is trusted, not unknown: no series.
		g(MetricClockKnown, b(st.ClockKnown))
		g(MetricClockUncertainty, st.ClockUncertainty.Seconds())
	}
	g(MetricMalformed, float64(len(st.Problems)))
	for _, s := range Sources {
		g(MetricSource, b(st.Source == s), s)
	}
}
