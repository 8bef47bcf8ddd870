package world

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// etcd is a model of one etcd cluster as its clients see it: one
// revision counter, keys with create and mod revisions, leases, and
// transactions that compare mod revisions. It fails by itself only as
// etcd does a transaction of more than maxOps operations (--max-txn-ops):
// it refuses it. The world decides what else a client hears (an answer
// lost, a write refused) and when each watcher's events arrive.
type etcd struct {
	maxOps  int
	refused []string // the transactions refused for their size: their first key and size
	rev     int64
	kvs     map[string]kv
	leases  map[int64]int64 // lease → expiry (true ns)
	nextID  int64
	watches []*watch
	applied func(key string, value []byte) // every change, in order
}

type kv struct {
	value       []byte
	create, mod int64
	lease       int64
}

// event is one change of a key, at rev; value is nil for a deletion.
type event struct {
	rev   int64
	key   string
	value []byte
}

// cond holds when key's mod revision is mod (0: the key is absent), or,
// with prefix, when no key under key is stored.
type cond struct {
	key    string
	mod    int64
	prefix bool
}

// op is a put (value non-nil) or a delete of key.
type op struct {
	key   string
	value []byte
	lease int64
}

// watch is one watcher of a prefix: what etcd sent it, not yet delivered.
type watch struct {
	prefix    string
	noDeletes bool // etcd's WithFilterDelete
	pending   []event
	closed    bool
}

func newEtcd(maxOps int) *etcd {
	return &etcd{maxOps: maxOps, rev: 1, kvs: map[string]kv{}, leases: map[int64]int64{}}
}

// txn applies ops if every cond holds, and returns whether it did and the
// revision after it. A transaction of more than maxOps operations is
// refused whatever its conditions.
func (e *etcd) txn(cmps []cond, ops []op) (bool, int64) {
	if len(ops) > e.maxOps || len(cmps) > e.maxOps {
		e.refused = append(e.refused, fmt.Sprintf("%s and %d more", ops[0].key, len(ops)-1))
		return false, e.rev
	}
	return e.commit(cmps, ops)
}

// commit applies ops if every cond holds.
func (e *etcd) commit(cmps []cond, ops []op) (bool, int64) {
	for _, c := range cmps {
		if c.prefix {
			for k := range e.kvs {
				if strings.HasPrefix(k, c.key) {
					return false, e.rev
				}
			}
			continue
		}
		if e.kvs[c.key].mod != c.mod {
			return false, e.rev
		}
	}
	for _, o := range ops {
		if o.lease != 0 {
			if _, ok := e.leases[o.lease]; !ok {
				return false, e.rev
			}
		}
	}
	if len(ops) == 0 {
		return true, e.rev
	}
	e.rev++
	for _, o := range ops {
		e.apply(o)
	}
	return true, e.rev
}

func (e *etcd) apply(o op) {
	old, had := e.kvs[o.key]
	if o.value == nil {
		if !had {
			return
		}
		delete(e.kvs, o.key)
	} else {
		n := kv{value: o.value, create: e.rev, mod: e.rev, lease: o.lease}
		if had {
			n.create = old.create
		}
		e.kvs[o.key] = n
	}
	if e.applied != nil {
		e.applied(o.key, o.value)
	}
	for _, w := range e.watches {
		if !w.closed && strings.HasPrefix(o.key, w.prefix) && (o.value != nil || !w.noDeletes) {
			w.pending = append(w.pending, event{e.rev, o.key, o.value})
		}
	}
}

// get returns every key under prefix, in key order, and the revision.
func (e *etcd) get(prefix string) ([]string, map[string]kv, int64) {
	out := map[string]kv{}
	for k, v := range e.kvs {
		if strings.HasPrefix(k, prefix) {
			out[k] = v
		}
	}
	return slices.Sorted(maps.Keys(out)), out, e.rev
}

// watch starts a watcher of prefix from the current revision on, of
// puts alone when noDeletes.
func (e *etcd) watch(prefix string, noDeletes bool) *watch {
	w := &watch{prefix: prefix, noDeletes: noDeletes}
	e.watches = append(e.watches, w)
	return w
}

// grant returns a new lease that expires at expiry.
func (e *etcd) grant(expiry int64) int64 {
	e.nextID++
	e.leases[e.nextID] = expiry
	return e.nextID
}

// keepAlive moves lease's expiry; false when it has expired.
func (e *etcd) keepAlive(lease, expiry int64) bool {
	if _, ok := e.leases[lease]; !ok {
		return false
	}
	e.leases[lease] = expiry
	return true
}

// revoke ends lease now, deleting its keys.
func (e *etcd) revoke(lease int64) {
	if _, ok := e.leases[lease]; !ok {
		return
	}
	delete(e.leases, lease)
	var ops []op
	for _, k := range slices.Sorted(maps.Keys(e.kvs)) {
		if e.kvs[k].lease == lease {
			ops = append(ops, op{key: k})
		}
	}
	e.commit(nil, ops) // etcd's own: not a client's transaction
}

// expire ends every lease whose expiry is at or before now.
func (e *etcd) expire(now int64) {
	for _, id := range slices.Sorted(maps.Keys(e.leases)) {
		if e.leases[id] <= now {
			e.revoke(id)
		}
	}
}
