package schema

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-go/sluice/internal/share"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/skew"
)

// Version is the version of every record this package writes. Decoders
// accept records of this version, or with no version field (taken as this
// one), and reject newer ones.
const Version = 1

// Limits enforced by Validate.
const (
	MaxLimit  = 1_000_000_000_000 // most permits per window a provider may have
	MinWindow = 10 * time.Millisecond
	MaxWindow = time.Hour // the longest window shared by configd's shares
	// MaxBudgetWindow is the longest window of a provider's further limit
	// (Lane): one longer than MaxWindow is a budget, which the instances
	// take from a counter instead of sharing it (see BudgetRecord).
	MaxBudgetWindow = 24 * time.Hour
	MaxRecordSize   = 1 << 20 // bytes; larger bodies and records are rejected
	// MaxGeneration is the highest shares generation a record may carry:
	// far beyond any real count (a publish a millisecond for 285 years),
	// and far enough below the end of int64 that the next one never
	// overflows. A larger one is a forged or corrupt record.
	MaxGeneration = 1 << 53
	DefaultWindow = time.Second
	// DefaultFailStatic is a provider's fail_static when none is set.
	DefaultFailStatic = 10 * time.Second
	// MaxFailStatic is the longest fail_static a provider may have.
	MaxFailStatic = time.Hour
)

// Duration is a time.Duration encoded in JSON as a string such as "1s" or
// "250ms".
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String returns the duration as time.Duration formats it.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON encodes d as a string ("1s").
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON accepts a string in time.ParseDuration syntax. Numbers are
// rejected: "1000000000" is too easy to misread.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return &json.UnmarshalTypeError{Value: "number " + string(b), Type: durationType}
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return &json.UnmarshalTypeError{Value: "string " + s, Type: durationType}
	}
	*d = Duration(v)
	return nil
}

var durationType = typeOf[Duration]()

// Mode says whether a provider's limit is enforced.
type Mode string

// Modes.
const (
	ModeEnforce Mode = "enforce" // refuse or delay beyond the share
	ModeShadow  Mode = "shadow"  // admit everything; count what would have been refused
)

// Algorithm names how configd splits a provider's limit between instances.
type Algorithm string

// Algorithms.
const (
	AlgorithmEven Algorithm = "even" // limit / live instances
	AlgorithmFair Algorithm = "fair" // max-min fair by reported demand
)

// Coordination names how configd hands a provider's limit to its
// instances.
type Coordination string

// Coordinations.
const (
	// CoordinationShares: configd publishes a share record per instance
	// and infers from acknowledgements what each may still admit. The
	// default.
	CoordinationShares Coordination = "shares"
	// CoordinationLedger: configd writes grants of room in numbered
	// windows, and the instances their releases, under Keys.Ledger (see
	// package internal/ledger): what each may admit is stored, so the
	// guarantee can be checked by reading etcd (configd audit).
	CoordinationLedger Coordination = "ledger"
)

// ProviderConfig is an operator's configuration of one provider, stored at
// Keys.Config(name).
type ProviderConfig struct {
	Version   int       `json:"version"`
	Name      string    `json:"name"`
	Limit     int64     `json:"limit"`     // permits per window, all instances together
	Window    Duration  `json:"window"`    // window length; windows start at multiples of it
	Mode      Mode      `json:"mode"`      // enforce or shadow
	Algorithm Algorithm `json:"algorithm"` // even or fair
	Pacing    bool      `json:"pacing"`    // spread each window's permits evenly across it
	// Dimension is what the limit counts: empty for requests (one per
	// call), or a cost such as "tokens", as the instances acquire it (a
	// lane of cluster.JoinGroup names it too, and refuses a config that
	// counts something else). Stored only when not requests.
	Dimension string `json:"dimension,omitempty"`
	// Floor is the least share (permits per window) the "fair" algorithm
	// leaves an idle instance so it can start; 0 lets the allocator choose.
	Floor int64 `json:"floor,omitempty"`
	// MaxClockOffset is the clock measurement uncertainty beyond which an
	// instance's share is cut (see skew.EnforcedShare); 0 selects the
	// default, 2% of the window.
	MaxClockOffset Duration `json:"max_clock_offset,omitempty"`
	// FailStatic is how long an instance cut off from etcd keeps enforcing
	// its share after its lease would have expired, and so how long
	// configd keeps the share of an instance whose lease expired (rather
	// than one that left) reserved for it before handing it to others: the
	// two never overlap, so an instance out of reach never pushes a window
	// over the limit. Past it the instance admits nothing until it is back.
	// Longer rides out longer etcd outages; shorter hands a crashed
	// instance's share to the others sooner. 0 selects DefaultFailStatic;
	// at most MaxFailStatic.
	FailStatic Duration `json:"fail_static,omitempty"`
	// Lanes are the provider's further limits, each kept by a lane
	// provider configd derives from this config (see Lane). Of is, in a
	// lane provider's config, the provider it is a lane of.
	Lanes []Lane `json:"lanes,omitempty"`
	Of    string `json:"of,omitempty"`
	// Adaptive, when set, makes Limit the effective limit configd keeps
	// between a floor and the operator's ceiling (see Adaptive).
	Adaptive *Adaptive `json:"adaptive,omitempty"`
	// Coordination is how the limit reaches the instances:
	// CoordinationLedger, or CoordinationShares (also what a config
	// stored with none means: configs written before Created). It is
	// fixed when the provider is created (see Created): the two keep
	// different records, and neither counts the other's. A later write
	// that names none keeps it.
	Coordination Coordination `json:"coordination,omitempty"`
	// Classes are the provider's priority classes, highest first, each
	// with its reserve of the limit (see Class). None: every call is
	// alike. They are of the first limit: a lane provider has none.
	Classes []Class `json:"classes,omitempty"`
}

// Created returns c as a provider is created from it: one that names no
// coordination is coordinated by the ledger, whose grants configd audit
// checks and which alone keeps a class's reserve across the fleet.
func (c ProviderConfig) Created() ProviderConfig {
	if c.Coordination == "" {
		c.Coordination = CoordinationLedger
	}
	return c
}

