package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// lostHistory drives one leader's real publisher (publish: plan.Decide,
// the books, writeRecords) over a real etcd, on a clock the test moves,
// and feeds it the provider's changes in revision order as its watch
// would, only as far as the test says.
type lostHistory struct {
	t           *testing.T
	cli         *clientv3.Client
	p           *publisher
	name        string
	readsCommon bool
	clock       time.Time
	seen        int64 // the last revision fed to p
}

func newLostHistory(t *testing.T, cli *clientv3.Client, name string, limit int64, readsCommon bool) *lostHistory {
	t.Helper()
	h := &lostHistory{t: t, cli: cli, name: name, readsCommon: readsCommon}
	h.p = newLeader(t, cli, name, "r1")
	h.p.now = func() time.Time { return h.clock }
	h.seen = h.p.fences[name].rev
	_, rev := putLimit(t, cli, name, limit)
	h.catchUp(rev)
	return h
}

// put writes instance id's record, acknowledging generation gen, and
// returns its revision; p sees it only once caught up.
func (h *lostHistory) put(id string, gen int64) int64 {
	h.t.Helper()
	return h.write(schema.InstanceRecord{ID: id, AppliedGeneration: gen})
}

// write writes the instance record rec as a member of this release does.
func (h *lostHistory) write(rec schema.InstanceRecord) int64 {
	h.t.Helper()
	rec.Version, rec.Started, rec.Updated, rec.Source = schema.Version, h.clock.UTC(), h.clock.UTC(), schema.SourceShares
	rec.ReadsCommon, rec.ReadsUnmoved = h.readsCommon, h.readsCommon
	b, err := schema.Encode(rec)
	if err != nil {
		h.t.Fatal(err)
	}
	resp, err := h.cli.Put(ctxT(h.t), keys.Instance(h.name, rec.ID), string(b))
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.Header.Revision
}

// leave marks instance id leaving and deletes its key, as a member that
// closes does; it returns the deletion's revision.
func (h *lostHistory) leave(id string) int64 {
	h.t.Helper()
	h.write(schema.InstanceRecord{ID: id, Leaving: true})
	resp, err := h.cli.Delete(ctxT(h.t), keys.Instance(h.name, id))
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.Header.Revision
}

// ackAll has every live instance acknowledge the generation of its record
// in the books, and feeds p the acknowledgements.
func (h *lostHistory) ackAll() {
	h.t.Helper()
	v := h.books()
	for _, id := range slices.Sorted(maps.Keys(h.p.providers[h.name].instances)) {
		h.catchUp(h.put(id, v.Generations[id]))
	}
}

// settle has the instances acknowledge and the leader publish, a second
// apart, until the books give want or rounds publishes are made.
func (h *lostHistory) settle(rounds int, want map[string]int64) {
	h.t.Helper()
	for range rounds {
		if v := h.books(); maps.Equal(v.Shares, want) {
			return
		}
		h.ackAll()
		h.clock = h.clock.Add(time.Second)
		if err := h.publish(); err != nil {
			h.t.Fatal(err)
		}
	}
	if v := h.books(); !maps.Equal(v.Shares, want) {
		h.t.Errorf("after %d rounds of acknowledgements the books give %v (granted %v), want %v", rounds, v.Shares, v.Granted, want)
	}
}

// head returns etcd's revision now.
func (h *lostHistory) head() int64 {
	h.t.Helper()
	resp, err := h.cli.Get(ctxT(h.t), "\x00", clientv3.WithCountOnly())
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.Header.Revision
}

// catchUp feeds p the provider's changes after the last fed, up to
// revision through, in order.
func (h *lostHistory) catchUp(through int64) {
	h.t.Helper()
	if through <= h.seen {
		return
	}
	ctx, cancel := context.WithCancel(ctxT(h.t))
	defer cancel()
	wch := h.cli.Watch(ctx, keys.Provider(h.name), clientv3.WithPrefix(), clientv3.WithRev(h.seen+1))
	for h.seen < through {
		wr, ok := <-wch
		if !ok || wr.Err() != nil {
			h.t.Fatalf("watch: %v", wr.Err())
		}
		for _, ev := range wr.Events {
			if ev.Kv.ModRevision > through {
				h.seen = through
				return
			}
			h.p.apply(ev.Type, ev.Kv)
			h.seen = ev.Kv.ModRevision
		}
	}
}

