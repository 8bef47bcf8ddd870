package cluster

import (
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/internal/share"
	"github.com/sluice-go/sluice/limiter"
)

// FuzzObserve feeds a Member's observe path — what it does with each key
// and value it reads from etcd — two arbitrary records, each under one of
// the keys it watches (its provider's config, its own share record) or one
// it does not (another instance's share or record, a stranger's), and then
// applies the view, with or without a configd leader. Whatever the bytes:
// no panic; a config or own share record that fails to decode, or a share
// record inconsistent with the config, is listed in Status.Problems under
// its key; other keys are ignored; the share applied is within
// 0..MaxQuota, and never above the provider's limit.
func FuzzObserve(f *testing.F) {
	cfg := `{"version":1,"name":"api","limit":40,"window":"100ms","mode":"enforce","algorithm":"even","pacing":false}`
	sh := `{"version":1,"provider":"api","instance":"a","generation":3,"effective_from":0,"window":"100ms","total":40,"share":30,"granted":30}`
	f.Add(uint8(0), []byte(cfg), uint8(1), []byte(sh), true)
	f.Add(uint8(0), []byte(cfg), uint8(2), []byte("x"), false)
	f.Add(uint8(0), []byte(cfg), uint8(1), []byte(`{"version":1,"provider":"api","instance":"a","generation":3,"window":"1s","total":1000000000000,"share":1000000000000,"granted":1000000000000}`), true)
	f.Add(uint8(0), []byte(cfg), uint8(0), []byte(`{"version":1,"name":"api","limit":40,"window":"7s"}`), false)
	f.Add(uint8(0), []byte(`{"version":1,"name":"api","limit":1000000000000,"window":"1h","mode":"shadow","algorithm":"fair","pacing":true}`), uint8(1),
		[]byte(`{"version":1,"provider":"api","instance":"a","generation":9,"window":"10ms","total":1000000000000,"share":1000000000000,"granted":1000000000000}`), true)
	f.Add(uint8(5), []byte(cfg), uint8(6), []byte(sh), true)
	f.Add(uint8(0), []byte{}, uint8(1), []byte{0xff}, false)
	f.Add(uint8(0), []byte(cfg), uint8(3), []byte(`{"version":1,"id":"b","demand":4}`), false)
	f.Add(uint8(0), []byte(cfg), uint8(1), []byte(`{"version":1,"provider":"api","instance":"b","generation":3,"window":"100ms","total":40,"share":30,"granted":30}`), false)

	k := schema.DefaultKeys()
	keyFor := []string{
		k.Config("api"), k.Share("api", "a"), k.Share("api", "b"), k.Instance("api", "b"),
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
			watched := true
			switch r.key {
			case k.Config("api"):
				var c schema.ProviderConfig
				c, decodeErr = schema.DecodeProviderConfig(r.value)
				if decodeErr == nil && c.Name != "api" {
					decodeErr = errNamed
				}
			case k.Share("api", "a"):
				var s schema.ShareRecord
				s, decodeErr = schema.DecodeShareRecord(r.value)
				if decodeErr == nil && (s.Provider != "api" || s.Instance != "a") {
					decodeErr = errNamed
				}
				if decodeErr == nil && v.config != nil {
					decodeErr = s.CheckAgainst(*v.config, v.configRev)
				}
			default:
				watched = false
			}
			// The view's problems, which Status.Problems copies; see
			// TestProblemListedAtOnce for when it does.
			_, listed := v.problems[r.key]
			if watched && decodeErr != nil && !deleted && !listed {
				t.Fatalf("record %q at %s fails to decode (%v) but is not listed: %q", r.value, r.key, decodeErr, v.problems)
			}
			if (!watched || decodeErr == nil) && listed {
				t.Fatalf("record %q at %s listed as a problem: %q", r.value, r.key, v.problems)
			}
			if st.Share < 0 || st.Share > limiter.MaxQuota {
				t.Fatalf("share %d out of range", st.Share)
			}
			if c := v.config; c != nil && st.Source != "fallback" && st.Share > share.In(c.Limit, c.Window.D(), st.Window) {
				t.Fatalf("share %d per %v (%s) above the provider's limit %d per %v", st.Share, st.Window, st.Source, c.Limit, c.Window.D())
			}
			if s := v.share; s != nil && (s.Provider != "api" || s.Instance != "a") {
				t.Fatalf("a share record of %s/%s is in force for api/a", s.Provider, s.Instance)
			}
		}
	})
}

// errNamed stands for observe's refusal of a record naming another
// provider or instance than its key.
var errNamed = errorString("config names another provider")

type errorString string

func (e errorString) Error() string { return string(e) }
