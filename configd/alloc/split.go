package alloc

import "github.com/sluice-go/sluice/internal/schema"

// Split is the one adapter between etcd records and the algorithms: it
// splits cfg.Limit over the live instances with the algorithm the config
// names (ByName: "even" or "fair"), each instance's demand being the
// Demand of its record (permits wanted per window, smoothed by the
// instance; 0 for a live instance whose record is malformed and that has
// no last good one). The floor is cfg.Floor, or DefaultFloor when the
// config leaves it 0.
//
// The result maps instance ID to share and adds up to at most cfg.Limit
// (the algorithms hand out exactly the limit). An error means the config
// names an unknown algorithm or a record holds an invalid value.
func Split(cfg schema.ProviderConfig, instances []schema.InstanceRecord) (map[string]int64, error) {
	algo, err := ByName(string(cfg.Algorithm))
	if err != nil {
		return nil, err
	}
	floor := cfg.Floor
	if floor == 0 {
		floor = DefaultFloor(cfg.Limit, len(instances))
	}
	in := make([]Instance, len(instances))
	for i, r := range instances {
		in[i] = Instance{ID: r.ID, Demand: float64(r.Demand)}
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
