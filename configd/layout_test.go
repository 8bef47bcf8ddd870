package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

var (
	layoutSeed = flag.Uint64("layout.seed", 0, "TestShareLayoutOracle: replay this seed only")
	layoutN    = flag.Int("layout.n", 20, "TestShareLayoutOracle: random histories to check")
)

// TestShareLayoutOracle checks the leader's writes of share records (the
// common record, the records that say Common, the instances' own records:
// see shares.go) against an oracle, over random histories of publishes on
// a real etcd: instances come and go, their shares move alike or apart, a
// process registers again under an ID, records are forged or malformed
// between publishes. After every etcd revision a publish writes (every
// snapshot an instance can read), every instance's record, resolved,
// is its record before the publish or the new one (with the publish's
// boundary); after the publish, every instance resolves to its new record
// at a revision after its registration, no other instance has a record,
// the common record is there only if some record says Common, and the
// leader's books say what etcd holds. Over the whole history, no common
// record says Unmoved after another write of an instance's record since
// the common record before it (layoutUnmoved).
//
//	go test ./configd -run 'TestShareLayoutOracle$' -layout.n=500
//	go test ./configd -run 'TestShareLayoutOracle$' -layout.seed=N -v
func TestShareLayoutOracle(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	seeds := []uint64{*layoutSeed}
	if *layoutSeed == 0 {
		seeds = seeds[:0]
		base := uint64(time.Now().UnixNano())
		for i := range *layoutN {
			seeds = append(seeds, base+uint64(i))
		}
		t.Logf("%d histories from seed %d", len(seeds), base)
	}
	unmoved := 0 // common records that said Unmoved: the check below ran on them
	defer func() { t.Logf("%d common records said unmoved", unmoved) }()
	for i, seed := range seeds {
		if err := layoutHistory(ctxT(t), cli, fmt.Sprintf("lay%d", i), seed, &unmoved); err != nil {
			t.Fatalf("seed %d: %v\nreplay: go test ./configd -run 'TestShareLayoutOracle$' -layout.seed=%d -v", seed, err, seed)
		}
	}
}

