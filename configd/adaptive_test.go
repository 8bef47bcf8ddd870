package main

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// adaptFixture is an adaptor on a real etcd with a fake clock, and one
// instance whose record the test writes as the instance would.
type adaptFixture struct {
	t   *testing.T
	cli *clientv3.Client
	a   *adaptor
	at  time.Time
	rec schema.InstanceRecord
}

func newAdaptFixture(t *testing.T, ad schema.Adaptive) *adaptFixture {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	log := slog.New(slog.DiscardHandler)
	st := &store{cli: cli, keys: keys, log: log}
	limit := ad.Ceiling
	if _, err := st.put(ctxT(t), schema.ProviderConfig{Name: "api", Limit: limit, Window: schema.Duration(time.Second), Adaptive: &ad}, anyRevision, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctxT(t), keys.Owner("api"), "r1"); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := &adaptFixture{t: t, cli: cli, at: at,
		rec: schema.InstanceRecord{Version: schema.Version, ID: "a", Started: at, Updated: at}}
	f.a = &adaptor{cli: cli, keys: keys, store: st, replica: "r1", log: log,
		metrics: newMetrics(prometheus.NewRegistry()), now: func() time.Time { return f.at }, every: time.Second}
	f.round(0, 0, time.Time{})
	return f
}

// round writes the instance's record with pushbacks more, sending sent
// per window, advances the clock a second and runs a round.
func (f *adaptFixture) round(sent, pushbacks int64, retryUntil time.Time) schema.ProviderConfig {
	f.t.Helper()
	f.rec.Enforced, f.rec.Demand = sent, 2*sent
	f.rec.Pushbacks += pushbacks
	f.rec.RetryUntil = retryUntil
	b, err := schema.Encode(f.rec)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.cli.Put(ctxT(f.t), keys.Instance("api", "a"), string(b)); err != nil {
		f.t.Fatal(err)
	}
	if err := f.a.round(ctxT(f.t)); err != nil {
		f.t.Fatal(err)
	}
	f.at = f.at.Add(time.Second)
	return f.config()
}

