package cluster

import (
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
)

// TestEvenShare: under the even split an instance takes total/N, less what
// the others may still enforce of configd's last shares beyond their own
// total/N.
func TestEvenShare(t *testing.T) {
	now := time.Date(2026, 11, 22, 7, 0, 0, 0, time.UTC)
	cfg := &schema.ProviderConfig{Version: 1, Name: "api", Limit: 90, Window: schema.Duration(100 * time.Millisecond)}
	shares := &schema.Shares{Version: 1, Provider: "api", Generation: 7, Window: schema.Duration(100 * time.Millisecond), Total: 90,
		Shares: map[string]int64{"a": 60, "b": 30}, Granted: map[string]int64{"a": 60, "b": 30}}
	rec := func(gen int64) schema.InstanceRecord {
		return schema.InstanceRecord{Version: 1, AppliedGeneration: gen}
	}
	stale := schema.InstanceRecord{Version: 1, ID: "stale"} // generation 0, written before the leader went
	tests := []struct {
		name   string
		cfg    *schema.ProviderConfig
		shares *schema.Shares
		live   map[string]*schema.InstanceRecord // nil record: malformed
		held   map[string]time.Time
		want   int64
	}{
		{"no shares ever: total/N", cfg, nil, map[string]*schema.InstanceRecord{"a": nil, "b": nil}, nil, 45},
		{"a still on configd's shares (generation 7): 90 - 60", cfg, shares, map[string]*schema.InstanceRecord{"a": new(rec(7)), "b": new(rec(0))}, nil, 30},
		{"a on the even split (generation 0): total/N", cfg, shares, map[string]*schema.InstanceRecord{"a": new(rec(0)), "b": new(rec(7))}, nil, 45},
		{"a's record malformed: it may enforce its grant", cfg, shares, map[string]*schema.InstanceRecord{"a": nil, "b": nil}, nil, 30},
		{"a's generation 0 written before the leader went: it may have applied shares since", cfg, shares, map[string]*schema.InstanceRecord{"a": &stale, "b": nil}, nil, 30},
		{"shares of a longer window: a may admit its whole grant in one window", &schema.ProviderConfig{Version: 1, Name: "api", Limit: 90, Window: schema.Duration(50 * time.Millisecond)}, shares,
			map[string]*schema.InstanceRecord{"a": new(rec(7)), "b": nil}, nil, 30},
		{"a window overlapping 3 of the shares' windows: 3 grants", &schema.ProviderConfig{Version: 1, Name: "api", Limit: 270, Window: schema.Duration(150 * time.Millisecond)},
			shares, map[string]*schema.InstanceRecord{"a": new(rec(7)), "b": nil}, nil, 90}, // 270 - 3×60
		{"a gone, held: 90 - 60", cfg, shares, map[string]*schema.InstanceRecord{"b": nil}, map[string]time.Time{"a": now.Add(time.Second)}, 30},
		{"a gone, its hold over: the whole limit", cfg, shares, map[string]*schema.InstanceRecord{"b": nil}, map[string]time.Time{"a": now}, 90},
		{"a grant smaller than total/N counts as total/N", cfg,
			&schema.Shares{Version: 1, Provider: "api", Generation: 7, Window: schema.Duration(100 * time.Millisecond), Total: 90, Shares: map[string]int64{"a": 10, "b": 80}},
			map[string]*schema.InstanceRecord{"a": new(rec(7)), "b": nil}, nil, 45},
		{"three: a on its 60, c on the split: nothing left for b", cfg, shares,
			map[string]*schema.InstanceRecord{"a": new(rec(7)), "b": nil, "c": new(rec(0))}, nil, 0},
		{"shares of another window length are scaled up",
			&schema.ProviderConfig{Version: 1, Name: "api", Limit: 900, Window: schema.Duration(time.Second)}, shares,
			map[string]*schema.InstanceRecord{"a": new(rec(7)), "b": nil}, nil, 300},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := newView()
			v.config, v.shares = tt.cfg, tt.shares
			v.leaderGone = 10
			for id, r := range tt.live {
				v.instances[id] = true
				if r != nil {
					v.records[id] = seen(*r)
				}
			}
			for id, until := range tt.held {
				v.held[id] = until
			}
			m := &Member{id: "b"}
			if got := m.evenShare(v, now); got != tt.want {
				t.Errorf("evenShare = %d, want %d", got, tt.want)
			}
		})
	}
}

// seen is r as the view holds it when written at revision 11, after the
// leader went at 10 — or at 9, before, for a record with ID "stale".
func seen(r schema.InstanceRecord) seenRecord {
	if r.ID == "stale" {
		return seenRecord{r, 9}
	}
	return seenRecord{r, 11}
}

