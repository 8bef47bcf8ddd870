package world

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sluice-go/sluice/configd/round"
	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/limiter"
)

// member is one instance: a real limiter on its own clock, enforcing
// what its view of the ledger allows (ledger.State.Schedule), writing
// the releases its newest grant asks of it (ToRelease) after enforcing
// them, and reporting its demand on a lease.
type member struct {
	w       *World
	name    string
	group   string // the script's group, if any
	inc     int
	holder  string
	skew    int64
	lim     *limiter.Limiter
	hold    *ledger.Holder
	lease   int64
	watches []*watch
	due     []bool // a delivery is scheduled, per watch
	crashed bool
	paused  int64 // true time it wakes at
	cut     int64 // true time it reaches etcd again
	demand  int64 // permits of batch (or of no class) it wants per window
	// critical is the permits of critical it wants per window
	// (Config.Critical), critTaken what it took of them in the window
	// critWindow of its clock, and classes the classes its limiter
	// serves.
	critical, critTaken, critWindow int64
	classes                         []limiter.Class
	// viewReserve is what the grants m enforces keep for critical, as of
	// its last commit, and cw its limiter's current window as the class
	// check sees it (checkClassWindow).
	viewReserve int64
	cw          *classWindow
	started     int64 // true time its incarnation began
	sending     bool
	ticks       int
	// shares: the config named the shares, and m left the ledger (its
	// limiter admits nothing: the world does not play the shares).
	// follows counts the ledger's Followers of this incarnation, gen is
	// the ledger its Follower began on (World.gen), look when it next
	// looks whether to stand in for configd, standing that its write
	// standing in is under way.
	shares   bool
	follows  int
	gen      int
	look     int64
	standing bool
	// applying is the Holder whose computed change is on its way to the
	// limiter (Config.ApplyLag), again that a sync came meanwhile: like
	// store.Follower's one goroutine, the next change is computed only
	// once the last is committed.
	applying *ledger.Holder
	again    bool
}

// leaseTTL is how long a member's lease outlives its last keep-alive.
const leaseTTL = 3 * time.Second

type memberClock struct{ m *member }

func (c memberClock) Now() time.Time { return time.Unix(0, c.m.w.now+c.m.skew) }

func (m *member) clock() int64 { return m.w.now + m.skew }

// join starts a new member.
func (w *World) join() *member {
	w.nextID++
	m := &member{w: w, name: fmt.Sprintf("m%d", w.nextID)}
	m.demand = 2 * w.limit / int64(max(1, w.cfg.Members))
	m.critical = w.wantCritical()
	w.mems = append(w.mems, m)
	m.start()
	return m
}

// start begins a new incarnation of m: a new limiter, Follower and
// session, as a restarted process has.
func (m *member) start() {
	w := m.w
	m.inc++
	m.crashed, m.paused, m.cut, m.started = false, 0, 0, w.now
	m.skew = w.rng.Int64N(2*int64(w.cfg.SkewBound)+1) - int64(w.cfg.SkewBound)
	lim, err := limiter.New(0, w.window, limiter.WithClock(memberClock{m}))
	if err != nil {
		panic(err) // a window the world chose: a bug in the world
	}
	lim.SetClockUncertainty(time.Duration(w.cfg.SkewBound))
	m.lim, m.classes, m.critTaken = lim, nil, 0
	m.shares, m.follows, m.look, m.standing = false, 0, 0, false
	m.watches, m.due = make([]*watch, 3), make([]bool, 3)
	m.follow()
	m.session()
	inc := m.inc
	w.at(w.now+w.rng.Int64N(int64(w.window)/5+1), func() { m.tick(inc) })
	w.tracef("%s starts", m.holder)
}

// follow begins a Follower of the ledger on m's limiter, as
// store.NewFollower does: a new holder name, that no earlier Follower
// took, whose grants it reads and then watches, with the publishes.
func (m *member) follow() {
	w := m.w
	m.holder = fmt.Sprintf("%s.%d", m.name, m.inc)
	if m.follows > 0 {
		m.holder += fmt.Sprintf(".%d", m.follows)
	}
	m.follows++
	m.gen = w.gen
	m.viewReserve, m.cw = 0, nil
	m.hold = ledger.NewHolder(w.keys, m.holder)
	for _, i := range []int{0, 1} {
		if m.watches[i] != nil {
			m.watches[i].closed, m.watches[i].pending = true, nil
		}
		m.due[i] = false
	}
	// As store.Follower watches: no deletions of publishes.
	m.watches[0], m.watches[1] = w.etcd.watch(w.keys.Pubs(), true), w.etcd.watch(w.keys.Grants(m.holder), false)
	for _, prefix := range []string{w.keys.Pubs(), w.keys.Grants(m.holder)} {
		keys, kvs, _ := w.etcd.get(prefix)
		for _, k := range keys {
			m.decode(k, kvs[k].value)
		}
	}
}

