package schema

import (
	"testing"
	"time"
)

// TestShareSet: a set follows puts and deletions of one provider's share
// records, keeps the last good record when a write does not decode or
// names another instance than its key, and ignores every other key.
func TestShareSet(t *testing.T) {
	keys := DefaultKeys()
	rec := func(id string, gen, share int64) ShareRecord {
		return ShareRecord{Version: 1, Provider: "pay", Instance: id, Generation: gen, Window: Duration(time.Second),
			Total: 100, Share: share, Granted: share}
	}
	enc := func(r ShareRecord) []byte {
		b, err := Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	s := NewShareSet(keys, "pay")
	if _, ok := s.View(); ok {
		t.Fatal("an empty set has a view")
	}
	for _, r := range []ShareRecord{rec("a", 3, 60), rec("b", 4, 40)} {
		if ok, err := s.Apply(keys.Share("pay", r.Instance), enc(r), false); !ok || err != nil {
			t.Fatalf("apply %s: %v %v", r.Instance, ok, err)
		}
	}
	for _, k := range []string{keys.Share("other", "a"), keys.Instance("pay", "a"), keys.Config("pay"), keys.LegacyShares("pay"), "/elsewhere"} {
		if ok, err := s.Apply(k, []byte("{"), false); ok || err != nil {
			t.Errorf("%s: applied %v, error %v; want ignored", k, ok, err)
		}
	}
	if ok, err := s.Apply(keys.Share("pay", "a"), []byte("{"), false); !ok || err == nil {
		t.Errorf("malformed: applied %v, error %v; want an error", ok, err)
	}
	if ok, err := s.Apply(keys.Share("pay", "a"), enc(rec("b", 9, 100)), false); !ok || err == nil {
		t.Errorf("another instance's record under a's key: applied %v, error %v; want an error", ok, err)
	}
	v, ok := s.View()
	if !ok || v.Generation != 4 || v.Shares["a"] != 60 || v.Shares["b"] != 40 || v.GenerationOf("a") != 3 || v.Instances != 2 {
		t.Fatalf("view %+v: want a 60 (generation 3) and b 40 (generation 4), the last good records", v)
	}
	if ok, err := s.Apply(keys.Share("pay", "b"), nil, true); !ok || err != nil {
		t.Fatalf("delete: %v %v", ok, err)
	}
	if v, _ := s.View(); v.Instances != 1 || s.Len() != 1 {
		t.Errorf("after b's deletion: %+v", v)
	}
	if r, ok := s.Record("a"); !ok || r.Share != 60 {
		t.Errorf("Record(a) = %+v, %v", r, ok)
	}
}

// TestGrantPer: what an instance may take on its own authority is its
// grant of its record's regime, per window of the config, scaled down
// where the limit is now below the record's total — never the old
// regime's grant counted into a shorter window.
func TestGrantPer(t *testing.T) {
	rec := ShareRecord{Window: Duration(time.Second), Total: 100, Share: 30, Granted: 40,
		Before: &ShareTransition{Window: Duration(10 * time.Second), Since: 1, Granted: 500}}
	for _, tc := range []struct {
		name  string
		w     time.Duration
		limit int64
		want  int64
	}{
		{"same window, same limit: the grant", time.Second, 100, 40},
		{"same window, a higher limit: the grant", time.Second, 1000, 40},
		{"the limit halved: half the grant", time.Second, 50, 20},
		{"a shorter window: what fits the grant per second", 100 * time.Millisecond, 10, 4},
		{"a longer window: the grant, all of which may fall in one second", 10 * time.Second, 1000, 40},
		{"no limit left", time.Second, 0, 0},
	} {
		if got := rec.GrantPer(tc.w, tc.limit); got != tc.want {
			t.Errorf("%s: GrantPer(%v, %d) = %d, want %d", tc.name, tc.w, tc.limit, got, tc.want)
		}
	}
	huge := ShareRecord{Window: Duration(time.Second), Total: MaxLimit, Share: MaxLimit, Granted: MaxLimit}
	if got := huge.GrantPer(time.Second, MaxLimit-1); got != MaxLimit-1 {
		t.Errorf("at the largest limit: %d, want %d", got, int64(MaxLimit-1))
	}
}
