package schema

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// The fuzz targets below run over their seed corpus in every `go test`; run
// one for real with e.g.
//
//	go test ./internal/schema -run '^$' -fuzz FuzzDecodeProviderConfig -fuzztime 30s
//
// Each checks that decoding never panics, that a record that decodes
// re-encodes to bytes that decode to the same record (encode∘decode is
// stable), and that no accepted body has a key twice in one object or a
// field name in another case (unambiguousKeys).

var configSeeds = []string{
	`{"version":1,"name":"payments","limit":1000,"window":"1s","mode":"enforce","algorithm":"even","pacing":false}`,
	`{"name":"a","limit":1,"window":"10ms","mode":"shadow","algorithm":"fair","pacing":true,"floor":1,"max_clock_offset":"5ms","fail_static":"30s"}`,
	`{"name":"a","limit":1.5}`, `{"name":"a","limit":-3,"window":"7s"}`, `{"limit":1e400}`, `{"x":1}`,
	`null`, `[]`, `{`, ``, `{"window":"-9223372036854775808ns"}`, "{\"name\":\"\xff\"}",
	`{"name":"payments","limit":5,"limit":7,"window":"1s","mode":"enforce","algorithm":"even"}`,
	`{"name":"payments","limit":5,"LIMIT":7,"window":"1s","mode":"enforce","algorithm":"even"}`,
	`{"name":"payments","Limit":5,"window":"1s","mode":"enforce","algorithm":"even"}`,
	`{"name":"payments","limit":5,"\u006cimit":7,"window":"1s","mode":"enforce","algorithm":"even"}`,
	`{"name":"payments","limit":5,"ver\u017fion":1,"window":"1s","mode":"enforce","algorithm":"even"}`,
	`{"name":"llm","limit":500,"window":"1m","lanes":[{"lane":1,"dimension":"tokens","limit":200000,"window":"1m"},{"lane":2,"limit":50000,"window":"1h","retired":true}]}`,
	`{"name":"llm","limit":500,"window":"1m","lanes":[{"dimension":"tokens","limit":200000,"window":"1m"}]}`,
	`{"name":"llm~1","of":"llm","limit":200000,"window":"1m","dimension":"tokens"}`,
	`{"name":"llm~1","limit":200000,"window":"1m"}`,
	`{"name":"llm","limit":5,"window":"1s","lanes":[{"lane":1,"limit":6,"window":"1s"}]}`,
	`{"name":"llm","limit":5,"window":"1s","lanes":[{"lane":1,"limit":6,"window":"1m"},{"lane":1,"limit":7,"window":"1h"}]}`,
	`{"name":"api","limit":1000,"window":"1s","classes":[{"name":"critical","reserve":"60%"},{"name":"default","reserve":100},{"name":"batch"}]}`,
	`{"name":"api","limit":1000,"window":"1s","classes":[{"name":"a","reserve":"12.5%"},{"name":"a"}]}`,
	`{"name":"api","limit":1,"window":"1s","classes":[{"name":"a","reserve":"60%"},{"name":"b","reserve":"60%"}]}`,
	`{"name":"api","limit":10,"window":"1s","classes":[{"name":"a","reserve":"60"},{"name":"b","reserve":11},{"name":"c","Reserve":1}]}`,
}

func FuzzDecodeProviderConfig(f *testing.F) {
	for _, s := range configSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeProviderConfig(b)
		if err != nil {
			return
		}
		unambiguousKeys(t, b)
		stable(t, c, func(b []byte) (any, error) { return DecodeProviderConfig(b) })
	})
}

func FuzzDecodeProviderConfigInput(f *testing.F) {
	for _, s := range configSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeProviderConfigInput(b, "payments")
		if err != nil {
			return
		}
		if c.Name != "payments" {
			t.Fatalf("name %q accepted for URL name payments", c.Name)
		}
		unambiguousKeys(t, b)
		// configd numbers an operator's lanes before it stores the config.
		if c, err = c.NumberLanes(nil); err != nil {
			return
		}
		stable(t, c, func(b []byte) (any, error) { return DecodeProviderConfig(b) })
	})
}

