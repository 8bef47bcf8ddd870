package cluster

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/skew"
)

// Defaults of a Member's options.
const (
	DefaultLeaseTTL       = 5 * time.Second
	DefaultReportInterval = time.Second
	DefaultColdStart      = 3 * time.Second
	DefaultChangeMargin   = 100 * time.Millisecond
	DefaultOpTimeout      = 2 * time.Second
)

// Option configures a Member in Join.
type Option interface{ apply(*options) }

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

type options struct {
	prefix         string
	id             string
	leaseTTL       time.Duration
	report         time.Duration
	coldStart      time.Duration
	margin         time.Duration
	opTimeout      time.Duration
	fallbackQuota  int64
	fallbackWindow time.Duration
	logger         *slog.Logger
	limiterOpts    []limiter.Option
	clock          *skew.Monitor
	// enforced, for a Member of Join (none) and the first Member of a
	// Group that JoinProvider made, are the provider's further limits
	// this instance enforces (schema.Lane): one in force that is not
	// (added later, or joined with Join) is listed among its problems;
	// nil: not checked.
	enforced []schema.Lane
	// budget is the window of the budget lane a Member of JoinProvider
	// keeps (schema.IsBudget): it takes the limit from the window's
	// counter instead of following shares. 0: not a budget.
	budget time.Duration
}

func defaultOptions() options {
	return options{
		prefix:         schema.DefaultPrefix,
		leaseTTL:       DefaultLeaseTTL,
		report:         DefaultReportInterval,
		coldStart:      DefaultColdStart,
		margin:         DefaultChangeMargin,
		opTimeout:      DefaultOpTimeout,
		fallbackWindow: time.Second,
		logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

func (o options) validate() error {
	switch {
	case o.leaseTTL < time.Second:
		return fmt.Errorf("cluster: lease TTL must be at least 1s, got %v", o.leaseTTL)
	case o.report <= 0:
		return fmt.Errorf("cluster: report interval must be positive, got %v", o.report)
	case o.coldStart < 0:
		return fmt.Errorf("cluster: cold start timeout must not be negative, got %v", o.coldStart)
	case o.margin < 0:
		return fmt.Errorf("cluster: change margin must not be negative, got %v", o.margin)
	case o.opTimeout <= 0:
		return fmt.Errorf("cluster: etcd operation timeout must be positive, got %v", o.opTimeout)
	}
	if err := o.validateFallback(); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	return nil
}

// validateFallback checks the fallback quota and window (WithFallback,
// Lane.Fallback).
func (o *options) validateFallback() error {
	if err := limiter.ValidateQuota(o.fallbackQuota); err != nil {
		return fmt.Errorf("fallback quota: %w", err)
	}
	if err := limiter.ValidateWindow(o.fallbackWindow); err != nil {
		return fmt.Errorf("fallback window: %w", err)
	}
	return nil
}

// WithPrefix sets the etcd key prefix shared with configd (default
// "/sluice/").
func WithPrefix(p string) Option { return optionFunc(func(o *options) { o.prefix = p }) }

// WithID sets the instance id (default host-pid-random). In Kubernetes the
// pod name is a good choice. It must match [A-Za-z0-9][A-Za-z0-9._:-]{0,127}
// and be unique among the processes running: shares, and the holds that
// keep a lapsed share from others, go by id.
func WithID(id string) Option { return optionFunc(func(o *options) { o.id = id }) }

// WithLeaseTTL sets the TTL of the instance's etcd lease (default 5s,
// rounded up to whole seconds, at least 1s): how long after a crash the
// others still count this instance.
func WithLeaseTTL(d time.Duration) Option { return optionFunc(func(o *options) { o.leaseTTL = d }) }

// WithReportInterval sets how often the instance considers writing its
// record — demand, admissions, clock offset — to etcd (default 1s). The
// record is written only when something changed meaningfully, so etcd
// traffic does not grow with the request rate.
func WithReportInterval(d time.Duration) Option {
	return optionFunc(func(o *options) { o.report = d })
}

// WithColdStartTimeout sets how long Join waits for etcd before starting
// on the fallback quota (default 3s).
func WithColdStartTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) { o.coldStart = d })
}

// WithFallback sets the quota and window used when the provider's config
// cannot be read: at a cold start with etcd unreachable, or before the
// provider is configured. The default, 0 permits per 1s, is fail-closed:
// nothing is admitted until a share is known. Once a share is known, an
// etcd outage keeps it (fail-static) instead.
func WithFallback(quota int64, window time.Duration) Option {
	return optionFunc(func(o *options) { o.fallbackQuota, o.fallbackWindow = quota, window })
}

// WithChangeMargin sets how far ahead, at least, a change computed by the
// instance itself (the even split when no configd is alive) takes effect:
// the first window boundary at least this far away (default 100ms), so that
// every instance switches at the same boundary.
func WithChangeMargin(d time.Duration) Option {
	return optionFunc(func(o *options) { o.margin = d })
}

// WithLogger sets the structured logger (default: discard). A Member logs
// one line per change of state, never per request.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) {
		if l != nil {
			o.logger = l
		}
	})
}

// WithLimiterOptions passes options to the limiter the Member creates
// (a clock, an initial clock offset).
func WithLimiterOptions(opts ...limiter.Option) Option {
	return optionFunc(func(o *options) { o.limiterOpts = append(o.limiterOpts, opts...) })
}

// WithClockMonitor makes the Member measure its clock with mon, which it
// runs until Close (do not run it yourself). Each report interval the
// Member corrects its limiter's window boundaries by the measured offset
// (limiter.SetClockOffset), keeps a band of the measurement's uncertainty
// at each boundary (limiter.SetClockUncertainty), reports the offset in its
// record, and enforces
// skew.EnforcedShare of its share: the full share while the offset is known
// within the provider's max_clock_offset (default skew.DefaultBound of the
// window), less when the uncertainty is larger, half when the offset is
// unknown. Without a monitor the clock is trusted as it is.
func WithClockMonitor(mon *skew.Monitor) Option {
	return optionFunc(func(o *options) { o.clock = mon })
}
