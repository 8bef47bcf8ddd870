package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// fieldSentinels maps JSON field names to the sentinel a type error in that
// field is reported with.
var fieldSentinels = map[string]error{
	"name":             ErrInvalidName,
	"id":               ErrInvalidInstanceID,
	"limit":            ErrInvalidLimit,
	"window":           ErrInvalidWindow,
	"mode":             ErrInvalidMode,
	"algorithm":        ErrInvalidAlgorithm,
	"floor":            ErrInvalidFloor,
	"max_clock_offset": ErrInvalidMaxClockOffset,
	"fail_static":      ErrInvalidFailStatic,
	"clock_offset":     ErrInvalidClockOffset,
	"version":          ErrInvalidVersion,
	"total":            ErrInvalidLimit,
	"reserve":          ErrInvalidReserve,
}

// decode decodes exactly one JSON value from b into v, rejecting unknown
// fields, duplicated keys, keys that match a field only when case is
// ignored, trailing data and oversized input, and translating encoding/json's
// errors into *ValidationError.
func decode(b []byte, v any) error {
	if len(b) > MaxRecordSize {
		return &ValidationError{Field: "body", Value: strconv.Itoa(len(b)) + " bytes", Err: ErrTooLarge}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return &ValidationError{Field: "body", Err: fmt.Errorf("%w: unexpected data after the JSON object", ErrMalformed)}
	}
	// encoding/json lets the last of duplicated keys win and matches keys
	// to fields case-insensitively, so {"limit":5,"LIMIT":7} would store 7
	// while a proxy, an auditor or another JSON reader sees 5. The body is
	// valid JSON by now (Decode accepted it, depth limit included), so a
	// second pass over its keys only has these two things to find.
	return checkKeys(&keyScan{b: b}, reflect.TypeOf(v), "body")
}

// checkKeys reads the next JSON value from s, which is decoded into a
// value of type t, and rejects an object with a duplicated key, and an
// object decoded into a struct with a key that is not exactly one of the
// struct's JSON field names. where names the value in errors ("body" for the
// whole record, else the field holding the object). Map keys (instance ids
// in Shares) may differ only in case: they are different keys.
//
// It scans the bytes itself rather than reading encoding/json's tokens:
// every acknowledgement a configd replica receives is decoded, and the
// tokens cost it a twelfth of its CPU (BENCHMARKS.md, section 13).
// TestCheckKeysAgreesWithTokens holds it to the token reader's answers.
func checkKeys(s *keyScan, t reflect.Type, where string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshaler) {
		// Duration, time.Time: a string, read by its own method.
		return s.skip()
	}
	if t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Uint8 {
		return checkElems(s, t.Elem(), where)
	}
	if t.Kind() != reflect.Struct && t.Kind() != reflect.Map {
		return s.skip()
	}
	s.space()
	if s.peek() != '{' {
		return s.skip() // null (Decode accepted it); nothing else gets here
	}
	s.i++
	var fields map[string]reflect.Type
	if t.Kind() == reflect.Struct {
		fields = jsonFields(t)
	}
	var seen map[string]bool
	for first := true; ; first = false {
		s.space()
		switch s.peek() {
		case '}':
			s.i++
			return nil
		case ',':
			if first {
				return s.malformed()
			}
			s.i++
			s.space()
		default:
			if !first {
				return s.malformed()
			}
		}
		key, err := s.str()
		if err != nil {
			return err
		}
		s.space()
		if s.peek() != ':' {
			return s.malformed()
		}
		s.i++
		if seen[key] {
			return duplicateKey(where, key)
		}
		if seen == nil {
			seen = map[string]bool{}
		}
		seen[key] = true
		if t.Kind() == reflect.Map {
			if err := checkKeys(s, t.Elem(), where); err != nil {
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
			if err := s.skip(); err != nil {
				return err
			}
			continue
		}
		if err := checkKeys(s, ft, key); err != nil {
			return err
		}
	}
}

// checkElems reads the next JSON value from s, which is decoded into a
// slice of elem, and checks the keys of each element as checkKeys does:
// a list of objects (a provider's lanes, its classes) is held to the
// same rules as the record around it.
func checkElems(s *keyScan, elem reflect.Type, where string) error {
	s.space()
	if s.peek() != '[' {
		return s.skip() // null
	}
	s.i++
	for first := true; ; first = false {
		s.space()
		switch s.peek() {
		case ']':
			s.i++
			return nil
		case ',':
			if first {
				return s.malformed()
			}
			s.i++
		default:
			if !first {
				return s.malformed()
			}
		}
		if err := checkKeys(s, elem, where); err != nil {
			return err
		}
	}
}

// duplicateKey is the error for key, met twice in one object at where.
func duplicateKey(where, key string) error {
	return &ValidationError{Field: where, Err: &keyError{
		msg: fmt.Sprintf("duplicate key %q (a key may appear only once in an object)", key),
		err: ErrDuplicateKey,
	}}
}

