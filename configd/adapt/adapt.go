// Package adapt decides a provider's effective limit from the fleet's
// pushback: the 429s and 503s the provider answered, its Retry-After, and
// the remaining/reset of its rate-limit headers. It is pure: no I/O, no
// clock (each round carries its time), no randomness, standard library
// only, so configd's leader and the simulator run the very same code.
//
// The effective limit always lies in [Floor, Ceiling]. It is meant as a
// retune: configd writes it as the limit in force, so the guarantee that
// covers any limit change covers it, and the ceiling bounds every window.
//
// One round (Step) per report interval or so:
//
//   - pushback lowers the limit multiplicatively (Decrease), but not below
//     the level it probed up from (the last that met no pushback), so a
//     probe that meets the provider's limit steps back one step, and a
//     provider that lowers its limit is met by halving; pushback that comes
//     within Settle of a decrease is the old limit's, still in force in
//     some window, and changes nothing;
//   - a Retry-After pauses probing until it has passed (at most MaxPause
//     ahead);
//   - a remaining the provider's headers said at the end of its window is
//     room the fleet left unused: the limit rises to what the fleet sent
//     per window plus it, at once; a remaining below the first probe step
//     (Probe·Ceiling: one window's hiccup leaves that much) holds the
//     limit where it is; a remaining of a window that began before the
//     last change was in force (the first window boundary at least Lead
//     after it) is ignored, and the limit holds for three more windows
//     awaiting a fresh one;
//   - otherwise the limit probes up towards the ceiling in steps that grow
//     by Probe·Ceiling each quiet round (1, 2, 3 … steps), slow near the
//     level that was pushed back and quick beyond, so the ceiling is
//     reached within RoundsToCeiling quiet rounds after the pause.
package adapt

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Sentinel errors of Config.Validate, matched with errors.Is.
var (
	ErrCeiling  = errors.New("adapt: ceiling must be at least 1")
	ErrFloor    = errors.New("adapt: floor must be from 1 to the ceiling")
	ErrWindow   = errors.New("adapt: window must be positive")
	ErrDecrease = errors.New("adapt: decrease must be a factor above 0 and below 1")
	ErrProbe    = errors.New("adapt: probe must be above 0 and at most 1")
	ErrSettle   = errors.New("adapt: settle must be from 0 to 1h")
	ErrMaxPause = errors.New("adapt: max pause must be from 0 to 1h")
	ErrLead     = errors.New("adapt: lead must be from 0 to 1h")
)

// Defaults of DefaultConfig.
const (
	DefaultDecrease = 0.5
	DefaultProbe    = 0.02
	// DefaultSettle is in windows: a lowered limit is in force within
	// about a window and propagation, and its pushbacks reach configd a
	// report interval and a round later.
	DefaultSettle   = 3
	DefaultMaxPause = time.Minute
	// DefaultFloorShare is the floor as a share of the ceiling when none is
	// given: a provider rarely cuts a quota by more than 90%, and a fleet
	// sent to 0 could not learn that it has room again.
	DefaultFloorShare = 0.1
)

// Config is the controller's setting for one provider.
type Config struct {
	Ceiling int64         // the configured limit: never exceeded
	Floor   int64         // never lowered below it; 1..Ceiling
	Window  time.Duration // the provider's window; counts are scaled to it
	// Decrease is the factor a pushback multiplies the limit by at most:
	// the limit falls to Decrease·limit, or to the level it probed up
	// from if that is higher.
	Decrease float64
	// Probe is the growth of the probe step per quiet round, as a share of
	// the ceiling: the k-th quiet round in a row adds k·Probe·Ceiling.
	Probe float64
	// Settle is how long after a decrease pushback is taken for the old
	// limit's, still in force in some window, and ignored.
	Settle time.Duration
	// MaxPause bounds how far ahead a Retry-After or a reset pauses the
	// probing; a provider's absurd Retry-After cannot freeze the fleet.
	MaxPause time.Duration
	// Lead is how long after the round that set it a limit may take to
	// be in force, before the window boundary it starts at: the
	// enforcer's propagation margin, its clock's uncertainty and the time
	// to publish. A new limit is in force from the first boundary (a
	// multiple of Window since the Unix epoch) at least Lead after its
	// round, and the provider's word on it is a remaining of a window
	// that began then.
	Lead time.Duration
}

