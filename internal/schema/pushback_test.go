package schema

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestInstanceRecordPushback(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	base := InstanceRecord{Version: Version, ID: "a", Started: at, Updated: at}
	b, err := Encode(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"pushbacks", "retry_until", "remaining"} {
		if strings.Contains(string(b), `"`+k) {
			t.Errorf("a record without pushback carries %q (an older configd refuses it): %s", k, b)
		}
	}
	rec := base
	rec.Pushbacks, rec.RetryUntil, rec.Remaining, rec.RemainingAt = 42, at.Add(3*time.Second), 7, at
	if b, err = Encode(rec); err != nil {
		t.Fatal(err)
	}
	got, err := DecodeInstanceRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rec) {
		t.Errorf("round trip: got %+v, want %+v", got, rec)
	}
	bad := rec
	bad.Pushbacks = -1
	if _, err := Encode(bad); !errors.Is(err, ErrInvalidField) {
		t.Errorf("negative pushbacks: %v, want ErrInvalidField", err)
	}
	bad = rec
	bad.Remaining = MaxLimit + 1
	if _, err := Encode(bad); !errors.Is(err, ErrInvalidField) {
		t.Errorf("remaining beyond MaxLimit: %v, want ErrInvalidField", err)
	}
}
