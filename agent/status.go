package agent

import (
	"sort"
)

// Status is what the agent holds and how it has been used: GET /v1/status.
type Status struct {
	Providers []ProviderStatus `json:"providers"`
	Callers   []CallerStatus   `json:"callers"`
	// Grants is how many grants and reservations are kept for Settle and
	// Cancel.
	Grants int `json:"grants"`
}

// ProviderStatus is one provider's limits as this agent enforces them.
type ProviderStatus struct {
	Name string `json:"name"`
	// Local is true for a provider this agent enforces alone (no etcd).
	Local bool `json:"local"`
	// Ready is false while the agent joins it.
	Ready  bool          `json:"ready"`
	Limits []LimitStatus `json:"limits,omitempty"`
}

// LimitStatus is one limit: its window's quota here (this machine's share
// of a shared provider), what the window can still admit, and where the
// share comes from.
type LimitStatus struct {
	Dimension string `json:"dimension"`
	Window    string `json:"window"`
	Quota     int64  `json:"quota"`
	Remaining int64  `json:"remaining"`
	Admitted  int64  `json:"admitted"`
	Waiting   int    `json:"waiting"`
	// Provider, Source, Share, Total, Connected and Problems are the
	// cluster member's (shared providers only).
	Provider  string   `json:"provider,omitempty"`
	Source    string   `json:"source,omitempty"`
	Share     int64    `json:"share,omitempty"`
	Total     int64    `json:"total,omitempty"`
	Connected bool     `json:"connected,omitempty"`
	Problems  []string `json:"problems,omitempty"`
}

// Status returns a snapshot.
func (a *Agent) Status() Status {
	a.mu.RLock()
	ps := make([]*provider, 0, len(a.providers))
	for _, p := range a.providers {
		ps = append(ps, p)
	}
	a.mu.RUnlock()
	sort.Slice(ps, func(i, j int) bool { return ps[i].name < ps[j].name })
	st := Status{Grants: a.grants.len()}
	for _, p := range ps {
		pst := ProviderStatus{Name: p.name}
		select {
		case <-p.ready:
			pst.Ready = p.err == nil
		default:
		}
		if pst.Ready {
			pst.Local = p.group == nil
			pst.Limits = limitsStatus(p)
		}
		st.Providers = append(st.Providers, pst)
	}
	for _, t := range a.callers.all() {
		if cs, ok := t.status(); ok {
			st.Callers = append(st.Callers, cs)
		}
	}
	return st
}

func limitsStatus(p *provider) []LimitStatus {
	var out []LimitStatus
	for i, lm := range p.multi.Limits() {
		s := p.multi.Limiter(i).Stats()
		ls := LimitStatus{Dimension: lm.Dimension, Window: s.Window.String(), Quota: s.Quota, Remaining: s.Remaining,
			Admitted: s.Admitted, Waiting: s.Waiting}
		if p.group != nil {
			if ms := p.group.Members(); i < len(ms) {
				m := ms[i].Status()
				ls.Provider, ls.Source, ls.Share, ls.Total, ls.Connected, ls.Problems = ms[i].Provider(), m.Source, m.Share, m.Total, m.Connected, m.Problems
			}
		}
		out = append(out, ls)
	}
	return out
}
