package ledger

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// MaxRecord is the largest record Decode accepts, in bytes.
const MaxRecord = 64 << 10

// Keys lays out one limit's ledger under a prefix, such as
// "/sluice/ledger/payments/requests/":
//
//	head                      the head
//	pub/<seq>                 a publish
//	grant/<holder>/<seq>      holder's grant in publish seq
//	release/<holder>/<seq>/<from>/<limit>
//	                          one release of that grant
//
// A holder watches pub/ and grant/<holder>/: two small events a publish,
// whatever the number of holders.
type Keys string

func (k Keys) Head() string                          { return string(k) + "head" }
func (k Keys) Pubs() string                          { return string(k) + "pub/" }
func (k Keys) Pub(seq int64) string                  { return k.Pubs() + seqKey(seq) }
func (k Keys) Grants(holder string) string           { return string(k) + "grant/" + holder + "/" }
func (k Keys) AllGrants() string                     { return string(k) + "grant/" }
func (k Keys) Grant(holder string, seq int64) string { return k.Grants(holder) + seqKey(seq) }
func (k Keys) AllReleases() string                   { return string(k) + "release/" }

// HolderReleases is the prefix of every release holder wrote.
func (k Keys) HolderReleases(holder string) string { return k.AllReleases() + holder + "/" }

// Releases is the prefix of every release of holder's grant in publish seq.
func (k Keys) Releases(holder string, seq int64) string {
	return k.HolderReleases(holder) + seqKey(seq) + "/"
}

func (k Keys) Release(r Release) string {
	return k.Releases(r.Holder, r.Pub) + seqKey(r.From) + "/" + strconv.FormatInt(r.Limit, 10)
}

// seqKey formats seq to sort as a string sorts.
func seqKey(seq int64) string { return fmt.Sprintf("%020d", seq) }

// Encode returns v's stored form. v is a Head, Pub, Grant or Release; it
// is validated as Decode would.
func Encode(v any) ([]byte, error) {
	if err := validate(v); err != nil {
		return nil, err
	}
	b, err := json.Marshal(v)
	if err == nil && len(b) > MaxRecord {
		return nil, fmt.Errorf("%w: record of %d bytes, at most %d", ErrInvalid, len(b), MaxRecord)
	}
	return b, err
}

// Decode reads the record stored at key under k into s, or deletes it
// from s when value is nil. A malformed record is refused with an error
// wrapping ErrInvalid and changes nothing.
func (k Keys) Decode(s *State, key string, value []byte) error {
	rest, ok := strings.CutPrefix(key, string(k))
	if !ok {
		return fmt.Errorf("%w: key %q is not under %q", ErrInvalid, key, string(k))
	}
	kind, tail, _ := strings.Cut(rest, "/")
	switch kind {
	case "head":
		if value == nil {
			s.Head = Head{}
			return nil
		}
		var h Head
		return decodeInto(value, &h, func() { s.Head = h })
	case "pub":
		seq, err := parseSeq(tail)
		if err != nil {
			return err
		}
		if value == nil {
			delete(s.Pubs, seq)
			return nil
		}
		var p Pub
		return decodeInto(value, &p, func() { s.Pubs[seq] = p }, func() error { return keyMatch(key, p.Seq, "", seq, "") })
	case "grant":
		holder, seqS, ok := strings.Cut(tail, "/")
		if !ok {
			return fmt.Errorf("%w: key %q: want grant/<holder>/<seq>", ErrInvalid, key)
		}
		seq, err := parseSeq(seqS)
		if err != nil {
			return err
		}
		gk := GrantKey{seq, holder}
		if value == nil {
			delete(s.Grants, gk)
			return nil
		}
		var g Grant
		return decodeInto(value, &g, func() { s.Grants[gk] = g }, func() error { return keyMatch(key, g.Pub, g.Holder, seq, holder) })
	case "release":
		return k.decodeRelease(s, key, tail, value)
	}
	return fmt.Errorf("%w: key %q: unknown kind %q (want head, pub, grant or release)", ErrInvalid, key, kind)
}

