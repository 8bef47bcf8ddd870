package main

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestHoldFor: configd holds an expired instance's grant for the longest
// fail_static the instance may still be counting with, plus the clock
// bound: the provider's, the one its record reports, and one replaced
// after that record was written (the instance may have read it since).
func TestHoldFor(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 7, 0, 0, 0, time.UTC)
	const bound = 20 * time.Millisecond // 2% of the 1 s window
	cfg := func(fs time.Duration) *schema.ProviderConfig {
		return &schema.ProviderConfig{Version: 1, Name: "pay", Limit: 100, Window: schema.Duration(time.Second), FailStatic: schema.Duration(fs)}
	}
	rec := func(fs time.Duration, updated time.Time) *schema.InstanceRecord {
		return &schema.InstanceRecord{Version: 1, ID: "a", Updated: updated, FailStatic: schema.Duration(fs)}
	}
	// configs are applied in order, the last at t0, each earlier one five
	// minutes before the next (more than recordSkew).
	tests := []struct {
		name    string
		configs []*schema.ProviderConfig
		rec     *schema.InstanceRecord
		written time.Time // when this replica saw rec, if before rec.Updated
		want    time.Duration
	}{
		{"no config: the default", nil, nil, time.Time{}, schema.DefaultFailStatic + bound},
		{"the provider's", []*schema.ProviderConfig{cfg(5 * time.Second)}, rec(5*time.Second, t0), time.Time{}, 5*time.Second + bound},
		{"0 in the config is the default", []*schema.ProviderConfig{cfg(0)}, rec(0, t0), time.Time{}, schema.DefaultFailStatic + bound},
		{"a record from before the field", []*schema.ProviderConfig{cfg(5 * time.Second)}, rec(0, t0), time.Time{}, 5*time.Second + bound},
		{"the record alone (a replica that never saw the change): its value",
			[]*schema.ProviderConfig{cfg(time.Second)}, rec(40*time.Second, t0), time.Time{}, 40*time.Second + bound},
		{"the instance's clock 10 min ahead: a value replaced after the record was seen counts",
			[]*schema.ProviderConfig{cfg(40 * time.Second), cfg(time.Second)}, rec(time.Second, t0.Add(10*time.Minute)), t0.Add(-2 * time.Minute), 40*time.Second + bound},
		{"lowered; the record still says the old value (cut off before it read the new one)",
			[]*schema.ProviderConfig{cfg(40 * time.Second), cfg(time.Second)}, rec(40*time.Second, t0.Add(-2*time.Minute)), time.Time{}, 40*time.Second + bound},
		{"lowered; the record, written after, says the new value",
			[]*schema.ProviderConfig{cfg(40 * time.Second), cfg(time.Second)}, rec(time.Second, t0.Add(5*time.Minute)), time.Time{}, time.Second + bound},
		{"raised then lowered after the record was written: it may have read the raised value",
			[]*schema.ProviderConfig{cfg(5 * time.Second), cfg(40 * time.Second), cfg(time.Second)}, rec(5*time.Second, t0.Add(-90*time.Second)), time.Time{}, 40*time.Second + bound},
		{"a value replaced before the record was written is not counted",
			[]*schema.ProviderConfig{cfg(40 * time.Second), cfg(5 * time.Second), cfg(time.Second)}, rec(5*time.Second, t0.Add(-30*time.Second)), time.Time{}, 5*time.Second + bound},
		{"no record (a leader that starts): every value remembered",
			[]*schema.ProviderConfig{cfg(40 * time.Second), cfg(5 * time.Second), cfg(time.Second)}, nil, time.Time{}, 40*time.Second + bound},
		{"the config deleted: the default, and the replaced value",
			[]*schema.ProviderConfig{cfg(40 * time.Second), nil}, nil, time.Time{}, 40*time.Second + bound},
		{"an instance that said it was leaving: Settle alone",
			[]*schema.ProviderConfig{cfg(40 * time.Second)}, &schema.InstanceRecord{Version: 1, ID: "a", Updated: t0, FailStatic: schema.Duration(40 * time.Second), Leaving: true}, time.Time{}, 0},
		{"max_clock_offset is the bound",
			[]*schema.ProviderConfig{{Version: 1, Name: "pay", Limit: 100, Window: schema.Duration(time.Second), FailStatic: schema.Duration(3 * time.Second), MaxClockOffset: schema.Duration(100 * time.Millisecond)}},
			nil, time.Time{}, 3*time.Second + 100*time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := &providerState{}
			for i, c := range tt.configs {
				prev := st.cfg
				st.cfg = c
				st.noteFailStatic(prev, t0.Add(-time.Duration(len(tt.configs)-1-i)*5*time.Minute))
			}
			written := tt.written
			if tt.rec != nil && written.IsZero() {
				written = tt.rec.Updated
			}
			// Every hold lasts Settle more: a window and twice the bound.
			want := tt.want + st.config().Settle()
			if got := st.holdFor("i", tt.rec, written); got != want {
				t.Errorf("holdFor = %v, want %v (replaced %v)", got, want, st.replaced)
			}
		})
	}
}

