package consumer

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/limiter"
)

// Option configures what a Consumer is wired to (logger, metrics registry,
// Kafka client details), as opposed to Config, which says how it behaves.
type Option interface{ apply(*options) }

type options struct {
	log          *slog.Logger
	reg          prometheus.Registerer
	readerConfig func(*kafka.ReaderConfig)
	dlq          MessageWriter
	cost         func(kafka.Message) []limiter.Amount
	class        func(kafka.Message) string
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

func buildOptions(opts []Option) options {
	o := options{log: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		if opt != nil {
			opt.apply(&o)
		}
	}
	return o
}

// WithLogger sends the consumer's logs, and kafka-go's (at Debug, its
// errors at Warn), to l. The default discards them. A nil l keeps the
// default.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) {
		if l != nil {
			o.log = l
		}
	})
}

// WithRegisterer registers the consumer's metrics (sluice_consumer_*,
// labelled topic and group) on r when New is called. Without it no metric
// is registered anywhere; Stats works either way. New fails if r already
// holds a consumer for the same topic and group.
func WithRegisterer(r prometheus.Registerer) Option {
	return optionFunc(func(o *options) { o.reg = r })
}

// WithReaderConfig lets fn adjust the kafka-go ReaderConfig built from
// Config before the Reader is made: a Dialer with TLS or SASL, session and
// heartbeat timeouts, StartOffset, GroupBalancers, MaxBytes. Brokers, Topic,
// GroupID and CommitInterval are set again from Config after fn runs:
// commits are always synchronous, made by the consumer. The GroupBalancers
// (kafka-go's defaults if none) are wrapped so that the consumer learns of
// a revocation before the member joins again (see Run); they assign
// partitions as they would. New validates the result and returns an error
// (kafka-go itself would panic).
func WithReaderConfig(fn func(*kafka.ReaderConfig)) Option {
	return optionFunc(func(o *options) { o.readerConfig = fn })
}

// MessageWriter is what the consumer needs to produce dead letters;
// *kafka.Writer implements it. The messages passed name their topic
// (Config.DeadLetterTopic), so the writer must not have a Topic of its own.
type MessageWriter interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// WithDeadLetterWriter makes the consumer produce dead letters through w
// instead of the kafka.Writer it makes from Config.Brokers (which takes TLS,
// SASL and client ID from the ReaderConfig's Dialer, if any). Use it to
// share a writer or to tune one. The consumer does not close w.
func WithDeadLetterWriter(w MessageWriter) Option {
	return optionFunc(func(o *options) { o.dlq = w })
}