// layoutHistory runs one random history of publishes of provider name.
func layoutHistory(ctx context.Context, cli *clientv3.Client, name string, seed uint64, unmoved *int) error {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	const limit = 1000
	cfg, _ := schema.Encode(schema.ProviderConfig{Name: name, Limit: limit}.WithDefaults())
	put, err := cli.Put(ctx, keys.Config(name), string(cfg))
	if err != nil {
		return err
	}
	cond := clientv3.Compare(clientv3.ModRevision(keys.Config(name)), "=", put.Header.Revision)
	own, err := cli.Put(ctx, keys.Owner(name), "r1")
	if err != nil {
		return err
	}
	p := &publisher{
		cli: cli, keys: keys, log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(prometheus.NewRegistry()),
		margin: DefaultPropagationMargin, replica: "r1", now: time.Now,
		providers: map[string]*providerState{}, malformed: map[string]string{}, dirty: map[string]bool{},
		fences: map[string]fence{name: {key: keys.Owner(name), rev: own.Header.Revision}},
	}
	st := p.state(name)
	c, _ := schema.DecodeProviderConfig(cfg)
	st.cfg, st.cfgRev, st.keyRev = &c, put.Header.Revision, put.Header.Revision
	f := p.fences[name]
	ids := make([]string, 2+rng.IntN(14))
	for i := range ids {
		ids[i] = fmt.Sprintf("i%02d", i)
		// Most follow a record that says Common; one of an older
		// release does not.
		st.instances[ids[i]] = schema.InstanceRecord{ID: ids[i], ReadsCommon: rng.IntN(6) != 0, ReadsUnmoved: rng.IntN(10) != 0}
	}
	shapes := []int64{0, 50, 80, 100}
	var trace []string
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%s\nhistory:\n  %s", fmt.Sprintf(format, args...), strings.Join(trace, "\n  "))
	}
	rev := put.Header.Revision
	for gen := int64(1); gen <= 12; gen++ {
		// Between publishes: a process registers again under an ID, a
		// record is forged or malformed.
		if rng.IntN(4) == 0 {
			id := ids[rng.IntN(len(ids))]
			st.shares.registered[id] = rev + 1
			trace = append(trace, fmt.Sprintf("%s registers again", id))
		}
		if rng.IntN(5) == 0 {
			key, val := layoutForgery(rng, name, ids, gen)
			resp, err := cli.Put(ctx, key, val)
			if err != nil {
				return err
			}
			p.applyKV(mvccpb.PUT, &mvccpb.KeyValue{Key: []byte(key), Value: []byte(val), ModRevision: resp.Header.Revision, Version: 2}, false)
			trace = append(trace, fmt.Sprintf("forged %s = %s", key, val))
		}
		before, rev0, err := layoutRead(ctx, cli, name)
		if err != nil {
			return err
		}
		// The publish: a record for each live instance, most alike.
		want := map[string]schema.ShareRecord{}
		common := shapes[rng.IntN(len(shapes))]
		for _, id := range ids {
			if rng.IntN(5) == 0 {
				continue // gone
			}
			sh := common
			if rng.IntN(3) == 0 {
				sh = shapes[rng.IntN(len(shapes))]
			}
			r := schema.ShareRecord{Version: schema.Version, Provider: name, Instance: id, Generation: gen,
				EffectiveFrom: gen * int64(time.Second), Window: schema.Duration(time.Second), Total: limit,
				Share: sh, Granted: sh, ConfigRevision: st.cfgRev, Published: time.Unix(gen, 0).UTC(), Leader: "r1"}
			if rng.IntN(8) == 0 {
				r.Share, r.Held = 0, true
			}
			want[id] = r
		}
		trace = append(trace, fmt.Sprintf("generation %d: %s", gen, layoutWant(want)))
		wctx, stopWatch := context.WithCancel(ctx)
		wch := cli.Watch(wctx, keys.Shares(name), clientv3.WithPrefix(), clientv3.WithRev(rev0+1))
		_, _, ok, err := p.writeRecords(ctx, f, name, st, cond, want)
		if err != nil || !ok {
			stopWatch()
			return fail("generation %d: write: %v, ok %v", gen, err, ok)
		}
		after, rev1, err := layoutRead(ctx, cli, name)
		if err != nil {
			stopWatch()
			return err
		}
		rev = rev1
		// Every snapshot between the two reads: nothing but the publish
		// writes meanwhile.
		snap := maps.Clone(before.raw)
		var evs []*clientv3.Event
		for rev1 > rev0 && (len(evs) == 0 || evs[len(evs)-1].Kv.ModRevision < rev1) {
			wr, open := <-wch
			if !open || wr.Err() != nil {
				stopWatch()
				return fmt.Errorf("watch: %v", wr.Err())
			}
			evs = append(evs, wr.Events...)
		}
		stopWatch()
		for i, ev := range evs {
			if ev.Type == clientv3.EventTypeDelete {
				delete(snap, string(ev.Kv.Key))
			} else {
				snap[string(ev.Kv.Key)] = ev.Kv
			}
			p.applyKV(ev.Type, ev.Kv, false) // the leader's own watch: echoes
			if i+1 < len(evs) && evs[i+1].Kv.ModRevision == ev.Kv.ModRevision {
				continue // the rest of this revision's transaction
			}
			now := layoutResolve(name, snap)
			for _, id := range ids {
				if err := layoutAllowed(before.resolved[id], now[id], want, id); err != nil {
					return fail("generation %d, at revision %d: %s: %v", gen, ev.Kv.ModRevision, id, err)
				}
			}
		}
		// After it.
		for _, id := range ids {
			r, have := after.resolved[id]
			w, named := want[id]
			switch {
			case !named && have:
				return fail("generation %d: %s is gone and still has a record %+v", gen, id, r)
			case named && after.pointers[id] && !st.instances[id].ReadsCommon:
				return fail("generation %d: %s, of an older release, was given a record that says Common", gen, id)
			case named && (!have || !sameRecord(r.rec, w)):
				return fail("generation %d: %s resolves to %+v (have %v), want %+v", gen, id, r.rec, have, w)
			case named && r.rev < st.shares.registered[id]:
				return fail("generation %d: %s's record is from revision %d, before it registered at %d", gen, id, r.rev, st.shares.registered[id])
			case named && (st.shares.records[id].rec != r.rec || st.shares.records[id].rev != r.rev):
				return fail("generation %d: %s: the books say %+v at %d, etcd %+v at %d", gen, id, st.shares.records[id].rec, st.shares.records[id].rev, r.rec, r.rev)
			}
			if _, books := st.shares.pointers[id]; books != after.pointers[id] {
				return fail("generation %d: %s: the books say pointer %v, etcd %v", gen, id, books, after.pointers[id])
			}
		}
		if _, ok := after.raw[keys.CommonShare(name)]; ok != (len(after.pointers) > 0) {
			return fail("generation %d: common record there %v, with %d records that say Common", gen, ok, len(after.pointers))
		}
		if len(st.shares.records) != len(want) || st.shares.bad() {
			return fail("generation %d: %d records in the books, want %d; to rewrite %v", gen, len(st.shares.records), len(want), st.shares.rewrite)
		}
	}
	if err := layoutUnmoved(ctx, cli, name, put.Header.Revision, rev, st.readsUnmoved(), unmoved); err != nil {
		return fail("%v", err)
	}
	return nil
}