func FuzzDecodeInstanceRecord(f *testing.F) {
	for _, s := range []string{
		`{"version":1,"id":"h-1:42","host":"h","pid":42,"started":"2026-01-02T03:04:05Z","updated":"2026-01-02T03:04:06.5+02:00","demand":10,"admitted":9,"clock_offset":"-3ms","clock_known":true,"applied_generation":4}`,
		`{"version":1,"id":"a","applied_generation":4,"fail_static":"30s"}`, `{"id":"a","fail_static":"2h"}`, `{"id":"a","fail_static":"-1s"}`,
		`{"id":"a","applied_generation":4,"applied_from":1795316940000000000}`, `{"id":"a","applied_from":-1}`, `{"id":"a","reads_common":true,"reads_unmoved":true}`,
		`{"id":"x"}`, `{"id":"x","clock_offset":5}`, `{"id":"x","started":"yesterday"}`, `{"id":"../x"}`, `{}`, `1`,
		`{"id":"x","id":"y"}`, `{"id":"x","ID":"y"}`, `{"Id":"x"}`, `{"id":"x","demand":1,"Demand":-1}`,
		`{"id":"x","class_demand":{"critical":40,"batch":900}}`, `{"id":"x","class_demand":{"a":1,"a":2}}`,
		`{"id":"x","class_demand":{"Critical":1}}`, `{"id":"x","class_demand":{"a":-1}}`, `{"id":"x","class_demand":[]}`,
		`{"id":"x","class_demand":{"critical":40},"class_admitted":{"critical":1200,"batch":0}}`, `{"id":"x","class_admitted":{"a":1,"a":2}}`,
		`{"id":"x","class_admitted":{"a<b>":1}}`, `{"id":"x","class_admitted":{"a":-1}}`, `{"id":"x","class_admitted":{"a":1000000000001}}`,
		`{"id":"x","class_admitted":{"a":1,"b":1,"c":1,"d":1,"e":1,"f":1,"g":1,"h":1,"i":1}}`, `{"id":"x","class_admitted":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeInstanceRecord(b)
		if err != nil {
			return
		}
		unambiguousKeys(t, b, "class_demand", "class_admitted")
		stable(t, r, func(b []byte) (any, error) { return DecodeInstanceRecord(b) })
	})
}

func FuzzDecodeShares(f *testing.F) {
	for _, s := range []string{
		`{"version":1,"provider":"p","generation":3,"effective_from":1000000000000,"window":"1s","total":10,"instances":3,"shares":{"a":4,"b":3,"c":3},"config_revision":5,"published":"2026-01-02T03:04:05Z","leader":"r1"}`,
		`{"provider":"p","generation":1,"window":"1s","total":0,"instances":0,"shares":null}`,
		`{"provider":"p","generation":1,"window":"1s","total":1,"instances":1,"shares":{"a":2}}`,
		`{"provider":"p","generation":1,"window":"1s","total":9223372036854775807,"instances":2,"shares":{"a":9223372036854775807,"b":9223372036854775807}}`,
		`{"shares":{"a":"1"}}`,
		`{"provider":"p","generation":1,"window":"1s","total":10,"instances":2,"shares":{"a":1,"A":2},"granted":{"a":1,"A":2}}`,
		`{"provider":"p","generation":1,"window":"1s","total":10,"instances":1,"shares":{"a":1,"a":9}}`,
		`{"provider":"p","generation":1,"window":"1s","total":10,"instances":1,"shares":{"a":1},"granted":{"a":1,"a":9}}`,
		`{"provider":"p","generation":1,"window":"1s","total":10,"instances":1,"shares":{"a":1},"Total":1}`,
		`{"provider":"p","generation":4,"window":"1s","total":10,"instances":1,"shares":{"a":1},"granted":{"a":6},"before":{"window":"10s","since":3,"granted":{"a":60}}}`,
		`{"provider":"p","generation":4,"window":"1s","total":10,"instances":1,"shares":{"a":1},"before":{"window":"100ms","since":3,"granted":{}}}`,
		`{"provider":"p","generation":4,"window":"1s","total":10,"instances":1,"shares":{"a":1},"before":{"window":"10s","since":9,"granted":{"a":-1}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeShares(b)
		if err != nil {
			return
		}
		var sum int64
		for _, v := range s.Shares {
			sum += v
		}
		if sum > s.Total {
			t.Fatalf("accepted shares adding up to %d > total %d", sum, s.Total)
		}
		unambiguousKeys(t, b, "shares", "granted")
		stable(t, s, func(b []byte) (any, error) { return DecodeShares(b) })
	})
}

func FuzzDecodeShareRecord(f *testing.F) {
	for _, s := range []string{
		`{"version":1,"provider":"p","instance":"a","generation":3,"effective_from":1000000000000,"window":"1s","total":10,"share":4,"granted":6,"config_revision":5,"published":"2026-01-02T03:04:05Z","leader":"r1"}`,
		`{"provider":"p","instance":"a","generation":4,"window":"1s","total":10,"share":1,"granted":1,"before":{"window":"10s","since":3,"granted":60}}`,
		`{"provider":"p","instance":"a","generation":4,"window":"1s","total":10,"share":0,"granted":7,"held":true}`,
		`{"provider":"p","instance":"a","generation":9223372036854775807,"window":"1s","total":10,"share":1,"granted":1}`,
		`{"provider":"p","instance":"a","generation":1,"window":"1s","total":10,"share":11,"granted":11}`,
		`{"provider":"p","instance":"a","generation":1,"window":"1s","total":10,"share":3,"granted":2}`,
		`{"provider":"p","instance":"a","generation":1,"window":"1s","total":10,"share":3,"granted":3,"held":true}`,
		`{"provider":"p","instance":"a","generation":1,"window":"1s","total":10,"share":3,"granted":3,"share":4}`,
		`{"provider":"p","instance":"a b","generation":1,"window":"1s","total":10,"share":3,"granted":3}`,
		`{"version":1,"provider":"p","instance":"a","common":true,"generation":3,"published":"2026-01-02T03:04:05Z","leader":"r1"}`,
		`{"provider":"p","instance":"a","common":true,"generation":3,"window":"1s","total":10,"share":3,"granted":3}`,
		`{"provider":"p","instance":"*","common":true,"generation":3}`,
		`{"version":1,"provider":"p","instance":"*","unmoved":true,"generation":3,"window":"1s","total":10,"share":3,"granted":3}`,
		`{"version":1,"provider":"p","instance":"a","unmoved":true,"generation":3,"window":"1s","total":10,"share":3,"granted":3}`,
		`{"provider":"p","instance":"*","generation":3,"window":"1s","total":10,"share":3,"granted":3}`,
		`{"provider":"p","instance":"*","generation":3,"window":"1s","total":10,"share":0,"granted":3,"held":true}`,
	} {
		f.Add([]byte(s))
	}
	common := ShareRecord{Version: Version, Provider: "p", Instance: CommonInstance, Generation: 2, Window: Duration(time.Second), Total: 10, Share: 5, Granted: 5, Unmoved: true}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeShareRecord(b)
		if err != nil {
			return
		}
		if r.Share > r.Total || r.Granted < r.Share || r.Generation > MaxGeneration {
			t.Fatalf("accepted share %d of total %d, granted %d, generation %d", r.Share, r.Total, r.Granted, r.Generation)
		}
		if r.Common && (r.Window != 0 || r.Total != 0 || r.Granted != 0 || r.Before != nil || r.Held || r.Instance == CommonInstance) {
			t.Fatalf("accepted a record that says Common and holds more: %+v", r)
		}
		if r.Unmoved && r.Instance != CommonInstance {
			t.Fatalf("accepted an instance's record that says unmoved: %+v", r)
		}
		if !r.Common && ValidateWindow(r.Window.D()) != nil {
			t.Fatalf("accepted a record without a valid window: %+v", r)
		}
		// What a record resolves to is a record encode accepts.
		if res, err := r.Resolve(&common); err == nil && r.Instance != CommonInstance {
			if _, err := Encode(res); err != nil {
				t.Fatalf("%+v resolves to %+v, which encode refuses: %v", r, res, err)
			}
		}
		stable(t, r, func(b []byte) (any, error) { return DecodeShareRecord(b) })
	})
}