// TestReplacedFailStaticForgotten: a replaced value is remembered for
// failStaticMemory, then no longer lengthens a hold.
func TestReplacedFailStaticForgotten(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 7, 0, 0, 0, time.UTC)
	old := &schema.ProviderConfig{Version: 1, Name: "pay", Limit: 100, Window: schema.Duration(time.Second), FailStatic: schema.Duration(time.Hour)}
	cur := *old
	cur.FailStatic = schema.Duration(time.Second)
	st := &providerState{cfg: &cur}
	st.noteFailStatic(old, t0)
	if got := st.holdFor("i", nil, time.Time{}); got < time.Hour {
		t.Fatalf("just after the change: hold %v, want at least the replaced 1h", got)
	}
	st.noteFailStatic(&cur, t0.Add(failStaticMemory)) // no change: only prunes
	if len(st.replaced) != 1 {
		t.Fatalf("forgotten at exactly failStaticMemory: %v", st.replaced)
	}
	st.noteFailStatic(&cur, t0.Add(failStaticMemory+time.Second))
	if got, want := st.holdFor("i", nil, time.Time{}), time.Second+20*time.Millisecond+cur.Settle(); got != want || len(st.replaced) != 0 {
		t.Errorf("after failStaticMemory: hold %v (replaced %v), want %v", got, st.replaced, want)
	}
}

// TestLoweredFailStaticHoldsByTheRecord: the provider's fail_static is
// lowered from 40 s to 1 s while an instance is cut off from etcd (its
// record, from before, says its expiry counts with 40 s); when its lease
// expires, its grant is held for 40 s, not 1 s: it may enforce its share
// that long. The same for a leader that never saw the change (it started
// after): the record says so.
func TestLoweredFailStaticHoldsByTheRecord(t *testing.T) {
	for _, sawChange := range []bool{true, false} {
		t.Run(fmt.Sprintf("leader saw the change %v", sawChange), func(t *testing.T) {
			now := time.Date(2026, 11, 22, 7, 0, 0, 0, time.UTC)
			p := holdPublisher(&now)
			ev := applyEvents(t, p)
			keys := p.keys
			cfg := schema.ProviderConfig{Version: 1, Name: "pay", Limit: 100, Window: schema.Duration(time.Second), FailStatic: schema.Duration(40 * time.Second)}.WithDefaults()
			if sawChange {
				ev(mvccpb.PUT, keys.Config("pay"), cfg)
			}
			ev(mvccpb.PUT, keys.Instance("pay", "a"), schema.InstanceRecord{Version: 1, ID: "a", Updated: now, FailStatic: schema.Duration(40 * time.Second)})
			ev(mvccpb.PUT, keys.Share("pay", "a"), schema.ShareRecord{Version: 1, Provider: "pay", Instance: "a", Generation: 1, Window: schema.Duration(time.Second), Total: 100,
				Share: 100, Granted: 100})
			// Cut off: it writes nothing more. The operator lowers
			// fail_static a few minutes later, and its lease expires after.
			now = now.Add(3 * time.Minute)
			cfg.FailStatic = schema.Duration(time.Second)
			ev(mvccpb.PUT, keys.Config("pay"), cfg)
			now = now.Add(5 * time.Second)
			ev(mvccpb.DELETE, keys.Instance("pay", "a"), nil)
			want := now.Add(40*time.Second + 20*time.Millisecond + cfg.Settle())
			if got := p.providers["pay"].held["a"].until; !got.Equal(want) {
				t.Errorf("held until %v, want %v (the record's 40 s plus the clock bound, plus Settle)", got, want)
			}
		})
	}
}