// session registers m's holder on a new lease, reads the config and
// watches it from there, as limiter/cluster's ledgerSession: a config
// that names the shares ends the Follower (leave); a deleted one changes
// nothing. A lease lost starts a new session of the same Follower.
func (m *member) session() {
	w := m.w
	m.lease = w.etcd.grant(w.now + int64(leaseTTL))
	if m.watches[2] != nil {
		m.watches[2].closed, m.watches[2].pending = true, nil
	}
	m.watches[2], m.due[2] = w.etcd.watch(configKey, true), false
	if kv, ok := w.etcd.kvs[configKey]; ok && m.configNames(kv.value) == coordShares {
		m.leave()
		return
	}
	m.report()
}

// configNames returns the coordination a config record names.
func (m *member) configNames(value []byte) string {
	var c configRecord
	if err := json.Unmarshal(value, &c); err != nil {
		m.w.fail("%s cannot read the config: %v", m.holder, err)
		return ""
	}
	return c.Coordination
}

// config handles a config m's watch brought: one naming the shares ends
// its Follower (leave), one naming the ledger while it is on the shares
// begins a new one, and a new session.
func (m *member) config(value []byte) {
	switch c := m.configNames(value); {
	case c == coordShares && !m.shares:
		m.leave()
	case c == coordLedger && m.shares:
		m.shares = false
		m.follow()
		m.session()
		m.w.tracef("%s follows the ledger again", m.holder)
		m.sync()
	}
}

// leave is limiter/cluster's leftLedger: the limiter drops what the
// ledger's grants left in it at once, and the Follower ends. Its lease is
// no longer kept alive, and ends.
func (m *member) leave() {
	m.shares = true
	if err := m.lim.SetQuota(0, time.Time{}); err != nil {
		m.w.fail("%s cannot drop the ledger's quota: %v", m.holder, err)
	}
	for _, i := range []int{0, 1} {
		m.watches[i].closed, m.watches[i].pending = true, nil
	}
	m.w.tracef("%s leaves the ledger: the config names the shares", m.holder)
}

// depart is cluster's clean exit (store.Follower.Leave): the limiter set
// to admit nothing, then the releases of every grant from the first
// window it governs whole sent, before the lease is revoked. Cut off or
// paused, it sends nothing: its grants end at their publish's end.
func (m *member) depart() {
	if !m.reachable() || m.shares {
		return
	}
	w := m.w
	now := m.clock()
	rels := m.hold.Leave(m.enforceFrom(ledger.NewState(), now))
	for _, r := range rels {
		w.tracef("%s releases publish %d to %d from window %d as it leaves", m.holder, r.Pub, r.Limit, r.From)
	}
	// Every unsent release, as many transactions as that takes, whatever
	// write is still on its way: the Follower's Run has returned.
	sent, lops, err := m.hold.Unsent()
	if err != nil {
		w.fail("%s: %v", m.holder, err)
		return
	}
	for len(lops) > 0 {
		n := min(len(lops), w.cfg.MaxOps)
		ops := make([]op, 0, n)
		for _, o := range lops[:n] {
			ops = append(ops, op{key: o.Key, value: o.Value})
		}
		last, batch := n == len(lops), sent[:n]
		hold := m.hold
		w.write(nil, ops, func(ok, known bool) {
			if ok {
				hold.Stored(batch)
				if last {
					w.res.Departed++
				}
			}
		})
		sent, lops = sent[n:], lops[n:]
	}
}

// stop ends m's incarnation: its limiter and watches go.
func (m *member) stop() {
	m.crashed = true
	m.lim.Close()
	for _, wt := range m.watches {
		wt.closed, wt.pending = true, nil
	}
}

func (m *member) decode(key string, value []byte) {
	if err := m.hold.Observe(key, value); err != nil {
		m.w.fail("%s cannot read %s: %v", m.holder, key, err)
	}
}

func (m *member) reachable() bool { return !m.crashed && m.w.now >= m.paused && m.w.now >= m.cut }

// tick admits this tick's load and, every few ticks, reports demand.
func (m *member) tick(inc int) {
	w := m.w
	if m.crashed || inc != m.inc {
		return
	}
	if w.now < m.paused {
		w.at(m.paused, func() { m.tick(inc) })
		return
	}
	w.at(w.now+int64(w.window)/5+w.rng.Int64N(int64(w.window)/20+1), func() { m.tick(inc) })
	m.ticks++
	want := m.demand / 5
	if int64(m.ticks%5) < m.demand%5 {
		want++
	}
	var got int64
	for got < want && m.lim.TryAcquire() {
		got++
	}
	if m.critical > 0 {
		got += m.takeCritical()
	}
	if got > 0 {
		w.count(w.now, got)
		if w.prov != nil {
			w.call(m, got)
		}
	}
	m.sync()
	if m.ticks%4 == 0 {
		m.report()
	}
	if w.now >= m.look && !m.crashed {
		m.look = w.now + int64(round.StandInEvery(w.config(w.limit), 4*w.window/5))
		m.standIn()
	}
}