// publish runs one publish of the provider, as the watch loop does.
func (h *lostHistory) publish() error {
	return h.p.publish(ctxT(h.t), h.p.fences[h.name], h.name, h.p.providers[h.name])
}

// books returns the leader's view of the records.
func (h *lostHistory) books() *schema.Shares { return h.p.providers[h.name].shares.view(h.name) }

// worst returns the most the instances may admit together in one aligned
// window, judged by the share records each may be following: any record
// it resolves to (its own with the common record, in one snapshot) at a
// revision from from on, since its watch may bring each of them late, but
// in order. In the window from a boundary b an instance enforces a record
// in force by b, or one before it; so it may admit the largest share of
// the records in force by b that it may resolve to. It returns that sum at
// the worst boundary of any record, the boundary, and each instance's part.
func (h *lostHistory) worst(from int64) (int64, time.Time, map[string]int64) {
	h.t.Helper()
	recs := map[string][]schema.ShareRecord{}
	for rev := from; rev <= h.head(); rev++ {
		resp, err := h.cli.Get(ctxT(h.t), keys.Shares(h.name), clientv3.WithPrefix(), clientv3.WithRev(rev))
		if err != nil {
			h.t.Fatal(err)
		}
		raw := map[string]*mvccpb.KeyValue{}
		for _, kv := range resp.Kvs {
			raw[string(kv.Key)] = kv
		}
		for id, e := range layoutResolve(h.name, raw) {
			recs[id] = append(recs[id], e.rec)
		}
	}
	var sum int64
	var at time.Time
	var parts map[string]int64
	for _, rs := range recs {
		for _, r := range rs {
			b := r.EffectiveFrom
			per := map[string]int64{}
			var s int64
			for id, rs := range recs {
				for _, r := range rs {
					if r.EffectiveFrom <= b && !r.Held {
						per[id] = max(per[id], r.Share)
					}
				}
				s += per[id]
			}
			if s > sum {
				sum, at, parts = s, time.Unix(0, b), per
			}
		}
	}
	return sum, at, parts
}

// xThenZ publishes, from a whole second on, generation 1 (x alone has
// 100) and generation 2 (z joins: x gives up 50, granted 100, and z waits
// at 0), each acknowledged, and returns the revision after them.
func (h *lostHistory) xThenZ() int64 {
	h.t.Helper()
	mustPublish := func(gen int64, want map[string]int64) {
		h.t.Helper()
		if err := h.publish(); err != nil {
			h.t.Fatal(err)
		}
		if v := h.books(); v.Generation != gen || !maps.Equal(v.Shares, want) {
			h.t.Fatalf("published generation %d, shares %v; want generation %d, %v", v.Generation, v.Shares, gen, want)
		}
	}
	base := time.Now().Truncate(time.Second)
	h.clock = base.Add(100 * time.Millisecond)
	h.catchUp(h.put("x", 0))
	mustPublish(1, map[string]int64{"x": 100})
	h.catchUp(h.put("x", 1))
	h.clock = base.Add(1500 * time.Millisecond)
	h.catchUp(h.put("z", 0))
	mustPublish(2, map[string]int64{"x": 50, "z": 0})
	h.put("x", 2)
	h.catchUp(h.put("z", 2))
	return h.head()
}

// loseWritesOf arms amb to lose the answer to the next transaction that
// writes instance id's own record.
func loseWritesOf(amb *ambiguousKV, name, id string) {
	key := keys.Share(name, id)
	amb.match = func(op clientv3.Op) bool { return op.IsPut() && string(op.KeyBytes()) == key }
	amb.armed = true
}

// sumOf spells parts out: "x 50 + y 33 + z 50".
func sumOf(parts map[string]int64) string {
	var terms []string
	for _, id := range slices.Sorted(maps.Keys(parts)) {
		terms = append(terms, fmt.Sprintf("%s %d", id, parts[id]))
	}
	return strings.Join(terms, " + ")
}

