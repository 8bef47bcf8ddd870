package schema

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

// A provider may hold several limits ("100 requests per second and 50,000
// per hour", "500 requests and 200,000 tokens per minute"). Its config
// holds the first (Limit, Window, Dimension) and Lanes the others. configd
// keeps each further limit as a provider of its own, its lane provider,
// named LaneName(name, lane), whose config it derives from the provider's
// (Lane.Derive) and writes in the same transaction: each limit then has
// its own shares, handover and fallback, so the guarantee holds for each
// as for a provider of one limit, and an instance enforces them together
// (cluster.JoinProvider, a limiter.Multi). Users cannot name a provider
// so: the '~' a lane's name carries is not allowed in names they give.

// MaxLanes is the most lanes a provider's config keeps, retired ones
// included: lane numbers run from 1 to MaxLanes. At most MaxLimits-1 are
// in force at once.
const MaxLanes = 9

// MaxLimits is the most limits a provider enforces together: its own
// and its lanes in force (limiter.MaxLimits).
const MaxLimits = limiter.MaxLimits

// Lane is one further limit of a provider.
type Lane struct {
	// Lane numbers the lane provider (LaneName), from 1; 0 in what an
	// operator gives: configd numbers it. It never changes for a limit,
	// and a number once used keeps its dimension, so that an instance
	// enforcing it never finds it counting something else.
	Lane      int      `json:"lane,omitempty"`
	Dimension string   `json:"dimension,omitempty"` // empty: requests
	Limit     int64    `json:"limit"`
	Window    Duration `json:"window"`
	// Retired says the limit was removed. Its lane provider stays, with
	// the largest limit there is, until the provider is deleted: instances
	// that joined while it was in force keep a lane for it and go on
	// admitting under it, now without bound, where a deleted config would
	// put them on their fallback.
	Retired bool `json:"retired,omitempty"`
}

// ErrInvalidLanes and ErrLaneName: a provider's further limits are
// inconsistent; a provider name a user gave is a lane's.
var (
	ErrInvalidLanes = errors.New("invalid further limits")
	ErrLaneName     = errors.New("a name with '~' is a lane configd keeps for a further limit of a provider: change that provider's limits instead")
)

// LaneName returns the name of provider name's lane provider number lane.
func LaneName(name string, lane int) string { return name + "~" + strconv.Itoa(lane) }