// layoutUnmoved checks, over the history of provider name's share records
// from revision from to to, what a common record that says Unmoved
// promises its followers (schema.ShareRecord.Unmoved): between the write
// of the common record before it (any, or none) and it, every write of an
// instance's record said Common, and none was deleted; and none says so
// unless every instance that reads the common record decodes the flag
// (reads). It adds to unmoved the common records that said so.
func layoutUnmoved(ctx context.Context, cli *clientv3.Client, name string, from, to int64, reads bool, unmoved *int) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := cli.Watch(wctx, keys.Shares(name), clientv3.WithPrefix(), clientv3.WithRev(from))
	var moved []string // writes of instances' records since the last common record's
	for last := int64(0); last < to; {
		wr, open := <-wch
		if !open || wr.Err() != nil {
			return fmt.Errorf("watch: %v", wr.Err())
		}
		for _, ev := range wr.Events {
			last = ev.Kv.ModRevision
			key := string(ev.Kv.Key)
			if key != keys.CommonShare(name) {
				if r, err := schema.DecodeShareRecord(ev.Kv.Value); ev.Type == clientv3.EventTypeDelete || err != nil || !r.Common {
					moved = append(moved, fmt.Sprintf("%s at %d (%s)", key, ev.Kv.ModRevision, ev.Type))
				}
				continue
			}
			if c, err := schema.DecodeShareRecord(ev.Kv.Value); ev.Type == clientv3.EventTypePut && err == nil && c.Unmoved && len(moved) > 0 {
				return fmt.Errorf("the common record written at %d says unmoved, after %v", ev.Kv.ModRevision, moved)
			}
			if c, err := schema.DecodeShareRecord(ev.Kv.Value); err == nil && c.Unmoved {
				if !reads {
					return fmt.Errorf("the common record written at %d says unmoved, and an instance that reads it does not decode the flag", ev.Kv.ModRevision)
				}
				*unmoved++
			}
			moved = moved[:0]
		}
	}
	return nil
}

// layoutForgery returns a record someone else writes: an instance's with
// another share, a malformed one, or a common record.
func layoutForgery(rng *rand.Rand, name string, ids []string, gen int64) (key, val string) {
	id := ids[rng.IntN(len(ids))]
	r := schema.ShareRecord{Version: schema.Version, Provider: name, Instance: id, Generation: gen,
		EffectiveFrom: 0, Window: schema.Duration(time.Second), Total: 1000, Share: 70, Granted: 70, Leader: "forger"}
	switch rng.IntN(3) {
	case 0:
		b, _ := schema.Encode(r)
		return keys.Share(name, id), string(b)
	case 1:
		return keys.Share(name, id), "{not json"
	}
	r.Instance = schema.CommonInstance
	b, _ := schema.Encode(r)
	return keys.CommonShare(name), string(b)
}

