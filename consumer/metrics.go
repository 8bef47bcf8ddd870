package consumer

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats is a snapshot of a Consumer's counters since New. Counts are in
// messages unless said otherwise.
type Stats struct {
	Consumed           int64         // messages fetched from Kafka (re-deliveries count again)
	Handled            int64         // messages whose handler returned nil
	Retried            int64         // handler calls that failed and were tried again (RetryAfter answers included)
	DeadLettered       int64         // messages written to the dead-letter topic after their last attempt
	DeadLettersTrimmed int64         // of DeadLettered, those written without part of their message: the whole was too large for the broker
	Abandoned          int64         // messages given up, not committed, delivered again later: at shutdown (drain cut short), or because their partition was revoked (dropped unstarted, or their call cut after the grace)
	Throttled          int64         // permits that took longer than Config.MaxWait (the message still waited and was handled)
	ThrottleWait       time.Duration // total time spent waiting for permits
	InFlight           int64         // messages fetched and not yet committed (≤ Config.MaxInFlight)
	Commits            int64         // offset commits the broker accepted
	CommitErrors       int64         // offset commits that failed (retried at the next commit)
	Rebalances         int64         // consumer group generations joined, the first included
	Lag                int64         // messages behind the partition's end, as of the last fetch (kafka-go's estimate)
}

// counters is the single source of Stats and of the Prometheus metrics.
type counters struct {
	consumed, handled, retried, deadLettered, abandoned, throttled atomic.Int64
	waitNanos, inFlight, commits, commitErrors, rebalances, lag    atomic.Int64
	deadLettersTrimmed                                             atomic.Int64
}

func (c *counters) stats() Stats {
	return Stats{
		Consumed:           c.consumed.Load(),
		Handled:            c.handled.Load(),
		Retried:            c.retried.Load(),
		DeadLettered:       c.deadLettered.Load(),
		DeadLettersTrimmed: c.deadLettersTrimmed.Load(),
		Abandoned:          c.abandoned.Load(),
		Throttled:          c.throttled.Load(),
		ThrottleWait:       time.Duration(c.waitNanos.Load()),
		InFlight:           c.inFlight.Load(),
		Commits:            c.commits.Load(),
		CommitErrors:       c.commitErrors.Load(),
		Rebalances:         c.rebalances.Load(),
		Lag:                c.lag.Load(),
	}
}

// collector exports the counters, plus a histogram of permit waits, as
// Prometheus metrics named sluice_consumer_*, labelled with the topic and
// the group.
type collector struct {
	c        *counters
	wait     prometheus.Histogram
	counterD []*prometheus.Desc // in the order of counterValues
	gaugeD   []*prometheus.Desc // in the order of gaugeValues
}

var counterMetrics = []struct{ name, help string }{
	{"sluice_consumer_consumed_total", "Messages fetched from Kafka (re-deliveries count again)."},
	{"sluice_consumer_handled_total", "Messages whose handler succeeded."},
	{"sluice_consumer_retried_total", "Handler calls that failed and were tried again."},
	{"sluice_consumer_dead_lettered_total", "Messages written to the dead-letter topic."},
	{"sluice_consumer_dead_letters_trimmed_total", "Dead letters written without part of their message (too large for the broker as a whole)."},
	{"sluice_consumer_abandoned_total", "Messages given up at shutdown or because their partition was revoked, to be delivered again."},
	{"sluice_consumer_throttled_total", "Permits that took longer than the configured MaxWait."},
	{"sluice_consumer_throttle_wait_seconds_total", "Total time spent waiting for permits, in seconds."},
	{"sluice_consumer_commits_total", "Offset commits accepted by the broker."},
	{"sluice_consumer_commit_errors_total", "Offset commits that failed."},
	{"sluice_consumer_rebalances_total", "Consumer group generations joined."},
}

var gaugeMetrics = []struct{ name, help string }{
	{"sluice_consumer_in_flight_messages", "Messages fetched and not yet committed."},
	{"sluice_consumer_lag_messages", "Messages behind the end of the partition last fetched from."},
}

func newCollector(c *counters, topic, group string) *collector {
	labels := prometheus.Labels{"topic": topic, "group": group}
	col := &collector{c: c}
	for _, m := range counterMetrics {
		col.counterD = append(col.counterD, prometheus.NewDesc(m.name, m.help, nil, labels))
	}
	for _, m := range gaugeMetrics {
		col.gaugeD = append(col.gaugeD, prometheus.NewDesc(m.name, m.help, nil, labels))
	}
	col.wait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:        "sluice_consumer_permit_wait_seconds",
		Help:        "Time one message waited for its permit, in seconds.",
		ConstLabels: labels,
		Buckets:     prometheus.ExponentialBuckets(0.0001, 4, 10), // 100µs .. ~26s
	})
	return col
}

func (col *collector) counterValues() []float64 {
	c := col.c
	return []float64{
		float64(c.consumed.Load()), float64(c.handled.Load()), float64(c.retried.Load()),
		float64(c.deadLettered.Load()), float64(c.deadLettersTrimmed.Load()), float64(c.abandoned.Load()), float64(c.throttled.Load()),
		time.Duration(c.waitNanos.Load()).Seconds(), float64(c.commits.Load()),
		float64(c.commitErrors.Load()), float64(c.rebalances.Load()),
	}
}

func (col *collector) gaugeValues() []float64 {
	return []float64{float64(col.c.inFlight.Load()), float64(col.c.lag.Load())}
}

// Describe implements prometheus.Collector.
func (col *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range col.counterD {
		ch <- d
	}
	for _, d := range col.gaugeD {
		ch <- d
	}
	col.wait.Describe(ch)
}

// Collect implements prometheus.Collector.
func (col *collector) Collect(ch chan<- prometheus.Metric) {
	for i, v := range col.counterValues() {
		ch <- prometheus.MustNewConstMetric(col.counterD[i], prometheus.CounterValue, v)
	}
	for i, v := range col.gaugeValues() {
		ch <- prometheus.MustNewConstMetric(col.gaugeD[i], prometheus.GaugeValue, v)
	}
	col.wait.Collect(ch)
}

// observeWait records one permit's wait.
func (col *collector) observeWait(d time.Duration) {
	col.c.waitNanos.Add(int64(d))
	col.wait.Observe(d.Seconds())
}
