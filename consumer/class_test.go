package consumer_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/limiter"
)

// classSpy records every permit a Limiter granted: the class its context
// named ("" for none), when it was asked for and when it came.
type classSpy struct {
	inner  *limiter.Limiter
	mu     sync.Mutex
	grants []classGrant
}

type classGrant struct {
	class         string
	before, after time.Time
}

func (s *classSpy) AcquireN(ctx context.Context, n int64, maxWait time.Duration) error {
	before := time.Now()
	err := s.inner.AcquireN(ctx, n, maxWait)
	if err == nil {
		name, _ := limiter.ClassOf(ctx)
		s.mu.Lock()
		s.grants = append(s.grants, classGrant{name, before, time.Now()})
		s.mu.Unlock()
	}
	return err
}

func (s *classSpy) Backoff(d time.Duration) { s.inner.Backoff(d) }

func newClassLimiter(t *testing.T, quota int64, window time.Duration, cs ...limiter.Class) *limiter.Limiter {
	t.Helper()
	l, err := limiter.New(quota, window, limiter.WithClasses(cs...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// classMessages returns n messages whose value is their index and whose
// "priority" header is class(i); none where class(i) is "".
func classMessages(n int, class func(i int) string) []kafka.Message {
	msgs := testMessages(n)
	for i := range msgs {
		if c := class(i); c != "" {
			msgs[i].Headers = append(msgs[i].Headers, kafka.Header{Key: "priority", Value: []byte(c)})
		}
	}
	return msgs
}

// TestClassKeepsItsReserveUnderABatchFlood: batch messages flood a
// consumer with many workers, so its permits are queued windows ahead;
// the critical messages among them, named by a header, wait at most about
// one window (their reserve is kept for them in every window, and they go
// ahead of batch's waiters), while batch's wait for several. No window
// admits more than the quota.
func TestClassKeepsItsReserveUnderABatchFlood(t *testing.T) {
	const (
		n       = 200
		quota   = 20
		reserve = 10
		window  = 100 * time.Millisecond
	)
	critical := func(i int) bool { return i%10 == 5 }
	k := newKafka(t)
	topic, group := name(t, "topic"), name(t, "group")
	k.createTopic(t, topic, 1)
	k.produce(t, topic, 1, classMessages(n, func(i int) string {
		if critical(i) {
			return "critical"
		}
		return "batch"
	}))
	lim := newClassLimiter(t, quota, window, limiter.Class{Name: "critical", Reserve: reserve}, limiter.Class{Name: "batch"})
	spy := &classSpy{inner: lim}
	rec := newRecord(n)
	consumeAll(t, consumer.Config{
		Brokers: k.brokers, Topic: topic, GroupID: group,
		Workers: 64, MaxInFlight: 128, Ordering: consumer.OrderNone, MaxWait: time.Millisecond,
	}, spy, rec, consumer.WithReaderConfig(fastGroup), consumer.WithClass(consumer.ClassHeader("priority")))

	spy.mu.Lock()
	defer spy.mu.Unlock()
	var all [][2]time.Time
	longest := map[string]time.Duration{}
	count := map[string]int{}
	for _, g := range spy.grants {
		all = append(all, [2]time.Time{g.before, g.after})
		longest[g.class] = max(longest[g.class], g.after.Sub(g.before))
		count[g.class]++
	}
	if msg := overQuota(all, window, quota); msg != "" {
		t.Fatalf("rate above quota: %s", msg)
	}
	if want := n / 10; count["critical"] != want || count["batch"] != n-want {
		t.Fatalf("permits by class %v, want critical %d and batch %d", count, want, n-want)
	}
	// Batch's waiters (up to 64, 10 permits a window for them) wait about
	// six windows: the flood is real. A critical message waits for the
	// next window at most, plus scheduling.
	if longest["batch"] < 3*window {
		t.Fatalf("batch waited at most %v: no flood, the test shows nothing", longest["batch"])
	}
	if longest["critical"] >= 2*window {
		t.Errorf("a critical message waited %v for its permit under the batch flood (batch at most %v), want less than two windows (%v)", longest["critical"], longest["batch"], 2*window)
	}
	st := lim.Stats()
	if st.Classes[0].Name != "critical" || st.Classes[0].Admitted != n/10 {
		t.Errorf("Stats.Classes = %+v: want critical admitted %d", st.Classes, n/10)
	}
}

// TestClassUnknownIsServedAsDefault: a message naming a class the
// limiter does not list, a name that is no class name at all, or none, is
// handled as the default class; none is lost, dead-lettered or retried.
func TestClassUnknownIsServedAsDefault(t *testing.T) {
	names := []string{"critical", "nonesuch", "", "NOT a class!", strings.Repeat("x", 1<<16), "batch", "default", "\xff\x00"}
	const n = 80
	k := newKafka(t)
	topic, group := name(t, "topic"), name(t, "group")
	k.createTopic(t, topic, 2)
	k.produce(t, topic, 2, classMessages(n, func(i int) string { return names[i%len(names)] }))
	lim := newClassLimiter(t, 1000, time.Second,
		limiter.Class{Name: "critical", Reserve: 5}, limiter.Class{Name: "default"}, limiter.Class{Name: "batch"})
	spy := &classSpy{inner: lim}
	rec := newRecord(n)
	c := consumeAll(t, consumer.Config{
		Brokers: k.brokers, Topic: topic, GroupID: group, Workers: 4, MaxAttempts: 1,
	}, spy, rec, consumer.WithReaderConfig(fastGroup), consumer.WithClass(consumer.ClassHeader("priority")))
	per := n / len(names)
	want := map[string]int64{"critical": int64(per), "batch": int64(per), "default": int64(n - 2*per)}
	for _, cs := range lim.Stats().Classes {
		if cs.Admitted != want[cs.Name] {
			t.Errorf("class %s admitted %d, want %d", cs.Name, cs.Admitted, want[cs.Name])
		}
	}
	spy.mu.Lock()
	defer spy.mu.Unlock()
	for _, g := range spy.grants {
		if g.class != "" && !limiter.ValidClassName(g.class) {
			t.Errorf("the limiter was asked for class %.40q, which is no class name", g.class)
		}
	}
	if st := c.Stats(); st.Handled != n || st.DeadLettered != 0 || st.Retried != 0 {
		t.Errorf("Stats = %+v: want %d handled, none dead-lettered or retried", st, n)
	}
}

func TestClassHeader(t *testing.T) {
	class := consumer.ClassHeader("priority")
	tests := []struct {
		headers []kafka.Header
		want    string
	}{
		{nil, ""},
		{[]kafka.Header{{Key: "trace", Value: []byte("x")}}, ""},
		{[]kafka.Header{{Key: "priority", Value: []byte("critical")}}, "critical"},
		{[]kafka.Header{{Key: "priority", Value: []byte("batch")}, {Key: "priority", Value: []byte("critical")}}, "critical"},
		{[]kafka.Header{{Key: "Priority", Value: []byte("critical")}}, ""},
		{[]kafka.Header{{Key: "priority"}}, ""},
	}
	for _, tt := range tests {
		if got := class(kafka.Message{Headers: tt.headers}); got != tt.want {
			t.Errorf("ClassHeader(priority)(%v) = %q, want %q", tt.headers, got, tt.want)
		}
	}
}

// TestClassWithCost: WithClass goes with WithCost, whose limiter.Multi
// serves the message's class: New accepts them together
// (TestCostPermitsOfTheMessagesClass takes the permits).
func TestClassWithCost(t *testing.T) {
	m, err := limiter.NewMulti([]limiter.Limit{{Quota: 10, Window: time.Second}},
		limiter.WithClasses(limiter.Class{Name: "critical", Reserve: 6}, limiter.Class{Name: "batch"}))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, err := consumer.New(consumer.Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t", GroupID: "g"},
		m, func(context.Context, kafka.Message) error { return nil },
		consumer.WithCost(func(kafka.Message) []limiter.Amount { return nil }),
		consumer.WithClass(consumer.ClassHeader("priority")))
	if err != nil || c == nil {
		t.Fatalf("New(WithCost, WithClass) = %v", err)
	}
}
