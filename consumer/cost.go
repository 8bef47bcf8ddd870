package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/limiter"
)

// ErrNoGrant is returned by Settle called with a context that is not a
// handler call's under WithCost.
var ErrNoGrant = errors.New("consumer: no grant to settle: Settle takes the context of a handler call of a Consumer made WithCost")

// CostLimiter is a Limiter that takes a cost in several dimensions per
// call, all-or-nothing (*limiter.Multi): with WithCost, each handler call
// takes its message's cost, and the handler reports the actual cost with
// Settle.
type CostLimiter interface {
	Limiter
	// Acquire returns a Grant once every limit has room for cost; errors
	// as Limiter.AcquireN's.
	Acquire(ctx context.Context, maxWait time.Duration, cost ...limiter.Amount) (limiter.Grant, error)
}

// WithCost makes every handler call take cost(msg) from the Consumer's
// limiter, which must be a CostLimiter (New refuses another), instead of
// one permit: the tokens a call is estimated to use, say, with the request
// it is (1 request unless cost names requests). A handler that learns the
// actual cost from the provider's answer reports it with Settle. A cost
// the limiter refuses as invalid (a dimension it has no limit of, a
// negative amount) fails the message for good: it is dead-lettered, not
// retried.
func WithCost(cost func(kafka.Message) []limiter.Amount) Option {
	return optionFunc(func(o *options) { o.cost = cost })
}

// Settle reports what the handler call whose ctx this is actually cost, in
// the dimensions it names (see limiter.Grant.Settle): what was charged too
// much goes back to the window it was charged to. Call it once per call,
// from the handler, after the provider answered; it returns ErrNoGrant
// outside a handler of a Consumer made WithCost, and the Grant's error for
// a second Settle or an invalid amount.
func Settle(ctx context.Context, actual ...limiter.Amount) error {
	g, ok := ctx.Value(grantKey{}).(*limiter.Grant)
	if !ok {
		return ErrNoGrant
	}
	return g.Settle(actual...)
}

type grantKey struct{}

// permits takes what one handler call of msg costs: one permit, or
// msg's cost WithCost. It returns the Grant to settle (the zero Grant
// without a cost).
type permits func(ctx context.Context, msg kafka.Message, maxWait time.Duration) (limiter.Grant, error)

// newPermits returns how the Consumer takes its permits from lim: of
// the message's class, with class (WithClass).
func newPermits(lim Limiter, cost func(kafka.Message) []limiter.Amount, class func(kafka.Message) string) (permits, error) {
	if cost == nil {
		return func(ctx context.Context, msg kafka.Message, maxWait time.Duration) (limiter.Grant, error) {
			if name := classOf(class, msg); name != "" {
				ctx = limiter.WithClass(ctx, name)
			}
			return limiter.Grant{}, lim.AcquireN(ctx, 1, maxWait)
		}, nil
	}
	cl, ok := lim.(CostLimiter)
	if !ok {
		return nil, &ConfigError{Field: "lim", Value: fmt.Sprintf("%T", lim), Rule: "WithCost needs a CostLimiter, such as *limiter.Multi"}
	}
	return func(ctx context.Context, msg kafka.Message, maxWait time.Duration) (limiter.Grant, error) {
		if name := classOf(class, msg); name != "" {
			ctx = limiter.WithClass(ctx, name)
		}
		return cl.Acquire(ctx, maxWait, cost(msg)...)
	}, nil
}

// withGrant is the handler's context, carrying g for Settle.
func withGrant(ctx context.Context, g *limiter.Grant) context.Context {
	return context.WithValue(ctx, grantKey{}, g)
}