// grantOf returns the grant that key, a grant's key under k, stores.
func (k Keys) grantOf(key string) (GrantKey, bool) {
	tail, ok := strings.CutPrefix(key, string(k)+"grant/")
	if !ok {
		return GrantKey{}, false
	}
	holder, seqS, ok := strings.Cut(tail, "/")
	seq, err := parseSeq(seqS)
	return GrantKey{seq, holder}, ok && err == nil
}

// decodeRelease stores or deletes one release step.
func (k Keys) decodeRelease(s *State, key, tail string, value []byte) error {
	parts := strings.Split(tail, "/")
	if len(parts) != 4 {
		return fmt.Errorf("%w: key %q: want release/<holder>/<seq>/<from>/<limit>", ErrInvalid, key)
	}
	seq, err := parseSeq(parts[1])
	if err != nil {
		return err
	}
	from, err1 := strconv.ParseInt(parts[2], 10, 64)
	limit, err2 := strconv.ParseInt(parts[3], 10, 64)
	if err1 != nil || err2 != nil {
		return fmt.Errorf("%w: key %q: window and limit must be integers", ErrInvalid, key)
	}
	gk := GrantKey{seq, parts[0]}
	step := Step{From: from, Limit: limit}
	if value == nil {
		rs := s.Releases[gk]
		rs.Steps = slices.DeleteFunc(slices.Clone(rs.Steps), func(x Step) bool { return x == step })
		if len(rs.Steps) == 0 {
			delete(s.Releases, gk)
		} else {
			s.Releases[gk] = rs
		}
		return nil
	}
	var r Release
	return decodeInto(value, &r, func() { s.Apply(r) }, func() error {
		if r.Pub != seq || r.Holder != parts[0] || r.From != from || r.Limit != limit {
			return fmt.Errorf("%w: release %+v under key %q", ErrInvalid, r, key)
		}
		return nil
	})
}

func parseSeq(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%w: sequence %q: want a positive integer", ErrInvalid, s)
	}
	return n, nil
}

func keyMatch(key string, seq int64, holder string, wantSeq int64, wantHolder string) error {
	if seq != wantSeq || holder != wantHolder {
		return fmt.Errorf("%w: record of publish %d, holder %q under key %q", ErrInvalid, seq, holder, key)
	}
	return nil
}

// decodeInto decodes value strictly into v, validates it, runs the
// checks, and only then calls store.
func decodeInto(value []byte, v any, store func(), checks ...func() error) error {
	if len(value) > MaxRecord {
		return fmt.Errorf("%w: record of %d bytes, at most %d", ErrInvalid, len(value), MaxRecord)
	}
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: data after the record", ErrInvalid)
	}
	if err := validate(v); err != nil {
		return err
	}
	for _, c := range checks {
		if err := c(); err != nil {
			return err
		}
	}
	store()
	return nil
}

