package consumer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// RetryAfterError is returned (wrapped or not) by a Handler when the
// provider refused the call for now and said when to come back (HTTP 429 or
// 503 with Retry-After). The consumer reports Delay to the limiter
// (Limiter.Backoff), so no instance call goes out before it, and calls the
// handler again. Such answers do not count against Config.MaxAttempts:
// throttling never sends a message to the dead-letter topic.
type RetryAfterError struct {
	Delay time.Duration // how long the provider asked to wait; ≤ 0 means retry after the usual backoff
	Err   error         // the provider's answer, may be nil
}

// RetryAfter returns a *RetryAfterError: the handler's way of saying "the
// provider said retry after d". err may be nil.
func RetryAfter(d time.Duration, err error) error {
	return &RetryAfterError{Delay: d, Err: err}
}

func (e *RetryAfterError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("consumer: provider asked to retry after %v", e.Delay)
	}
	return fmt.Sprintf("consumer: provider asked to retry after %v: %v", e.Delay, e.Err)
}

// Unwrap returns the provider's error.
func (e *RetryAfterError) Unwrap() error { return e.Err }

// permanentError marks a handler error that retrying cannot fix.
type permanentError struct{ err error }

// Permanent wraps err so that the consumer does not retry the message: it
// goes to the dead-letter topic at once (or, without one, Run stops with
// ErrHandlerFailed). Use it for messages that can never succeed, such as
// ones that do not parse. Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// IsPermanent reports whether err (or an error it wraps) was made by
// Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// backoff returns the wait before retry number attempt (1 for the first
// retry): base·2^(attempt-1), capped at max, of which the upper half is
// random (so that retries of many messages spread out).
func backoff(attempt int, base, max time.Duration) time.Duration {
	d := base
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	d = min(d, max)
	half := d / 2
	if half <= 0 {
		return d
	}
	return half + rand.N(half+1)
}