func (f *adaptFixture) config() schema.ProviderConfig {
	f.t.Helper()
	resp, err := f.cli.Get(ctxT(f.t), keys.Config("api"))
	if err != nil || len(resp.Kvs) != 1 {
		f.t.Fatalf("config: %v", err)
	}
	c, err := schema.DecodeProviderConfig(resp.Kvs[0].Value)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func TestAdaptiveLowersProbesAndRecords(t *testing.T) {
	f := newAdaptFixture(t, schema.Adaptive{Ceiling: 1000, Floor: 200})
	// The provider's limit fell: 400 calls came back, with a Retry-After.
	c := f.round(1000, 400, f.at.Add(2500*time.Millisecond))
	if c.Limit != 500 || c.Adaptive.Ceiling != 1000 || !strings.Contains(c.Adaptive.Reason, "lowered 1000 → 500: 400 pushbacks in 1s") {
		t.Fatalf("after pushback: limit %d, %+v; want 500 with the reason", c.Limit, *c.Adaptive)
	}
	if c.Adaptive.PauseUntil.IsZero() {
		t.Error("no pause for the Retry-After")
	}
	hist, err := f.a.store.history(ctxT(t), "api")
	if err != nil {
		t.Fatal(err)
	}
	last := hist[len(hist)-1]
	if last.Who != adaptWho || last.Old.Limit != 1000 || last.New.Limit != 500 {
		t.Errorf("history entry %s: %d → %d; want %s: 1000 → 500", last.Who, last.Old.Limit, last.New.Limit, adaptWho)
	}
	// Pushback of the old limit, still in force in some window, changes nothing.
	if c = f.round(500, 50, time.Time{}); c.Limit != 500 {
		t.Errorf("pushback within the settle time moved the limit to %d", c.Limit)
	}
	if c = f.round(500, 0, time.Time{}); c.Limit != 500 {
		t.Errorf("probed to %d while the Retry-After had not passed", c.Limit)
	}
	if c = f.round(500, 0, time.Time{}); c.Limit != 520 {
		t.Errorf("first probe: limit %d, want 520", c.Limit)
	}
	// The provider's headers say what was left unused at the end of its
	// window: of one that ended before the probe could be in force, the
	// limit awaits a fresh word; of one two windows after, it goes to
	// what the fleet sends and that, at once.
	f.rec.Remaining, f.rec.RemainingAt = 300, f.at.Add(-500*time.Millisecond)
	if c = f.round(520, 0, time.Time{}); c.Limit != 520 {
		t.Errorf("limit %d while awaiting the provider's word on the probe, want 520", c.Limit)
	}
	f.rec.Remaining, f.rec.RemainingAt = 80, f.at
	if c = f.round(520, 0, time.Time{}); c.Limit != 600 || !strings.Contains(c.Adaptive.Reason, "80 left unused") {
		t.Errorf("after a remaining of 80: limit %d (%s), want 600", c.Limit, c.Adaptive.Reason)
	}
}

func TestAdaptiveShadowDoesNotEnforce(t *testing.T) {
	f := newAdaptFixture(t, schema.Adaptive{Ceiling: 1000, Floor: 200, Shadow: true})
	c := f.round(1000, 400, time.Time{})
	if c.Limit != 1000 || c.Adaptive.Effective != 500 {
		t.Errorf("shadow: limit %d, effective %d; want 1000 and 500", c.Limit, c.Adaptive.Effective)
	}
}

func TestAdaptiveOnlyWhereLeading(t *testing.T) {
	f := newAdaptFixture(t, schema.Adaptive{Ceiling: 1000, Floor: 200})
	f.a.replica = "r2"
	if c := f.round(1000, 400, time.Time{}); c.Limit != 1000 {
		t.Errorf("a replica that does not lead the provider moved it to %d", c.Limit)
	}
}

func TestApplyAdaptive(t *testing.T) {
	base := schema.ProviderConfig{Name: "api", Limit: 1000}.WithDefaults()
	on := func(spec string) (schema.ProviderConfig, error) {
		c, err := edit{adaptive: optString{val: spec, set: true}}.apply(base)
		return c, err
	}
	c, err := on("floor=200")
	if want := (schema.Adaptive{Ceiling: 1000, Floor: 200}); err != nil || c.Limit != 1000 || *c.Adaptive != want {
		t.Fatalf("floor=200: %+v %v", c.Adaptive, err)
	}
	if c, err = on("shadow"); err != nil || c.Adaptive.Floor != 100 || !c.Adaptive.Shadow {
		t.Errorf("shadow alone: floor %+v %v, want the default floor 100", c.Adaptive, err)
	}
	for _, bad := range []string{"floor=2000", "floor=0", "floor=x", "decrease=1", "probe=-1", "bogus", "floor"} {
		if _, err := on(bad); !errors.Is(err, schema.ErrInvalidAdaptive) {
			t.Errorf("%q: %v, want ErrInvalidAdaptive", bad, err)
		}
	}
	// An effective limit of 600 under a ceiling of 1000: --limit sets the
	// ceiling and starts from it; off restores the ceiling.
	c.Adaptive = &schema.Adaptive{Ceiling: 1000, Floor: 200, Reason: "lowered"}
	c.Limit = 600
	raise := edit{limit: optString{val: "800", set: true}}
	got, err := raise.apply(c)
	if err != nil || got.Limit != 800 || got.Adaptive.Ceiling != 800 || got.Adaptive.Reason != "" {
		t.Errorf("--limit 800: limit %d %+v %v; want 800 and ceiling 800", got.Limit, got.Adaptive, err)
	}
	off := edit{adaptive: optString{val: "off", set: true}}
	if got, err = off.apply(c); err != nil || got.Limit != 1000 || got.Adaptive != nil {
		t.Errorf("off: limit %d %+v %v; want the ceiling 1000 and no adaptive", got.Limit, got.Adaptive, err)
	}
}
