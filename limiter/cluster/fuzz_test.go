package cluster

import (
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// FuzzObserve feeds a Member's observe path — what it does with each key
// and value it reads from etcd — two arbitrary records, each under one of
// the provider's keys (or a stranger's), and then applies the view, with
// or without a configd leader. Whatever the bytes: no panic; a config,
// shares or instance record that fails to decode is listed in
// Status.Problems under its key; an instance key counts as a live instance
// whatever its record holds; the share applied is within 0..MaxQuota, and
// an even split within the provider's limit.
func FuzzObserve(f *testing.F) {
	cfg := `{"version":1,"name":"api","limit":40,"window":"100ms","mode":"enforce","algorithm":"even","pacing":false}`
	sh := `{"version":1,"provider":"api","generation":3,"effective_from":0,"window":"100ms","total":40,"instances":2,"shares":{"a":30,"b":10}}`
	f.Add(uint8(0), []byte(cfg), uint8(1), []byte(sh), true)
	f.Add(uint8(0), []byte(cfg), uint8(2), []byte("x"), false)
	f.Add(uint8(0), []byte(cfg), uint8(1), []byte(`{"version":1,"provider":"other","generation":3,"window":"1s","total":1000000000000,"instances":1,"shares":{"a":1000000000000}}`), true)
	f.Add(uint8(0), []byte(cfg), uint8(0), []byte(`{"version":1,"name":"api","limit":40,"window":"7s"}`), false)
	f.Add(uint8(0), []byte(`{"version":1,"name":"api","limit":1000000000000,"window":"1h","mode":"shadow","algorithm":"fair","pacing":true}`), uint8(1),
		[]byte(`{"version":1,"provider":"api","generation":9,"window":"10ms","total":1000000000000,"instances":1,"shares":{"a":1000000000000}}`), true)
	f.Add(uint8(5), []byte(cfg), uint8(6), []byte(sh), true)
	f.Add(uint8(0), []byte{}, uint8(1), []byte{0xff}, false)
	f.Add(uint8(0), []byte(cfg), uint8(3), []byte(`{"version":1,"id":"b","demand":4}`), false)
	f.Add(uint8(0), []byte(cfg), uint8(3), []byte(`{"version":1,"id":"a","demand":4}`), false)
	f.Add(uint8(3), []byte(`{"version":1,"id":"b","demand":-4}`), uint8(3), []byte("D"), false)
	f.Add(uint8(0), []byte(cfg), uint8(3), []byte(`{"version":1,"id":"b","demand":4,"demand":5}`), false)

	k := schema.DefaultKeys()
	keyFor := []string{
		k.Config("api"), k.Shares("api"), k.Instance("api", "a"), k.Instance("api", "b"),
		k.Instances("api") + "bad id", k.Config("other"), k.HistoryEntry("api", 1), k.Provider("api") + "stray",
	}
	f.Fuzz(func(t *testing.T, k1 uint8, v1 []byte, k2 uint8, v2 []byte, leader bool) {
		lim, err := limiter.New(0, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		m := &Member{provider: "api", id: "a", keys: k, cfg: defaultOptions(), lim: lim, log: slog.New(slog.DiscardHandler),
			status: Status{Source: "fallback", Window: time.Second}}
		v := newView()
		if leader {
			v.leaders[k.Election()+"/1"] = true
		}
		ap := applied{Source: "fallback", Window: time.Second}
		for i, r := range []struct {
			key   string
			value []byte
		}{{keyFor[int(k1)%len(keyFor)], v1}, {keyFor[int(k2)%len(keyFor)], v2}} {
			deleted := len(r.value) == 1 && r.value[0] == 'D'
			m.observe(v, r.key, r.value, deleted, int64(i+1))
			m.apply(v, &ap)
			st := m.Status()
			var decodeErr error
			switch r.key {
			case k.Config("api"):
				var c schema.ProviderConfig
				c, decodeErr = schema.DecodeProviderConfig(r.value)
				if decodeErr == nil && c.Name != "api" {
					decodeErr = errNamed
				}
			case k.Shares("api"):
				var s schema.Shares
				s, decodeErr = schema.DecodeShares(r.value)
				if decodeErr == nil && s.Provider != "api" {
					decodeErr = errNamed
				}
			case k.Instance("api", "a"), k.Instance("api", "b"):
				id := r.key[len(k.Instances("api")):]
				var rec schema.InstanceRecord
				rec, decodeErr = schema.DecodeInstanceRecord(r.value)
				if decodeErr == nil && rec.ID != id {
					decodeErr = errNamed
				}
				if v.instances[id] == deleted {
					t.Fatalf("instance key %s (deleted %v, record %q): counted live %v", r.key, deleted, r.value, v.instances[id])
				}
			}
			// The view's problems, which Status.Problems copies; see
			// TestProblemListedAtOnce for when it does.
			_, listed := v.problems[r.key]
			if decodeErr != nil && !deleted && !listed {
				t.Fatalf("record %q at %s fails to decode (%v) but is not listed: %q", r.value, r.key, decodeErr, v.problems)
			}
			if decodeErr == nil && listed {
				t.Fatalf("good record %q at %s listed as a problem: %q", r.value, r.key, v.problems)
			}
			if st.Share < 0 || st.Share > limiter.MaxQuota {
				t.Fatalf("share %d out of range", st.Share)
			}
			if c := v.config; c != nil && st.Share > c.Limit && st.Source == "even" {
				t.Fatalf("even share %d above the provider's limit %d", st.Share, c.Limit)
			}
			if s := v.shares; s != nil && s.Provider != "api" {
				t.Fatalf("shares of provider %q are in force for api", s.Provider)
			}
		}
	})
}

// errNamed stands for observe's refusal of a record naming another
// provider or instance than its key.
var errNamed = errorString("config names another provider")

type errorString string

func (e errorString) Error() string { return string(e) }
