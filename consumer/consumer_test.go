package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/limiter"
)

func newLimiter(t testing.TB, quota int64, window time.Duration) *limiter.Limiter {
	t.Helper()
	l, err := limiter.New(quota, window)
	if err != nil {
		t.Fatalf("limiter.New(%d, %v): %v", quota, window, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// spyLimiter records, for every permit granted, the times just before the
// call and just after it returned, and every Backoff.
type spyLimiter struct {
	inner    consumer.Limiter
	mu       sync.Mutex
	grants   [][2]time.Time
	backoffs []time.Duration
}

func (s *spyLimiter) AcquireN(ctx context.Context, n int64, maxWait time.Duration) error {
	before := time.Now()
	err := s.inner.AcquireN(ctx, n, maxWait)
	if err == nil {
		after := time.Now()
		s.mu.Lock()
		for range n {
			s.grants = append(s.grants, [2]time.Time{before, after})
		}
		s.mu.Unlock()
	}
	return err
}

func (s *spyLimiter) Backoff(d time.Duration) {
	s.mu.Lock()
	s.backoffs = append(s.backoffs, d)
	s.mu.Unlock()
	s.inner.Backoff(d)
}

// overQuota checks that no run of aligned windows admitted more than quota
// per window. A permit is granted at some moment between its call and its
// return, so a grant whose call and return fall in windows a..b was granted
// in a window within a..b; the grants so bounded within any range lo..hi can
// number at most quota·(hi-lo+1). It returns a description of the first
// violation, or "".
func overQuota(grants [][2]time.Time, window time.Duration, quota int64) string {
	if len(grants) == 0 {
		return ""
	}
	type span struct{ a, b int64 }
	spans := make([]span, len(grants))
	lo, hi := int64(1<<62), int64(0)
	for i, g := range grants {
		spans[i] = span{g[0].UnixNano() / int64(window), g[1].UnixNano() / int64(window)}
		lo, hi = min(lo, spans[i].a), max(hi, spans[i].b)
	}
	for a := lo; a <= hi; a++ {
		for b := a; b <= hi; b++ {
			var n int64
			for _, s := range spans {
				if s.a >= a && s.b <= b {
					n++
				}
			}
			if n > quota*(b-a+1) {
				return fmt.Sprintf("%d permits granted within windows %d..%d, limit %d", n, a-lo, b-lo, quota*(b-a+1))
			}
		}
	}
	return ""
}

func TestOverQuotaCanFail(t *testing.T) {
	w := 100 * time.Millisecond
	base := time.Unix(1000, 0)
	at := func(d time.Duration) [2]time.Time { return [2]time.Time{base.Add(d), base.Add(d)} }
	tests := []struct {
		name   string
		grants [][2]time.Time
		quota  int64
		bad    bool
	}{
		{"under", [][2]time.Time{at(0), at(10 * time.Millisecond), at(150 * time.Millisecond)}, 2, false},
		{"over in one window", [][2]time.Time{at(0), at(10 * time.Millisecond), at(20 * time.Millisecond)}, 2, true},
		{"over across a boundary span", [][2]time.Time{at(0), at(10 * time.Millisecond), {base.Add(20 * time.Millisecond), base.Add(120 * time.Millisecond)}, at(130 * time.Millisecond), at(140 * time.Millisecond)}, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := overQuota(tt.grants, w, tt.quota) != ""; got != tt.bad {
				t.Errorf("overQuota reported violation = %v, want %v", got, tt.bad)
			}
		})
	}
}

func TestConsumeEveryMessage(t *testing.T) {
	const n, partitions = 600, 4
	tests := []struct {
		ordering    consumer.Ordering
		workers     int
		maxInFlight int
	}{
		{consumer.OrderPartition, 4, 32},
		{consumer.OrderKey, 8, 16},
		{consumer.OrderNone, 3, 8},
	}
	k := newKafka(t)
	for _, tt := range tests {
		t.Run(tt.ordering.String(), func(t *testing.T) {
			topic, group := name(t, "topic"), name(t, "group")
			k.createTopic(t, topic, partitions)
			k.produce(t, topic, partitions, testMessages(n))

			rec := newRecord(n)
			var maxBusy, busy int
			var mu sync.Mutex
			c, err := consumer.New(consumer.Config{
				Brokers: k.brokers, Topic: topic, GroupID: group,
				Workers: tt.workers, MaxInFlight: tt.maxInFlight, Ordering: tt.ordering,
			}, newLimiter(t, 1_000_000, 100*time.Millisecond), func(ctx context.Context, m kafka.Message) error {
				mu.Lock()
				busy++
				maxBusy = max(maxBusy, busy)
				mu.Unlock()
				rec.add(m)
				mu.Lock()
				busy--
				mu.Unlock()
				return nil
			}, consumer.WithReaderConfig(fastGroup))
			if err != nil {
				t.Fatal(err)
			}
			stop := started(t, c)
			waitFor(t, rec.all, "every message handled")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}

			// No message lost, and after a graceful stop everything is
			// committed: each partition's committed offset is its end.
			for v := range n {
				if rec.calls[strconv.Itoa(v)] == 0 {
					t.Errorf("message %d never handled", v)
				}
			}
			for p, off := range k.committed(t, group, topic, partitions) {
				if off != n/partitions {
					t.Errorf("partition %d committed at %d, want %d", p, off, n/partitions)
				}
			}
			st := c.Stats()
			if st.Handled < n || st.Consumed < n || st.InFlight != 0 {
				t.Errorf("Stats = %+v, want Handled and Consumed ≥ %d, InFlight 0", st, n)
			}
			if maxBusy > tt.workers {
				t.Errorf("%d handlers ran at once, Workers = %d", maxBusy, tt.workers)
			}
			if tt.ordering == consumer.OrderPartition {
				for p, offs := range rec.order {
					if !slices.IsSorted(offs) {
						t.Errorf("partition %d handled out of order: %v", p, offs)
					}
				}
			}
		})
	}
}

func TestHandlerRateNeverAboveQuota(t *testing.T) {
	const (
		n, partitions = 150, 3
		quota         = 20
		window        = 100 * time.Millisecond
	)
	k := newKafka(t)
	topic, group := name(t, "topic"), name(t, "group")
	k.createTopic(t, topic, partitions)
	k.produce(t, topic, partitions, testMessages(n))

	spy := &spyLimiter{inner: newLimiter(t, quota, window)}
	rec := newRecord(n)
	c := consumeAll(t, consumer.Config{
		Brokers: k.brokers, Topic: topic, GroupID: group,
		Workers: 8, MaxInFlight: 64, Ordering: consumer.OrderNone, MaxWait: time.Millisecond,
	}, spy, rec, consumer.WithReaderConfig(fastGroup))

	spy.mu.Lock()
	defer spy.mu.Unlock()
	if len(spy.grants) < n {
		t.Fatalf("%d permits granted for %d messages handled", len(spy.grants), n)
	}
	if msg := overQuota(spy.grants, window, quota); msg != "" {
		t.Fatalf("rate above quota: %s", msg)
	}
	// n messages at quota per window cannot all go in the first window: the
	// consumer must have been throttled, and counted it.
	if st := c.Stats(); st.Throttled == 0 || st.ThrottleWait == 0 {
		t.Errorf("Stats = %+v: want Throttled > 0 and ThrottleWait > 0", st)
	}
}

func TestRetryThenDeadLetter(t *testing.T) {
	const n, partitions = 200, 2
	k := newKafka(t)
	topic, dlq, group := name(t, "topic"), name(t, "dlq"), name(t, "group")
	k.createTopic(t, topic, partitions)
	k.createTopic(t, dlq, 1)
	k.produce(t, topic, partitions, testMessages(n))

	bad := func(v int) bool { return v%10 == 0 }  // always fails
	slow := func(v int) bool { return v%10 == 5 } // first call: "429, retry after 20ms"
	var mu sync.Mutex
	calls := map[int]int{}
	goodDone, badLast := 0, 0
	wantGood, wantBad := 0, 0
	for v := range n {
		if bad(v) {
			wantBad++
		} else {
			wantGood++
		}
	}
	finished := make(chan struct{})
	spy := &spyLimiter{inner: newLimiter(t, 1_000_000, 100*time.Millisecond)}
	reg := prometheus.NewPedanticRegistry()
	c, err := consumer.New(consumer.Config{
		Brokers: k.brokers, Topic: topic, GroupID: group, DeadLetterTopic: dlq,
		Workers: 4, MaxInFlight: 32, MaxAttempts: 3, RetryBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond,
	}, spy, func(ctx context.Context, m kafka.Message) error {
		v, _ := strconv.Atoi(string(m.Value))
		mu.Lock()
		defer mu.Unlock()
		calls[v]++
		switch {
		case bad(v):
			if calls[v] == 3 {
				badLast++
				if badLast == wantBad && goodDone == wantGood {
					close(finished)
				}
			}
			return fmt.Errorf("boom %d", v)
		case slow(v) && calls[v] == 1:
			return consumer.RetryAfter(20*time.Millisecond, errors.New("429"))
		}
		if calls[v] == 1 || (slow(v) && calls[v] == 2) {
			goodDone++
			if badLast == wantBad && goodDone == wantGood {
				close(finished)
			}
		}
		return nil
	}, consumer.WithReaderConfig(fastGroup), consumer.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	stop := started(t, c)
	waitFor(t, finished, "every message handled or failed 3 times")
	if err := stop(); err != nil { // the drain finishes the dead-letter writes
		t.Fatalf("Run: %v", err)
	}

	mu.Lock()
	for v := range n {
		want := 1
		if bad(v) {
			want = 3
		} else if slow(v) {
			want = 2
		}
		if calls[v] != want {
			t.Errorf("message %d: %d handler calls, want %d", v, calls[v], want)
		}
	}
	mu.Unlock()

	st := c.Stats()
	if st.DeadLettered != int64(wantBad) || st.Handled != int64(wantGood) {
		t.Errorf("Stats: DeadLettered %d Handled %d, want %d and %d", st.DeadLettered, st.Handled, wantBad, wantGood)
	}
	if want := int64(wantBad*2 + n/10); st.Retried != want {
		t.Errorf("Stats.Retried = %d, want %d", st.Retried, want)
	}
	spy.mu.Lock()
	if len(spy.backoffs) != n/10 || spy.backoffs[0] != 20*time.Millisecond {
		t.Errorf("limiter Backoff calls = %v, want %d of 20ms", spy.backoffs, n/10)
	}
	spy.mu.Unlock()

	// Dead letters keep key, value and headers, and say what went wrong.
	for _, m := range k.readAll(t, dlq, wantBad) {
		v, _ := strconv.Atoi(string(m.Value))
		h := map[string]string{}
		for _, x := range m.Headers {
			h[x.Key] = string(x.Value)
		}
		if !bad(v) || string(m.Key) != fmt.Sprintf("k%d", v) || h["trace"] != fmt.Sprintf("t%d", v) {
			t.Errorf("dead letter %q key %q headers %v: not one of the failing messages as produced", m.Value, m.Key, h)
		}
		if h[consumer.HeaderError] != fmt.Sprintf("boom %d", v) || h[consumer.HeaderAttempts] != "3" || h[consumer.HeaderTopic] != topic {
			t.Errorf("dead letter %d headers %v: want the error, 3 attempts and the topic", v, h)
		}
	}
	// Every message is done, so everything is committed.
	for p, off := range k.committed(t, group, topic, partitions) {
		if off != n/partitions {
			t.Errorf("partition %d committed at %d, want %d", p, off, n/partitions)
		}
	}
	// The metrics are on the injected registry and agree with Stats.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if m := mf.GetMetric(); len(m) == 1 && m[0].GetCounter() != nil {
			got[mf.GetName()] = m[0].GetCounter().GetValue()
		}
	}
	if got["sluice_consumer_dead_lettered_total"] != float64(wantBad) || got["sluice_consumer_handled_total"] != float64(wantGood) {
		t.Errorf("metrics %v disagree with Stats %+v", got, st)
	}
}

