package world

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/sluice-go/sluice/configd/round"
	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/schema"
)

// electionPrefix holds one key per configd replica alive, as configd's
// election does: a member stands in for configd only while there is
// none.
const electionPrefix = "E/"

func electionKey(id int) string { return fmt.Sprintf("%s%d", electionPrefix, id) }

// elect stores every replica's election key.
func (w *World) elect() {
	ops := make([]op, 0, len(w.reps))
	for _, rp := range w.reps {
		ops = append(ops, op{key: electionKey(rp.id), value: []byte("alive")})
	}
	w.etcd.commit(nil, ops)
	w.afterWrite()
}

// configdAlive reports whether any replica's election key is stored.
func (w *World) configdAlive() bool {
	for _, rp := range w.reps {
		if _, ok := w.etcd.kvs[electionKey(rp.id)]; ok {
			return true
		}
	}
	return false
}

// outage stops every configd replica for d: their sessions end and
// their election keys go, so the members stand in.
func (w *World) outage(d int64) {
	if w.down {
		return
	}
	w.down = true
	ops := make([]op, 0, len(w.reps))
	for _, rp := range w.reps {
		ops = append(ops, op{key: electionKey(rp.id)})
	}
	w.etcd.commit(nil, ops)
	w.afterWrite()
	w.res.Outages++
	w.tracef("configd is down until %.3fs", float64(w.now+d-epoch)/1e9)
	w.at(w.now+d, w.endOutage)
}

// endOutage starts configd's replicas again.
func (w *World) endOutage() {
	if !w.down {
		return
	}
	w.down = false
	w.elect()
	w.tracef("configd is back")
}

// instances returns the members' records in etcd, as configd's leader
// and a stand-in read them: each registers under its holder name, which
// is its ID, and may stand in.
func (w *World) instances() ([]schema.InstanceRecord, error) {
	keys, kvs, _ := w.etcd.get("I/")
	live := make([]schema.InstanceRecord, 0, len(keys))
	for _, k := range keys {
		var rep report
		if err := json.Unmarshal(kvs[k].value, &rep); err != nil {
			return nil, fmt.Errorf("the record %s: %w", k, err)
		}
		h := strings.TrimPrefix(k, "I/")
		live = append(live, schema.InstanceRecord{ID: h, Holder: h, Demand: rep.Demand, ClassDemand: rep.ClassDemand, StandsIn: true})
	}
	return live, nil
}

// begun returns st as a Publisher decides from it: a ledger with no head,
// read at etcd's revision now, numbers its publishes past every earlier
// ledger's (ledger.State.BeginAt). st is not changed.
func (w *World) begun(st *ledger.State) *ledger.State {
	if st.Head.Seq != 0 {
		return st
	}
	st = st.Clone()
	st.BeginAt(w.etcd.rev)
	return st
}

// standIn is limiter/cluster's standIn: with no configd replica alive,
// the one live member round.StandIn names runs configd's round on its
// own clock (round.Target, round.Policy, ledger.Plan), and writes it
// conditioned on the head it read, on no replica being alive and on the
// config's revision. As cluster's, its policy leaves MaxOps at the
// ledger's default: a member does not know etcd's --max-txn-ops.
func (m *member) standIn() {
	w := m.w
	if m.shares || m.standing || !m.reachable() || w.configdAlive() {
		return
	}
	kv, ok := w.etcd.kvs[configKey]
	if !ok {
		return // nothing to grant
	}
	var c configRecord
	if err := json.Unmarshal(kv.value, &c); err != nil || c.Coordination != coordLedger {
		return
	}
	live, err := w.instances()
	if err != nil {
		w.fail("%s standing in: %v", m.holder, err)
		return
	}
	if round.StandIn(live) != m.holder {
		return
	}
	cfg := w.config(w.limit)
	target, reserves, err := round.Target(cfg, live)
	if err != nil {
		w.fail("%s standing in: %v", m.holder, err)
		return
	}
	p := round.Policy(cfg)
	p.Reserves = reserves
	st, headMod := w.read()
	ch, err := ledger.Plan(w.begun(st), p, target, m.clock())
	if err != nil {
		w.fail("%s standing in: %v", m.holder, err)
		return
	}
	if ch.Empty() {
		return
	}
	ops, err := w.ops(ch)
	if err != nil {
		w.fail("%s standing in: %v", m.holder, err)
		return
	}
	if len(ops) > w.cfg.MaxOps {
		// etcd refuses it, whatever its conditions: without configd the
		// grants end at their horizon. Counted, not failed: the member
		// has no way to know the limit.
		w.res.StandInsTooLarge++
		w.tracef("%s standing in writes %d ops: etcd refuses more than %d", m.holder, len(ops), w.cfg.MaxOps)
		return
	}
	w.tracef("%s stands in for configd: %d ops on head %d: %s", m.holder, len(ops), headMod, strings.Join(ch.Why, "; "))
	m.standing = true
	inc := m.inc
	conds := []cond{{key: w.keys.Head(), mod: headMod}, {key: electionPrefix, prefix: true}, {key: configKey, mod: kv.mod}}
	w.write(conds, ops, func(ok, known bool) {
		if inc == m.inc {
			m.standing = false
		}
		if ok {
			w.res.StandIns++
		}
		w.tracef("%s's write standing in: ok=%v known=%v", m.holder, ok, known)
	})
}

// add sums the counts of r's new faults into s (tests' tallies).
func (s *Result) add(r Result) {
	s.Deletes += r.Deletes
	s.Creates += r.Creates
	s.Shares += r.Shares
	s.Emptied += r.Emptied
	s.LedgersDeleted += r.LedgersDeleted
	s.Across += r.Across
	s.Outages += r.Outages
	s.StandIns += r.StandIns
	s.StandInsTooLarge += r.StandInsTooLarge
	s.TopUpsOfAll += r.TopUpsOfAll
	s.Departed += r.Departed
}
