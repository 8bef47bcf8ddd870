package ledger

import "slices"

// DefaultMaxOps is etcd's default limit on the operations of one
// transaction (--max-txn-ops).
const DefaultMaxOps = 128

// MaxOps is the most operations of one transaction Plan works with:
// that many grants of holders with names of 128 bytes stay under etcd's
// default --max-request-bytes of 1.5 MiB.
const MaxOps = 4096

// Op is one write of a Change: a put of Value at Key, or a delete of Key
// when Value is nil.
type Op struct {
	Key   string
	Value []byte
}

// Ops returns the writes of c in the order a transaction makes them: the
// head, the publishes and grants, then the deletes sorted by key: c.Size()
// of them, which Plan keeps within its policy's MaxOps. Every driver writes a Change through it, so the simulation and etcd store the
// same records.
func (k Keys) Ops(c Change) ([]Op, error) {
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
	for _, p := range c.DelPubs {
		gone = append(gone, k.Pub(p.Seq))
	}
	for _, g := range c.DelGrants {
		gone = append(gone, k.Grant(g.Holder, g.Pub))
	}
	for _, r := range c.DelReleases {
		gone = append(gone, k.Release(r))
	}
	slices.Sort(gone)
	for _, key := range slices.Compact(gone) {
		ops = append(ops, Op{Key: key})
	}
	return ops, nil
}
