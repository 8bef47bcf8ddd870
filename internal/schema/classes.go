package schema

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"

	"github.com/sluice-go/sluice/limiter"
)

// MaxClasses is the most priority classes a provider may list. Each is
// counted apart by every instance, so the list is kept short.
const MaxClasses = 8

// Class is one of a provider's priority classes. A provider's classes are
// ordered, highest priority first. A call names its class (see
// limiter.WithClass); one that names none, or a class the provider does not
// list, is of the class "default" if the provider lists one, else of the
// last class.
//
// Reserve is the part of the limit kept for the class in every window:
// lower classes may not take it while the class has not used it.
type Class struct {
	Name    string  `json:"name"`
	Reserve Reserve `json:"reserve,omitzero"`
}

// Reserve is a class's reserve: Count permits per window, or Share
// hundredths of a percent of the limit (6000 is 60%). At most one is set;
// the zero Reserve reserves nothing.
//
// In JSON it is a number of permits (600) or a string with a percent sign
// ("60%", "12.5%").
type Reserve struct {
	Count int64 // permits per window
	Share int64 // hundredths of a percent of the limit, 0..10000
}

// IsZero reports whether r reserves nothing.
func (r Reserve) IsZero() bool { return r.Count == 0 && r.Share == 0 }

// Of returns the permits r reserves of a limit: Count, or Share of limit
// rounded down, so that shares adding up to at most 100% never reserve
// more than the limit.
func (r Reserve) Of(limit int64) int64 {
	if r.Share != 0 {
		// limit ≤ MaxLimit (10^12) and Share ≤ 10^4: the product fits.
		return limit * r.Share / 10000
	}
	return r.Count
}

// String returns r as an operator types it: "600", "60%", "12.5%", or
// "0".
func (r Reserve) String() string {
	if r.Share == 0 {
		return strconv.FormatInt(r.Count, 10)
	}
	s := strconv.FormatInt(r.Share/100, 10)
	if f := r.Share % 100; f != 0 {
		s += strings.TrimRight(fmt.Sprintf(".%02d", f), "0")
	}
	return s + "%"
}

// ParseReserve parses a reserve as an operator types it: a count of
// permits ("600") or a share of the limit ("60%", "12.5%", at most two
// decimals). It checks the range Validate checks, but not the sum.
func ParseReserve(s string) (Reserve, error) {
	bad := invalid("reserve", s, ErrInvalidReserve)
	s = strings.TrimSpace(s)
	if pct, ok := strings.CutSuffix(s, "%"); ok {
		whole, frac, dotted := strings.Cut(pct, ".")
		if whole == "" || len(frac) > 2 || (dotted && frac == "") || !digits(whole) || !digits(frac) || len(whole) > 3 {
			return Reserve{}, bad
		}
		w, _ := strconv.ParseInt(whole, 10, 64)
		f, _ := strconv.ParseInt((frac + "00")[:2], 10, 64)
		r := Reserve{Share: w*100 + f}
		if r.Share > 10000 {
			return Reserve{}, bad
		}
		return r, nil
	}
	if !digits(s) || s == "" {
		return Reserve{}, bad
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > MaxLimit {
		return Reserve{}, bad
	}
	return Reserve{Count: n}, nil
}

// digits reports whether s is only ASCII digits (true for "").
func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// MarshalJSON encodes r as a number of permits or a string "60%".
func (r Reserve) MarshalJSON() ([]byte, error) {
	if r.Share != 0 {
		return json.Marshal(r.String())
	}
	return []byte(strconv.FormatInt(r.Count, 10)), nil
}

// UnmarshalJSON accepts a whole number of permits, or a string holding a
// share of the limit ("60%"). A string without a percent sign is
// rejected: a count is a number.
func (r *Reserve) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		if !strings.HasSuffix(strings.TrimSpace(s), "%") {
			return &json.UnmarshalTypeError{Value: "string " + s, Type: reserveType}
		}
		v, err := ParseReserve(s)
		if err != nil {
			return &json.UnmarshalTypeError{Value: "string " + s, Type: reserveType}
		}
		*r = v
		return nil
	}
	v, err := ParseReserve(string(b))
	if err != nil {
		return &json.UnmarshalTypeError{Value: "number " + string(b), Type: reserveType}
	}
	*r = v
	return nil
}

var reserveType = typeOf[Reserve]()

// Errors of a provider's classes.
var (
	ErrInvalidClassName  = errors.New(`class name must be 1 to 32 lower-case letters, digits, '_' or '-', starting with a letter (e.g. "critical")`)
	ErrInvalidClasses    = fmt.Errorf("classes must have unique names, at most %d of them", MaxClasses)
	ErrInvalidReserve    = errors.New(`reserve must be a count of permits per window (e.g. 600) or a share of the limit from 0% to 100%, at most two decimals (e.g. "60%", "12.5%")`)
	ErrReservesOverLimit = errors.New("the classes' reserves must add up to at most the limit (the ceiling, for an adaptive provider)")
)