// TestReplacedFromHistory: a replica that loads learns from the history
// entries of the last failStaticMemory which fail_static values were
// replaced, and when.
func TestReplacedFromHistory(t *testing.T) {
	now := time.Date(2026, 11, 22, 7, 0, 0, 0, time.UTC)
	cfg := func(fs time.Duration) *schema.ProviderConfig {
		c := schema.ProviderConfig{Version: 1, Name: "pay", Limit: 100, Window: schema.Duration(time.Second), FailStatic: schema.Duration(fs)}.WithDefaults()
		return &c
	}
	entry := func(when time.Time, old, new *schema.ProviderConfig) *mvccpb.KeyValue {
		b, err := schema.Encode(schema.HistoryEntry{Version: 1, Provider: "pay", Who: "op", When: when, Old: old, New: new})
		if err != nil {
			t.Fatal(err)
		}
		return &mvccpb.KeyValue{Value: b}
	}
	kvs := []*mvccpb.KeyValue{
		entry(now.Add(-time.Minute), cfg(40*time.Second), cfg(time.Second)),      // lowered: remembered
		entry(now.Add(-2*time.Minute), cfg(30*time.Second), cfg(30*time.Second)), // the limit changed, not fail_static
		entry(now.Add(-3*time.Minute), nil, cfg(30*time.Second)),                 // created
		entry(now.Add(-4*time.Minute), cfg(20*time.Second), nil),                 // deleted: remembered
		entry(now.Add(-3*time.Hour), cfg(time.Hour), cfg(time.Second)),           // too old
		{Value: []byte(`{"version":1,`)},                                         // malformed
	}
	st := &providerState{}
	st.replacedFrom(kvs, now)
	want := []replacedFailStatic{{d: 40 * time.Second, until: now.Add(-time.Minute)}, {d: 20 * time.Second, until: now.Add(-4 * time.Minute)}}
	if !slices.Equal(st.replaced, want) {
		t.Errorf("replaced %v, want %v", st.replaced, want)
	}
}

// TestOwnMalformedRecordIsNotRewritten: a share record at the revision
// this replica wrote it that does not decode (a newer decoder refusing an
// older configd's output, or a record over the decoders' size limit as an
// older configd wrote) is reported, not rewritten: rewriting its own
// output would write the same again, in a loop (issue 12: 101 rewrites in
// 5 s). A malformed record written by anyone else is rewritten.
func TestOwnMalformedRecordIsNotRewritten(t *testing.T) {
	p := &publisher{
		keys: schema.DefaultKeys(), log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(prometheus.NewRegistry()),
		now: time.Now, providers: map[string]*providerState{}, malformed: map[string]string{}, dirty: map[string]bool{},
		history: map[string]int64{},
	}
	k := p.keys.Share("pay", "i1")
	p.apply(mvccpb.PUT, &mvccpb.KeyValue{Key: []byte(p.keys.Config("pay")), ModRevision: 1,
		Value: []byte(`{"version":1,"name":"pay","limit":10,"window":"1s","mode":"enforce","algorithm":"even","pacing":false}`)})
	st := p.providers["pay"]
	st.shares.own["i1"] = 7
	p.apply(mvccpb.PUT, &mvccpb.KeyValue{Key: []byte(k), ModRevision: 7, Value: []byte(`{"version":1,`)})
	if st.shares.bad() {
		t.Errorf("its own malformed record is to be rewritten")
	}
	if _, listed := p.malformed[k]; !listed {
		t.Errorf("its own malformed record is not reported")
	}
	p.apply(mvccpb.PUT, &mvccpb.KeyValue{Key: []byte(k), ModRevision: 8, Value: []byte(`{"version":1,`)})
	if !st.shares.bad() {
		t.Errorf("a malformed record written by someone else is not to be rewritten")
	}
}

