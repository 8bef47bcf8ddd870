package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// tokenCheckKeys is checkKeys as it was written first, over
// encoding/json's tokens: slow, but plainly right. It is the reference
// checkKeys is held to.
func tokenCheckKeys(dec *json.Decoder, t reflect.Type, where string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshaler) {
		// Duration, time.Time: a string, read by its own method.
		return tokenSkip(dec)
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
	default:
		return tokenSkip(dec)
	}
	tok, err := dec.Token()
	if err != nil {
		return jsonError(err)
	}
	if tok != json.Delim('{') {
		return nil // null (Decode accepted it); nothing else gets here
	}
	var fields map[string]reflect.Type
	if t.Kind() == reflect.Struct {
		fields = jsonFields(t)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return jsonError(err)
		}
		key, _ := tok.(string)
		if seen[key] {
			return duplicateKey(where, key)
		}
		seen[key] = true
		if t.Kind() == reflect.Map {
			if err := tokenCheckKeys(dec, t.Elem(), where); err != nil {
				return err
			}
			continue
		}
		ft, ok := fields[key]
		if !ok {
			if err := foldedKey(where, key, fields); err != nil {
				return err
			}
			// Decode rejected unknown fields already.
			if err := tokenSkip(dec); err != nil {
				return err
			}
			continue
		}
		if err := tokenCheckKeys(dec, ft, key); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return jsonError(err)
	}
	return nil
}

// skipValue reads past the next JSON value.
func tokenSkip(dec *json.Decoder) error {
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return jsonError(err)
	}
	return nil
}

// checkKeysAgree decodes b into a value of each record type as decode's
// first pass does, and where that accepts it, compares checkKeys with
// the token reader: the same error (or none) for every body.
func checkKeysAgree(t *testing.T, b []byte) {
	t.Helper()
	for _, v := range []any{&ProviderConfig{}, &InstanceRecord{}, &Shares{}, &ShareRecord{}, &HistoryEntry{}} {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if dec.Decode(v) != nil {
			continue
		}
		if _, err := dec.Token(); err == nil {
			continue // trailing data: decode stops before the key check
		}
		want := tokenCheckKeys(json.NewDecoder(bytes.NewReader(b)), reflect.TypeOf(v), "body")
		got := checkKeys(&keyScan{b: b}, reflect.TypeOf(v), "body")
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%T %q: checkKeys says %v, the token reader %v", v, b, got, want)
		}
	}
}

var keySeeds = []string{
	`{"name":"a","limit":5,"limit":7}`, `{"name":"a","LIMIT":7}`, `{"name":"a","Limit":7}`,
	`{"name":"a","\u006cimit":7,"limit":1}`, `{"ver\u017fion":1}`, "{\"name\":\"\xff\",\"id\":\"\xfe\"}",
	`{"provider":"p","shares":{"a":1,"A":2,"a":3}}`, `{"provider":"p","shares":{"\u0061":1,"a":2}}`,
	"{\"provider\":\"p\",\"shares\":{\"a\xff\":1,\"a\xfe\":2}}", `{"provider":"p","shares":null}`,
	`{"id":"i","updated":"2026-11-27T00:00:00Z","demand":3,"applied_generation":2}`,
	`{"before":{"window":"1s","granted":{"a":1,"a":2}}}`, `{"before":{"window":"1s","Granted":{"a":1}}}`,
	` { "name" : "a" , "limit" : [1,{"x":"}"}] } `, `{"name":"a\"b","limit":1}`, `null`, `{}`,
}

func TestCheckKeysAgreesWithTokens(t *testing.T) {
	seeds := append([]string(nil), keySeeds...)
	seeds = append(seeds, configSeeds...)
	for _, s := range seeds {
		checkKeysAgree(t, []byte(s))
	}
	// Every record the package's own tests encode, with each key doubled
	// and each key in upper case in turn.
	for _, v := range []any{
		ProviderConfig{Name: "payments", Limit: 1000}.WithDefaults(),
		InstanceRecord{ID: "i-1", Demand: 5, AppliedGeneration: 3},
		ShareRecord{Provider: "p", Instance: "i-1", Generation: 2, Share: 10, Granted: 10, Before: &ShareTransition{Granted: 4}},
	} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		checkKeysAgree(t, b)
		for _, key := range strings.Split(string(b), ",") {
			k, _, ok := strings.Cut(key, ":")
			if !ok {
				continue
			}
			k = strings.TrimLeft(k, "{")
			checkKeysAgree(t, []byte(strings.Replace(string(b), k+":", k+":0,"+k+":", 1)))
			checkKeysAgree(t, []byte(strings.Replace(string(b), k, strings.ToUpper(k), 1)))
		}
	}
}

func FuzzCheckKeysAgreesWithTokens(f *testing.F) {
	for _, s := range append(append([]string(nil), keySeeds...), configSeeds...) {
		f.Add([]byte(s))
	}
	f.Fuzz(checkKeysAgree)
}

func BenchmarkDecodeInstanceRecord(b *testing.B) {
	rec, err := json.Marshal(InstanceRecord{Version: Version, ID: "instance-0001", Host: "host-1", PID: 4242, Demand: 1000, AppliedGeneration: 17, AppliedFrom: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeInstanceRecord(rec); err != nil {
			b.Fatal(err)
		}
	}
}