// Ledger reports whether the provider is coordinated by the ledger.
func (c ProviderConfig) Ledger() bool { return c.Coordination == CoordinationLedger }

// DimensionOrDefault returns Dimension, or limiter.Requests when empty.
func (c ProviderConfig) DimensionOrDefault() string {
	if c.Dimension == "" {
		return limiter.Requests
	}
	return c.Dimension
}

// FailStaticOrDefault returns FailStatic, or DefaultFailStatic when it is 0.
func (c ProviderConfig) FailStaticOrDefault() time.Duration {
	if c.FailStatic == 0 {
		return DefaultFailStatic
	}
	return c.FailStatic.D()
}

// ClockBound returns the clock error an instance may have while it
// enforces its whole share: MaxClockOffset, or skew.DefaultBound of the
// window (of DefaultWindow when none is set).
func (c ProviderConfig) ClockBound() time.Duration {
	if b := c.MaxClockOffset.D(); b > 0 {
		return b
	}
	w := c.Window.D()
	if w <= 0 {
		w = DefaultWindow
	}
	return skew.DefaultBound(w)
}

// HoldAfter returns how long after an instance's key went the share it
// may still enforce stays out of the others' reach: the longer of the
// provider's fail_static and failStatic (one the instance may be counting
// with instead), plus ClockBound, since its expiry is on its own clock.
func (c ProviderConfig) HoldAfter(failStatic time.Duration) time.Duration {
	return max(c.FailStaticOrDefault(), failStatic) + c.ClockBound()
}

// Settle returns how long configd keeps the grant of an instance that
// stopped admitting (it left, or its hold after its lease went ended) from
// the others beyond that instant: a window and twice ClockBound. An
// instance that receives a growth after its boundary applies it in the
// window under way (follow.Schedule) less than a window after the publish
// was sent, so a window that began after the stopped instance's last one,
// on either clock.
func (c ProviderConfig) Settle() time.Duration {
	w := c.Window.D()
	if w <= 0 {
		w = DefaultWindow
	}
	return w + 2*c.ClockBound()
}

// WithDefaults returns c with empty fields set to their defaults: the
// current Version, a 1s window, enforce mode and the even algorithm.
func (c ProviderConfig) WithDefaults() ProviderConfig {
	if c.Version == 0 {
		c.Version = Version
	}
	if c.Window == 0 {
		c.Window = Duration(DefaultWindow)
	}
	if c.Mode == "" {
		c.Mode = ModeEnforce
	}
	if c.Algorithm == "" {
		c.Algorithm = AlgorithmEven
	}
	if c.Dimension == limiter.Requests {
		c.Dimension = "" // the default, not stored: members from before dimensions read the config
	}
	if slices.ContainsFunc(c.Lanes, func(l Lane) bool { return l.Dimension == limiter.Requests }) {
		c.Lanes = slices.Clone(c.Lanes)
		for i := range c.Lanes {
			if c.Lanes[i].Dimension == limiter.Requests {
				c.Lanes[i].Dimension = ""
			}
		}
	}
	return c
}

// Validate checks every field; the error is a *ValidationError for the
// first bad field.
func (c ProviderConfig) Validate() error {
	if err := validateVersion(c.Version); err != nil {
		return err
	}
	if err := ValidateName(c.Name); err != nil {
		return err
	}
	if err := ValidateLimit(c.Limit); err != nil {
		return err
	}
	if err := c.validateWindow(); err != nil {
		return err
	}
	if c.Dimension != "" && limiter.ValidateDimension(c.Dimension) != nil {
		return invalid("dimension", c.Dimension, ErrInvalidDimension)
	}
	if c.Mode != ModeEnforce && c.Mode != ModeShadow {
		return invalid("mode", string(c.Mode), ErrInvalidMode)
	}
	if c.Algorithm != AlgorithmEven && c.Algorithm != AlgorithmFair {
		return invalid("algorithm", string(c.Algorithm), ErrInvalidAlgorithm)
	}
	if c.Floor < 0 || c.Floor > c.Limit {
		return invalid("floor", c.Floor, ErrInvalidFloor)
	}
	if c.MaxClockOffset < 0 || c.MaxClockOffset.D() > time.Hour {
		return invalid("max_clock_offset", c.MaxClockOffset, ErrInvalidMaxClockOffset)
	}
	if c.FailStatic < 0 || c.FailStatic.D() > MaxFailStatic {
		return invalid("fail_static", c.FailStatic, ErrInvalidFailStatic)
	}
	if c.Adaptive != nil {
		if err := c.Adaptive.validate(c.Limit, len(c.Lanes)); err != nil {
			return err
		}
	}
	if err := c.validateCoordination(); err != nil {
		return err
	}
	if err := c.validateClasses(); err != nil {
		return err
	}
	return c.validateLanes()
}

// ValidateLimit checks a provider limit: 1..MaxLimit.
func ValidateLimit(n int64) error {
	if n < 1 || n > MaxLimit {
		return invalid("limit", n, ErrInvalidLimit)
	}
	return nil
}

// ValidateWindow checks a window length: MinWindow..MaxWindow, dividing 24h.
func ValidateWindow(w time.Duration) error {
	if w < MinWindow || w > MaxWindow || (24*time.Hour)%w != 0 {
		return invalid("window", w, ErrInvalidWindow)
	}
	return nil
}

// ValidateLimitWindow checks the window of a provider's further limit:
// MinWindow..MaxBudgetWindow, dividing 24h.
func ValidateLimitWindow(w time.Duration) error {
	if w < MinWindow || w > MaxBudgetWindow || (24*time.Hour)%w != 0 {
		return invalid("window", w, ErrInvalidLimitWindow)
	}
	return nil
}

// IsBudget reports whether a limit of window w is a budget: longer than
// configd's shares go (MaxWindow), taken from a counter by the instances.
func IsBudget(w time.Duration) bool { return w > MaxWindow }

// validateWindow checks c's window: a lane provider's may be a budget's.
func (c ProviderConfig) validateWindow() error {
	if _, _, lane := SplitLaneName(c.Name); lane {
		return ValidateLimitWindow(c.Window.D())
	}
	return ValidateWindow(c.Window.D())
}