// TestHoldCoversAWindowOfAnotherLength: an instance whose share record is
// of another window length than the config's (the window changed while it
// was cut off) may admit past its horizon to the end of a window that began
// before it, so its hold is longer by that length. Found by review: a 10 s
// window ran 8 s past a hold that ended when the window had become 1 s,
// 90 in a 1 s window of 60.
func TestHoldCoversAWindowOfAnotherLength(t *testing.T) {
	cfg := &schema.ProviderConfig{Version: 1, Name: "pay", Limit: 60, Window: schema.Duration(time.Second), FailStatic: schema.Duration(time.Second)}
	st := &providerState{cfg: cfg, shares: newShareState()}
	rec := &schema.InstanceRecord{FailStatic: schema.Duration(time.Second)}
	base := st.holdFor("a", rec, time.Time{})
	st.shares.records["a"] = shareEntry{rec: schema.ShareRecord{Window: schema.Duration(time.Second), Share: 30}}
	if got := st.holdFor("a", rec, time.Time{}); got != base {
		t.Errorf("a record of the config's window: hold %v, want %v", got, base)
	}
	st.shares.records["a"] = shareEntry{rec: schema.ShareRecord{Window: schema.Duration(10 * time.Second), Share: 30}}
	if got := st.holdFor("a", rec, time.Time{}); got != base+10*time.Second {
		t.Errorf("a record of 10 s windows under a config of 1 s: hold %v, want %v", got, base+10*time.Second)
	}
	st.shares.records["a"] = shareEntry{rec: schema.ShareRecord{Window: schema.Duration(time.Second), Share: 30,
		Before: &schema.ShareTransition{Window: schema.Duration(5 * time.Second), Since: 3, Granted: 150}}}
	if got := st.holdFor("a", rec, time.Time{}); got != base+5*time.Second {
		t.Errorf("a record keeping an old regime of 5 s windows: hold %v, want %v", got, base+5*time.Second)
	}
}

// TestHoldGrowsWhenTheWindowChanges: a hold set while the config's window
// was that of the held instance's record grows by that window's length
// when the config's window changes, since the instance's limiter may run
// a window of the old length past its horizon. Found by review: the hold
// ended inside the held instance's 10 s window after it became 1 s.
func TestHoldGrowsWhenTheWindowChanges(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 6, 0, 0, 0, time.UTC)
	old := &schema.ProviderConfig{Version: 1, Name: "pay", Limit: 60, Window: schema.Duration(10 * time.Second), FailStatic: schema.Duration(3 * time.Second)}
	st := &providerState{cfg: old, shares: newShareState(), held: map[string]hold{"a": {until: t0, under: *old}}}
	st.shares.records["a"] = shareEntry{rec: schema.ShareRecord{Window: schema.Duration(10 * time.Second), Share: 30}}
	st.configChanged()
	if got := st.held["a"].until; !got.Equal(t0) {
		t.Errorf("no change of window: hold until %v, want %v", got, t0)
	}
	cur := *old
	cur.Window = schema.Duration(time.Second)
	st.cfg = &cur
	st.configChanged()
	if got, want := st.held["a"].until, t0.Add(10*time.Second); !got.Equal(want) {
		t.Errorf("window 10s became 1s: hold until %v, want %v", got, want)
	}
}