func FuzzDecodeHistoryEntry(f *testing.F) {
	for _, s := range []string{
		`{"version":1,"provider":"p","who":"ops@h","when":"2026-01-02T03:04:05Z","old":null,"new":{"version":1,"name":"p","limit":5,"window":"1s","mode":"enforce","algorithm":"even","pacing":false}}`,
		`{"provider":"p","who":"x","old":{"name":"p","limit":5,"window":"1s","mode":"enforce","algorithm":"even"},"new":null,"revision":9}`,
		`{"provider":"p","new":{"name":"q","limit":5,"window":"1s","mode":"enforce","algorithm":"even"}}`,
		`{"provider":"p","new":{"name":"p","limit":5,"extra":1}}`,
		`{"provider":"p","who":"x","new":{"name":"p","limit":5,"window":"1s","mode":"enforce","algorithm":"even","limit":6}}`,
		`{"provider":"p","who":"x","new":{"name":"p","limit":5,"window":"1s","mode":"enforce","algorithm":"even","Limit":6}}`,
		`{"provider":"p","who":"x","who":"y","new":{"name":"p","limit":5,"window":"1s","mode":"enforce","algorithm":"even"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHistoryEntry(b)
		if err != nil {
			return
		}
		unambiguousKeys(t, b)
		stable(t, h, func(b []byte) (any, error) { return DecodeHistoryEntry(b) })
	})
}

func FuzzDecodeBudgetRecord(f *testing.F) {
	for _, s := range []string{
		`{"version":1,"provider":"p~1","start":86400000000000,"window":"24h","taken":500}`,
		`{"provider":"p~1","start":7200000000000,"window":"2h","taken":0}`,
		`{"provider":"p~1","start":5,"window":"24h","taken":1}`,
		`{"provider":"p~1","start":0,"window":"1h","taken":1}`,
		`{"provider":"p~1","start":0,"window":"24h","taken":-1}`,
		`{"provider":"p~1","start":0,"window":"24h","taken":1,"taken":2}`,
		`{"provider":"p~1","start":0,"window":"48h","taken":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeBudgetRecord(b)
		if err != nil {
			return
		}
		if r.Taken < 0 || r.Taken > MaxLimit || !IsBudget(r.Window.D()) || r.Start%int64(r.Window) != 0 {
			t.Fatalf("accepted %+v", r)
		}
		unambiguousKeys(t, b)
		stable(t, r, func(b []byte) (any, error) { return DecodeBudgetRecord(b) })
	})
}