// TestGoneHolds: an instance whose key goes is kept out of the even split
// for the longest fail_static it may count with plus the clock bound —
// unless it said it was leaving, confirmed the even split (its horizon is
// then its lease's end), or has no grant.
func TestGoneHolds(t *testing.T) {
	now := time.Date(2026, 11, 22, 7, 0, 0, 0, time.UTC)
	cfg := &schema.ProviderConfig{Version: 1, Name: "api", Limit: 90, Window: schema.Duration(time.Second), FailStatic: schema.Duration(5 * time.Second)}
	shares := &schema.Shares{Version: 1, Provider: "api", Generation: 7, Window: schema.Duration(time.Second), Total: 90,
		Shares: map[string]int64{"a": 60, "b": 30, "z": 0}}
	const bound = 20 * time.Millisecond
	tests := []struct {
		name string
		id   string
		rec  *schema.InstanceRecord
		want time.Duration // 0: not held
	}{
		{"on configd's shares: the provider's fail_static", "a", &schema.InstanceRecord{AppliedGeneration: 7}, 5*time.Second + bound},
		{"its record counts with a longer one", "a", &schema.InstanceRecord{AppliedGeneration: 7, FailStatic: schema.Duration(time.Minute)}, time.Minute + bound},
		{"no good record", "a", nil, 5*time.Second + bound},
		{"it said it was leaving", "a", &schema.InstanceRecord{AppliedGeneration: 7, Leaving: true}, 0},
		{"it confirmed the even split", "a", &schema.InstanceRecord{AppliedGeneration: 0}, 0},
		{"generation 0, written before the leader went", "a", &schema.InstanceRecord{ID: "stale"}, 5*time.Second + bound},
		{"no grant", "z", &schema.InstanceRecord{AppliedGeneration: 7}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := newView()
			v.config, v.shares = cfg, shares
			v.leaderGone = 10
			v.instances[tt.id] = true
			if tt.rec != nil {
				v.records[tt.id] = seen(*tt.rec)
			}
			v.gone(tt.id, now)
			until, held := v.held[tt.id]
			if v.instances[tt.id] {
				t.Errorf("%s still live", tt.id)
			}
			if tt.want == 0 && held {
				t.Errorf("held until %v, want not held", until)
			}
			if tt.want != 0 && !until.Equal(now.Add(tt.want)) {
				t.Errorf("held until %v (held %v), want %v", until, held, now.Add(tt.want))
			}
		})
	}
	// A member that loads holds every instance the shares name with a
	// grant and that is not live, from now; holds that ended go.
	v := newView()
	v.config, v.shares = cfg, shares
	v.instances["b"] = true
	v.held["old"] = now.Add(-time.Second)
	v.holdMissing(now)
	if len(v.held) != 1 || !v.held["a"].Equal(now.Add(5*time.Second+bound)) {
		t.Errorf("after holdMissing: %v, want only a, until %v", v.held, now.Add(5*time.Second+bound))
	}
}

// TestConfirmationFollowsRevisions: through observe and leader events, a
// record saying applied generation 0 confirms the even split only if it was
// written after the last leader key went: a, on the split, then on a new
// leader's shares (its acknowledgement never written), is counted at its
// grant once that leader goes, until it writes generation 0 again.
func TestConfirmationFollowsRevisions(t *testing.T) {
	k := schema.DefaultKeys()
	m := &Member{provider: "api", id: "b", keys: k, cfg: defaultOptions(), log: slog.New(slog.DiscardHandler)}
	v := newView()
	cfg := schema.ProviderConfig{Version: 1, Name: "api", Limit: 90, Window: schema.Duration(100 * time.Millisecond)}.WithDefaults()
	put := func(key string, val any, rev int64) {
		t.Helper()
		b, err := schema.Encode(val)
		if err != nil {
			t.Fatal(err)
		}
		m.observe(v, key, b, false, rev)
	}
	rec := func(id string, gen int64) schema.InstanceRecord {
		return schema.InstanceRecord{Version: 1, ID: id, AppliedGeneration: gen}
	}
	now := time.Now()
	put(k.Config("api"), cfg, 1)
	put(k.Shares("api"), schema.Shares{Version: 1, Provider: "api", Generation: 7, Window: schema.Duration(100 * time.Millisecond), Total: 90,
		Instances: 2, Shares: map[string]int64{"a": 60, "b": 30}}, 2)
	put(k.Instance("api", "b"), rec("b", 7), 3)
	leader := k.Election() + "/1"
	v.leaderEvent(leader, false, 4)
	put(k.Instance("api", "a"), rec("a", 7), 5)
	v.leaderEvent(leader, true, 6) // configd goes; a has not confirmed
	if got := m.evenShare(v, now); got != 30 {
		t.Fatalf("a unconfirmed: %d, want 30", got)
	}
	put(k.Instance("api", "a"), rec("a", 0), 7) // a confirms
	if got := m.evenShare(v, now); got != 45 {
		t.Fatalf("a confirmed: %d, want 45", got)
	}
	v.leaderEvent(leader, false, 8) // a leader again; a applies its shares, its acknowledgement lost
	v.leaderEvent(leader, true, 9)  // and it goes: a's record (revision 7) predates that
	if got := m.evenShare(v, now); got != 30 {
		t.Fatalf("a's generation-0 record from before the leader went: %d, want 30", got)
	}
	put(k.Instance("api", "a"), rec("a", 0), 9) // the same revision as the departure: not after it
	if got := m.evenShare(v, now); got != 30 {
		t.Fatalf("a record at the departure's revision: %d, want 30", got)
	}
	put(k.Instance("api", "a"), rec("a", 0), 10)
	if got := m.evenShare(v, now); got != 45 {
		t.Fatalf("a confirmed again: %d, want 45", got)
	}
}