// foldedKey returns the error for key, not a field of an object at where
// but matching one when case is ignored (encoding/json would take it for
// that field); nil when it matches none.
func foldedKey(where, key string, fields map[string]reflect.Type) error {
	for name := range fields {
		if strings.EqualFold(name, key) { // the folding encoding/json uses
			return &ValidationError{Field: where, Err: &keyError{
				msg: fmt.Sprintf("unknown field %q (field names are case-sensitive; did you mean %q?)", key, name),
				err: ErrUnknownField,
			}}
		}
	}
	return nil
}

var jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()

// keyScan walks a JSON text that encoding/json has accepted. Should it
// meet anything else, it reports ErrMalformed rather than panic.
type keyScan struct {
	b []byte
	i int
}

func (s *keyScan) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *keyScan) malformed() error {
	return &ValidationError{Field: "body", Err: fmt.Errorf("%w at byte %d", ErrMalformed, s.i)}
}

func (s *keyScan) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// str reads a string and returns it as encoding/json decodes it (escapes
// resolved, invalid UTF-8 replaced by U+FFFD).
func (s *keyScan) str() (string, error) {
	start := s.i
	plain, err := s.skipString()
	if err != nil {
		return "", err
	}
	raw := s.b[start:s.i]
	if plain {
		return string(raw[1 : len(raw)-1]), nil
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", s.malformed()
	}
	return v, nil
}

// skipString reads past a string; plain reports that it holds no escape,
// no control character and only valid UTF-8, so that its bytes are its
// value.
func (s *keyScan) skipString() (plain bool, err error) {
	if s.peek() != '"' {
		return false, s.malformed()
	}
	start := s.i + 1
	plain = true
	for s.i++; s.i < len(s.b); s.i++ {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return plain && utf8.Valid(s.b[start:s.i-1]), nil
		case c == '\\':
			plain = false
			s.i++ // the escaped byte; a \u's digits are plain bytes
		case c < 0x20:
			plain = false
		}
	}
	return false, s.malformed()
}

// skip reads past the next value.
func (s *keyScan) skip() error {
	s.space()
	switch s.peek() {
	case '"':
		_, err := s.skipString()
		return err
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				if _, err := s.skipString(); err != nil {
					return err
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					s.i++
					return nil
				}
			}
			s.i++
		}
		return s.malformed()
	case 0:
		return s.malformed()
	}
	// A number, true, false or null: up to the next delimiter.
	start := s.i
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			if s.i == start {
				return s.malformed()
			}
			return nil
		}
		s.i++
	}
	if s.i == start {
		return s.malformed()
	}
	return nil
}

// fieldCache holds jsonFields' answer per struct type: the record types
// are few and fixed, and every decode asks.
var fieldCache sync.Map // reflect.Type → map[string]reflect.Type, read-only

// jsonFields returns the JSON names of t's fields, as encoding/json names
// them (the tag's name, else the Go name; "-" and unexported fields left
// out), with their types; callers must not modify it. The records embed no
// structs, so promotion rules beyond reflect.VisibleFields' are not needed.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	out := map[string]reflect.Type{}
	for _, f := range reflect.VisibleFields(t) {
		if !f.IsExported() || f.Anonymous {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		out[name] = f.Type
	}
	fieldCache.Store(t, out)
	return out
}

// keyError is a sentinel with a message that names the key: "duplicate key
// "limit" (...)" reads better than the sentinel followed by ", got "limit"".
type keyError struct {
	msg string
	err error
}

func (e *keyError) Error() string { return e.msg }
func (e *keyError) Unwrap() error { return e.err }

// jsonError turns an encoding/json error into a *ValidationError.
func jsonError(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		field := te.Field
		if i := strings.LastIndexByte(field, '.'); i >= 0 {
			field = field[i+1:]
		}
		value := te.Value
		if v, ok := strings.CutPrefix(value, "number "); ok {
			value = v
		} else if v, ok := strings.CutPrefix(value, "string "); ok {
			value = strconv.Quote(v)
		} else if !strings.ContainsAny(value, " \"") {
			value = "a JSON " + value // "string", "bool", "object", "array"
		}
		sentinel, ok := fieldSentinels[field]
		if !ok {
			sentinel = fmt.Errorf("%w: %s must be of type %s", ErrMalformed, field, jsonTypeName(te.Type))
		}
		return &ValidationError{Field: field, Value: value, Err: sentinel}
	case errors.As(err, &se):
		return &ValidationError{Field: "body", Err: fmt.Errorf("%w at byte %d: %v", ErrMalformed, se.Offset, se)}
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return &ValidationError{Field: "body", Err: fmt.Errorf("%w: empty or truncated", ErrMalformed)}
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return &ValidationError{Field: "body", Value: name, Err: ErrUnknownField}
	}
	return &ValidationError{Field: "body", Err: fmt.Errorf("%w: %v", ErrMalformed, err)}
}

func jsonTypeName(t reflect.Type) string {
	if t == nil {
		return "unknown"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "integer"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Map, reflect.Struct, reflect.Pointer:
		return "object"
	}
	return t.String()
}