func TestShutdownMidStreamCommitsWhatWasHandled(t *testing.T) {
	const n, partitions, stopAfter = 400, 4, 150
	k := newKafka(t)
	topic, group := name(t, "topic"), name(t, "group")
	k.createTopic(t, topic, partitions)
	k.produce(t, topic, partitions, testMessages(n))
	cfg := consumer.Config{Brokers: k.brokers, Topic: topic, GroupID: group, Workers: 4, MaxInFlight: 40}

	// First consumer: throttled to 40 per 100 ms, stopped after stopAfter
	// messages, while more are fetched and in flight.
	first := newRecord(n)
	enough := make(chan struct{})
	var count int
	var mu sync.Mutex
	c1, err := consumer.New(cfg, newLimiter(t, 40, 100*time.Millisecond), func(ctx context.Context, m kafka.Message) error {
		first.add(m)
		mu.Lock()
		if count++; count == stopAfter {
			close(enough)
		}
		mu.Unlock()
		return nil
	}, consumer.WithReaderConfig(fastGroup))
	if err != nil {
		t.Fatal(err)
	}
	stop := started(t, c1)
	waitFor(t, enough, "enough messages handled")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	handled := len(first.calls)
	if handled >= n {
		t.Fatalf("all %d messages were handled before the stop; the test needs a stop mid-stream", n)
	}

	// The committed offsets are exactly what was handled: per partition,
	// offsets 0..committed-1 were handled once, and nothing beyond.
	committed := k.committed(t, group, topic, partitions)
	var total int64
	for p := range partitions {
		offs := first.order[p]
		// -1: nothing committed (a partition nothing was handled from
		// before the stop, as on a loaded machine).
		want := make([]int64, max(committed[p], 0))
		for i := range want {
			want[i] = int64(i)
		}
		if !slices.Equal(offs, want) && !(len(offs) == 0 && committed[p] <= 0) {
			t.Errorf("partition %d: committed %d, handled offsets %v", p, committed[p], offs)
		}
		total += max(committed[p], 0)
	}
	if total != int64(handled) {
		t.Errorf("committed %d messages in all, handled %d", total, handled)
	}

	// A second consumer of the group handles exactly the rest: no gap, no
	// duplicate.
	second := newRecord(n - handled)
	c2, err := consumer.New(cfg, newLimiter(t, 1_000_000, 100*time.Millisecond), func(ctx context.Context, m kafka.Message) error {
		second.add(m)
		return nil
	}, consumer.WithReaderConfig(fastGroup))
	if err != nil {
		t.Fatal(err)
	}
	stop2 := started(t, c2)
	waitFor(t, second.all, "the rest handled")
	if err := stop2(); err != nil {
		t.Fatalf("second Run: %v", err)
	}
	for v := range n {
		s := strconv.Itoa(v)
		if first.calls[s]+second.calls[s] != 1 {
			t.Errorf("message %d handled %d times by the first consumer and %d by the second, want once in all", v, first.calls[s], second.calls[s])
		}
	}
}

