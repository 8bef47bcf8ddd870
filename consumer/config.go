package consumer

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Every error returned by this package wraps one of them
// (test with errors.Is) together with a message saying what was wrong.
var (
	// ErrInvalidConfig reports a Config field with a value that is not
	// allowed; the wrapping *ConfigError names the field.
	ErrInvalidConfig = errors.New("consumer: invalid config")
	// ErrAlreadyRun is returned by Run when the Consumer has been run before:
	// a Consumer runs once.
	ErrAlreadyRun = errors.New("consumer: Run called more than once")
	// ErrHandlerFailed is returned by Run when a message failed every
	// attempt and no dead-letter topic is configured. The message is not
	// committed, so it is delivered again when the group resumes.
	ErrHandlerFailed = errors.New("consumer: handler failed and no dead-letter topic is configured")
	// ErrLimiterClosed is returned by Run when the limiter reports that it
	// is closed: no permit can be had any more, so no message can be
	// handled. Messages not yet handled are not committed.
	ErrLimiterClosed = errors.New("consumer: limiter closed")
)

// Ordering says which messages a Consumer handles in the order they were
// fetched.
type Ordering int

const (
	// OrderPartition (the default) handles the messages of one partition
	// one at a time, in offset order; different partitions run in parallel
	// on up to Config.Workers workers.
	OrderPartition Ordering = iota
	// OrderKey handles the messages with the same key one at a time, in
	// offset order; keys are spread over Config.Workers workers. Offsets are
	// still committed contiguously per partition.
	OrderKey
	// OrderNone hands every message to the next free worker: the most
	// parallel, no order between any two messages.
	OrderNone
)