// TestLostAnswerThenJoin: a publish grows z from 0 to 50; etcd applies
// it but the answer is lost, and x and z may follow the new records
// before they acknowledge them. Then y joins. Whatever the leader's books
// make of the write, the next publish must count z at the 50 it may now
// admit, not at the 0 of the generation it acknowledged before, and must
// not give the records a generation number the lost write may already
// have used. Limit 100: x, y and z together must stay within it in every
// window, whichever of the records each follows there.
func TestLostAnswerThenJoin(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	amb := &ambiguousKV{KV: cli.KV}
	cli.KV = amb
	for _, tc := range []struct {
		name        string
		readsCommon bool // x and z follow a common record of 50 from the lost publish on
		joinFirst   bool // y registers before the lost write lands, so the leader decides before its watch brings it
	}{
		{"own", false, false},
		{"own-join-first", false, true},
		{"common", true, false},
		{"common-join-first", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "lost-" + tc.name
			h := newLostHistory(t, cli, name, 100, tc.readsCommon)
			from := h.xThenZ()

			// 3.1 s later z grows to 50. etcd applies the write; the
			// answer is lost. x and z may follow it from here on.
			h.clock = h.clock.Add(3100 * time.Millisecond)
			var yRev int64
			if tc.joinFirst {
				yRev = h.put("y", 0)
			}
			amb.match, amb.armed = nil, true // the pointers' write
			if !tc.readsCommon {
				loseWritesOf(amb, name, "z")
			}
			if err := h.publish(); err == nil || amb.armed {
				t.Fatalf("the injected lost answer did not happen (publish: %v)", err)
			}
			lost := h.head()
			// 30 ms later y joins; the leader's watch brings the join,
			// and before it the lost write unless y registered first.
			h.clock = h.clock.Add(30 * time.Millisecond)
			if !tc.joinFirst {
				yRev = h.put("y", 0)
			}
			h.catchUp(yRev)
			if err := h.publish(); err != nil {
				t.Fatal(err)
			}
			v := h.books()
			t.Logf("books: generation %d, shares %v, granted %v, generations %v", v.Generation, v.Shares, v.Granted, v.Generations)
			if sum, at, parts := h.worst(from); sum > 100 {
				t.Errorf("in the window from %s the instances may admit %s = %d > 100 (the lost write landed at revision %d)",
					at.UTC().Format("15:04:05.000"), sumOf(parts), sum, lost)
			}
			// The acknowledgements come (x and z first of the lost
			// generation); the move then ends at the even split.
			h.put("x", 3)
			h.catchUp(h.put("z", 3))
			h.settle(4, map[string]int64{"x": 34, "y": 33, "z": 33})
		})
	}
}

// TestLostCommonAnswerThenJoin: x and z follow the common record, and a
// publish that grows both writes it alone; etcd applies it but the answer
// is lost, so every follower may read the new common record. Then y joins.
// The next publish must count x and z at what the lost record gives them,
// though they acknowledged the generation before it.
func TestLostCommonAnswerThenJoin(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	amb := &ambiguousKV{KV: cli.KV}
	cli.KV = amb
	name := "lost-common"
	h := newLostHistory(t, cli, name, 90, true)
	base := time.Now().Truncate(time.Second)
	// x, w and z follow a common record of 30 each; w leaves, and once its
	// hold is over x and z may grow to 45.
	h.clock = base.Add(100 * time.Millisecond)
	h.put("x", 0)
	h.put("w", 0)
	h.catchUp(h.put("z", 0))
	if err := h.publish(); err != nil {
		t.Fatal(err)
	}
	h.ackAll()
	h.clock = base.Add(1500 * time.Millisecond)
	h.catchUp(h.leave("w"))
	if err := h.publish(); err != nil {
		t.Fatal(err)
	}
	h.ackAll()
	from := h.head()
	h.clock = h.clock.Add(5 * time.Second)
	if pts := h.p.providers[name].shares.pointers; len(pts) != 2 {
		t.Fatalf("x and z do not both follow the common record: %v", pts)
	}
	common := keys.CommonShare(name)
	amb.match = func(op clientv3.Op) bool { return op.IsPut() && string(op.KeyBytes()) == common }
	amb.armed = true
	if err := h.publish(); err == nil || amb.armed {
		t.Fatalf("the injected lost answer did not happen (publish: %v)", err)
	}
	h.clock = h.clock.Add(30 * time.Millisecond)
	h.catchUp(h.put("y", 0))
	if err := h.publish(); err != nil {
		t.Fatal(err)
	}
	v := h.books()
	t.Logf("books: generation %d, shares %v, granted %v, generations %v", v.Generation, v.Shares, v.Granted, v.Generations)
	if sum, at, parts := h.worst(from); sum > 90 {
		t.Errorf("in the window from %s the instances may admit %s = %d > 90", at.UTC().Format("15:04:05.000"), sumOf(parts), sum)
	}
	h.settle(4, map[string]int64{"x": 30, "y": 30, "z": 30})
}