// TestHoldGrowsWithSettle: a hold counts Settle, a window and twice the
// clock bound past the held instance's horizon, so that the others grow a
// late record into a window it admitted nothing in (follow.Schedule). A
// config of a longer window or a larger bound lengthens the hold by what
// Settle grew since the config it was counted under. Found by review:
// held for a 1 s Settle, an instance cut off on its fail_static stopped a
// second before the others, who had switched to 60 s windows, grew a late
// record at once in the window it had admitted in: 6,363 of 6,000. Then,
// by a second review, the same compared with the defaults after the
// provider was deleted and created again, and not made when the config
// changed while the watch was broken (TestHoldAcrossAReload).
func TestHoldGrowsWithSettle(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 6, 0, 0, 0, time.UTC)
	second := schema.ProviderConfig{Version: 1, Name: "pay", Limit: 100, Window: schema.Duration(time.Second), FailStatic: schema.Duration(30 * time.Second)}
	minute := second
	minute.Limit, minute.Window = 6000, schema.Duration(time.Minute)
	bounded := minute
	bounded.MaxClockOffset = schema.Duration(5 * time.Second)
	tenth := second
	tenth.Limit, tenth.Window = 10, schema.Duration(100*time.Millisecond)
	for _, c := range []struct {
		name       string
		under, cur schema.ProviderConfig
		grows      time.Duration
	}{
		{"1 s to 60 s", second, minute, minute.Settle() - second.Settle()},
		{"60 s to 1 s", minute, second, 0},
		{"a larger clock bound", minute, bounded, bounded.Settle() - minute.Settle()},
		{"held while the provider was deleted, created again of 60 s", schema.ProviderConfig{}, minute, minute.Settle() - schema.ProviderConfig{}.Settle()},
		{"held under 100 ms, deleted, created again of 1 s", tenth, second, second.Settle() - tenth.Settle()},
		{"the same config", minute, minute, 0},
	} {
		st := &providerState{cfg: &c.cur, shares: newShareState(), held: map[string]hold{"x": {until: t0, under: c.under}}}
		st.shares.records["x"] = shareEntry{rec: schema.ShareRecord{Window: c.cur.Window, Share: 10, Granted: 10}}
		st.configChanged()
		if got, want := st.held["x"].until, t0.Add(c.grows); !got.Equal(want) {
			t.Errorf("%s: hold until %v, want %v (Settle grew by %v)", c.name, got, want, c.grows)
		}
		st.configChanged() // once counted, not again
		if got, want := st.held["x"].until, t0.Add(c.grows); !got.Equal(want) {
			t.Errorf("%s, the change seen twice: hold until %v, want %v", c.name, got, want)
		}
	}
}

// applyEvents returns a function that applies a watch event of key, with
// v encoded as its value (nil: none), to p, each at the next revision.
func applyEvents(t *testing.T, p *publisher) func(typ mvccpb.Event_EventType, key string, v any) {
	rev := int64(10)
	return func(typ mvccpb.Event_EventType, key string, v any) {
		t.Helper()
		rev++
		kv := &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev, CreateRevision: rev, Lease: 1}
		if v != nil {
			b, err := schema.Encode(v)
			if err != nil {
				t.Fatal(err)
			}
			kv.Value = b
		}
		p.apply(typ, kv)
	}
}

// holdPublisher is a publisher with no etcd, on the clock *now.
func holdPublisher(now *time.Time) *publisher {
	return &publisher{
		keys: schema.DefaultKeys(), log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(prometheus.NewRegistry()),
		now: func() time.Time { return *now }, providers: map[string]*providerState{}, malformed: map[string]string{}, dirty: map[string]bool{},
		history: map[string]int64{},
	}
}

