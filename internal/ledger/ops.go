package ledger

import "slices"

// Op is one write of a Change: a put of Value at Key, or a delete of Key
// when Value is nil.
type Op struct {
	Key   string
	Value []byte
}

// Ops returns the writes of c, decided from s, in the order a transaction
// makes them: the head, the publishes and grants, then the deletes sorted
// by key. Every driver writes a Change through it, so the simulation and
// etcd store the same records.
func (k Keys) Ops(s *State, c Change) ([]Op, error) {
	var ops []Op
	put := func(key string, v any) error {
		b, err := Encode(v)
		ops = append(ops, Op{Key: key, Value: b})
		return err
	}
	if err := put(k.Head(), c.Head); err != nil {
		return nil, err
	}
	for _, p := range c.Pubs {
		if err := put(k.Pub(p.Seq), p); err != nil {
			return nil, err
		}
	}
	for _, g := range c.Grants {
		if err := put(k.Grant(g.Holder, g.Pub), g); err != nil {
			return nil, err
		}
	}
	var gone []string
	for _, p := range c.Deletes {
		gone = append(gone, k.Pub(p.Seq))
		for gk := range s.Grants {
			if gk.Pub == p.Seq {
				gone = append(gone, k.Grant(gk.Holder, p.Seq))
			}
		}
		for gk, rs := range s.Releases {
			if gk.Pub != p.Seq {
				continue
			}
			for _, st := range rs.Steps {
				gone = append(gone, k.Release(Release{Pub: p.Seq, Holder: gk.Holder, From: st.From, Limit: st.Limit}))
			}
		}
	}
	for _, r := range c.Orphans {
		gone = append(gone, k.Release(r))
	}
	slices.Sort(gone)
	for _, key := range slices.Compact(gone) {
		ops = append(ops, Op{Key: key})
	}
	return ops, nil
}