// DefaultConfig returns a Config for a provider of limit ceiling per window
// w, with the floor at DefaultFloorShare of it.
func DefaultConfig(ceiling int64, w time.Duration) Config {
	return Config{
		Ceiling:  ceiling,
		Floor:    max(1, int64(float64(ceiling)*DefaultFloorShare)),
		Window:   w,
		Decrease: DefaultDecrease,
		Probe:    DefaultProbe,
		Settle:   DefaultSettle * w,
		MaxPause: DefaultMaxPause,
		Lead:     w, // any propagation margin up to a window
	}
}

// Validate checks every field; the error wraps one of the Err values.
func (c Config) Validate() error {
	switch {
	case c.Ceiling < 1:
		return fmt.Errorf("%w, got %d", ErrCeiling, c.Ceiling)
	case c.Floor < 1 || c.Floor > c.Ceiling:
		return fmt.Errorf("%w (%d), got %d", ErrFloor, c.Ceiling, c.Floor)
	case c.Window <= 0:
		return fmt.Errorf("%w, got %v", ErrWindow, c.Window)
	case !(c.Decrease > 0 && c.Decrease < 1):
		return fmt.Errorf("%w, got %v", ErrDecrease, c.Decrease)
	case !(c.Probe > 0 && c.Probe <= 1):
		return fmt.Errorf("%w, got %v", ErrProbe, c.Probe)
	case c.Settle < 0 || c.Settle > time.Hour:
		return fmt.Errorf("%w, got %v", ErrSettle, c.Settle)
	case c.MaxPause < 0 || c.MaxPause > time.Hour:
		return fmt.Errorf("%w, got %v", ErrMaxPause, c.MaxPause)
	case c.Lead < 0 || c.Lead > time.Hour:
		return fmt.Errorf("%w, got %v", ErrLead, c.Lead)
	}
	return nil
}

// RoundsToCeiling returns how many quiet rounds, once any pause has passed,
// take the limit from the floor to the ceiling at most: the least k with
// Probe·Ceiling·k(k+1)/2 ≥ Ceiling − Floor (each step at least 1).
func (c Config) RoundsToCeiling() int {
	gap := c.Ceiling - c.Floor
	var sum int64
	k := 0
	for sum < gap {
		k++
		sum += c.step(k)
	}
	return k
}

// step is the k-th quiet round's growth.
func (c Config) step(k int) int64 {
	s := math.Ceil(c.Probe * float64(c.Ceiling) * float64(k))
	if s >= float64(c.Ceiling) {
		return c.Ceiling
	}
	return max(1, int64(s))
}

// Round is what the fleet saw since the previous round: counts are for the
// interval between the rounds' At.
type Round struct {
	At        time.Time
	Pushbacks int64 // calls the provider answered 429 or 503
	// Sent is the calls per window the fleet sends now (for sluice: the
	// least of each instance's quota and demand, summed); 0: not known,
	// taken as the limit.
	Sent int64
	// RetryUntil is the latest instant a Retry-After named; zero: none.
	RetryUntil time.Time
	// Remaining is the room the provider's headers said the fleet left
	// unused in its window that ended at RemainingAt (the least any
	// instance was told in it), valid when HasRemaining.
	Remaining    int64
	HasRemaining bool
	RemainingAt  time.Time
}

// State is the controller's state between rounds. The zero State is not
// valid: start from Start.
type State struct {
	Limit      int64     // the effective limit, in [Floor, Ceiling]
	PauseUntil time.Time // no probing before it
	Last       time.Time // the previous round's At; zero before the first
	Quiet      int       // quiet rounds in a row since the last pushback
	Changed    time.Time // when Limit last moved
	Lowered    time.Time // when Limit was last lowered
	// Good is the level the last raise started from: it met no pushback.
	// 0: none since the last decrease.
	Good int64
}

// Start returns the state of a fleet that has seen no pushback: at the
// ceiling.
func (c Config) Start() State { return State{Limit: c.Ceiling} }