// TestHoldAcrossDeleteAndCreate: the provider deleted and created again
// while an instance is held, of 100 ms windows before and 1 s after. The
// hold grows by the linger of the held instance's 100 ms record and by
// what Settle grew since the config it was counted under. Found by
// review: compared with the defaults' Settle, which is the new one's,
// nothing was added, and the others grew a late record at once in a 1 s
// window the held instance still admitted in (worked out: about 290 of
// 200).
func TestHoldAcrossDeleteAndCreate(t *testing.T) {
	now := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	p := holdPublisher(&now)
	ev := applyEvents(t, p)
	k := p.keys
	old := schema.ProviderConfig{Version: 1, Name: "pay", Limit: 20, Window: schema.Duration(100 * time.Millisecond), FailStatic: schema.Duration(10 * time.Second)}.WithDefaults()
	ev(mvccpb.PUT, k.Config("pay"), old)
	ev(mvccpb.PUT, k.Instance("pay", "x"), schema.InstanceRecord{Version: 1, ID: "x", Updated: now, FailStatic: schema.Duration(10 * time.Second), AppliedGeneration: 1})
	ev(mvccpb.PUT, k.Share("pay", "x"), schema.ShareRecord{Version: 1, Provider: "pay", Instance: "x", Generation: 1, Window: old.Window, Total: 20, Share: 10, Granted: 10, ConfigRevision: 11})
	// x is cut off: its key goes; it may admit until 10 s later (its
	// fail_static), plus the clock bound, on its 100 ms windows.
	ev(mvccpb.DELETE, k.Instance("pay", "x"), nil)
	stop := now.Add(old.HoldAfter(10 * time.Second)) // the latest x may still admit (its horizon, on any clock)
	st := p.providers["pay"]
	t.Logf("held until stop + %v (Settle of 100 ms: %v)", st.held["x"].until.Sub(stop), old.Settle())
	// The operator deletes the provider and creates it again, 200 per 1 s.
	now = now.Add(time.Second)
	ev(mvccpb.DELETE, k.Config("pay"), nil)
	now = now.Add(time.Second)
	cur := schema.ProviderConfig{Version: 1, Name: "pay", Limit: 200, Window: schema.Duration(time.Second), FailStatic: schema.Duration(10 * time.Second)}.WithDefaults()
	ev(mvccpb.PUT, k.Config("pay"), cur)
	st = p.providers["pay"]
	// x's last 100 ms window may run 100 ms past stop (lingers), and the
	// others grow a late record of 1 s windows at once up to a window and
	// twice the bound after its publish.
	need := stop.Add(100*time.Millisecond + cur.Settle())
	got := st.held["x"].until
	t.Logf("held until stop + %v; needed stop + %v", got.Sub(stop), need.Sub(stop))
	if got.Before(need) {
		t.Errorf("hold ends %v before x's last 100 ms window plus Settle of the 1 s config", need.Sub(got))
	}
}

// TestHoldAcrossAReload: the config changed while the publisher's watch
// was broken. load reads the new config into a fresh state, and the holds
// it keeps grow as the watch would have grown them. Found by review:
// copied unchanged, a hold of a 1 s Settle ended a minute before the
// others' new 60 s window began.
func TestHoldAcrossAReload(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := ctxT(t)
	put := func(key string, v any) {
		t.Helper()
		b, err := schema.Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, key, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	old := schema.ProviderConfig{Version: 1, Name: "pay", Limit: 100, Window: schema.Duration(time.Second), FailStatic: schema.Duration(30 * time.Second)}.WithDefaults()
	put(keys.Config("pay"), old)
	put(keys.Instance("pay", "x"), schema.InstanceRecord{Version: 1, ID: "x", Updated: time.Now(), FailStatic: schema.Duration(30 * time.Second), AppliedGeneration: 1})
	put(keys.Share("pay", "x"), schema.ShareRecord{Version: 1, Provider: "pay", Instance: "x", Generation: 1, Window: old.Window, Total: 100, Share: 50, Granted: 50, ConfigRevision: 1})
	now := time.Now()
	p := holdPublisher(&now)
	p.cli = cli
	if _, err := p.load(ctx); err != nil {
		t.Fatal(err)
	}
	// The watch brings x's key going.
	del, err := cli.Delete(ctx, keys.Instance("pay", "x"))
	if err != nil {
		t.Fatal(err)
	}
	p.apply(mvccpb.DELETE, &mvccpb.KeyValue{Key: []byte(keys.Instance("pay", "x")), ModRevision: del.Header.Revision})
	before := p.providers["pay"].held["x"].until
	stop := now.Add(old.HoldAfter(30 * time.Second))
	// The watch breaks; meanwhile the operator sets 6,000 per 60 s; the
	// publisher reloads.
	now = now.Add(time.Second)
	cur := old
	cur.Limit, cur.Window = 6000, schema.Duration(time.Minute)
	put(keys.Config("pay"), cur)
	if _, err := p.load(ctx); err != nil {
		t.Fatal(err)
	}
	got := p.providers["pay"].held["x"].until
	need := stop.Add(time.Second + cur.Settle()) // x's 1 s window past its horizon, and Settle of 60 s
	t.Logf("held until stop + %v (was stop + %v); needed stop + %v", got.Sub(stop), before.Sub(stop), need.Sub(stop))
	if got.Before(need) {
		t.Errorf("after a reload, hold ends %v before x's last window plus Settle of the new config (the watch would have grown it)", need.Sub(got))
	}
}