// report keeps the lease alive and writes the record (the demand, and
// what the provider said); a lease that
// expired ends this incarnation and starts the next.
func (m *member) report() {
	w := m.w
	if m.w.now < m.cut || m.shares {
		return
	}
	if !w.etcd.keepAlive(m.lease, w.now+int64(leaseTTL)) {
		w.tracef("%s lost its lease", m.holder)
		m.session()
		return
	}
	w.write(nil, []op{{key: "I/" + m.holder, value: m.record(), lease: m.lease}}, func(bool, bool) {})
}

// schedule arranges the delivery of each watch's pending events.
func (m *member) schedule() {
	for i, wt := range m.watches {
		if m.crashed || m.due[i] || len(wt.pending) == 0 {
			continue
		}
		m.due[i] = true
		inc := m.inc
		m.w.at(m.w.now+m.w.latency(), func() { m.deliver(inc, i) })
	}
}

// deliver hands watch i's events to m: all that arrived by now, in
// order, once m runs and reaches etcd.
func (m *member) deliver(inc, i int) {
	if inc != m.inc || m.crashed {
		return
	}
	if !m.reachable() {
		m.w.at(max(m.paused, m.cut), func() { m.deliver(inc, i) })
		return
	}
	if _, ok := m.w.etcd.leases[m.lease]; i == 2 && !ok && !m.shares {
		// The session ended with its lease, and its watch of the config
		// with it: the next session reads the config as it is now, and a
		// Follower that missed a config of the shares goes on.
		m.w.tracef("%s's session ended with its lease", m.holder)
		m.session()
		return
	}
	wt := m.watches[i]
	evs := wt.pending
	wt.pending, m.due[i] = nil, false
	for _, e := range evs {
		if i == 2 {
			m.config(e.value)
			continue
		}
		if i == 0 && m.gen != m.w.gen {
			// The ledger m's Follower began on was emptied or deleted
			// since: m lived across.
			m.gen = m.w.gen
			m.w.res.Across++
			m.w.tracef("%s follows across a ledger emptied or deleted", m.holder)
		}
		m.decode(e.key, e.value)
	}
	m.sync()
}

// sync enforces what the view allows, lowering first what its newest
// grant asks it to release, and sends the releases not yet known stored.
// A release is kept, and sent, only if the limiter enforced it before its
// window began: the member takes Config.ApplyLag to apply a change, as a
// real process may. One change is applied at a time, as store.Follower
// does: a change computed before the last was committed would enforce a
// view without the releases that commit kept.
func (m *member) sync() {
	w := m.w
	if m.shares {
		return // the Follower ended
	}
	if m.applying == m.hold {
		m.again = true
		return
	}
	now := m.clock()
	next, rels := m.hold.Next(now, 0)
	if w.cfg.ApplyLag <= 0 {
		m.commit(next, rels, now)
		return
	}
	inc, hold := m.inc, m.hold
	m.applying, m.again = hold, false
	w.at(w.now+int64(w.cfg.ApplyLag), func() {
		if inc != m.inc || m.crashed || hold != m.hold || m.shares {
			return
		}
		m.applying = nil
		m.commit(next, rels, now)
		if m.again {
			m.sync()
		}
	})
}

// commit enforces the schedule of next, computed at now, then keeps and
// sends the releases that were enforced before their windows began.
func (m *member) commit(next *ledger.State, rels []ledger.Release, now int64) {
	w := m.w
	m.observeClasses()
	kept := m.hold.Commit(next, rels, m.enforceFrom(next, now))
	m.applyClasses(next)
	m.observeClasses()
	for _, r := range rels {
		if slices.Contains(kept, r) {
			w.tracef("%s releases publish %d to %d from window %d", m.holder, r.Pub, r.Limit, r.From)
		} else {
			w.tracef("%s drops its release of publish %d from window %d: enforced too late", m.holder, r.Pub, r.From)
		}
	}
	m.send()
}

// send writes the releases not yet known stored: each its own record, as
// many as one transaction holds; the next sync sends the rest.
func (m *member) send() {
	w := m.w
	if m.sending || w.now < m.cut || m.shares {
		return
	}
	sent, lops, err := m.hold.Unsent()
	if err != nil {
		w.fail("%s: %v", m.holder, err)
		return
	}
	if len(sent) == 0 {
		return
	}
	n := min(len(sent), w.cfg.MaxOps)
	sent, lops = sent[:n], lops[:n]
	ops := make([]op, 0, len(lops))
	for _, o := range lops {
		ops = append(ops, op{key: o.Key, value: o.Value})
	}
	m.sending = true
	inc, hold := m.inc, m.hold
	w.write(nil, ops, func(ok, known bool) {
		if inc != m.inc {
			return
		}
		m.sending = false
		if ok {
			hold.Stored(sent)
		}
	})
}

// enforceFrom sets the limiter to view's schedule as computed at now, and
// returns the start of the first window the limiter governs whole.
func (m *member) enforceFrom(view *ledger.State, now int64) int64 {
	if m.w.cfg.Break == "unenforced" {
		view = view.Clone()
		clear(view.Releases)
	}
	from, err := ledger.Enforce(m.lim, view, m.holder, now, m.clock(), m.w.window)
	if err != nil {
		m.w.fail("%s: %v", m.holder, err)
		return math.MaxInt64 // nothing enforced: no release is true
	}
	return from
}