// ValidateClassName checks a class's name: 1 to 32 lower-case letters,
// digits, '_' or '-', starting with a letter.
func ValidateClassName(name string) error {
	if !validClassName(name) {
		return invalid("class", name, ErrInvalidClassName)
	}
	return nil
}

func validClassName(name string) bool { return limiter.ValidClassName(name) }

// validateClasses checks c's classes: at most MaxClasses, names valid and
// unique, each reserve in range, and the reserves together at most the
// limit they are of. An adaptive provider's are of its ceiling: the
// effective limit moves without the operator, and a config configd's
// controller writes must stay valid.
func (c ProviderConfig) validateClasses() error {
	if c.Of != "" && len(c.Classes) > 0 {
		return invalid("classes", c.ClassesString(), fmt.Errorf("%w: a lane provider has none (its provider's classes are of the first limit)", ErrInvalidClasses))
	}
	if len(c.Classes) > MaxClasses {
		return invalid("classes", fmt.Sprintf("%d classes", len(c.Classes)), ErrInvalidClasses)
	}
	limit := c.ReserveBase()
	var sum, shares int64
	for i, cl := range c.Classes {
		at := "classes[" + strconv.Itoa(i) + "]."
		if !validClassName(cl.Name) {
			return invalid(at+"name", cl.Name, ErrInvalidClassName)
		}
		for _, o := range c.Classes[:i] {
			if o.Name == cl.Name {
				return invalid(at+"name", cl.Name, fmt.Errorf("%w: %q is listed twice", ErrInvalidClasses, cl.Name))
			}
		}
		r := cl.Reserve
		if r.Count < 0 || r.Count > MaxLimit || r.Share < 0 || r.Share > 10000 || (r.Count != 0 && r.Share != 0) {
			return invalid(at+"reserve", fmt.Sprintf("count %d, share %d/10000", r.Count, r.Share), ErrInvalidReserve)
		}
		sum += r.Of(limit) // each ≤ MaxLimit, at most MaxClasses of them: no overflow
		shares += r.Share
	}
	if shares > 10000 {
		// Rounding down could let shares over 100% pass on a small limit.
		return invalid("classes", fmt.Sprintf("shares adding up to %s", Reserve{Share: shares}), ErrReservesOverLimit)
	}
	if sum > limit {
		return invalid("classes", fmt.Sprintf("reserves of %d for a limit of %d", sum, limit), ErrReservesOverLimit)
	}
	return nil
}

// ReserveBase is the limit c's reserves are of, and checked against: the
// limit, or an adaptive provider's ceiling.
func (c ProviderConfig) ReserveBase() int64 {
	if c.Adaptive != nil {
		return c.Adaptive.Ceiling
	}
	return c.Limit
}

// Reserves returns the permits each of c's classes reserves of limit, in
// c's order. When limit is below what they add up to of ReserveBase (an
// adaptive provider's effective limit under its ceiling), each is taken of
// limit itself: shares scale with it and counts are cut in proportion,
// rounded down, so that they never add up to more than limit.
func (c ProviderConfig) Reserves(limit int64) []int64 {
	out := make([]int64, len(c.Classes))
	var sum int64
	for i, cl := range c.Classes {
		out[i] = cl.Reserve.Of(limit)
		sum += out[i]
	}
	if sum > limit && sum > 0 {
		for i := range out {
			out[i] = mulDivDown(out[i], limit, sum)
		}
	}
	return out
}

// mulDivDown is ⌊a·b/c⌋ for 0 ≤ a ≤ c and b ≥ 0, c > 0: the product is
// taken in 128 bits, and the quotient is at most b.
func mulDivDown(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(q)
}

// ClassesString says c's classes as --class takes them, comma-separated:
// "critical=60%,default,batch", or "none".
func (c ProviderConfig) ClassesString() string {
	if len(c.Classes) == 0 {
		return "none"
	}
	parts := make([]string, len(c.Classes))
	for i, cl := range c.Classes {
		parts[i] = cl.String()
	}
	return strings.Join(parts, ",")
}

// String returns cl as --class takes it: "critical=60%", or "batch" when
// it reserves nothing.
func (cl Class) String() string {
	if cl.Reserve.IsZero() {
		return cl.Name
	}
	return cl.Name + "=" + cl.Reserve.String()
}

// ParseClass parses a class as --class gives it: NAME or NAME=RESERVE.
func ParseClass(s string) (Class, error) {
	name, res, hasReserve := strings.Cut(strings.TrimSpace(s), "=")
	if err := ValidateClassName(name); err != nil {
		return Class{}, err
	}
	cl := Class{Name: name}
	if hasReserve {
		r, err := ParseReserve(res)
		if err != nil {
			return Class{}, err
		}
		cl.Reserve = r
	}
	return cl, nil
}