// String returns "partition", "key" or "none".
func (o Ordering) String() string {
	switch o {
	case OrderPartition:
		return "partition"
	case OrderKey:
		return "key"
	case OrderNone:
		return "none"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// Defaults used for zero Config fields.
const (
	DefaultWorkers        = 8
	DefaultMaxInFlight    = 1000
	DefaultMaxWait        = 100 * time.Millisecond
	DefaultMaxAttempts    = 5
	DefaultRetryBackoff   = 100 * time.Millisecond
	DefaultMaxBackoff     = 10 * time.Second
	DefaultDrainTimeout   = 30 * time.Second
	DefaultCommitInterval = 0
)

// Config configures a Consumer. The zero value of every optional field
// means "use the default" (documented per field); negative numbers and
// durations are invalid. Kafka settings beyond these (TLS, SASL, session
// timeouts) are set with WithReaderConfig and WithDeadLetterWriter.
type Config struct {
	// Brokers are the bootstrap broker addresses ("host:port"). Required.
	Brokers []string
	// Topic is the topic to consume. Required.
	Topic string
	// GroupID is the consumer group. Required: offsets are committed to the
	// group, which is what makes delivery at-least-once across restarts.
	GroupID string

	// Workers is how many messages are handled concurrently.
	// 0 means DefaultWorkers (8). With OrderPartition, at most one worker
	// per assigned partition is busy at a time.
	Workers int
	// MaxInFlight bounds the messages fetched but not yet committed
	// (waiting, being handled, or handled and waiting for their commit).
	// When it is reached, fetching blocks until a commit frees room: this
	// is the consumer's memory bound and back-pressure, and also the most
	// messages delivered twice after a crash. 0 means DefaultMaxInFlight
	// (1000); it must be at least Workers.
	MaxInFlight int
	// Ordering says which messages keep their order. The zero value is
	// OrderPartition.
	Ordering Ordering

	// MaxWait is how long one permit may take before the consumer counts
	// the message as throttled (metric and debug log). It never drops or
	// skips a message: after MaxWait the consumer keeps waiting for the
	// permit. 0 means DefaultMaxWait (100 ms).
	MaxWait time.Duration
	// MaxAttempts is how many times the handler is called for one message
	// before it goes to the dead-letter topic (RetryAfter answers do not
	// count; Permanent errors go at once). 0 means DefaultMaxAttempts (5);
	// 1 means no retry.
	MaxAttempts int
	// RetryBackoff is the wait before the first retry; each next retry
	// waits twice as long, up to MaxBackoff, with random jitter of up to
	// half the wait. 0 means DefaultRetryBackoff (100 ms).
	RetryBackoff time.Duration
	// MaxBackoff caps the wait between retries. 0 means DefaultMaxBackoff
	// (10 s); it must be at least RetryBackoff.
	MaxBackoff time.Duration
	// HandlerTimeout, when > 0, bounds each handler call through its
	// context. 0 means no per-call bound.
	HandlerTimeout time.Duration
	// DeadLetterTopic receives messages that failed every attempt, with
	// the original key, value and headers plus headers naming the error
	// (see HeaderError). Empty means no dead-letter topic: Run then stops
	// with ErrHandlerFailed when a message exhausts its attempts, leaving it
	// uncommitted.
	DeadLetterTopic string

	// DrainTimeout is how long Run, once its context is cancelled, lets
	// messages already fetched finish before abandoning them (they are not
	// committed and are delivered again later); what is done by then is
	// committed all the same. It also bounds how long handler calls in
	// progress when the consumer's partitions are revoked may go on (at
	// most half the group's rebalance timeout). 0 means
	// DefaultDrainTimeout (30 s).
	DrainTimeout time.Duration
	// CommitInterval is the least time between two offset commits. 0 (the
	// default) commits as soon as the previous commit returned and there is
	// progress, which keeps re-deliveries after a crash smallest.
	CommitInterval time.Duration
}

// ConfigError describes one invalid Config field. It wraps
// ErrInvalidConfig.
type ConfigError struct {
	Field string // the Config field, e.g. "MaxInFlight"
	Value any    // the value given
	Rule  string // what is allowed
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("consumer: invalid config: %s = %v: %s", e.Field, e.Value, e.Rule)
}

// Unwrap returns ErrInvalidConfig.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// Validate reports every invalid field of c, joined with errors.Join; each
// is a *ConfigError wrapping ErrInvalidConfig. It checks c as given: zero
// optional fields are valid (they mean the default).
func (c Config) Validate() error {
	var errs []error
	bad := func(field string, v any, rule string) {
		errs = append(errs, &ConfigError{Field: field, Value: v, Rule: rule})
	}
	if len(c.Brokers) == 0 {
		bad("Brokers", c.Brokers, "at least one broker address (host:port) is required")
	}
	for i, b := range c.Brokers {
		if strings.TrimSpace(b) == "" || !strings.Contains(b, ":") {
			bad(fmt.Sprintf("Brokers[%d]", i), fmt.Sprintf("%q", b), "must be host:port")
		}
	}
	if c.Topic == "" {
		bad("Topic", `""`, "a topic name is required")
	} else if err := checkTopic(c.Topic); err != "" {
		bad("Topic", fmt.Sprintf("%q", c.Topic), err)
	}
	if c.GroupID == "" {
		bad("GroupID", `""`, "a consumer group is required (offsets are committed to it)")
	}
	if c.Workers < 0 {
		bad("Workers", c.Workers, "must be ≥ 0 (0 means the default, 8)")
	}
	if c.MaxInFlight < 0 {
		bad("MaxInFlight", c.MaxInFlight, "must be ≥ 0 (0 means the default, 1000)")
	}
	if w, m := c.workers(), c.maxInFlight(); c.Workers >= 0 && c.MaxInFlight >= 0 && m < w {
		bad("MaxInFlight", m, fmt.Sprintf("must be ≥ Workers (%d)", w))
	}
	if c.Ordering < OrderPartition || c.Ordering > OrderNone {
		bad("Ordering", int(c.Ordering), "must be OrderPartition, OrderKey or OrderNone")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"MaxWait", c.MaxWait}, {"RetryBackoff", c.RetryBackoff}, {"MaxBackoff", c.MaxBackoff},
		{"HandlerTimeout", c.HandlerTimeout}, {"DrainTimeout", c.DrainTimeout},
		{"CommitInterval", c.CommitInterval},
	} {
		if d.v < 0 {
			bad(d.name, d.v, "must be ≥ 0 (0 means the default)")
		}
	}
	if c.MaxAttempts < 0 {
		bad("MaxAttempts", c.MaxAttempts, "must be ≥ 0 (0 means the default, 5)")
	}
	if c.RetryBackoff >= 0 && c.MaxBackoff >= 0 && c.maxBackoff() < c.retryBackoff() {
		bad("MaxBackoff", c.maxBackoff(), fmt.Sprintf("must be ≥ RetryBackoff (%v)", c.retryBackoff()))
	}
	if c.DeadLetterTopic != "" {
		if err := checkTopic(c.DeadLetterTopic); err != "" {
			bad("DeadLetterTopic", fmt.Sprintf("%q", c.DeadLetterTopic), err)
		} else if c.DeadLetterTopic == c.Topic {
			bad("DeadLetterTopic", fmt.Sprintf("%q", c.DeadLetterTopic), "must differ from Topic")
		}
	}
	return errors.Join(errs...)
}

// checkTopic applies Kafka's topic name rules; it returns "" when name is
// valid, else the rule broken.
func checkTopic(name string) string {
	if len(name) > 249 {
		return "at most 249 characters"
	}
	if name == "." || name == ".." {
		return `"." and ".." are not topic names`
	}
	for _, r := range name {
		ok := r == '.' || r == '_' || r == '-' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
		if !ok {
			return "only ASCII letters, digits, '.', '_' and '-' are allowed"
		}
	}
	return ""
}

func (c Config) workers() int           { return orDefault(c.Workers, DefaultWorkers) }
func (c Config) maxInFlight() int       { return orDefault(c.MaxInFlight, DefaultMaxInFlight) }
func (c Config) maxWait() time.Duration { return orDefault(c.MaxWait, DefaultMaxWait) }
func (c Config) maxAttempts() int       { return orDefault(c.MaxAttempts, DefaultMaxAttempts) }
func (c Config) retryBackoff() time.Duration {
	return orDefault(c.RetryBackoff, DefaultRetryBackoff)
}
func (c Config) maxBackoff() time.Duration   { return orDefault(c.MaxBackoff, DefaultMaxBackoff) }
func (c Config) drainTimeout() time.Duration { return orDefault(c.DrainTimeout, DefaultDrainTimeout) }

func orDefault[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}