// Budget reports whether c is a budget lane's config: its window is
// longer than configd's shares go.
func (c ProviderConfig) Budget() bool { return IsBudget(c.Window.D()) }

func validateVersion(v int) error {
	if v != 0 && v != Version {
		return invalid("version", v, ErrInvalidVersion)
	}
	return nil
}

// InstanceRecord is what an instance publishes about itself at
// Keys.Instance(provider, id), attached to its lease: the key exists exactly
// as long as the instance is alive. The instance rewrites it every report
// interval with its demand and clock.
type InstanceRecord struct {
	Version int       `json:"version"`
	ID      string    `json:"id"`             // equals the last segment of the key
	Host    string    `json:"host,omitempty"` // hostname
	PID     int       `json:"pid,omitempty"`  // process id
	Started time.Time `json:"started"`        // when the instance joined
	Updated time.Time `json:"updated"`        // when this record was written ("last seen")
	// Demand is the permits per window the instance wants, smoothed.
	Demand int64 `json:"demand"`
	// Admitted is the permits the instance admitted since it started (a
	// running total).
	Admitted int64 `json:"admitted"`
	// ClockOffset is the measured NTP offset (corrected = local + offset);
	// meaningful only when ClockKnown.
	ClockOffset Duration `json:"clock_offset"`
	ClockKnown  bool     `json:"clock_known"`
	// AppliedGeneration is the Shares.Generation the instance enforces now.
	AppliedGeneration int64 `json:"applied_generation"`
	// AppliedFrom is when (Unix nanoseconds, on the instance's corrected
	// clock) AppliedGeneration's share governs whole windows of the
	// instance's limiter: the record's EffectiveFrom when it arrived in
	// time; a later boundary when it arrived after it (the window under way
	// keeps what it admitted) or changed the window length (which switches
	// at a boundary both lengths share). Until then the instance may still
	// enforce what it had. 0: not known (a member from before the field).
	AppliedFrom int64 `json:"applied_from,omitempty"`
	// Leaving is written just before the instance revokes its lease on a
	// graceful exit, after it stopped admitting: configd may hand its share
	// to the others at once instead of keeping it for the provider's
	// fail_static.
	Leaving bool `json:"leaving,omitempty"`
	// FailStatic is the provider's fail_static the instance's expiry
	// counts with now: the value it last read from the provider's config.
	// configd holds the share of an instance whose lease expired for at
	// least this long, so an instance cut off before it read a lowered
	// fail_static never outlasts its hold. 0: no expiry armed with one
	// (the even split, the fallback, or a member from before the field).
	FailStatic Duration `json:"fail_static,omitempty"`
	// Source says where the quota the instance enforces comes from, as
	// cluster.Status.Source does: SourceShares, SourceEven, SourceFallback
	// or SourceLapsed. Empty: a member from before the field; Enforced
	// then says nothing.
	Source string `json:"source,omitempty"`
	// Enforced is the quota the instance's limiter enforces, in permits
	// per window: its share, or less while its clock is unsure (see
	// skew.EnforcedShare). It is what configd published for it, or what
	// it computed itself (the even split), cut for the clock.
	Enforced int64 `json:"enforced,omitempty"`
	// ClockUncertainty is the guard band the instance keeps at each
	// window boundary: its clock measurement's uncertainty, widened after
	// a step of the offset until the offset settles.
	ClockUncertainty Duration `json:"clock_uncertainty,omitempty"`
	// ReadsCommon says the instance follows a share record that says
	// Common (the provider's common record). configd writes such a record
	// only for an instance that says so: one of an older release refuses
	// it, and would neither follow nor acknowledge it.
	ReadsCommon bool `json:"reads_common,omitempty"`
	// ReadsUnmoved says the instance decodes a common record that says
	// Unmoved. configd writes the flag only while every live instance
	// that reads the common record says so: one of an older release
	// refuses a field it does not know, and would keep its last record.
	ReadsUnmoved bool `json:"reads_unmoved,omitempty"`
	// Pushbacks is the provider's answers that pushed back (429, 503)
	// since the instance started (a running total, as Admitted), and
	// RetryUntil the latest end of a Retry-After among them: what an
	// adaptive provider's effective limit follows. Written only once
	// there was one, so a configd of an older release, which refuses a
	// field it does not know, reads the records of a fleet without.
	Pushbacks  int64     `json:"pushbacks,omitempty"`
	RetryUntil time.Time `json:"retry_until,omitzero"`
	// Remaining is the least remaining the provider's rate-limit headers
	// said to the instance in the provider's last window that ended, at
	// RemainingAt, that window's end (zero: none): the room the fleet left
	// unused in it (limiter.Stats.ProviderRemaining).
	Remaining   int64     `json:"remaining,omitempty"`
	RemainingAt time.Time `json:"remaining_at,omitzero"`
	// Holder is, for a provider coordinated by the ledger, the name this
	// incarnation of the instance holds grants under: its ID, a dot and
	// an id drawn at start, never reused by a restart. configd grants to
	// it; empty for the shares.
	Holder string `json:"holder,omitempty"`
	// StandsIn says the instance runs configd's ledger rounds while no
	// configd replica is alive, if it has the least ID of those that say
	// so: etcd lets it write the ledger's grants, as far as it knows.
	StandsIn bool `json:"stands_in,omitempty"`
	// ClassDemand is the instance's demand by priority class (see
	// ProviderConfig.Classes): permits per window each class wants,
	// smoothed as Demand is, by class name; at most MaxClasses of them.
	// Written only while the instance serves the provider's classes, so
	// that a configd of an older release, which refuses a field it does
	// not know, reads the records of a provider without classes. configd
	// does not allocate by it yet.
	ClassDemand map[string]int64 `json:"class_demand,omitempty"`
	// ClassAdmitted is the permits the instance admitted of each priority
	// class since it started, by class name: a running total per class, as
	// Admitted is of all, so two records give exactly what each class was
	// admitted between them (what the console charts against the class's
	// reserve). Written when ClassDemand is, for the same reason; at most
	// MaxClasses of them.
	ClassAdmitted map[string]int64 `json:"class_admitted,omitempty"`
}

