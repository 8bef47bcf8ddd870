package limiter

import "errors"

// Sentinel errors. Every refusal wraps one of these — a wait that ran out of
// quota wraps both ErrTimeout and ErrNoQuota, and one ended by its context
// also wraps the context's error — so callers branch with errors.Is.
var (
	// ErrTimeout means the earliest permit lies further away than the
	// caller's maxWait or its context's deadline. Acquire returns it at once,
	// without sleeping, when that is known up front.
	ErrTimeout = errors.New("limiter: no permit within the allowed wait")

	// ErrCanceled means the caller's context was cancelled while it waited;
	// the error also matches context.Canceled. The reserved permit was given
	// back. (A context whose deadline passes gives ErrTimeout and
	// context.DeadlineExceeded instead.)
	ErrCanceled = errors.New("limiter: wait canceled")

	// ErrClosed means the Limiter was closed.
	ErrClosed = errors.New("limiter: closed")

	// ErrNoQuota means the quota in force, now and in every scheduled window,
	// is smaller than the permits asked for (a quota of 0 is the usual case:
	// an instance that has no share yet), or that no window before the
	// expiry (SetExpiry) has room for them. Reserve returns it at once;
	// Acquire waits for a quota change until its deadline and then returns
	// an error that matches both ErrTimeout and ErrNoQuota.
	ErrNoQuota = errors.New("limiter: no quota")

	// ErrInvalid means an argument was out of range; the message says which
	// and what is allowed.
	ErrInvalid = errors.New("limiter: invalid argument")
)
