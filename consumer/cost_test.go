package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/limiter"
)

// costSpy records every grant of a CostLimiter: when it was asked for and
// when it came, and what it charged.
type costSpy struct {
	*limiter.Multi
	mu     sync.Mutex
	grants []costGrant
}

type costGrant struct {
	before, after time.Time
	tokens        int64
}

func (s *costSpy) Acquire(ctx context.Context, maxWait time.Duration, cost ...limiter.Amount) (limiter.Grant, error) {
	before := time.Now()
	g, err := s.Multi.Acquire(ctx, maxWait, cost...)
	if err == nil {
		s.mu.Lock()
		s.grants = append(s.grants, costGrant{before, time.Now(), g.Cost("tokens")})
		s.mu.Unlock()
	}
	return g, err
}

// TestCostPerMessage: WithCost takes each message's estimated tokens and a
// request from a limiter of two limits, the handler settles what the
// provider used, and no window gets more tokens than its limit.
func TestCostPerMessage(t *testing.T) {
	const (
		n, partitions = 200, 2
		tokens        = 300 // per window
		window        = 100 * time.Millisecond
	)
	k := newKafka(t)
	topic, group := name(t, "topic"), name(t, "group")
	k.createTopic(t, topic, partitions)
	k.produce(t, topic, partitions, testMessages(n))
	m, err := limiter.NewMulti([]limiter.Limit{
		{Quota: 1000, Window: window},
		{Dimension: "tokens", Quota: tokens, Window: window},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	spy := &costSpy{Multi: m}
	estimate := func(msg kafka.Message) int64 { return 10 + int64(len(msg.Value))*10 } // 20..40
	rec := newRecord(n)
	var mu sync.Mutex
	var used int64
	c, err := consumer.New(consumer.Config{
		Brokers: k.brokers, Topic: topic, GroupID: group,
		Workers: 8, MaxInFlight: 64, Ordering: consumer.OrderNone, MaxWait: time.Millisecond,
	}, spy, func(ctx context.Context, msg kafka.Message) error {
		actual := estimate(msg) / 2 // what the provider's answer says
		if err := consumer.Settle(ctx, limiter.Cost("tokens", actual)); err != nil {
			return consumer.Permanent(err)
		}
		mu.Lock()
		used += actual
		mu.Unlock()
		rec.add(msg)
		return nil
	}, consumer.WithReaderConfig(fastGroup), consumer.WithCost(func(msg kafka.Message) []limiter.Amount {
		return []limiter.Amount{limiter.Cost("tokens", estimate(msg))}
	}))
	if err != nil {
		t.Fatal(err)
	}
	stop := started(t, c)
	waitFor(t, rec.all, "every message handled")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	st := m.Stats()
	mu.Lock()
	if st[1].Admitted != used || st[0].Admitted != int64(len(spy.grants)) {
		t.Errorf("admitted %d requests and %d tokens; the handler was called %d times and used %d tokens", st[0].Admitted, st[1].Admitted, len(spy.grants), used)
	}
	mu.Unlock()
	// Used per window, by when the grant came, within the limit: what was
	// charged less what Settle gave back to the window while it was open
	// is within it, and each call used half its charge. (A grant that
	// came across a boundary could be either window's: left out.)
	spy.mu.Lock()
	defer spy.mu.Unlock()
	perWindow := map[int64]int64{}
	for _, g := range spy.grants {
		w := g.after.UnixNano() / int64(window)
		if g.before.UnixNano()/int64(window) == w {
			perWindow[w] += g.tokens / 2
		}
	}
	full := 0
	for w, sum := range perWindow {
		if sum > tokens {
			t.Errorf("window %d: %d tokens used, limit %d", w, sum, tokens)
		}
		if sum > tokens/2 {
			full++ // more than the limit's worth of charges went in: the refunds were used
		}
	}
	if full == 0 {
		t.Errorf("no window used more than half the tokens limit (%v): the refunds were never taken", perWindow)
	}
}

// TestCostInvalidIsDeadLettered: a message whose cost the limiter cannot
// take (a dimension it has no limit of) is dead-lettered at once, and the
// others are handled.
func TestCostInvalidIsDeadLettered(t *testing.T) {
	const n = 20
	k := newKafka(t)
	topic, dlq, group := name(t, "topic"), name(t, "dlq"), name(t, "group")
	k.createTopic(t, topic, 1)
	k.createTopic(t, dlq, 1)
	k.produce(t, topic, 1, testMessages(n))
	m, err := limiter.NewMulti([]limiter.Limit{{Quota: 1000, Window: time.Second}, {Dimension: "tokens", Quota: 1_000_000, Window: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	rec := newRecord(n - 1)
	c, err := consumer.New(consumer.Config{Brokers: k.brokers, Topic: topic, GroupID: group, DeadLetterTopic: dlq},
		m, func(ctx context.Context, msg kafka.Message) error {
			rec.add(msg)
			return nil
		}, consumer.WithReaderConfig(fastGroup), consumer.WithCost(func(msg kafka.Message) []limiter.Amount {
			if string(msg.Value) == "7" {
				return []limiter.Amount{limiter.Cost("bytes", 1)}
			}
			return []limiter.Amount{limiter.Cost("tokens", 5)}
		}))
	if err != nil {
		t.Fatal(err)
	}
	stop := started(t, c)
	waitFor(t, rec.all, "every other message handled")
	dl := k.readAll(t, dlq, 1)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if v := string(dl[0].Value); v != "7" {
		t.Errorf("dead letter %q, want message 7", v)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.calls["7"] != 0 {
		t.Errorf("message 7 handled %d times with a cost the limiter refused", rec.calls["7"])
	}
}

// TestCostNeedsACostLimiter: WithCost with a limiter that takes no cost is
// refused by New, and Settle outside a handler says there is nothing.
func TestCostNeedsACostLimiter(t *testing.T) {
	_, err := consumer.New(consumer.Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t", GroupID: "g"},
		newLimiter(t, 10, time.Second), func(context.Context, kafka.Message) error { return nil },
		consumer.WithCost(func(kafka.Message) []limiter.Amount { return nil }))
	if !errors.Is(err, consumer.ErrInvalidConfig) {
		t.Errorf("New(WithCost, *limiter.Limiter) = %v, want ErrInvalidConfig", err)
	}
	if err := consumer.Settle(context.Background(), limiter.Cost("tokens", 1)); !errors.Is(err, consumer.ErrNoGrant) {
		t.Errorf("Settle outside a handler = %v, want ErrNoGrant", err)
	}
}
