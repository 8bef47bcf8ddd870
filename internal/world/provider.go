package world

import (
	"encoding/json"
	"time"

	"github.com/sluice-go/sluice/configd/adapt"
	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/limiter"
)

// provider is what the members call in an adaptive history
// (Config.Adaptive): a service that enforces a hidden limit of its own per
// aligned window of true time, answers the calls beyond it with a
// pushback and a Retry-After to the end of its window and, when it says
// remaining, tells every call the room left in its window with the time
// to its reset. Each member hands every answer to its real limiter
// (limiter.Observe), whose counters its report carries; configd's leader
// runs the real controller (adapt.Tally, adapt.Config.Step) on those
// reports and writes the effective limit as the config's limit.
type provider struct {
	ctl      adapt.Config
	limit    int64 // the hidden limit: it moves while faults are drawn
	says     bool  // it says remaining and reset on every answer
	accepted map[int64]int64
	refused  int64
	pause    time.Time // the controller's pause, stored with the config
	// changes is every effective limit configd wrote, in order of true
	// time, the first being the ceiling at the start.
	changes []limitChange
}

type limitChange struct {
	at    int64
	limit int64
}

func newProvider(w *World) *provider {
	p := &provider{ctl: adapt.DefaultConfig(w.cfg.Limit, w.cfg.Window), limit: w.cfg.Limit,
		says: w.rng.IntN(2) == 0, accepted: map[int64]int64{}}
	p.changes = []limitChange{{w.now, w.cfg.Limit}}
	return p
}

// call is n calls of m, admitted by its limiter at true time now.
func (w *World) call(m *member, n int64) {
	p := w.prov
	k := ledger.WindowOf(w.now, w.window)
	left := time.Duration(ledger.StartOf(k+1, w.window) - w.now)
	for range n {
		ok := p.accepted[k] < p.limit
		s := limiter.Signal{Pushback: !ok}
		if ok {
			p.accepted[k]++
		} else {
			p.refused++
			s.RetryAfter = left
		}
		if p.says {
			s.Remaining, s.HasRemaining, s.Reset = max(p.limit-p.accepted[k], 0), true, left
		}
		m.lim.Observe(s)
	}
}

// moveProvider draws the provider's next hidden limit: from a fifth of
// the ceiling to a fifth above it.
func (w *World) moveProvider() {
	c := w.prov.ctl.Ceiling
	w.prov.limit = c/5 + w.rng.Int64N(c)
	w.tracef("the provider's limit is %d", w.prov.limit)
}

// report is a member's record: its demand and what its limiter says of
// the provider's answers.
type report struct {
	Demand      int64 `json:"demand"`
	Started     int64 `json:"started"` // true time its incarnation began
	Enforced    int64 `json:"enforced"`
	Pushbacks   int64 `json:"pushbacks"`
	RetryUntil  int64 `json:"retry_until"`  // Unix ns on its clock; 0: none
	Remaining   int64 `json:"remaining"`    // of the window that ended at RemainingAt
	RemainingAt int64 `json:"remaining_at"` // Unix ns on its clock; 0: none
	// ClassDemand is what it wants of each class (Config.Critical).
	ClassDemand map[string]int64 `json:"class_demand,omitempty"`
}

func (m *member) record() []byte {
	rep := report{Demand: m.demand + m.critical, Started: m.started}
	if m.w.cfg.Critical > 0 {
		rep.ClassDemand = map[string]int64{"critical": m.critical, "batch": m.demand}
	}
	if m.w.prov != nil {
		st := m.lim.Stats()
		rep.Enforced, rep.Pushbacks, rep.Remaining = st.Quota, st.Pushbacks, st.ProviderRemaining
		if !st.RetryUntil.IsZero() {
			rep.RetryUntil = st.RetryUntil.UnixNano()
		}
		if !st.ProviderWindowEnd.IsZero() {
			rep.RemainingAt = st.ProviderWindowEnd.UnixNano()
		}
	}
	b, _ := json.Marshal(rep) // a struct of integers: no error
	return b
}

// adapt runs one round of the controller on the reports in etcd, as
// configd's leader does, and writes a moved limit as the config's.
func (r *replica) adapt() {
	w := r.w
	p := w.prov
	if r.tally == nil {
		r.tally, r.state = &adapt.Tally{}, p.ctl.Start()
	}
	// The stored config is the truth: another replica may have moved it.
	r.state.Limit, r.state.PauseUntil = w.limit, p.pause
	var reps []adapt.Report
	keys, kvs, _ := w.etcd.get("I/")
	for _, k := range keys {
		var rep report
		if err := json.Unmarshal(kvs[k].value, &rep); err != nil {
			w.fail("replica %d: the record %s: %v", r.id, k, err)
			return
		}
		reps = append(reps, adapt.Report{ID: k, Started: time.Unix(0, rep.Started), Pushbacks: rep.Pushbacks,
			Enforced: rep.Enforced, Demand: rep.Demand, RetryUntil: unixOrZero(rep.RetryUntil),
			Remaining: rep.Remaining, RemainingAt: unixOrZero(rep.RemainingAt)})
	}
	rd, ok := r.tally.Round(time.Unix(0, r.clock()), w.window, reps)
	if !ok {
		r.state.Last = rd.At
		return
	}
	next, why := p.ctl.Step(r.state, rd)
	r.state = next
	if why == "" {
		return
	}
	if next.Limit < p.ctl.Floor || next.Limit > p.ctl.Ceiling {
		w.fail("replica %d: the controller set %d, outside [%d, %d]", r.id, next.Limit, p.ctl.Floor, p.ctl.Ceiling)
	}
	w.tracef("replica %d adapts: %s", r.id, why)
	p.pause = next.PauseUntil
	w.setLimit(next.Limit)
}

func unixOrZero(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// leastSince returns the least limit in force from t until now.
func (p *provider) leastSince(t int64) int64 {
	least := p.changes[0].limit
	for _, c := range p.changes {
		if c.at <= t {
			least = c.limit // the one in force at t
		} else {
			least = min(least, c.limit)
		}
	}
	return least
}

// setLimit makes limit the config's limit from now.
func (w *World) setLimit(limit int64) {
	w.limit = limit
	if w.prov != nil && limit != w.prov.changes[len(w.prov.changes)-1].limit {
		w.prov.changes = append(w.prov.changes, limitChange{w.now, limit})
	}
}

// checkEffective checks what an adaptive history admitted against the
// ceiling: no window of the provider's over it, ever, whatever limits the
// controller wrote. That no window goes over a lowered effective limit
// once in force is checkWindows' oracle: configd plans with the effective
// limit, and the ledger puts a lowering in force from the first window
// its grants fit under; the windows before it keep the older limit, and
// may be topped up under it seconds after the lowering.
func (w *World) checkEffective() {
	p := w.prov
	win := w.cfg.Window
	for k, n := range w.admitted[win] {
		if n > p.ctl.Ceiling {
			w.fail("window %d (at %.3fs) admitted %d, over the ceiling %d", k, float64(ledger.StartOf(k, win)-epoch)/1e9, n, p.ctl.Ceiling)
		}
	}
}