type layoutEntry struct {
	rec schema.ShareRecord
	rev int64 // of the instance's own key
}

// layoutState is what etcd holds of a provider's share records.
type layoutState struct {
	raw      map[string]*mvccpb.KeyValue
	resolved map[string]layoutEntry
	pointers map[string]bool
}

func layoutRead(ctx context.Context, cli *clientv3.Client, name string) (layoutState, int64, error) {
	resp, err := cli.Get(ctx, keys.Shares(name), clientv3.WithPrefix())
	if err != nil {
		return layoutState{}, 0, err
	}
	raw := map[string]*mvccpb.KeyValue{}
	for _, kv := range resp.Kvs {
		raw[string(kv.Key)] = kv
	}
	s := layoutState{raw: raw, resolved: layoutResolve(name, raw), pointers: map[string]bool{}}
	for key, kv := range raw {
		if r, err := schema.DecodeShareRecord(kv.Value); err == nil && r.Common {
			s.pointers[strings.TrimPrefix(key, keys.Shares(name))] = true
		}
	}
	return s, resp.Header.Revision, nil
}

// layoutResolve resolves every instance's record in one snapshot, as an
// instance does (schema.ShareRecord.Resolve); a record that does not
// decode or resolve is left out (the instance keeps its last good one,
// which the oracle then finds unchanged).
func layoutResolve(name string, raw map[string]*mvccpb.KeyValue) map[string]layoutEntry {
	var common *schema.ShareRecord
	if kv, ok := raw[keys.CommonShare(name)]; ok {
		if c, err := schema.DecodeShareRecord(kv.Value); err == nil {
			common = &c
		}
	}
	out := map[string]layoutEntry{}
	for key, kv := range raw {
		id := strings.TrimPrefix(key, keys.Shares(name))
		if id == schema.CommonInstance {
			continue
		}
		r, err := schema.DecodeShareRecord(kv.Value)
		if err == nil {
			r, err = r.Resolve(common)
		}
		if err == nil {
			out[id] = layoutEntry{r, kv.ModRevision}
		}
	}
	return out
}

// layoutAllowed reports whether now, what instance id resolves to while a
// publish of want is under way, is allowed: what it resolved to before,
// no record (its record goes or does not resolve: it keeps its last good
// one), its new record with the publish's boundary, or, when it is gone,
// a record of nothing.
func layoutAllowed(before, now layoutEntry, want map[string]schema.ShareRecord, id string) error {
	if now.rec.Generation == 0 || now.rec == before.rec {
		return nil
	}
	w, ok := want[id]
	if !ok {
		if now.rec.Enforcing() == 0 && now.rec.Held {
			return nil // a record of nothing, before its record goes
		}
		return fmt.Errorf("resolves to %+v, neither its record before (%+v) nor none", now.rec, before.rec)
	}
	if !sameRecord(now.rec, w) || now.rec.Generation != w.Generation || now.rec.EffectiveFrom != w.EffectiveFrom {
		return fmt.Errorf("resolves to %+v, neither its record before (%+v) nor its new one (%+v)", now.rec, before.rec, w)
	}
	return nil
}

// layoutLastWrite returns the newest revision among the share records.
func layoutLastWrite(s layoutState) int64 {
	var last int64
	for _, kv := range s.raw {
		last = max(last, kv.ModRevision)
	}
	return last
}

// layoutWant describes a publish's records briefly.
func layoutWant(want map[string]schema.ShareRecord) string {
	var b strings.Builder
	for _, id := range slices.Sorted(maps.Keys(want)) {
		r := want[id]
		fmt.Fprintf(&b, "%s:%d", id, r.Share)
		if r.Held {
			b.WriteString("(held)")
		}
		b.WriteByte(' ')
	}
	return b.String()
}
