// Package round is what configd's leader asks of a ledger provider's
// ledger in one round: the policy its config sets and the quotas its live
// instances' records ask for. configd's daemon and the simulation
// (internal/world) decide with these same functions.
package round

import (
	"maps"
	"slices"
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
	return ledger.Policy{
		Limit:   cfg.Limit,
		Window:  cfg.Window.D(),
		Horizon: Horizon(cfg),
		Keep:    Keep,
		Slack:   cfg.Limit / 50,
	}
}

// Target splits cfg's limit over the live instances (alloc.Split) and
// maps each share to the holder its record names. An instance that names
// none (a member that does not follow the ledger) is granted nothing; one
// that is leaving neither.
func Target(cfg schema.ProviderConfig, live []schema.InstanceRecord) (map[string]int64, error) {
	var recs []schema.InstanceRecord
	holder := map[string]string{}
	for _, r := range live {
		if r.Holder != "" && !r.Leaving {
			recs = append(recs, r)
			holder[r.ID] = r.Holder
		}
	}
	if len(recs) == 0 {
		return nil, nil
	}
	split, err := alloc.Split(cfg, recs)
	if err != nil {
		return nil, err
	}
	t := make(map[string]int64, len(split))
	for _, id := range slices.Sorted(maps.Keys(split)) {
		t[holder[id]] = split[id]
	}
	return t, nil
}
