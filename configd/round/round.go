// Package round is what configd's leader asks of a ledger provider's
// ledger in one round: the policy its config sets and the quotas its live
// instances' records ask for. configd's daemon and the simulation
// (internal/world) decide with these same functions.
package round

import (
	"slices"
	"strings"
	"time"

	"github.com/sluice-go/sluice/configd/alloc"
	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/schema"
)

// Keep is how many windows behind the current one a publish is kept
// before it may be collected.
const Keep = 3

// Tick is how often the leader looks at a ledger provider with nothing
// changed: grants end at their publish's end, which a round extends once
// fewer than half the horizon's windows remain ahead.
func Tick(w time.Duration) time.Duration {
	return min(max(w/4, 50*time.Millisecond), time.Second)
}

// Horizon is how many windows past the current one a publish grants: the
// provider's fail_static, the budget of an instance cut off from etcd,
// and at least 4.
func Horizon(cfg schema.ProviderConfig) int64 {
	w := cfg.Window.D()
	return max(4, int64((cfg.FailStaticOrDefault()+w-1)/w))
}

// Policy is what the leader asks of a ledger provider's ledger: a
// target within 2% of the limit of each holder's quota needs no new
// publish, so that demands that jitter do not make one every round.
func Policy(cfg schema.ProviderConfig) ledger.Policy {
	p := ledger.Policy{
		Limit:   cfg.Limit,
		Window:  cfg.Window.D(),
		Horizon: Horizon(cfg),
		Keep:    Keep,
		Slack:   cfg.Limit / 50,
		Bound:   cfg.ClockBound(),
	}
	for i, r := range cfg.Reserves(cfg.Limit) {
		if p.ClassReserves == nil {
			p.ClassReserves = map[string]int64{}
		}
		p.ClassReserves[cfg.Classes[i].Name] = r
	}
	return p
}

// Target splits cfg's limit over the live instances (alloc.Split) and
// maps each share to the holder its record names. An instance that names
// none (a member that does not follow the ledger) is granted nothing; one
// that is leaving neither.
//
// With classes that reserve, each class's reserve goes to the instances
// that report demand of it, max-min fairly (alloc.Reserve), and their
// shares are raised to hold it: reserves maps each holder to what it
// keeps per class (ledger.Policy.Reserves).
func Target(cfg schema.ProviderConfig, live []schema.InstanceRecord) (target map[string]int64, reserves map[string]map[string]int64, err error) {
	var recs []schema.InstanceRecord
	for _, r := range live {
		if r.Holder != "" && !r.Leaving {
			recs = append(recs, r)
		}
	}
	if len(recs) == 0 {
		return nil, nil, nil
	}
	split, err := alloc.Split(cfg, recs)
	if err != nil {
		return nil, nil, err
	}
	slices.SortFunc(recs, func(a, b schema.InstanceRecord) int { return strings.Compare(a.ID, b.ID) })
	ids, shares := make([]string, len(recs)), make([]int64, len(recs))
	for i, r := range recs {
		ids[i], shares[i] = r.ID, split[r.ID]
	}
	rs := cfg.Reserves(cfg.Limit)
	wants := make([][]int64, len(rs))
	for c := range rs {
		wants[c] = make([]int64, len(recs))
		for i, r := range recs {
			wants[c][i] = r.ClassDemand[cfg.Classes[c].Name]
		}
	}
	raised, got, err := alloc.Reserve(cfg.Limit, shares, ids, rs, wants)
	if err != nil {
		return nil, nil, err
	}
	target = make(map[string]int64, len(recs))
	for i, r := range recs {
		target[r.Holder] = raised[i]
		for c, g := range got {
			if g[i] > 0 {
				if reserves == nil {
					reserves = map[string]map[string]int64{}
				}
				if reserves[r.Holder] == nil {
					reserves[r.Holder] = map[string]int64{}
				}
				reserves[r.Holder][cfg.Classes[c].Name] = g[i]
			}
		}
	}
	return target, reserves, nil
}

// StandInEvery is how often an instance of a ledger provider looks
// whether to stand in for configd while no replica is alive: every
// report interval, or more often when the grants reach fewer windows
// ahead, so that one round extends them before they end (a round
// extends once fewer than half the horizon remain).
func StandInEvery(cfg schema.ProviderConfig, report time.Duration) time.Duration {
	ahead := time.Duration(Horizon(cfg)) * cfg.Window.D()
	return min(report, max(ahead/4, 50*time.Millisecond))
}

// StandIn returns the ID of the one instance of live that stands in for
// configd: the least ID among those that follow the ledger, may stand in
// and are not leaving; "" when none may. Any number of writers keep the
// ledger's invariant, since each write that adds room is conditioned on
// the head it was decided from: choosing one spares them the contention.
func StandIn(live []schema.InstanceRecord) string {
	var first string
	for _, r := range live {
		if r.Holder != "" && r.StandsIn && !r.Leaving && (first == "" || r.ID < first) {
			first = r.ID
		}
	}
	return first
}
