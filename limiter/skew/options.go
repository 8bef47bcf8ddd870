package skew

import (
	"fmt"
	"log/slog"
	"time"
)

// Defaults used by New for what no option sets.
const (
	// DefaultServer is queried when WithServers is not given. The NTP pool
	// asks clients not to poll more often than every 64 s (DefaultInterval).
	DefaultServer = "pool.ntp.org"
	// DefaultInterval is the time between rounds of queries.
	DefaultInterval = 64 * time.Second
	// DefaultTimeout is how long a round waits for each server's answer.
	DefaultTimeout = 2 * time.Second
	// DefaultStalenessFactor: the staleness limit defaults to this many
	// intervals, so that a measurement survives a few lost rounds.
	DefaultStalenessFactor = 4
	// DefaultMaxOffset is the largest offset a reply may give (either
	// sign) to be believed: the most an instance record can carry
	// (clock_offset within ±1h), and far beyond any clock kept by NTP.
	DefaultMaxOffset = time.Hour
)

// Option configures a Monitor in New.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	servers   []string
	interval  time.Duration
	timeout   time.Duration
	staleness time.Duration // 0: DefaultStalenessFactor × interval
	maxOffset time.Duration // a reply's offset beyond ±maxOffset is refused
	clock     Clock         // nil: system clock, kernel receive timestamps
	clockSet  bool
	logger    *slog.Logger
	onChange  func(Measurement)
}

// WithServers sets the NTP servers to query, each "host", "host:port" or
// "[ipv6]:port" (port 123 when omitted). At least one; none may be empty.
// Every round queries all of them at once. Default: DefaultServer.
func WithServers(servers ...string) Option {
	s := append([]string(nil), servers...)
	return optionFunc(func(c *config) { c.servers = s })
}

// WithInterval sets the time between the starts of two rounds of Run
// (> 0). Default: DefaultInterval.
func WithInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.interval = d })
}

// WithTimeout sets how long a round waits for each server's answer (> 0).
// A context deadline earlier than that ends the wait sooner. Default:
// DefaultTimeout.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.timeout = d })
}

// WithStaleness sets how long a measurement stays known without a newer
// valid answer (≥ the interval). Default: DefaultStalenessFactor ×
// interval.
func WithStaleness(d time.Duration) Option {
	return optionFunc(func(c *config) { c.staleness = d })
}

// WithMaxOffset sets the sanity bound on a reply's offset (> 0): a reply
// whose offset is beyond ±d is refused as a bad reply (ErrBadResponse,
// logged like any other server that failed), so a server — or a forged
// reply — claiming a time years away is not believed; with no other valid
// answer the measurement stays as it was and goes unknown when stale, and
// the instance cuts its share (EnforcedShare) rather than move its windows
// by that much (⌊q/2⌋ is safe whatever the clock error). A local clock
// really off by more than d is then never measured: step it with the
// system's tools (ntpd's panic threshold likewise refuses to follow a step
// over 1000 s). An instance record (package cluster) carries offsets
// within ±1h only: a Monitor given to cluster.WithClockMonitor should keep
// d at most DefaultMaxOffset. Default: DefaultMaxOffset.
func WithMaxOffset(d time.Duration) Option {
	return optionFunc(func(c *config) { c.maxOffset = d })
}

// WithClock measures the offset of c instead of the system clock, and
// times measurements and staleness with it. It must not be nil. Pass the
// limiter's clock here when the limiter has one.
func WithClock(c Clock) Option {
	return optionFunc(func(cfg *config) { cfg.clock, cfg.clockSet = c, true })
}

// WithLogger sets the logger (not nil). Round failures and changes between
// known and unknown are logged at Warn and Info. Default: a logger that
// discards everything.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) { c.logger = l })
}

// OnChange sets a function called after every round whose result differs
// from the last one reported: each round with a valid answer, and the first
// round after the measurement went stale. It runs on the goroutine that
// calls Measure (Run's, under Run), one call at a time and in order, before
// Measure returns; it may call Current but must not call Measure, and
// should return quickly (it delays the next round). The instance side sets
// the limiter's clock offset here.
func OnChange(f func(Measurement)) Option {
	return optionFunc(func(c *config) { c.onChange = f })
}

func buildConfig(opts []Option) (config, error) {
	c := config{
		servers:   []string{DefaultServer},
		interval:  DefaultInterval,
		timeout:   DefaultTimeout,
		maxOffset: DefaultMaxOffset,
		logger:    slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if len(c.servers) == 0 {
		return c, fmt.Errorf("%w: no NTP servers; give at least one to WithServers", ErrInvalid)
	}
	for i, s := range c.servers {
		if s == "" {
			return c, fmt.Errorf("%w: server %d is empty; allowed are \"host\" or \"host:port\"", ErrInvalid, i)
		}
	}
	if c.interval <= 0 {
		return c, fmt.Errorf("%w: interval %v; allowed is > 0", ErrInvalid, c.interval)
	}
	if c.timeout <= 0 {
		return c, fmt.Errorf("%w: timeout %v; allowed is > 0", ErrInvalid, c.timeout)
	}
	if c.maxOffset <= 0 {
		return c, fmt.Errorf("%w: max offset %v; allowed is > 0", ErrInvalid, c.maxOffset)
	}
	if c.staleness == 0 {
		c.staleness = DefaultStalenessFactor * c.interval
	}
	if c.staleness < c.interval {
		return c, fmt.Errorf("%w: staleness %v is shorter than the interval %v; allowed is ≥ the interval",
			ErrInvalid, c.staleness, c.interval)
	}
	if c.clockSet && c.clock == nil {
		return c, fmt.Errorf("%w: WithClock(nil); pass a clock or leave the option out", ErrInvalid)
	}
	if c.logger == nil {
		return c, fmt.Errorf("%w: WithLogger(nil); pass a logger or leave the option out", ErrInvalid)
	}
	return c, nil
}