// Sources of the quota an instance enforces (InstanceRecord.Source).
const (
	SourceShares   = "shares"   // the share configd published for it
	SourceEven     = "even"     // no configd replica alive: the limit over the live instances
	SourceFallback = "fallback" // no provider config: the instance's own fallback quota
	SourceLapsed   = "lapsed"   // its last share lapsed while etcd was out of reach: nothing yet
	SourceLedger   = "ledger"   // what its grants in the provider's ledger allow
)

// Validate checks the record.
func (r InstanceRecord) Validate() error {
	if err := validateVersion(r.Version); err != nil {
		return err
	}
	if err := ValidateInstanceID(r.ID); err != nil {
		return err
	}
	switch {
	case len(r.Host) > 255:
		return invalid("host", r.Host, ErrInvalidField)
	case r.PID < 0:
		return invalid("pid", r.PID, ErrInvalidField)
	case r.Demand < 0 || r.Demand > MaxLimit:
		return invalid("demand", r.Demand, ErrInvalidField)
	case r.Admitted < 0 || r.Admitted > MaxLimit:
		return invalid("admitted", r.Admitted, ErrInvalidField)
	case r.AppliedGeneration < 0 || r.AppliedGeneration > MaxGeneration:
		return invalid("applied_generation", r.AppliedGeneration, fmt.Errorf("%w: applied_generation must be from 0 to %d", ErrInvalidField, int64(MaxGeneration)))
	case r.AppliedFrom < 0:
		return invalid("applied_from", r.AppliedFrom, ErrInvalidField)
	case r.ClockOffset.D() > time.Hour || r.ClockOffset.D() < -time.Hour:
		return invalid("clock_offset", r.ClockOffset, ErrInvalidClockOffset)
	case r.FailStatic < 0 || r.FailStatic.D() > MaxFailStatic:
		return invalid("fail_static", r.FailStatic, ErrInvalidFailStatic)
	case r.Source != "" && !slices.Contains([]string{SourceShares, SourceEven, SourceFallback, SourceLapsed, SourceLedger}, r.Source):
		return invalid("source", r.Source, fmt.Errorf("%w: source must be %s, %s, %s, %s or %s", ErrInvalidField, SourceShares, SourceEven, SourceFallback, SourceLapsed, SourceLedger))
	case r.Enforced < 0 || r.Enforced > MaxLimit:
		return invalid("enforced", r.Enforced, ErrInvalidField)
	case r.ClockUncertainty < 0 || r.ClockUncertainty.D() > time.Hour:
		return invalid("clock_uncertainty", r.ClockUncertainty, ErrInvalidClockOffset)
	case r.Pushbacks < 0 || r.Pushbacks > MaxLimit:
		return invalid("pushbacks", r.Pushbacks, ErrInvalidField)
	case r.Remaining < 0 || r.Remaining > MaxLimit:
		return invalid("remaining", r.Remaining, ErrInvalidField)
	case r.Holder != "" && !validHolder(r.ID, r.Holder):
		return invalid("holder", r.Holder, fmt.Errorf("%w: holder must be the id, a dot and 1 to 32 letters or digits", ErrInvalidField))
	}
	if err := validateByClass("class_demand", r.ClassDemand); err != nil {
		return err
	}
	return validateByClass("class_admitted", r.ClassAdmitted)
}

// validateByClass checks a record's figures by class name, field: at most
// MaxClasses, each a valid class name with a value from 0 to MaxLimit.
func validateByClass(field string, m map[string]int64) error {
	if len(m) > MaxClasses {
		return invalid(field, fmt.Sprintf("%d classes", len(m)), fmt.Errorf("%w: at most %d classes", ErrInvalidField, MaxClasses))
	}
	for _, name := range slices.Sorted(maps.Keys(m)) {
		if err := ValidateClassName(name); err != nil {
			return invalid(field, name, ErrInvalidClassName)
		}
		if d := m[name]; d < 0 || d > MaxLimit {
			return invalid(field+"."+name, d, ErrInvalidField)
		}
	}
	return nil
}

