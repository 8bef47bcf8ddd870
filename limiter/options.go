package limiter

import "time"

// Clock is the source of wall-clock time a Limiter aligns its windows to.
// Only Now is used; waits are timed with the time package's timers, so a
// Clock must advance at the rate of real time (it may be offset from it).
// Without WithClock the system clock is used, read through its monotonic
// reading so that the hot path costs a single monotonic clock read.
//
// The limiter's time runs over the whole days that int64 nanoseconds since
// the Unix epoch hold, from 1677-09-22 to 2262-04-11T00:00:00Z: every window
// within them is whole. A clock outside them (a test clock, say) admits
// nothing, and waiters are told so with ErrNoQuota.
type Clock interface {
	Now() time.Time
}

// Option configures a Limiter in New.
type Option interface {
	apply(*config)
}

type config struct {
	clock   Clock
	pacing  bool
	shadow  bool
	offset  time.Duration
	classes []Class
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithClock makes the Limiter read wall-clock time from c instead of the
// system clock. Tests normally need no clock: run them under
// testing/synctest, whose fake time the system clock follows.
func WithClock(c Clock) Option {
	return optionFunc(func(cfg *config) { cfg.clock = c })
}

// WithPacing spreads each window's permits evenly across it: permit k of a
// window of length W and quota q becomes valid at start + ⌊k·W/q⌋ instead of
// all at the start. Permits a paced window did not use by their slot time
// are dropped rather than saved up, so pacing never produces a burst. Off by
// default; SetPacing changes it at run time.
func WithPacing(on bool) Option {
	return optionFunc(func(cfg *config) { cfg.pacing = on })
}

// WithShadow starts the Limiter in shadow mode: every call is admitted at
// once, and what would have been delayed or rejected is only counted (see
// Stats). SetShadow changes it at run time.
func WithShadow(on bool) Option {
	return optionFunc(func(cfg *config) { cfg.shadow = on })
}

// WithClockOffset starts the Limiter with a clock correction: the limiter's
// time is the clock's time plus d. SetClockOffset changes it at run time.
func WithClockOffset(d time.Duration) Option {
	return optionFunc(func(cfg *config) { cfg.offset = clampOffset(d) })
}
