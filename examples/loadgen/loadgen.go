// Package loadgen offers load to a rate-limited call at a set rate: a paced
// loop that, for every request it generates, takes a permit from a sluice
// limiter with Acquire(ctx, maxWait) and, when granted, calls the provider.
// It counts what was offered, admitted, refused and failed.
//
// The load is open-loop: the loop generates requests at its rate whatever
// happens to them, each in its own goroutine (at most MaxInFlight at once),
// so a wait for a permit or a slow provider never slows the offered rate.
// That is how callers behave when their own clients keep coming.
//
//	g := loadgen.New(lim, func(ctx context.Context) error { return callProvider(ctx) },
//		loadgen.WithMaxWait(50*time.Millisecond))
//	g.SetRate(300) // requests per second; may change at any time
//	err := g.Run(ctx) // until ctx ends, then waits for requests in flight
//	fmt.Println(g.Stats())
//
// The loop is paced with go.uber.org/ratelimit's blocking Take, which fits
// a load generator: it needs no cancellation (the loop looks at ctx between
// ticks) and its pacing is steady. Take cannot change its rate in place, so
// a new rate makes the loop build a new one at its next tick.
//
// The demo (examples/demo) drives its instances with it; it is usable by
// any program of the module.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/ratelimit"

	"github.com/sluice-go/sluice/limiter"
)

// ErrRefused may be returned, wrapped or not, by a call function to have the
// request counted as refused rather than failed: a driver of a server that
// answers 503 when its own limiter refuses, for example.
var ErrRefused = errors.New("loadgen: refused")

// MaxTicks is the most times per second the loop wakes up. Above it each
// tick offers several requests (the remainder spread by an accumulator), so
// high rates cost one wake-up a millisecond rather than one per request.
const MaxTicks = 1000

// Defaults of the options.
const (
	DefaultMaxWait     = 100 * time.Millisecond
	DefaultMaxInFlight = 1024
)

// Stats are a Generator's counters since New. Every offered request ends
// in exactly one of Admitted, Refused, Failed or Overload, or is InFlight.
type Stats struct {
	Offered  int64 // requests the loop generated
	Admitted int64 // permits granted (the provider was then called)
	Refused  int64 // Acquire said ErrTimeout (or the call said ErrRefused)
	Failed   int64 // any other Acquire error: no share yet, closed...
	CallErrs int64 // admitted requests whose call returned an error (other than ErrRefused)
	Overload int64 // dropped at once: MaxInFlight requests were in flight already
	InFlight int64 // waiting for a permit or in the call now
	Rate     int   // the rate in force, requests per second
}

// String formats s on one line.
func (s Stats) String() string {
	return fmt.Sprintf("rate %d/s offered %d admitted %d refused %d failed %d call errors %d overload %d in flight %d",
		s.Rate, s.Offered, s.Admitted, s.Refused, s.Failed, s.CallErrs, s.Overload, s.InFlight)
}

// Option configures a Generator.
type Option interface{ apply(*config) }

type config struct {
	maxWait     time.Duration
	maxInFlight int
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithMaxWait sets the maxWait passed to Acquire (default 100ms).
func WithMaxWait(d time.Duration) Option {
	return optionFunc(func(c *config) { c.maxWait = max(0, d) })
}

// WithMaxInFlight sets how many requests may be in flight at once (default
// 1024); a request generated beyond it is dropped and counted as Overload.
func WithMaxInFlight(n int) Option {
	return optionFunc(func(c *config) { c.maxInFlight = max(1, n) })
}

// Generator is a paced open-loop load generator. Its methods are safe for
// concurrent use; Run may be called once.
type Generator struct {
	lim  *limiter.Limiter
	call func(context.Context) error
	cfg  config
	sem  chan struct{}
	rate atomic.Int64

	offered, admitted, refused, failed, callErrs, overload, inFlight atomic.Int64
}

// New returns a Generator offering requests to lim and, for each permit
// granted, calling call. With a nil lim each request goes straight to call
// (to drive a server that has its own limiter). The rate starts at 0.
func New(lim *limiter.Limiter, call func(context.Context) error, opts ...Option) *Generator {
	cfg := config{maxWait: DefaultMaxWait, maxInFlight: DefaultMaxInFlight}
	for _, o := range opts {
		o.apply(&cfg)
	}
	return &Generator{lim: lim, call: call, cfg: cfg, sem: make(chan struct{}, cfg.maxInFlight)}
}

// SetRate sets the offered rate in requests per second (0 pauses, negative
// is 0). It takes effect at the loop's next tick.
func (g *Generator) SetRate(perSecond int) { g.rate.Store(int64(max(0, perSecond))) }

// Stats returns the counters.
func (g *Generator) Stats() Stats {
	return Stats{
		Offered: g.offered.Load(), Admitted: g.admitted.Load(), Refused: g.refused.Load(),
		Failed: g.failed.Load(), CallErrs: g.callErrs.Load(), Overload: g.overload.Load(),
		InFlight: g.inFlight.Load(), Rate: int(g.rate.Load()),
	}
}

// idleTick is how often a paused loop looks at its rate and ctx.
const idleTick = 20 * time.Millisecond

// Run offers load until ctx ends, then waits for the requests in flight
// (which see ctx cancelled) and returns ctx's error. A loop blocked in Take
// notices ctx at its next tick: at most 1/rate later.
func (g *Generator) Run(ctx context.Context) error {
	var reqs sync.WaitGroup
	defer reqs.Wait()
	var rl ratelimit.Limiter
	cur, ticks, acc := 0, 0, 0
	for ctx.Err() == nil {
		if r := int(g.rate.Load()); r != cur {
			// ratelimit cannot change its rate in place (and New(0)
			// panics): build a new one.
			cur, acc = r, 0
			if cur > 0 {
				ticks = min(cur, MaxTicks)
				rl = ratelimit.New(ticks, ratelimit.WithoutSlack)
			}
		}
		if cur == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(idleTick):
			}
			continue
		}
		rl.Take()
		acc += cur
		n := acc / ticks
		acc -= n * ticks
		for range n {
			g.offered.Add(1)
			select {
			case g.sem <- struct{}{}:
			default:
				g.overload.Add(1)
				continue
			}
			g.inFlight.Add(1)
			reqs.Go(func() {
				defer func() { <-g.sem; g.inFlight.Add(-1) }()
				g.request(ctx)
			})
		}
	}
	return ctx.Err()
}

func (g *Generator) request(ctx context.Context) {
	if g.lim != nil {
		switch err := g.lim.Acquire(ctx, g.cfg.maxWait); {
		case err == nil:
		case errors.Is(err, limiter.ErrTimeout):
			g.refused.Add(1)
			return
		default:
			g.failed.Add(1)
			return
		}
	}
	err := g.call(ctx)
	switch {
	case errors.Is(err, ErrRefused):
		g.refused.Add(1)
	case g.lim == nil && ctx.Err() != nil && err != nil:
		g.failed.Add(1) // stopped while in the call
	default:
		g.admitted.Add(1)
		if err != nil {
			g.callErrs.Add(1)
		}
	}
}