// validHolder reports whether holder names an incarnation of instance id.
func validHolder(id, holder string) bool {
	inc, ok := strings.CutPrefix(holder, id+".")
	if !ok || len(inc) == 0 || len(inc) > 32 {
		return false
	}
	for _, c := range inc {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// ShareRecord is one instance's share, as configd's leader publishes it at
// Keys.Share(provider, instance): its quota per window, in force from the
// window starting at EffectiveFrom, and the most it may still be enforcing.
// The leader writes an instance's record only when it changes, so an
// instance receives its own share and nothing of the others', and an
// acknowledgement of a record stays good while it is not rewritten. A
// record of an instance that went (Held) keeps its grant reserved until
// the instance can no longer be enforcing it, then is deleted.
//
// A record that says Common hands out nothing of its own: the instance
// follows the provider's common record (Keys.CommonShare, Instance
// CommonInstance) instead, as if that were written at its key (Resolve).
// configd writes the common record before the records that point to it,
// and an instance's own full record before a common record that no longer
// applies to it, so that any mix of old and new records an instance can
// read in one snapshot is one configd published for it.
type ShareRecord struct {
	Version  int    `json:"version"`
	Provider string `json:"provider"`
	Instance string `json:"instance"`
	// Common says the instance follows the provider's common record: the
	// fields below Generation are zero.
	Common bool `json:"common,omitempty"`
	// Unmoved, on the common record only, says that configd wrote no
	// instance's record other than one that says Common, and deleted
	// none, since it wrote the common record before this one (whoever
	// wrote that). An instance that follows the common record, as its own
	// record read last says, may then take this one from the watch event
	// without reading its own record again in the same snapshot: its own
	// record at this revision is the one it read, or one that says Common
	// written since (cluster.Member; docs/architecture.md, "The common
	// share record"). Absent (an older configd, or one that does not
	// know), the instance reads both.
	Unmoved bool `json:"unmoved,omitempty"`
	// Generation is the publish that wrote this record: the leader counts
	// one per publish, across leaders, and an instance acknowledges its
	// record by it.
	Generation int64 `json:"generation"`
	// EffectiveFrom is the start (Unix nanoseconds, a multiple of Window) of
	// the first window Share applies to.
	EffectiveFrom int64    `json:"effective_from"`
	Window        Duration `json:"window"`
	Total         int64    `json:"total"` // the provider's limit the shares split
	Share         int64    `json:"share"` // permits per window
	// Granted is the most permits per window the instance may still be
	// enforcing under records of this regime: its share, or a larger one it
	// had and has not yet acknowledged giving up. The grants of a provider
	// add up to at most Total (the handover's invariant) except right after
	// the total is lowered; a new leader resumes from them.
	Granted int64 `json:"granted"`
	// Held says the instance is gone (its lease expired) and Granted stays
	// reserved for it: it may be cut off from etcd and enforcing it still.
	Held bool `json:"held,omitempty"`
	// Before is present while the limit or the window changes, until every
	// instance enforces the new regime: see ShareTransition.
	Before *ShareTransition `json:"before,omitempty"`
	// ConfigRevision is the etcd ModRevision of the ProviderConfig used.
	ConfigRevision int64     `json:"config_revision"`
	Published      time.Time `json:"published"`
	Leader         string    `json:"leader,omitempty"` // the configd replica that published
}

// CommonInstance is the Instance of a provider's common share record, at
// Keys.CommonShare: not a valid instance ID, so that no instance's record
// can be taken for it.
const CommonInstance = "*"

// ErrNoCommonShare: an instance's record says Common and the provider's
// common record is not there (or not a common record).
var ErrNoCommonShare = errors.New("the record points to the provider's common share record, and there is none")

// Resolve returns the record r stands for: r itself, or, when r says
// Common, common (the provider's common record, nil if none) as r's
// instance's. The two must be read in one snapshot (one etcd revision):
// configd orders its writes so that every snapshot resolves to a record it
// published for the instance, and a common record read later than the
// pointer may already be another's.
func (r ShareRecord) Resolve(common *ShareRecord) (ShareRecord, error) {
	if !r.Common {
		return r, nil
	}
	if common == nil || common.Instance != CommonInstance || common.Common {
		return ShareRecord{}, ErrNoCommonShare
	}
	if common.Provider != r.Provider {
		return ShareRecord{}, fmt.Errorf("%w: the common record names provider %q, the instance's %q", ErrInvalidShares, common.Provider, r.Provider)
	}
	out := *common
	out.Instance, out.Unmoved = r.Instance, false
	return out, nil
}

// ShareTransition is what a share record keeps of the regime (limit and
// window) in force before the one it belongs to: the old window length, the
// first generation of the new regime, and the most the instance may admit
// in one window of the old length while it may not have switched yet.
type ShareTransition struct {
	Window  Duration `json:"window"`
	Since   int64    `json:"since"`
	Granted int64    `json:"granted"`
	// Total is the old regime's limit per window of Window; of two old
	// regimes kept as one, the lower of their limits when they and the
	// new one have one window length, else omitted (not known).
	Total int64 `json:"total,omitempty"`
}

// Validate checks the record on its own.
func (r ShareRecord) Validate() error {
	if err := validateVersion(r.Version); err != nil {
		return err
	}
	if err := ValidateName(r.Provider); err != nil {
		return &ValidationError{Field: "provider", Value: err.(*ValidationError).Value, Err: ErrInvalidName}
	}
	if err := ValidateInstanceID(r.Instance); err != nil && r.Instance != CommonInstance {
		return &ValidationError{Field: "instance", Value: r.Instance, Err: ErrInvalidInstanceID}
	}
	if r.Generation < 1 || r.Generation > MaxGeneration {
		return invalid("generation", r.Generation, fmt.Errorf("%w: generation must be from 1 to %d", ErrInvalidField, int64(MaxGeneration)))
	}
	if r.Common {
		if r.Instance == CommonInstance {
			return invalid("common", r.Common, fmt.Errorf("%w: the common record cannot point to itself", ErrInvalidShares))
		}
		if pointer := (ShareRecord{Version: r.Version, Provider: r.Provider, Instance: r.Instance, Generation: r.Generation,
			Common: true, Published: r.Published, Leader: r.Leader}); r != pointer {
			return invalid("common", r.Common, fmt.Errorf("%w: a record that follows the common record holds nothing of its own (window, total, share, granted, held, before, effective_from, config_revision must be unset)", ErrInvalidShares))
		}
		return nil
	}
	if r.Instance == CommonInstance && r.Held {
		return invalid("held", r.Held, fmt.Errorf("%w: the common record cannot be held", ErrInvalidShares))
	}
	if r.Unmoved && r.Instance != CommonInstance {
		return invalid("unmoved", r.Unmoved, fmt.Errorf("%w: only the common record (instance %q) says unmoved", ErrInvalidShares, CommonInstance))
	}
	if err := ValidateWindow(r.Window.D()); err != nil {
		return err
	}
	switch {
	case r.EffectiveFrom < 0 || r.EffectiveFrom%int64(r.Window) != 0:
		return invalid("effective_from", r.EffectiveFrom, fmt.Errorf("%w: effective_from must be a window start (a multiple of the window)", ErrInvalidShares))
	case r.Total < 0 || r.Total > MaxLimit:
		return invalid("total", r.Total, ErrInvalidLimit)
	case r.Share < 0 || r.Share > r.Total:
		return invalid("share", r.Share, fmt.Errorf("%w: share must be from 0 to the total %d", ErrInvalidShares, r.Total))
	case r.Granted < r.Share || r.Granted > MaxLimit:
		return invalid("granted", r.Granted, fmt.Errorf("%w: granted must be from the share %d to %d", ErrInvalidShares, r.Share, int64(MaxLimit)))
	case r.Held && r.Share != 0:
		return invalid("share", r.Share, fmt.Errorf("%w: a held record's share must be 0", ErrInvalidShares))
	case r.ConfigRevision < 0:
		return invalid("config_revision", r.ConfigRevision, ErrInvalidField)
	}
	if b := r.Before; b != nil {
		if err := ValidateWindow(b.Window.D()); err != nil {
			return invalid("before.window", b.Window, ErrInvalidWindow)
		}
		if b.Since < 1 || b.Since > r.Generation {
			return invalid("before.since", b.Since, fmt.Errorf("%w: before.since must be a generation from 1 to %d", ErrInvalidShares, r.Generation))
		}
		if b.Granted < 0 || b.Granted > MaxLimit {
			return invalid("before.granted", b.Granted, fmt.Errorf("%w: before.granted must be from 0 to %d", ErrInvalidShares, int64(MaxLimit)))
		}
		if b.Total < 0 || b.Total > MaxLimit {
			return invalid("before.total", b.Total, fmt.Errorf("%w: before.total must be from 0 to %d", ErrInvalidShares, int64(MaxLimit)))
		}
	}
	return nil
}

// CheckAgainst checks r against the config it must have been computed
// under, cfg at revision cfgRev, as Shares.CheckAgainst does: same
// provider, no config revision from the future, a total within the limit
// counted into the record's window (so the share is, too).
func (r ShareRecord) CheckAgainst(cfg ProviderConfig, cfgRev int64) error {
	return Shares{Provider: r.Provider, Window: r.Window, Total: r.Total, ConfigRevision: r.ConfigRevision}.CheckAgainst(cfg, cfgRev)
}

// Enforcing returns the most r leaves its instance enforcing, per window of
// r: its share, its grant, or its grant of the old regime counted into
// this length, whichever is largest.
func (r ShareRecord) Enforcing() int64 {
	e := max(r.Share, r.Granted)
	if b := r.Before; b != nil {
		e = max(e, share.In(b.Granted, b.Window.D(), r.Window.D()))
	}
	return e
}

// GrantPer returns the most permits per window of length w that keep the
// instance within its grant of r's regime in every window of r's length
// (share.Within) — scaled down by the limit where the provider's limit
// (limit per window of w) is now below r's total, so that what the
// instances take on their own authority still adds up to at most the
// limit: the cap of the even split while others may still follow
// configd's shares. Not the old regime's grant (Before): that one bounds
// windows of the old length, and taken per window of another length it
// can admit the old rate several times over.
func (r ShareRecord) GrantPer(w time.Duration, limit int64) int64 {
	g := min(max(r.Share, r.Granted), r.Total)
	if lim := share.In(limit, w, r.Window.D()); lim < r.Total {
		hi, lo := bits.Mul64(uint64(g), uint64(max(lim, 0)))
		q, _ := bits.Div64(hi, lo, uint64(r.Total)) // hi < Total: g ≤ Total, lim < 2^63
		g = int64(q)
	}
	return share.Within(g, w, r.Window.D())
}

// AssembleShares returns the provider view of recs, the share records of
// one provider (in any order): the newest generation, regime and boundary
// among them, every instance's share (held ones only granted), grant,
// generation and boundary, and the change of regime under way, if any.
//
// A record of another window length than the newest is one a publish
// that changed the window did not get to (its write was cut short): its
// instance may still admit its grant per window of that length. The view
// counts it into the newest length (share.In), and keeps it in Before at
// its own length, as an old regime's grant. Before's grants are all
// counted into its one length, the longest of the records'.
func AssembleShares(provider string, recs []ShareRecord) Shares {
	s := Shares{Version: Version, Provider: provider, Shares: map[string]int64{}, Granted: map[string]int64{},
		Generations: map[string]int64{}, From: map[string]int64{}}
	var newest ShareRecord
	for i, r := range recs {
		if i == 0 || r.Generation > newest.Generation || (r.Generation == newest.Generation && r.Published.After(newest.Published)) {
			newest = r
		}
	}
	w := newest.Window.D()
	old := map[string][]oldGrant{} // what each may admit under an old regime, per window of its length
	for _, r := range recs {
		s.EffectiveFrom = max(s.EffectiveFrom, r.EffectiveFrom)
		sh, gr := r.Share, r.Granted
		if rw := r.Window.D(); rw != w {
			sh, gr = share.In(r.Share, rw, w), share.In(max(r.Share, r.Granted), rw, w)
			old[r.Instance] = append(old[r.Instance], oldGrant{max(r.Share, r.Granted), rw})
			s.before(r.Window, 0, 0)
		} else if r.Total != newest.Total {
			// A record of another limit (a publish cut short): its
			// instance may enforce that regime, whose limit no Total
			// of the newest records says. It is an old regime, with its
			// own limit, so that no later transition counts its grant
			// under the newest limit (found by review: 240 in a window
			// of 200, a lowering beside a record of the limit before a
			// raise cut short).
			old[r.Instance] = append(old[r.Instance], oldGrant{max(r.Share, r.Granted), rw})
			s.before(r.Window, 0, r.Total)
		}
		if !r.Held {
			s.Shares[r.Instance] = sh
		}
		s.Granted[r.Instance] = gr
		s.Generations[r.Instance], s.From[r.Instance] = r.Generation, r.EffectiveFrom
		if b := r.Before; b != nil {
			s.before(b.Window, b.Since, b.Total)
			old[r.Instance] = append(old[r.Instance], oldGrant{b.Granted, b.Window.D()})
		}
	}
	if s.Before != nil {
		for id, os := range old {
			for _, o := range os {
				s.Before.Granted[id] = max(s.Before.Granted[id], share.In(o.n, o.per, s.Before.Window.D()))
			}
		}
	}
	s.Generation, s.Window, s.Total = newest.Generation, newest.Window, newest.Total
	s.ConfigRevision, s.Published, s.Leader = newest.ConfigRevision, newest.Published, newest.Leader
	s.Instances = len(s.Shares)
	return s
}

// oldGrant is n permits per window of length per.
type oldGrant struct {
	n   int64
	per time.Duration
}

// before merges one record's old regime (its length, the first
// generation of the new regime, the old limit: 0 when not known) into
// s.Before: the longest length, the newest first generation, and the old
// limit only while every record agrees on it.
func (s *Shares) before(window Duration, since, total int64) {
	if s.Before == nil {
		s.Before = &Transition{Window: window, Since: since, Granted: map[string]int64{}, Total: total}
	}
	if window != s.Before.Window || total != s.Before.Total {
		s.Before.Total = 0 // records of different old regimes: not known
	}
	s.Before.Window = max(s.Before.Window, window)
	s.Before.Since = max(s.Before.Since, since)
}

// Shares is the view of a provider's share records (AssembleShares): each
// live instance's quota, and each instance's grant. The records configd
// writes keep the sum of Shares within Total.
type Shares struct {
	Version    int    `json:"version"`
	Provider   string `json:"provider"`
	Generation int64  `json:"generation"` // grows by one with every publish, across leaders
	// EffectiveFrom is the start (Unix nanoseconds, a multiple of Window) of
	// the first window these shares apply to.
	EffectiveFrom int64    `json:"effective_from"`
	Window        Duration `json:"window"`
	Total         int64    `json:"total"`     // the provider's limit these shares split
	Instances     int      `json:"instances"` // live instances counted; equals len(Shares)
	// Shares maps instance ID to permits per window.
	Shares map[string]int64 `json:"shares"`
	// Granted maps instance ID to the most permits per window that instance
	// may still be enforcing under records of this window length: its
	// share, or a larger one it had before and has not yet acknowledged
	// giving up. The leader keeps Granted adding up to at most Total (the
	// handover's invariant) except right after the total is lowered, until
	// the instances acknowledge; a new leader resumes from it. Absent in
	// records from before the handover: then Shares.
	Granted map[string]int64 `json:"granted,omitempty"`
	// Before is present while the window length changes, until every
	// instance enforces the new length: see Transition.
	Before *Transition `json:"before,omitempty"`
	// ConfigRevision is the etcd ModRevision of the ProviderConfig used.
	ConfigRevision int64     `json:"config_revision"`
	Published      time.Time `json:"published"`
	Leader         string    `json:"leader,omitempty"` // the configd replica that published
	// Generations and From are, per instance, the generation and boundary
	// of its own record (a record is rewritten only when it changes); nil
	// in a view of one record.
	Generations map[string]int64 `json:"generations,omitempty"`
	From        map[string]int64 `json:"effective_froms,omitempty"`
}

// GenerationOf returns the generation of id's record: its own, or the
// view's.
func (s Shares) GenerationOf(id string) int64 {
	if g, ok := s.Generations[id]; ok {
		return g
	}
	return s.Generation
}

// EffectiveFromOf returns the boundary of id's record: its own, or the
// view's.
func (s Shares) EffectiveFromOf(id string) int64 {
	if f, ok := s.From[id]; ok {
		return f
	}
	return s.EffectiveFrom
}

// Transition is what a shares record keeps of the window length in force
// before it changed. An instance that has not applied the new length yet
// still admits in windows of the old one, by its old grant; so until every
// instance has applied the new length, the leader grows shares only where
// they fit beside the old grants, in windows of either length (a share of
// one length may put more than itself into a window of the other:
// share.In), and beside the new grants alone.
type Transition struct {
	Window Duration `json:"window"` // the old length
	// Since is the first generation of the new length: an instance that
	// has applied it, or a later one, enforces the new length.
	Since int64 `json:"since"`
	// Granted maps instance ID to the most it may admit in one window of
	// the old length.
	Granted map[string]int64 `json:"granted"`
	// Total is the old regime's limit per window of Window; 0: not known.
	Total int64 `json:"total,omitempty"`
}

// Enforcing returns the most s leaves instance id enforcing, per window of
// s: its share, its grant, or its grant of the old length while the length
// changes (counted into this length), whichever is largest.
func (s Shares) Enforcing(id string) int64 {
	e := max(s.Shares[id], s.Granted[id])
	if b := s.Before; b != nil {
		e = max(e, share.In(b.Granted[id], b.Window.D(), s.Window.D()))
	}
	return e
}

// Named returns every instance ID s gives a share, a grant, or a grant of
// the old length, sorted.
func (s Shares) Named() []string {
	seen := map[string]int64{}
	maps.Copy(seen, s.Shares)
	maps.Copy(seen, s.Granted)
	if s.Before != nil {
		maps.Copy(seen, s.Before.Granted)
	}
	return sortedKeys(seen)
}

// ErrInconsistent is wrapped by CheckAgainst: a shares record that is valid
// on its own but cannot have been computed under the provider's config.
var ErrInconsistent = errors.New("shares record inconsistent with the provider's config")

// CheckAgainst checks s against the config it must have been computed
// under, cfg at revision cfgRev, beyond what Validate checks on its own: it
// is of cfg's provider, it was computed under cfg or an earlier config (a
// record cannot name a config revision that does not exist yet), and it
// hands out no more than cfg's limit, counted into the record's window
// (share.In). A record that fails is forged, corrupt, or computed under a
// higher limit than the one now in force; an instance refuses it rather
// than enforce more than the limit it knows.
func (s Shares) CheckAgainst(cfg ProviderConfig, cfgRev int64) error {
	most := share.In(cfg.Limit, cfg.Window.D(), s.Window.D())
	switch {
	case s.Provider != cfg.Name:
		return fmt.Errorf("%w: it is for provider %q, the config for %q", ErrInconsistent, s.Provider, cfg.Name)
	case s.ConfigRevision > cfgRev:
		return fmt.Errorf("%w: computed under config revision %d, but the config is at %d", ErrInconsistent, s.ConfigRevision, cfgRev)
	case s.Total > most:
		return fmt.Errorf("%w: total %d per %v is more than the limit %d per %v allows", ErrInconsistent, s.Total, s.Window.D(), cfg.Limit, cfg.Window.D())
	}
	return nil
}

// EffectiveTime returns EffectiveFrom as a time.Time.
func (s Shares) EffectiveTime() time.Time { return time.Unix(0, s.EffectiveFrom) }

// Validate checks the record, including that the shares add up to at most
// Total.
func (s Shares) Validate() error {
	if err := validateVersion(s.Version); err != nil {
		return err
	}
	if err := ValidateName(s.Provider); err != nil {
		return &ValidationError{Field: "provider", Value: err.(*ValidationError).Value, Err: ErrInvalidName}
	}
	if s.Generation < 1 || s.Generation > MaxGeneration {
		return invalid("generation", s.Generation, fmt.Errorf("%w: generation must be from 1 to %d", ErrInvalidField, int64(MaxGeneration)))
	}
	if err := ValidateWindow(s.Window.D()); err != nil {
		return err
	}
	if s.EffectiveFrom < 0 || s.EffectiveFrom%int64(s.Window) != 0 {
		return invalid("effective_from", s.EffectiveFrom, fmt.Errorf("%w: effective_from must be a window start (a multiple of the window)", ErrInvalidShares))
	}
	if s.Total < 0 || s.Total > MaxLimit {
		return invalid("total", s.Total, ErrInvalidLimit)
	}
	if s.Instances != len(s.Shares) {
		return invalid("instances", s.Instances, fmt.Errorf("%w: instances must equal the number of shares (%d)", ErrInvalidShares, len(s.Shares)))
	}
	var sum int64
	for _, id := range sortedKeys(s.Shares) {
		if err := ValidateInstanceID(id); err != nil {
			return err
		}
		v := s.Shares[id]
		if v < 0 || v > MaxLimit {
			return invalid("shares", v, fmt.Errorf("%w: share of %q must be from 0 to the total", ErrInvalidShares, id))
		}
		if g, ok := s.Granted[id]; s.Granted != nil && (!ok || g < v) {
			return invalid("granted", g, fmt.Errorf("%w: granted of %q must be at least its share %d", ErrInvalidShares, id, v))
		}
		sum += v
	}
	if sum > s.Total {
		return invalid("shares", sum, fmt.Errorf("%w: shares must add up to at most the total %d", ErrInvalidShares, s.Total))
	}
	for _, id := range sortedKeys(s.Granted) {
		if err := ValidateInstanceID(id); err != nil {
			return err
		}
		if v := s.Granted[id]; v < 0 || v > MaxLimit {
			return invalid("granted", v, fmt.Errorf("%w: granted of %q must be from 0 to %d", ErrInvalidShares, id, int64(MaxLimit)))
		}
	}
	if s.ConfigRevision < 0 {
		return invalid("config_revision", s.ConfigRevision, ErrInvalidField)
	}
	if b := s.Before; b != nil {
		if err := ValidateWindow(b.Window.D()); err != nil {
			return invalid("before.window", b.Window, ErrInvalidWindow)
		}
		if b.Since < 1 || b.Since > s.Generation {
			return invalid("before.since", b.Since, fmt.Errorf("%w: before.since must be a generation from 1 to %d", ErrInvalidShares, s.Generation))
		}
		for _, id := range sortedKeys(b.Granted) {
			if err := ValidateInstanceID(id); err != nil {
				return err
			}
			if v := b.Granted[id]; v < 0 || v > MaxLimit {
				return invalid("before.granted", v, fmt.Errorf("%w: before.granted of %q must be from 0 to %d", ErrInvalidShares, id, int64(MaxLimit)))
			}
		}
	}
	return nil
}

// HistoryEntry is one audit record of a config change, stored at
// Keys.HistoryEntry(name, seq) in the same etcd transaction as the change.
type HistoryEntry struct {
	Version  int             `json:"version"`
	Provider string          `json:"provider"`
	Who      string          `json:"who"`  // who asked for the change (user@host, or the API's caller)
	When     time.Time       `json:"when"` // when configd made it
	Old      *ProviderConfig `json:"old"`  // nil: the provider was created, or its config was malformed
	New      *ProviderConfig `json:"new"`  // nil: the provider was deleted (both nil: a malformed config deleted)
	// Revision is the etcd revision of the change. It is not stored (the
	// record's ModRevision is it); readers fill it in.
	Revision int64 `json:"revision,omitempty"`
}

// Validate checks the record.
func (h HistoryEntry) Validate() error {
	if err := validateVersion(h.Version); err != nil {
		return err
	}
	if err := ValidateName(h.Provider); err != nil {
		return err
	}
	if len(h.Who) > 256 {
		return invalid("who", h.Who, ErrInvalidField)
	}
	for _, c := range []*ProviderConfig{h.Old, h.New} {
		if c == nil {
			continue
		}
		if err := c.Validate(); err != nil {
			return err
		}
		if c.Name != h.Provider {
			return invalid("name", c.Name, fmt.Errorf("%w: config name must equal the provider %q", ErrInvalidField, h.Provider))
		}
	}
	if h.Revision < 0 {
		return invalid("revision", h.Revision, ErrInvalidField)
	}
	return nil
}

func sortedKeys(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ParseLimit parses a limit as an operator types it ("300000"), with the
// same rules and messages as Validate: "1.5", "-3", "abc" and 10^13 are all
// a *ValidationError wrapping ErrInvalidLimit.
func ParseLimit(s string) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return 0, invalid("limit", s, ErrInvalidLimit)
	}
	if err := ValidateLimit(n); err != nil {
		return 0, err
	}
	return n, nil
}

// ParseWindow parses a window length such as "1s" or "100ms" and validates
// it like Validate does.
func ParseWindow(s string) (time.Duration, error) {
	w, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, invalid("window", s, ErrInvalidWindow)
	}
	if err := ValidateWindow(w); err != nil {
		return 0, err
	}
	return w, nil
}

// ParseLimitWindow parses the window of a limit as --limit gives it
// ("1s", "24h"): up to MaxBudgetWindow, which only a further limit may
// have (Validate says so of a first limit).
func ParseLimitWindow(s string) (time.Duration, error) {
	w, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, invalid("window", s, ErrInvalidLimitWindow)
	}
	if err := ValidateLimitWindow(w); err != nil {
		return 0, err
	}
	return w, nil
}

// validateCoordination checks Coordination. A budget lane of either
// coordination is taken from its counter (BudgetRecord), not granted.
func (c ProviderConfig) validateCoordination() error {
	switch c.Coordination {
	case "", CoordinationShares, CoordinationLedger:
		return nil
	}
	return invalid("coordination", string(c.Coordination), ErrInvalidCoordination)
}