// SplitLaneName returns the provider and lane number a lane provider's
// name stands for; ok is false for a name that is not a lane's.
func SplitLaneName(name string) (provider string, lane int, ok bool) {
	base, num, found := strings.Cut(name, "~")
	if !found {
		return name, 0, false
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 1 || n > MaxLanes || strconv.Itoa(n) != num {
		return name, 0, false
	}
	return base, n, true
}

// ValidateUserName checks a provider name an operator gives: a valid
// name that is not a lane's.
func ValidateUserName(name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	if strings.Contains(name, "~") {
		return invalid("name", name, ErrLaneName)
	}
	return nil
}

// DimensionOrDefault returns the lane's dimension, or limiter.Requests.
func (l Lane) DimensionOrDefault() string {
	if l.Dimension == "" {
		return limiter.Requests
	}
	return l.Dimension
}

// String says the limit as configd set takes it: "tokens=200000/1m".
func (l Lane) String() string {
	return FormatLimit(l.Dimension, l.Limit, l.Window.D())
}

// FormatLimit says a limit as configd set's --limit takes it:
// "100/1s", "tokens=200000/1m".
func FormatLimit(dim string, n int64, w time.Duration) string {
	ws := w.String() // 1m0s, 1h0m0s: said as 1m, 1h
	if strings.HasSuffix(ws, "m0s") {
		ws = strings.TrimSuffix(ws, "0s")
	}
	if strings.HasSuffix(ws, "h0m") {
		ws = strings.TrimSuffix(ws, "0m")
	}
	s := strconv.FormatInt(n, 10) + "/" + ws
	if dim != "" && dim != limiter.Requests {
		s = dim + "=" + s
	}
	return s
}

// Derive returns the config of c's lane provider for l: l's limit,
// dimension and window, with c's mode, algorithm, fail_static, clock
// bound and pacing (a lane shares its provider's instances and their
// clocks); a retired lane's limit is MaxLimit, which binds nothing.
func (l Lane) Derive(c ProviderConfig) ProviderConfig {
	d := ProviderConfig{
		Version: Version, Name: LaneName(c.Name, l.Lane), Of: c.Name,
		Limit: l.Limit, Window: l.Window, Dimension: l.Dimension,
		Mode: c.Mode, Algorithm: c.Algorithm, Pacing: c.Pacing,
		MaxClockOffset: c.MaxClockOffset, FailStatic: c.FailStatic,
		Coordination: c.Coordination,
	}
	if l.Retired {
		d.Limit = MaxLimit
	}
	if d.Dimension == limiter.Requests {
		d.Dimension = ""
	}
	return d
}

// InForce returns c's limits in force: its own first, then its lanes not
// retired, in lane order.
func (c ProviderConfig) InForce() []Lane {
	out := []Lane{{Dimension: c.Dimension, Limit: c.Limit, Window: c.Window}}
	for _, l := range c.Lanes {
		if !l.Retired {
			out = append(out, l)
		}
	}
	return out
}

// validateLanes checks c's lanes, and that a lane provider's config
// names the provider it is a lane of. A lane numbered 0 is one an
// operator gave, which configd numbers when it writes the config
// (NumberLanes); a config read back from etcd has every lane numbered
// (checkNumbered).
func (c ProviderConfig) validateLanes() error {
	base, _, isLane := SplitLaneName(c.Name)
	switch {
	case isLane && c.Of == "":
		return invalid("name", c.Name, ErrLaneName)
	case isLane && c.Of != base:
		return invalid("of", c.Of, fmt.Errorf("%w: a lane provider's config names its provider, %q", ErrInvalidLanes, base))
	case !isLane && c.Of != "":
		return invalid("of", c.Of, fmt.Errorf("%w: only a lane provider's config names a provider", ErrInvalidLanes))
	case isLane && len(c.Lanes) > 0:
		return invalid("lanes", len(c.Lanes), fmt.Errorf("%w: a lane provider has no lanes of its own", ErrInvalidLanes))
	case len(c.Lanes) > MaxLanes:
		return invalid("lanes", len(c.Lanes), fmt.Errorf("%w: at most %d lanes, retired ones included", ErrInvalidLanes, MaxLanes))
	}
	inForce := c.InForce()
	if len(inForce) > MaxLimits {
		return invalid("lanes", fmt.Sprintf("%d limits", len(inForce)), fmt.Errorf("%w: a provider enforces at most %d limits together", ErrInvalidLanes, MaxLimits))
	}
	for i, l := range c.Lanes {
		f := "lanes[" + strconv.Itoa(i) + "]"
		switch {
		case l.Lane < 0 || l.Lane > MaxLanes || (l.Lane > 0 && slices.ContainsFunc(c.Lanes[:i], func(o Lane) bool { return o.Lane == l.Lane })):
			return invalid(f+".lane", l.Lane, fmt.Errorf("%w: lanes are numbered 1 to %d, each once (0 or none: configd numbers it)", ErrInvalidLanes, MaxLanes))
		case l.Dimension != "" && limiter.ValidateDimension(l.Dimension) != nil:
			return invalid(f+".dimension", l.Dimension, ErrInvalidDimension)
		}
		if err := ValidateLimit(l.Limit); err != nil {
			return invalid(f+".limit", l.Limit, ErrInvalidLimit)
		}
		if err := ValidateLimitWindow(l.Window.D()); err != nil {
			return invalid(f+".window", l.Window, ErrInvalidLimitWindow)
		}
	}
	for i, a := range inForce {
		for _, b := range inForce[:i] {
			if a.DimensionOrDefault() == b.DimensionOrDefault() && a.Window == b.Window {
				return invalid("lanes", b.String()+" and "+a.String(), fmt.Errorf("%w: at most one limit per dimension and window; keep the smaller", ErrInvalidLanes))
			}
		}
	}
	return nil
}

// NumberLanes returns c with its lanes numbered against old (nil: a new
// provider), which the lane providers in etcd follow: a limit keeps the
// number of old's limit of the same dimension and window, or else of one
// of the same dimension (its amount or window changed); a new one takes
// a number never used; a lane of old not in c is kept, retired. A budget
// (IsBudget) keeps its number only in the same window, and no limit of
// another window takes a budget's: the instances take a budget from a
// counter of its window's, which a window of another length does not
// share. A lane c numbers itself must keep the dimension old's lane of
// that number had.
func (c ProviderConfig) NumberLanes(old *ProviderConfig) (ProviderConfig, error) {
	var prev []Lane
	if old != nil {
		if c.Coordination == "" {
			c.Coordination = old.Coordination
		}
		if old.Ledger() != c.Ledger() {
			return c, invalid("coordination", string(c.Coordination), ErrCoordinationFixed)
		}
		prev = old.Lanes
		var err error
		if c, err = c.keepFirst(*old); err != nil {
			return c, err
		}
	}
	taken := map[int]bool{}
	lanes := make([]Lane, 0, len(c.Lanes)+len(prev))
	for _, l := range c.Lanes {
		if l.Lane == 0 {
			continue
		}
		if i := slices.IndexFunc(prev, func(p Lane) bool { return p.Lane == l.Lane }); i >= 0 && prev[i].DimensionOrDefault() != l.DimensionOrDefault() {
			return c, invalid("lanes", l.String(), fmt.Errorf("%w: lane %d counts %s, and a lane keeps its dimension (give the limit no lane number: configd picks one)", ErrInvalidLanes, l.Lane, prev[i].DimensionOrDefault()))
		}
		if i := slices.IndexFunc(prev, func(p Lane) bool { return p.Lane == l.Lane }); i >= 0 && prev[i].Window != l.Window && (IsBudget(prev[i].Window.D()) || IsBudget(l.Window.D())) {
			return c, invalid("lanes", l.String(), fmt.Errorf("%w: lane %d is of window %v, and a budget (a window over %v) keeps its window (give the limit no lane number: configd picks one)", ErrInvalidLanes, l.Lane, prev[i].Window.D(), MaxWindow))
		}
		taken[l.Lane] = true
	}
	// In passes over every lane, so that a limit given again as it was
	// keeps its lane even when another of its dimension is listed before
	// it (found by review: adding tokens 200/1s before the tokens
	// 1000/10s in force took its lane, which the running instances
	// enforced, and gave 1000/10s a lane none of them did: 2,000 tokens
	// in a 10 s window of 1,000). Lanes in force first: running
	// instances enforce them, and not a retired one.
	given := slices.Clone(c.Lanes)
	for _, pass := range []struct{ sameWindow, retired bool }{{true, false}, {true, true}, {false, false}, {false, true}} {
		for i, l := range given {
			if l.Lane != 0 {
				continue
			}
			for _, p := range prev {
				if !taken[p.Lane] && p.Retired == pass.retired && p.DimensionOrDefault() == l.DimensionOrDefault() && (p.Window == l.Window || !pass.sameWindow && !IsBudget(p.Window.D()) && !IsBudget(l.Window.D())) {
					given[i].Lane, taken[p.Lane] = p.Lane, true
					break
				}
			}
		}
	}
	for _, l := range given {
		if l.Lane == 0 {
			for n := 1; n <= MaxLanes; n++ {
				if !taken[n] && !slices.ContainsFunc(prev, func(p Lane) bool { return p.Lane == n }) {
					l.Lane = n
					break
				}
			}
		}
		if l.Lane == 0 {
			return c, invalid("lanes", l.String(), fmt.Errorf("%w: all %d lane numbers are used; delete the provider to start again", ErrInvalidLanes, MaxLanes))
		}
		taken[l.Lane] = true
		lanes = append(lanes, l)
	}
	for _, p := range prev {
		if !taken[p.Lane] {
			p.Retired = true
			lanes = append(lanes, p)
		}
	}
	slices.SortFunc(lanes, func(a, b Lane) int { return cmp.Compare(a.Lane, b.Lane) })
	c.Lanes = lanes
	if len(c.Lanes) == 0 {
		c.Lanes = nil
	}
	return c, nil
}

// keepFirst returns c with its first limit counting what old's first
// counts, when c or old holds several limits: every running instance's
// first lane counts that dimension (cluster.JoinProvider), and refuses a
// config that counts another, so that its limit in the new dimension would
// bind nothing while the lane that counted it retires (found by review: a
// PUT listing tokens first took 1,000 tokens in windows of 100). A limit
// given of that dimension, in a window configd shares (the same window
// first), changes places with the first; with none, c is refused.
func (c ProviderConfig) keepFirst(old ProviderConfig) (ProviderConfig, error) {
	dim := old.DimensionOrDefault()
	if c.DimensionOrDefault() == dim || len(c.Lanes) == 0 && len(old.Lanes) == 0 {
		return c, nil
	}
	pick := -1
	for i, l := range c.Lanes {
		if l.Retired || l.DimensionOrDefault() != dim || IsBudget(l.Window.D()) {
			continue
		}
		if pick < 0 || l.Window == old.Window {
			pick = i
		}
	}
	if pick < 0 {
		return c, invalid("dimension", c.DimensionOrDefault(), fmt.Errorf("%w: the first limit counts %s, as every running instance's first lane does, and keeps its dimension: give a limit of %s (of at most %v), or delete the provider to start again", ErrInvalidLanes, dim, dim, MaxWindow))
	}
	lanes := slices.Clone(c.Lanes)
	l := lanes[pick]
	lanes[pick] = Lane{Dimension: c.Dimension, Limit: c.Limit, Window: c.Window}
	c.Dimension, c.Limit, c.Window, c.Lanes = l.Dimension, l.Limit, l.Window, lanes
	if c.Dimension == limiter.Requests {
		c.Dimension = ""
	}
	return c, nil
}

// Equal reports whether c and o are the same config (no lanes and an
// empty list of lanes are the same, and so for classes).
func (c ProviderConfig) Equal(o ProviderConfig) bool {
	lc, lo := c.Lanes, o.Lanes
	cc, co := c.Classes, o.Classes
	c.Lanes, o.Lanes, c.Classes, o.Classes = nil, nil, nil, nil
	return reflect.DeepEqual(c, o) && slices.Equal(lc, lo) && slices.Equal(cc, co)
}

// checkNumbered reports a lane of a stored config that has no number.
func (c ProviderConfig) checkNumbered() error {
	for i, l := range c.Lanes {
		if l.Lane == 0 {
			return invalid("lanes["+strconv.Itoa(i)+"].lane", 0, fmt.Errorf("%w: a stored config's lanes are numbered", ErrInvalidLanes))
		}
	}
	return nil
}
