package schema

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrInvalid matches every validation error of this package:
// errors.Is(err, ErrInvalid) is true for any *ValidationError.
var ErrInvalid = errors.New("schema: invalid input")

// Sentinel errors wrapped by *ValidationError. Their text says what is
// allowed; ValidationError adds what was given.
var (
	ErrInvalidName       = errors.New(`name must match ^[a-z0-9][a-z0-9._-]{0,127}$`)
	ErrInvalidInstanceID = errors.New(`instance id must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
	ErrInvalidLimit      = fmt.Errorf("limit must be a positive integer up to %d", MaxLimit)
	ErrInvalidWindow     = errors.New(`window must be a duration from 10ms to 1h that divides 24h (e.g. "1s", "100ms", "1m"; only a further limit may have one up to 24h)`)
	// ErrInvalidLimitWindow is a further limit's window out of range.
	ErrInvalidLimitWindow = errors.New(`a limit's window must be a duration that divides 24h (e.g. "1s", "1m", "24h"): from 10ms to 1h for a provider's first limit, up to 24h for a further one`)
	ErrInvalidMode        = errors.New(`mode must be "enforce" or "shadow"`)
	ErrInvalidAlgorithm   = errors.New(`algorithm must be "even" or "fair"`)
	// ErrInvalidCoordination and ErrCoordinationFixed: the coordination
	// field's errors.
	ErrInvalidCoordination = errors.New(`coordination must be "shares" or "ledger" (empty: the ledger when the provider is created, else the one it has)`)
	ErrCoordinationFixed   = errors.New("coordination is fixed when the provider is created: delete the provider and create it again to change it")
	ErrInvalidDimension    = errors.New(`dimension must be 1 to 32 lower-case letters, digits or '_', starting with a letter (e.g. "tokens"; empty: requests)`)
	ErrInvalidFloor        = errors.New("floor must be an integer from 0 up to the limit")
	ErrInvalidClockOffset  = errors.New("clock offset must be a duration within ±1h")
	// ErrInvalidMaxClockOffset is the bound's own error: it cannot be
	// negative.
	ErrInvalidMaxClockOffset = errors.New("max clock offset must be a duration from 0 to 1h")
	ErrInvalidFailStatic     = errors.New("fail static must be a duration from 0 to 1h")
	ErrInvalidVersion        = fmt.Errorf("version must be %d (or absent)", Version)
	ErrInvalidField          = errors.New("value out of range")
	ErrInvalidShares         = errors.New("shares record is inconsistent")
	ErrInvalidBudget         = errors.New("budget record is inconsistent")
	ErrInvalidKey            = errors.New("key does not belong to the sluice key layout")
	ErrInvalidPrefix         = errors.New(`prefix must start and end with "/" (e.g. "/sluice/")`)
	ErrInvalidReplicaID      = errors.New("replica id must be 1 to 128 characters, no spaces, tabs, newlines or slashes")
	// ErrElectionNoLease and ErrElectionKeyName: a key under Keys.Election
	// that no configd replica can have written (Keys.CheckElectionKey).
	ErrElectionNoLease = errors.New("election key has no lease: no configd replica wrote it, and it never expires")
	ErrElectionKeyName = errors.New("election key is not named after its lease (<prefix>configd/leader/<lease-hex>)")
	// ErrUnknownField is also the error for a key that matches a field
	// only when case is ignored ("LIMIT"): field names are case-sensitive.
	ErrUnknownField = errors.New("unknown field (only the documented fields are accepted)")
	// ErrDuplicateKey: a key appears twice in one JSON object. Readers
	// disagree on which one counts (encoding/json takes the last), so
	// neither is taken.
	ErrDuplicateKey = errors.New("duplicate key (a key may appear only once in an object)")
	ErrTooLarge     = fmt.Errorf("record larger than %d bytes", MaxRecordSize)
	ErrMalformed    = errors.New("malformed JSON")
)

// ValidationError says which field of a record was wrong, what it held and
// why. It unwraps to one of the sentinel errors above, and errors.Is(err,
// ErrInvalid) is true for it.
//
// Its message reads like "limit must be a positive integer up to
// 1000000000000, got -3".
type ValidationError struct {
	Field string // JSON field name ("limit"), or "body", "key", "name"
	Value string // the offending value as given, possibly shortened
	Err   error  // a sentinel such as ErrInvalidLimit
}

// Error implements error.
func (e *ValidationError) Error() string {
	msg := e.Err.Error()
	if e.Field != "" && !startsWithField(msg, e.Field) {
		msg = e.Field + ": " + msg
	}
	if e.Value != "" {
		msg += ", got " + e.Value
	}
	return msg
}

// startsWithField reports whether msg already names field at its start
// ("limit must be ..."), so it is not repeated.
func startsWithField(msg, field string) bool {
	return len(msg) > len(field) && msg[:len(field)] == field && msg[len(field)] == ' '
}

// Unwrap returns the sentinel error.
func (e *ValidationError) Unwrap() error { return e.Err }

// Is makes every ValidationError match ErrInvalid.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

// QuoteValue quotes v for an error message, shortened to 64 bytes, so
// that an error never echoes a huge input.
func QuoteValue(v string) string {
	if len(v) > 64 {
		v = v[:64] + "..."
	}
	return strconv.Quote(v)
}

// invalid returns a *ValidationError; value is formatted with %v and
// shortened to 64 bytes, strings quoted.
func invalid(field string, value any, err error) *ValidationError {
	var s string
	switch v := value.(type) {
	case string:
		s = QuoteValue(v)
	case nil:
	default:
		s = fmt.Sprint(v)
		if len(s) > 64 {
			s = s[:64] + "..."
		}
	}
	return &ValidationError{Field: field, Value: s, Err: err}
}
