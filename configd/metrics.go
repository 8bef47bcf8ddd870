package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are configd's Prometheus metrics, on a registry of its own (embed
// etcd registers its metrics on the default one).
type metrics struct {
	httpRequests    *prometheus.CounterVec
	leader          prometheus.Gauge
	leaderChanges   prometheus.Counter
	providersLed    prometheus.Gauge
	publishes       *prometheus.CounterVec
	publishFailures prometheus.Counter
	publishFailing  *prometheus.GaugeVec
	generation      *prometheus.GaugeVec
	liveInstances   *prometheus.GaugeVec
	total           *prometheus.GaugeVec
	malformed       prometheus.Gauge
	watchEvents     prometheus.Counter
	foreignShares   *prometheus.CounterVec
	damped          *prometheus.CounterVec
	historyPruned   prometheus.Counter
	// The adaptive limit (adaptive.go).
	effective, ceiling *prometheus.GaugeVec
	adaptMoves         *prometheus.CounterVec
	// Foreign keys in the election (see leader.go).
	electionForeign        prometheus.Gauge
	electionForeignRemoved prometheus.Counter
	// configd's own clock (serve's --ntp-server).
	clockKnown, clockOffset, clockUncertainty prometheus.Gauge
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "configd_http_requests_total", Help: "Admin API requests by route and status code.",
		}, []string{"route", "code"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "configd_leader", Help: "1 while this replica leads the election (the oldest live replica; a lone provider goes to it).",
		}),
		providersLed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "configd_providers_led", Help: "Providers this replica leads (holds the owner key of): it publishes their shares.",
		}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "configd_leader_terms_total", Help: "Times this replica became leader.",
		}),
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "configd_shares_published_total", Help: "Shares records published, by provider.",
		}, []string{"provider"}),
		publishFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "configd_shares_publish_failures_total", Help: "Publishes that failed (etcd errors, invalid allocations).",
		}),
		publishFailing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "configd_shares_publish_failing", Help: "1 while the leader's last attempt to publish a provider's shares failed (its log and configd status say why), by provider.",
		}, []string{"provider"}),
		generation: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "configd_shares_generation", Help: "Generation of the shares last published by this replica, by provider.",
		}, []string{"provider"}),
		liveInstances: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "configd_live_instances", Help: "Live instances (instance keys) the leader counts, by provider.",
		}, []string{"provider"}),
		total: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "configd_provider_limit", Help: "Provider limit (permits per window) in force, by provider.",
		}, []string{"provider"}),
		malformed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "configd_malformed_records", Help: "Malformed records in etcd the leader currently ignores.",
		}),
		watchEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "configd_watch_events_total", Help: "Events configd's watch of the providers and of its own keys received: the instances' records and the configs, never the ledgers' records.",
		}),
		foreignShares: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "configd_shares_foreign_writes_total", Help: "Shares records written by someone other than this replica while it led (a forgery or a hand edit), which it published over, by provider.",
		}, []string{"provider"}),
		damped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "configd_shares_damped_total",
			Help: "Recomputed shares not published, by provider and reason: hysteresis (every share within the band of its published value) or rate_limit (deferred to one window after the last publish).",
		}, []string{"provider", "reason"}),
		effective: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "configd_adaptive_limit", Help: "The effective limit the adaptive controller keeps (in shadow mode: would keep), by provider.",
		}, []string{"provider"}),
		ceiling: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "configd_adaptive_ceiling", Help: "The operator's limit an adaptive provider's effective limit stays under, by provider.",
		}, []string{"provider"}),
		adaptMoves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "configd_adaptive_moves_total", Help: "Times the adaptive controller lowered or raised a provider's effective limit, by provider and direction.",
		}, []string{"provider", "direction"}),
		historyPruned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "configd_history_pruned_total", Help: "History entries deleted by retention (--history-keep).",
		}),
		electionForeign: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "configd_election_foreign_keys",
			Help: "Keys under the election prefix that no configd replica holds (no lease, or not a replica's), found by this replica and not removed yet.",
		}),
		electionForeignRemoved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "configd_election_foreign_keys_removed_total",
			Help: "Foreign keys this replica removed from the election prefix (each also logged with why).",
		}),
		clockKnown: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "configd_clock_known", Help: "1 while configd's clock offset is known from NTP (--ntp-server), 0 otherwise.",
		}),
		clockOffset: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "configd_clock_offset_seconds", Help: "configd's measured clock offset (true time minus its clock), by which it corrects its clock.",
		}),
		clockUncertainty: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "configd_clock_uncertainty_seconds", Help: "Uncertainty of configd's clock measurement; publishes take effect that much further ahead.",
		}),
	}
	reg.MustRegister(m.httpRequests, m.leader, m.leaderChanges, m.providersLed, m.publishes, m.publishFailures, m.publishFailing,
		m.generation, m.liveInstances, m.total, m.malformed, m.watchEvents, m.foreignShares, m.damped, m.historyPruned, m.effective, m.ceiling, m.adaptMoves, m.electionForeign, m.electionForeignRemoved,
		m.clockKnown, m.clockOffset, m.clockUncertainty,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// forget drops a deleted provider's series.
func (m *metrics) forget(provider string) {
	m.generation.DeleteLabelValues(provider)
	m.liveInstances.DeleteLabelValues(provider)
	m.total.DeleteLabelValues(provider)
	m.publishes.DeleteLabelValues(provider)
	m.publishFailing.DeleteLabelValues(provider)
	m.foreignShares.DeleteLabelValues(provider)
	m.damped.DeletePartialMatch(prometheus.Labels{"provider": provider})
}