// validate checks what a record must satisfy whoever wrote it.
func validate(v any) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, a...)...)
	}
	switch r := v.(type) {
	case *Head:
		return validate(*r)
	case Head:
		if r.Staged < 0 || r.Staged > r.Pubs {
			return bad("head stages publish %d of %d used: want 0 or a number used", r.Staged, r.Pubs)
		}
		for i, e := range r.Eras {
			if err := validWindow(e.Window); err != nil {
				return err
			}
			if e.Bound < 0 {
				return bad("era %d: a clock bound of %v: want ≥ 0", e.Seq, e.Bound)
			}
			if !inRange(e.Start, e.Window) || !inRange(e.Floor, e.Window) {
				return bad("era %d starts at window %d, floor %d: out of the range of %v windows", e.Seq, e.Start, e.Floor, e.Window)
			}
			if i > 0 && e.Seq <= r.Eras[i-1].Seq {
				return bad("eras out of order: %d after %d", e.Seq, r.Eras[i-1].Seq)
			}
			for j, s := range e.Limits {
				if s.Limit < 0 || !inRange(s.From, e.Window) || (j > 0 && s.From <= e.Limits[j-1].From) {
					return bad("era %d: limits must be ≥ 0 and in order of window", e.Seq)
				}
			}
		}
	case *Pub:
		return validate(*r)
	case Pub:
		if err := validWindow(r.Window); err != nil {
			return err
		}
		if r.Seq < 1 || r.B < r.A || !inRange(r.A, r.Window) || !inRange(r.B, r.Window) {
			return bad("publish %d covers windows %d..%d of %v: want seq ≥ 1, a ≤ b, both within ±%d", r.Seq, r.A, r.B, r.Window, maxWindow(r.Window))
		}
		if r.Each < 0 || r.Of < 0 || (r.Each > 0) != (r.Of > 0) || r.Each > 0 && (!r.TopUp || r.Of >= r.Seq) {
			return bad("publish %d tops up %d each of publish %d's holders: want both 0, or a top-up giving each > 0 of an earlier publish", r.Seq, r.Each, r.Of)
		}
	case *Grant:
		return validate(*r)
	case Grant:
		if r.Pub < 1 || r.Quota < 0 || r.Holder == "" || strings.Contains(r.Holder, "/") {
			return bad("grant of publish %d to %q, quota %d: want seq ≥ 1, a holder without '/', quota ≥ 0", r.Pub, r.Holder, r.Quota)
		}
		return validReserve(r)
	case *Release:
		return validate(*r)
	case Release:
		if r.Pub < 1 || r.Holder == "" || strings.Contains(r.Holder, "/") || r.Limit < 0 {
			return bad("release of publish %d by %q to %d: want seq ≥ 1, a holder without '/', a limit ≥ 0", r.Pub, r.Holder, r.Limit)
		}
	default:
		return bad("cannot store a %T", v)
	}
	return nil
}

// MaxReserveClasses is the most classes a grant's Reserve names.
const MaxReserveClasses = 8

// validReserve checks that g's reserves name at most MaxReserveClasses
// classes and add up to at most its quota.
func validReserve(g Grant) error {
	if len(g.Reserve) > MaxReserveClasses {
		return fmt.Errorf("%w: grant of publish %d to %q reserves for %d classes: at most %d", ErrInvalid, g.Pub, g.Holder, len(g.Reserve), MaxReserveClasses)
	}
	var sum int64
	for c, r := range g.Reserve {
		if c == "" || len(c) > 64 || r < 0 || r > g.Quota {
			return fmt.Errorf("%w: grant of publish %d to %q reserves %d for class %q: want a name of 1 to 64 bytes and 0 to the quota %d", ErrInvalid, g.Pub, g.Holder, r, c, g.Quota)
		}
		if r > g.Quota-sum { // sum ≤ Quota so far: this cannot overflow
			return fmt.Errorf("%w: grant of publish %d to %q reserves more in all than its quota %d", ErrInvalid, g.Pub, g.Holder, g.Quota)
		}
		sum += r
	}
	return nil
}

// maxWindow is the largest window index of length w whose end, in ns,
// still fits an int64, with room for the arithmetic on it.
func maxWindow(w time.Duration) int64 { return math.MaxInt64/int64(w) - 2 }

// inRange reports whether window k of length w (a valid length) is
// within ±maxWindow(w).
func inRange(k int64, w time.Duration) bool { return k <= maxWindow(w) && k >= -maxWindow(w) }

func validWindow(w time.Duration) error {
	if w < 10*time.Millisecond || w > 24*time.Hour || (24*time.Hour)%w != 0 {
		return fmt.Errorf("%w: window %v: want 10ms to 24h, dividing 24h", ErrInvalid, w)
	}
	return nil
}
