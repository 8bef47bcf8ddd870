package main

import (
	"github.com/sluice-go/sluice/configd/alloc"
	"github.com/sluice-go/sluice/internal/schema"
)

// allocate is the one adapter between etcd records and configd/alloc: it
// splits cfg.Limit over the live instances with the algorithm the config
// names (alloc.ByName: "even" or "fair"), each instance's demand being the
// Demand of its record (permits wanted per window, smoothed by the
// instance; 0 for a live instance whose record is malformed and that has
// no last good one). The floor is cfg.Floor, or alloc.DefaultFloor when
// the config leaves it 0.
//
// The result maps instance ID to share and adds up to at most cfg.Limit
// (alloc's algorithms hand out exactly the limit); the publisher checks it
// again (schema.Shares.Validate) before publishing. An error means the
// config names an unknown algorithm or a record holds an invalid value;
// nothing is published then.
func allocate(cfg schema.ProviderConfig, instances []schema.InstanceRecord) (map[string]int64, error) {
	algo, err := alloc.ByName(string(cfg.Algorithm))
	if err != nil {
		return nil, err
	}
	floor := cfg.Floor
	if floor == 0 {
		floor = alloc.DefaultFloor(cfg.Limit, len(instances))
	}
	in := make([]alloc.Instance, len(instances))
	for i, r := range instances {
		in[i] = alloc.Instance{ID: r.ID, Demand: float64(r.Demand)}
	}
	shares, err := algo(cfg.Limit, floor, in)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(shares))
	for i, s := range shares {
		out[in[i].ID] = s
	}
	return out, nil
}
