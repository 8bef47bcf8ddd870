package consumer

import (
	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/limiter"
)

// WithClass makes every permit taken for a message, its retries' included,
// one of the priority class class(msg) names (limiter.WithClass), so that
// a limiter serving classes (limiter.WithClasses, or a cluster.Member of a
// provider that lists them) keeps each class's reserve for it and serves
// higher classes' waiters first. ClassHeader reads the class from a
// header.
//
// An empty name names no class. A name the limiter does not list —
// misspelt, dropped from the provider's config, or not a class name at
// all — is served as the limiter's default class, as limiter.WithClasses
// says: a message is never held back, dead-lettered or failed for its
// class, and the limiter's Stats.Classes (and its metrics) show where such
// messages went. A limiter without classes ignores the names.
//
// Classes order the waits for permits, not the fetch: a message still
// waits for the messages that must precede it (Config.Ordering) and for a
// free worker. Give Workers enough room beyond the partitions (or keys) a
// flood of lower classes keeps busy for a higher class's message to reach
// the limiter while they wait.
//
// With WithCost, the class is that of the limiter.Multi's acquisition,
// which keeps each class's reserve in every limit that lists classes.
func WithClass(class func(kafka.Message) string) Option {
	return optionFunc(func(o *options) { o.class = class })
}

// ClassHeader returns a class function for WithClass that reads the
// class from the header named key (matched exactly, as Kafka's header
// names are); the last header of that name wins, and a message without
// it names no class. Names starting with HeaderPrefix are the consumer's
// own: a producer's "sluice-…" header would be renamed in a dead letter,
// so pick a name of your own, such as "priority".
func ClassHeader(key string) func(kafka.Message) string {
	return func(m kafka.Message) string {
		name := ""
		for _, h := range m.Headers {
			if h.Key == key {
				name = string(h.Value)
			}
		}
		return name
	}
}

// classOf returns the class msg names under class, "" for none. A name
// that cannot name a class (limiter.ValidClassName) names none: the
// limiter would serve it as its default class all the same, and a
// hostile header's megabytes never reach the limiter's lock.
func classOf(class func(kafka.Message) string, msg kafka.Message) string {
	if class == nil {
		return ""
	}
	name := class(msg)
	if !limiter.ValidClassName(name) {
		return ""
	}
	return name
}