// Step returns the state after round r and, when the limit moved or a pause
// began, why (for history), else "". A state out of [Floor, Ceiling], from
// a config changed since, is brought back into it first. A round whose At is
// not after the previous one's counts as a zero-length interval.
func (c Config) Step(s State, r Round) (State, string) {
	old := s.Limit
	s.Limit = min(max(s.Limit, c.Floor), c.Ceiling)
	r.Pushbacks, r.Sent = max(r.Pushbacks, 0), max(r.Sent, 0)
	// A remaining describes the limits in force during its window: one of
	// a window that began before the last change was in force may describe
	// the limit before it. The instances' ends of a window agree to within
	// a tenth of it (Tally), so a window that ended that much early is
	// still the first under the new limit. While the provider's word on
	// the new limit is awaited (three windows after that first one: it
	// ends, is reported, and read), the limit holds rather than probes;
	// after that, a provider that stopped saying is probed.
	awaiting := false
	if r.HasRemaining && !s.Changed.IsZero() {
		first := c.inForce(s.Changed).Add(c.Window) // the end of the first window under the new limit
		if r.RemainingAt.Before(first.Add(-c.Window / 10)) {
			r.HasRemaining = false
			awaiting = r.At.Before(first.Add(3 * c.Window))
		}
	}
	interval := r.At.Sub(s.Last)
	if s.Last.IsZero() || interval <= 0 {
		interval = 0
	}
	if r.At.After(s.Last) {
		s.Last = r.At
	}
	why := ""
	pause := func(until time.Time, what string) {
		until = minTime(until, r.At.Add(c.MaxPause))
		if until.After(s.PauseUntil) && until.After(r.At) {
			s.PauseUntil = until
			why = join(why, fmt.Sprintf("paused until %s: %s", until.UTC().Format("15:04:05.000"), what))
		}
	}
	if !r.RetryUntil.IsZero() {
		pause(r.RetryUntil, "Retry-After")
	}

	switch {
	case r.Pushbacks > 0:
		s.Quiet = 0
		if !s.Lowered.IsZero() && r.At.Before(s.Lowered.Add(c.Settle)) {
			break // the old limit's, still in force somewhere
		}
		next := int64(float64(s.Limit) * c.Decrease)
		if s.Good < s.Limit {
			next = max(next, s.Good)
		}
		s.Limit, s.Good, s.Lowered = min(max(next, c.Floor), c.Ceiling), 0, r.At
		if s.Limit != old {
			why = join(why, fmt.Sprintf("lowered %d → %d: %d pushbacks in %v", old, s.Limit, r.Pushbacks, interval.Round(time.Millisecond)))
		}
	case r.At.Before(s.PauseUntil):
		// Paused: the provider asked for time; probing would only meet it.
	case r.HasRemaining && c.room(s.Limit, r)-s.Limit >= c.step(1):
		s.Quiet++
		s.Good, s.Limit = s.Limit, c.room(s.Limit, r)
		why = join(why, fmt.Sprintf("raised %d → %d: %d left unused in the provider's window", old, s.Limit, r.Remaining))
	case r.HasRemaining && r.Remaining < c.step(1), awaiting:
		// The provider says its limit was taken, but for less than a
		// probe's step (one window's hiccup leaves that much), or its
		// word on the last change is still to come: stay.
	default:
		s.Quiet++
		s.Good, s.Limit = s.Limit, min(s.Limit+c.step(s.Quiet), c.Ceiling)
		if s.Limit != old {
			why = join(why, fmt.Sprintf("raised %d → %d: probing, %d quiet rounds", old, s.Limit, s.Quiet))
		}
	}
	if s.Limit != old {
		s.Changed = r.At
	}
	return s, why
}

// RoundEarly is how much earlier than needed NextRound places a round: it
// allows for the round's reads before it decides, and a timer that fires
// late.
const RoundEarly = 50 * time.Millisecond

// NextRound returns when the round after at should run, for rounds every
// every: the first instant after at that is Lead and RoundEarly before a
// multiple of every (since the Unix epoch). With a window that is a
// multiple of every, one round falls just in time for each window
// boundary, so that what the fleet said since the last boundary is in
// force at the next, and the remaining of a window just ended (said as
// the next begins) is read early in the next: a round at any other phase
// waits for its boundary up to every longer.
func (c Config) NextRound(at time.Time, every time.Duration) time.Time {
	e := int64(every)
	if e <= 0 {
		return at
	}
	off := int64(c.Lead+RoundEarly) % e
	x := at.UnixNano() + off
	next := x - x%e + e // the first multiple of every after x
	if x < 0 && x%e != 0 {
		next -= e
	}
	return time.Unix(0, next-off)
}

// inForce returns when a limit set by the round at t is in force at the
// latest: the first window boundary at least Lead after t.
func (c Config) inForce(t time.Time) time.Time {
	n, w := t.Add(c.Lead).UnixNano(), int64(c.Window)
	b := n - n%w
	if b < n {
		b += w
	}
	return time.Unix(0, b)
}

// room returns what the provider's last window allowed, at most the
// ceiling: what the fleet sends per window (limit when not known) and the
// remaining it left unused.
func (c Config) room(limit int64, r Round) int64 {
	sent := limit
	if r.Sent > 0 {
		sent = min(r.Sent, c.Ceiling)
	}
	return sent + min(max(r.Remaining, 0), c.Ceiling-sent) // no overflow on an absurd remaining
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
