package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/internal/ledger"
	ledgerstore "github.com/sluice-go/sluice/internal/ledger/store"
	"github.com/sluice-go/sluice/internal/schema"
)

// auditView is the answer of audit: a provider's coordination and, for a
// ledger provider, its ledgers: its own, then its lane providers' in
// lane order.
type auditView struct {
	Provider     string              `json:"provider"`
	Coordination schema.Coordination `json:"coordination"`
	Ledgers      []ledgerView        `json:"ledgers"` // empty for the shares: nothing to audit
}

// ledgerView is one limit's ledger (package internal/ledger) as audit and
// status show it: the fullest window from the current one on against the
// limit in force there, every way the ledger breaks its invariant, and
// the records that do not decode.
type ledgerView struct {
	Provider string `json:"provider"` // whose ledger: the provider or a lane provider
	Revision int64  `json:"revision"` // the etcd revision it was read at
	// Era numbers the current era; 0 when none is written: nothing is
	// granted, and the fields below are zero.
	Era     int64           `json:"era"`
	Window  schema.Duration `json:"window,omitempty"` // the length of the era's windows
	Fullest int64           `json:"fullest"`          // the index of the fullest window from the current one on
	Start   time.Time       `json:"start,omitzero"`   // when it starts
	Sum     int64           `json:"sum"`              // what the grants add up to in it
	Limit   int64           `json:"limit"`            // the limit in force in it
	// Grants is what each holder may admit in the window under way, by
	// the grants and releases stored: what status shows per instance.
	Grants map[string]int64 `json:"grants,omitempty"`
	// Violations are every window, past or to come, where the ledger
	// breaks its invariant (ledger.Audit).
	Violations []violationView `json:"violations,omitempty"`
	// Bad are the records that do not decode. Each counts no room here,
	// nor for the instances, and configd writes nothing to the ledger
	// while one is there.
	Bad []malformedView `json:"bad,omitempty"`
	// Budget is, for a budget (schema.IsBudget), what was taken of it in
	// the window under way: a budget is taken from its counter in
	// transactions conditioned on it, not granted, so its ledger is
	// empty unless an earlier limit of its name left grants.
	Budget *budgetView `json:"budget,omitempty"`
}

// budgetView is a budget's counter of the window under way.
type budgetView struct {
	Start time.Time `json:"start"`
	Taken int64     `json:"taken"`
	Limit int64     `json:"limit"`
}

// violationView is one ledger.Violation, and when its window starts
// (zero: its era is not in the head).
type violationView struct {
	Era    int64     `json:"era"`
	Window int64     `json:"window"`
	Start  time.Time `json:"start,omitzero"`
	Sum    int64     `json:"sum"`
	Limit  int64     `json:"limit"`
	Reason string    `json:"reason"`
}

func (v violationView) String() string {
	if v.Start.IsZero() {
		return fmt.Sprintf("era %d, window %d: %s", v.Era, v.Window, v.Reason)
	}
	return fmt.Sprintf("era %d, window %d from %s: %s", v.Era, v.Window, v.Start.UTC().Format(time.RFC3339Nano), v.Reason)
}

// over reports whether the ledger breaks its invariant anywhere.
func (v ledgerView) over() bool { return len(v.Violations) > 0 || v.Sum > v.Limit }

// verdict is "OVER" when the ledger breaks its invariant, else "ok".
func (v ledgerView) verdict() string {
	if v.over() {
		return "OVER"
	}
	return "ok"
}

// says is the ledger in one line, as status and the console show it.
func (v ledgerView) says() string {
	if v.Era == 0 {
		return fmt.Sprintf("nothing granted yet (%s)", v.verdict())
	}
	s := fmt.Sprintf("fullest upcoming window %d of %d (%s): window %d from %s, era %d",
		v.Sum, v.Limit, v.verdict(), v.Fullest, v.Start.UTC().Format(time.RFC3339Nano), v.Era)
	if len(v.Violations) > 0 {
		x := v.Violations[0]
		s += fmt.Sprintf("; over first in window %d of era %d: see configd audit", x.Window, x.Era)
	}
	return s
}

// audit reads the ledgers of provider name, its own and its lane
// providers', retired lanes included: their grants stay until they end;
// for a budget, its counter. A provider coordinated by the shares has
// none.
func (s *store) audit(ctx context.Context, name string) (auditView, error) {
	p, err := s.get(ctx, name)
	if err != nil {
		return auditView{}, err
	}
	c := p.Config
	out := auditView{Provider: name, Coordination: cmp.Or(c.Coordination, schema.CoordinationShares), Ledgers: []ledgerView{}}
	if !c.Ledger() {
		return out, nil
	}
	limits := []schema.ProviderConfig{c}
	for _, l := range c.Lanes {
		if l.Retired && schema.IsBudget(l.Window.D()) {
			continue // what was taken of it admits nothing more
		}
		limits = append(limits, l.Derive(c))
	}
	for _, l := range limits {
		v, err := s.limitView(ctx, l)
		if err != nil {
			return auditView{}, err
		}
		out.Ledgers = append(out.Ledgers, v)
	}
	return out, nil
}

// limitView reads the ledger of limit c (a provider or a lane provider),
// and its counter when it is a budget.
func (s *store) limitView(ctx context.Context, c schema.ProviderConfig) (ledgerView, error) {
	v, err := s.readLedger(ctx, c.Name)
	if err != nil || !c.Budget() {
		return v, err
	}
	r, bad, err := s.budgetCounter(ctx, c.Name, c.Window)
	if err != nil {
		return ledgerView{}, err
	}
	v.Bad = append(v.Bad, bad...)
	v.Budget = &budgetView{Start: time.Unix(0, r.Start).UTC(), Taken: r.Taken, Limit: c.Limit}
	return v, nil
}

// readLedger reads the ledger of provider name (a lane provider's is its
// own) at one revision and audits it on the store's clock.
func (s *store) readLedger(ctx context.Context, name string) (ledgerView, error) {
	st, _, rev, bad, err := ledgerstore.Read(ctx, s.cli, ledger.Keys(s.keys.Ledger(name)))
	if err != nil {
		return ledgerView{}, etcdError(err)
	}
	v := ledgerView{Provider: name, Revision: rev}
	for _, err := range bad {
		var re *ledgerstore.RecordError
		if errors.As(err, &re) {
			v.Bad = append(v.Bad, s.malformed(re.Key, re.Rev, re.Err))
		} else {
			v.Bad = append(v.Bad, s.malformed(s.keys.Ledger(name), rev, err))
		}
	}
	for _, x := range ledger.Audit(st) {
		vv := violationView{Era: x.Era, Window: x.Window, Sum: x.Sum, Limit: x.Limit, Reason: x.Reason}
		if e, ok := st.Head.Era(x.Era); ok {
			vv.Start = time.Unix(0, ledger.StartOf(x.Window, e.Window)).UTC()
		}
		v.Violations = append(v.Violations, vv)
	}
	if e, ok := st.Head.Current(); ok {
		now := ledger.WindowOf(s.clock().UnixNano(), e.Window)
		k, sum, limit, _ := ledger.Fullest(st, now)
		v.Era, v.Window, v.Fullest, v.Sum, v.Limit = e.Seq, schema.Duration(e.Window), k, sum, limit
		v.Grants = st.Allowances(e.Seq, now)
		v.Start = time.Unix(0, ledger.StartOf(k, e.Window)).UTC()
	}
	return v, nil
}
