package agent

import (
	"sort"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// The operations counted per caller.
const (
	opAcquire = iota
	opTryAcquire
	opReserve
	opCancel
	opSettle
	numOps
)

var opNames = [numOps]string{"acquire", "try_acquire", "reserve", "cancel", "settle"}

// reasonIndex numbers the outcomes a tally counts: "" (granted) first.
var reasonNames = []string{"", ReasonTimeout, ReasonNoQuota, ReasonCanceled, ReasonClosed, ReasonInvalid,
	ReasonBadRequest, ReasonProviderNotAllowed, ReasonTooManyProviders, ReasonUnknownGrant, ReasonNotYetValid, ReasonInternal}

var reasonIndex = func() map[string]int {
	m := map[string]int{}
	for i, r := range reasonNames {
		m[r] = i
	}
	return m
}()

// tally counts one caller's requests to one provider, by operation and
// outcome. Counting takes no lock.
type tally struct {
	provider, caller string
	n                [numOps][12]atomic.Int64
}

func (t *tally) count(op int, err error) {
	i, ok := reasonIndex[Reason(err)]
	if !ok {
		i = reasonIndex[ReasonInternal]
	}
	t.n[op][i].Add(1)
}

// Unknown and other name the tallies of requests that named no provider
// the agent holds, and of callers beyond MaxCallers.
const (
	unknownProvider = "_unknown"
	otherCaller     = "_other"
	unnamedCaller   = "_unnamed"
)

type callerKey struct{ provider, caller string }

// callers holds the tallies, at most max distinct caller names (the rest
// share otherCaller), so that a caller naming itself anew on every request
// cannot grow the agent's memory or its metrics.
type callers struct {
	max  int
	mu   sync.RWMutex
	m    map[callerKey]*tally
	seen map[string]bool // caller names counted by name
	unk  *tally
}

func (c *callers) init(max int) {
	c.max = max
	c.m = map[callerKey]*tally{}
	c.seen = map[string]bool{}
	c.unk = &tally{provider: unknownProvider, caller: otherCaller}
}

func (c *callers) unknown() *tally { return c.unk }

func (c *callers) get(provider, caller string) *tally {
	if caller == "" {
		caller = unnamedCaller
	}
	k := callerKey{provider, caller}
	c.mu.RLock()
	t := c.m[k]
	c.mu.RUnlock()
	if t != nil {
		return t
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.seen[caller] {
		if len(c.seen) >= c.max {
			k.caller = otherCaller
		} else {
			c.seen[caller] = true
		}
	}
	if t = c.m[k]; t == nil {
		t = &tally{provider: k.provider, caller: k.caller}
		c.m[k] = t
	}
	return t
}

func (c *callers) all() []*tally {
	c.mu.RLock()
	out := make([]*tally, 0, len(c.m)+1)
	for _, t := range c.m {
		out = append(out, t)
	}
	c.mu.RUnlock()
	out = append(out, c.unk)
	sort.Slice(out, func(i, j int) bool {
		if out[i].provider != out[j].provider {
			return out[i].provider < out[j].provider
		}
		return out[i].caller < out[j].caller
	})
	return out
}

// CallerStatus is one caller's counts with one provider: per operation,
// per outcome ("OK" or a reason).
type CallerStatus struct {
	Provider string                      `json:"provider"`
	Caller   string                      `json:"caller"`
	Counts   map[string]map[string]int64 `json:"counts"`
}

func (t *tally) status() (CallerStatus, bool) {
	cs := CallerStatus{Provider: t.provider, Caller: t.caller, Counts: map[string]map[string]int64{}}
	for op := range numOps {
		for i, r := range reasonNames {
			if n := t.n[op][i].Load(); n > 0 {
				if r == "" {
					r = "OK"
				}
				if cs.Counts[opNames[op]] == nil {
					cs.Counts[opNames[op]] = map[string]int64{}
				}
				cs.Counts[opNames[op]][r] = n
			}
		}
	}
	return cs, len(cs.Counts) > 0
}

// MetricRequests counts requests per provider, caller, operation and
// outcome ("ok" or the reason in lower case).
const MetricRequests = "sluice_agent_requests_total"

var requestsDesc = prometheus.NewDesc(MetricRequests,
	"Requests to the agent, per provider, caller, operation and outcome (ok, or why it was refused).",
	[]string{"provider", "caller", "op", "outcome"}, nil)

// callerCollector exports the tallies: no lock or map lookup on the
// request path beyond finding the tally.
type callerCollector struct{ a *Agent }

func (c *callerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- requestsDesc }

func (c *callerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, t := range c.a.callers.all() {
		for op := range numOps {
			for i, r := range reasonNames {
				n := t.n[op][i].Load()
				if n == 0 {
					continue
				}
				out := "ok"
				if r != "" {
					out = lower(r)
				}
				ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.CounterValue, float64(n), t.provider, t.caller, opNames[op], out)
			}
		}
	}
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