// TestForeignRecordThenJoin: someone else writes z's record (a hand edit)
// growing it from 0 to 50, and y joins; the leader's watch brings both
// before it decides. z may follow that record whatever it acknowledged
// of the leader's, so the next publish must count it at 50, not at the 0
// of the generation it acknowledged before.
func TestForeignRecordThenJoin(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	name := "foreign-join"
	h := newLostHistory(t, cli, name, 100, false)
	from := h.xThenZ()
	h.clock = h.clock.Add(3100 * time.Millisecond)
	forged := h.p.providers[name].shares.records["z"].rec
	forged.Generation, forged.Share, forged.Granted, forged.Leader = 3, 50, 50, "hand"
	forged.EffectiveFrom = h.clock.Add(time.Second).Truncate(time.Second).UnixNano()
	b, err := schema.Encode(forged)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctxT(t), keys.Share(name, "z"), string(b)); err != nil {
		t.Fatal(err)
	}
	h.clock = h.clock.Add(30 * time.Millisecond)
	h.catchUp(h.put("y", 0))
	if err := h.publish(); err != nil {
		t.Fatal(err)
	}
	v := h.books()
	t.Logf("books: generation %d, shares %v, granted %v, generations %v", v.Generation, v.Shares, v.Granted, v.Generations)
	if sum, at, parts := h.worst(from); sum > 100 {
		t.Errorf("in the window from %s the instances may admit %s = %d > 100", at.UTC().Format("15:04:05.000"), sumOf(parts), sum)
	}
	h.put("z", 3)
	h.settle(4, map[string]int64{"x": 34, "y": 33, "z": 33})
}

// TestTwoLostAnswersInARow: the growth of z is lost as in
// TestLostAnswerThenJoin, and so is the publish that follows y's join,
// decided before the leader's watch brought the first. x and z then
// acknowledge the first lost generation. Each lost generation may be
// followed, so none is published again, and each counts at its grant.
func TestTwoLostAnswersInARow(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	amb := &ambiguousKV{KV: cli.KV}
	cli.KV = amb
	name := "two-lost"
	h := newLostHistory(t, cli, name, 100, false)
	from := h.xThenZ()
	h.clock = h.clock.Add(3100 * time.Millisecond)
	yRev := h.put("y", 0)
	for i := range 2 {
		loseWritesOf(amb, name, "z")
		if err := h.publish(); err == nil || amb.armed {
			t.Fatalf("the injected lost answer %d did not happen (publish: %v)", i+1, err)
		}
		h.clock = h.clock.Add(30 * time.Millisecond)
		h.catchUp(yRev)
	}
	if gen := h.p.providers[name].maxGen; gen != 4 {
		t.Errorf("after two lost publishes the highest generation known is %d, want 4", gen)
	}
	h.put("x", 3)
	zAck := h.put("z", 3)
	h.clock = h.clock.Add(time.Second)
	h.catchUp(zAck)
	if err := h.publish(); err != nil {
		t.Fatal(err)
	}
	v := h.books()
	t.Logf("books: generation %d, shares %v, granted %v, generations %v", v.Generation, v.Shares, v.Granted, v.Generations)
	if sum, at, parts := h.worst(from); sum > 100 {
		t.Errorf("in the window from %s the instances may admit %s = %d > 100", at.UTC().Format("15:04:05.000"), sumOf(parts), sum)
	}
	h.settle(5, map[string]int64{"x": 34, "y": 33, "z": 33})
}