func FuzzKeysParse(f *testing.F) {
	k := DefaultKeys()
	for _, s := range []string{k.Config("p"), k.Instance("p", "i:1"), k.HistoryEntry("p", 9), k.Shares("p"), k.Share("p", "i:1"),
		k.LegacyShares("p"), k.EvenMark("p", "i:1"), k.Budget("p~1", 24*time.Hour, 86400e9), "/sluice/providers/p~1/budget/5", "/sluice/providers/p~1/budget/86400/00000000000000000005", "/sluice/providers//config", "/sluice/providers/p/instances/a/b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		p, err := k.Parse(key)
		if err != nil {
			return
		}
		var again string
		switch p.Kind {
		case KindConfig:
			again = k.Config(p.Provider)
		case KindShares:
			// An instance's record, or without one the key where an
			// older configd kept every share (the fuzzer found the latter
			// formatted back as the records' folder).
			again = k.Share(p.Provider, p.Instance)
			if p.Instance == "" {
				again = k.LegacyShares(p.Provider)
			}
		case KindEven:
			again = k.EvenMark(p.Provider, p.Instance)
		case KindInstance:
			again = k.Instance(p.Provider, p.Instance)
		case KindBudget:
			again = k.Budget(p.Provider, p.Window, p.Seq)
		case KindHistory:
			again = k.HistoryEntry(p.Provider, p.Seq)
			p2, err := k.Parse(again)
			if err != nil || p2 != p {
				t.Fatalf("history key %q -> %+v -> %q -> %+v, %v", key, p, again, p2, err)
			}
			return
		default:
			t.Fatalf("Parse(%q) = %+v with nil error", key, p)
		}
		if again != key {
			t.Fatalf("Parse(%q) = %+v, formats back as %q", key, p, again)
		}
	})
}

// unambiguousKeys fails t if the accepted JSON b has a key twice in one
// object, or, in an object that is not a map (every object but those at the
// paths given in maps, "shares" for the top-level "shares" field), a key
// that is not a field name as the records spell them (lower case and "_"):
// encoding/json would have matched "Limit" to "limit".
func unambiguousKeys(t *testing.T, b []byte, maps ...string) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	var walk func(path string)
	walk = func(path string) {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("accepted %q but cannot read it back: %v", b, err)
		}
		switch tok {
		case json.Delim('['):
			for dec.More() {
				walk(path + "[]")
			}
			dec.Token()
		case json.Delim('{'):
			isMap := false
			for _, m := range maps {
				isMap = isMap || m == path
			}
			seen := map[string]bool{}
			for dec.More() {
				tok, _ := dec.Token()
				key := tok.(string)
				if seen[key] {
					t.Fatalf("accepted %q with key %q twice in %q", b, key, path)
				}
				seen[key] = true
				if !isMap && strings.Trim(key, "abcdefghijklmnopqrstuvwxyz_") != "" {
					t.Fatalf("accepted %q with key %q in %q, not a field name", b, key, path)
				}
				walk(key)
			}
			dec.Token()
		}
	}
	walk("")
}

// stable checks that encode(v) decodes, and that encoding the result gives
// the same bytes.
func stable(t *testing.T, v any, dec func([]byte) (any, error)) {
	t.Helper()
	b1, err := Encode(v)
	if err != nil {
		t.Fatalf("decoded %+v but cannot encode it: %v", v, err)
	}
	v2, err := dec(b1)
	if err != nil {
		t.Fatalf("encoded %s does not decode: %v", b1, err)
	}
	b2, err := Encode(v2)
	if err != nil {
		t.Fatalf("re-encode: %v", err)
	}
	if !bytes.Equal(b1, b2) {
		t.Fatalf("unstable round trip:\n%s\n%s", b1, b2)
	}
}
