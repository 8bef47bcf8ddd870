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
}

// decode decodes exactly one JSON value from b into v, rejecting unknown
// fields, trailing data and oversized input, and translating encoding/json's
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
	return nil
}

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

// Encode validates a record (ProviderConfig, InstanceRecord, Shares or
// HistoryEntry, by value) and returns its JSON with Version set. Anything
// else is encoded as plain JSON.
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