func typeOf[T any]() reflect.Type { return reflect.TypeFor[T]() }

// DecodeProviderConfig decodes and validates a ProviderConfig exactly as
// stored (no defaults applied). A missing version is set to Version.
func DecodeProviderConfig(b []byte) (ProviderConfig, error) {
	var c ProviderConfig
	if err := decode(b, &c); err != nil {
		return ProviderConfig{}, err
	}
	if err := c.Validate(); err != nil {
		return ProviderConfig{}, err
	}
	if err := c.checkNumbered(); err != nil {
		return ProviderConfig{}, err
	}
	c.Version = Version
	return c, nil
}

// DecodeProviderConfigInput decodes a ProviderConfig from an operator
// (an HTTP body), applies WithDefaults, and validates it. When name is not
// empty it is the provider's name from the URL: the body may omit "name",
// and if it gives one it must be the same.
func DecodeProviderConfigInput(b []byte, name string) (ProviderConfig, error) {
	var c ProviderConfig
	if err := decode(b, &c); err != nil {
		return ProviderConfig{}, err
	}
	if name != "" {
		if c.Name == "" {
			c.Name = name
		} else if c.Name != name {
			return ProviderConfig{}, invalid("name", c.Name, fmt.Errorf("%w: the body's name must match the URL's %q", ErrInvalidName, name))
		}
	}
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return ProviderConfig{}, err
	}
	return c, nil
}

// DecodeInstanceRecord decodes and validates an InstanceRecord.
func DecodeInstanceRecord(b []byte) (InstanceRecord, error) {
	var r InstanceRecord
	if err := decode(b, &r); err != nil {
		return InstanceRecord{}, err
	}
	if err := r.Validate(); err != nil {
		return InstanceRecord{}, err
	}
	r.Version = Version
	return r, nil
}

// DecodeShares decodes and validates a Shares record.
func DecodeShares(b []byte) (Shares, error) {
	var s Shares
	if err := decode(b, &s); err != nil {
		return Shares{}, err
	}
	if err := s.Validate(); err != nil {
		return Shares{}, err
	}
	s.Version = Version
	if s.Shares == nil {
		s.Shares = map[string]int64{}
	}
	return s, nil
}

// DecodeShareRecord decodes and validates a ShareRecord.
func DecodeShareRecord(b []byte) (ShareRecord, error) {
	var r ShareRecord
	if err := decode(b, &r); err != nil {
		return ShareRecord{}, err
	}
	if err := r.Validate(); err != nil {
		return ShareRecord{}, err
	}
	r.Version = Version
	return r, nil
}

// DecodeHistoryEntry decodes and validates a HistoryEntry.
func DecodeHistoryEntry(b []byte) (HistoryEntry, error) {
	var h HistoryEntry
	if err := decode(b, &h); err != nil {
		return HistoryEntry{}, err
	}
	if err := h.Validate(); err != nil {
		return HistoryEntry{}, err
	}
	h.Version = Version
	for _, c := range []*ProviderConfig{h.Old, h.New} {
		if c != nil {
			c.Version = Version
		}
	}
	return h, nil
}

// Encode validates a record (ProviderConfig, InstanceRecord, Shares,
// ShareRecord, BudgetRecord or HistoryEntry, by value) and returns its
// JSON with Version set. Anything else is encoded as plain JSON.
func Encode(v any) ([]byte, error) {
	switch r := v.(type) {
	case ProviderConfig:
		r.Version = Version
		if err := r.Validate(); err != nil {
			return nil, err
		}
		v = r
	case InstanceRecord:
		r.Version = Version
		if err := r.Validate(); err != nil {
			return nil, err
		}
		v = r
	case Shares:
		r.Version = Version
		if err := r.Validate(); err != nil {
			return nil, err
		}
		v = r
	case ShareRecord:
		r.Version = Version
		if err := r.Validate(); err != nil {
			return nil, err
		}
		v = r
	case BudgetRecord:
		r.Version = Version
		if err := r.Validate(); err != nil {
			return nil, err
		}
		v = r
	case HistoryEntry:
		r.Version = Version
		for _, c := range []**ProviderConfig{&r.Old, &r.New} {
			if *c != nil {
				cc := **c
				cc.Version = Version
				*c = &cc
			}
		}
		if err := r.Validate(); err != nil {
			return nil, err
		}
		v = r
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("schema: encode: %w", err)
	}
	if len(b) > MaxRecordSize {
		// What encode writes, decode must accept: a record this large would
		// be written and then refused by every reader.
		return nil, &ValidationError{Field: "body", Value: strconv.Itoa(len(b)) + " bytes", Err: ErrTooLarge}
	}
	return b, nil
}

// ReadBody reads at most MaxRecordSize bytes from r; a longer body returns a
// *ValidationError wrapping ErrTooLarge.
func ReadBody(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxRecordSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxRecordSize {
		return nil, &ValidationError{Field: "body", Value: "more than " + strconv.Itoa(MaxRecordSize) + " bytes", Err: ErrTooLarge}
	}
	return b, nil
}