func TestRunTwice(t *testing.T) {
	c, err := consumer.New(consumer.Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t", GroupID: "g"},
		newLimiter(t, 1, time.Second), func(context.Context, kafka.Message) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // Run returns at once on a cancelled context
	if err := c.Run(ctx); err != nil {
		t.Fatalf("first Run on a cancelled context: %v", err)
	}
	if err := c.Run(ctx); !errors.Is(err, consumer.ErrAlreadyRun) {
		t.Fatalf("second Run: %v, want ErrAlreadyRun", err)
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	good := consumer.Config{Brokers: []string{"localhost:9092"}, Topic: "orders", GroupID: "billing"}
	lim := newLimiter(t, 10, time.Second)
	h := func(context.Context, kafka.Message) error { return nil }
	tests := []struct {
		name  string
		edit  func(*consumer.Config)
		field string // named in the error
	}{
		{"no brokers", func(c *consumer.Config) { c.Brokers = nil }, "Brokers"},
		{"broker without port", func(c *consumer.Config) { c.Brokers = []string{"localhost"} }, "Brokers[0]"},
		{"no topic", func(c *consumer.Config) { c.Topic = "" }, "Topic"},
		{"bad topic", func(c *consumer.Config) { c.Topic = "a topic" }, "Topic"},
		{"no group", func(c *consumer.Config) { c.GroupID = "" }, "GroupID"},
		{"negative workers", func(c *consumer.Config) { c.Workers = -1 }, "Workers"},
		{"in-flight below workers", func(c *consumer.Config) { c.Workers, c.MaxInFlight = 8, 4 }, "MaxInFlight"},
		{"unknown ordering", func(c *consumer.Config) { c.Ordering = 7 }, "Ordering"},
		{"negative max wait", func(c *consumer.Config) { c.MaxWait = -time.Second }, "MaxWait"},
		{"negative attempts", func(c *consumer.Config) { c.MaxAttempts = -1 }, "MaxAttempts"},
		{"max backoff below backoff", func(c *consumer.Config) { c.RetryBackoff, c.MaxBackoff = time.Second, time.Millisecond }, "MaxBackoff"},
		{"negative drain", func(c *consumer.Config) { c.DrainTimeout = -1 }, "DrainTimeout"},
		{"dead letters to the same topic", func(c *consumer.Config) { c.DeadLetterTopic = c.Topic }, "DeadLetterTopic"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			tt.edit(&cfg)
			_, err := consumer.New(cfg, lim, h)
			if !errors.Is(err, consumer.ErrInvalidConfig) {
				t.Fatalf("New: %v, want ErrInvalidConfig", err)
			}
			var ce *consumer.ConfigError
			if !errors.As(err, &ce) || ce.Field != tt.field || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("New: %v, want a ConfigError for %s", err, tt.field)
			}
		})
	}
	t.Run("valid", func(t *testing.T) {
		if err := good.Validate(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("nil limiter and handler", func(t *testing.T) {
		_, err := consumer.New(good, nil, nil)
		if !errors.Is(err, consumer.ErrInvalidConfig) || !strings.Contains(err.Error(), "Limiter") || !strings.Contains(err.Error(), "Handler") {
			t.Fatalf("New: %v", err)
		}
	})
	t.Run("bad reader config is an error, not a panic", func(t *testing.T) {
		_, err := consumer.New(good, lim, h, consumer.WithReaderConfig(func(rc *kafka.ReaderConfig) { rc.MinBytes, rc.MaxBytes = 10, 1 }))
		if !errors.Is(err, consumer.ErrInvalidConfig) {
			t.Fatalf("New: %v, want ErrInvalidConfig", err)
		}
	})
	t.Run("metrics registered twice", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		if _, err := consumer.New(good, lim, h, consumer.WithRegisterer(reg)); err != nil {
			t.Fatal(err)
		}
		if _, err := consumer.New(good, lim, h, consumer.WithRegisterer(reg)); err == nil {
			t.Fatal("second consumer for the same topic and group registered its metrics too")
		}
	})
}

func TestRebalanceMidStreamLosesNothing(t *testing.T) {
	const n, partitions, joinAfter, inFlight = 600, 4, 150, 16
	k := newKafka(t)
	topic, group := name(t, "topic"), name(t, "group")
	k.createTopic(t, topic, partitions)
	k.produce(t, topic, partitions, testMessages(n))
	cfg := consumer.Config{Brokers: k.brokers, Topic: topic, GroupID: group, Workers: 4, MaxInFlight: inFlight}

	// Two throttled consumers of one group; the second joins mid-stream,
	// which moves partitions from the first to it.
	var mu sync.Mutex
	calls := map[string]int{}
	joinNow, all := make(chan struct{}), make(chan struct{})
	handler := func(ctx context.Context, m kafka.Message) error {
		mu.Lock()
		defer mu.Unlock()
		v := string(m.Value)
		calls[v]++
		if calls[v] == 1 {
			switch len(calls) {
			case joinAfter:
				close(joinNow)
			case n:
				close(all)
			}
		}
		return nil
	}
	a, err := consumer.New(cfg, newLimiter(t, 30, 100*time.Millisecond), handler, consumer.WithReaderConfig(fastGroup))
	if err != nil {
		t.Fatal(err)
	}
	b, err := consumer.New(cfg, newLimiter(t, 30, 100*time.Millisecond), handler, consumer.WithReaderConfig(fastGroup))
	if err != nil {
		t.Fatal(err)
	}
	stopA := started(t, a)
	waitFor(t, joinNow, "the first consumer to be mid-stream")
	stopB := started(t, b)
	waitFor(t, all, "every message handled")
	if err := stopB(); err != nil {
		t.Fatalf("second Run: %v", err)
	}
	if err := stopA(); err != nil {
		t.Fatalf("first Run: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for v := range n {
		switch c := calls[strconv.Itoa(v)]; {
		case c == 0:
			t.Errorf("message %d never handled", v)
		case c > 1:
			dups += c - 1
		}
	}
	if sa, sb := a.Stats(), b.Stats(); sb.Handled == 0 || sa.Rebalances < 2 {
		t.Errorf("no rebalance happened (first consumer: %d generations; second handled %d)", sa.Rebalances, sb.Handled)
	}
	// Progress not committed before a rebalance is handled again, by
	// whoever owns the partition next: at most what both held.
	if dups > 2*inFlight {
		t.Errorf("%d duplicate handler calls, want ≤ %d", dups, 2*inFlight)
	}
	for p, off := range k.committed(t, group, topic, partitions) {
		if off != n/partitions {
			t.Errorf("partition %d committed at %d, want %d", p, off, n/partitions)
		}
	}
	t.Logf("%d duplicates across the rebalance (bound %d)", dups, 2*inFlight)
}

// TestJoinRecordKnown checks that the consumer learns its member ID and
// generation from the kafka-go version in go.mod: without them every
// commit goes through the Reader, whose queued requests can be sent in
// the next generation, and revocations commit nothing (commit.go).
func TestJoinRecordKnown(t *testing.T) {
	const n = 20
	k := newKafka(t)
	topic, group := name(t, "topic"), name(t, "group")
	k.createTopic(t, topic, 1)
	k.produce(t, topic, 1, testMessages(n))
	rec := newRecord(n)
	c, err := consumer.New(consumer.Config{Brokers: k.brokers, Topic: topic, GroupID: group},
		newLimiter(t, 1_000_000, 100*time.Millisecond), func(ctx context.Context, m kafka.Message) error {
			rec.add(m)
			return nil
		}, consumer.WithReaderConfig(fastGroup))
	if err != nil {
		t.Fatal(err)
	}
	stop := started(t, c)
	waitFor(t, rec.all, "every message handled")
	member, gen, ok := c.JoinedGeneration()
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !ok || member == "" || gen < 1 {
		t.Fatalf("JoinedGeneration() = %q, %d, %v; want the member and generation of kafka-go's %q record", member, gen, ok, "Joined group")
	}
	if off := k.committed(t, group, topic, 1)[0]; off != n {
		t.Errorf("partition 0 committed at %d, want %d", off, n)
	}
}
