package consumer_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/etcdtest"
)

// Tests run against an in-process kfake cluster, one per test, or against
// the Kafka named by KAFKA_BROKERS (comma-separated host:port), with topics
// and groups named uniquely per test.

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	if os.Getenv(sharedChildEnv) != "" {
		os.Exit(sharedChildMain())
	}
	// Every goroutine must be gone when the tests end: kfake's and
	// kafka-go's included (clusters, readers, writers and transports are
	// all closed by the tests). Only the embedded etcd's process-wide
	// loops, which are not sluice's, are ignored.
	goleak.VerifyTestMain(m, etcdtest.IgnoreLeaks()...)
}

// testKafka is a Kafka-protocol cluster for one test.
type testKafka struct {
	brokers   []string
	transport *kafka.Transport
	client    *kafka.Client
	fake      *kfake.Cluster // nil when KAFKA_BROKERS is set
}

var nameSeq atomic.Int64

func newKafka(t testing.TB) *testKafka {
	t.Helper()
	k := &testKafka{transport: &kafka.Transport{}}
	if env := os.Getenv("KAFKA_BROKERS"); env != "" {
		k.brokers = strings.Split(env, ",")
	} else {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
		if err != nil {
			t.Fatalf("starting kfake: %v", err)
		}
		t.Cleanup(c.Close)
		k.brokers, k.fake = c.ListenAddrs(), c
	}
	t.Cleanup(k.transport.CloseIdleConnections)
	k.client = &kafka.Client{Addr: kafka.TCP(k.brokers...), Transport: k.transport}
	return k
}

// name returns a topic or group name unique to this test run.
func name(t testing.TB, what string) string {
	s := strings.NewReplacer("/", "-", " ", "-", "#", "-").Replace(t.Name())
	return fmt.Sprintf("%s-%s-%d-%d", s, what, os.Getpid(), nameSeq.Add(1))
}

func (k *testKafka) createTopic(t testing.TB, topic string, partitions int) {
	t.Helper()
	res, err := k.client.CreateTopics(t.Context(), &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}},
	})
	if err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
	if err := res.Errors[topic]; err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
}

// produce writes msgs to topic, message i to partition i % partitions so
// that every partition gets its share whatever the key.
func (k *testKafka) produce(t testing.TB, topic string, partitions int, msgs []kafka.Message) {
	t.Helper()
	w := &kafka.Writer{
		Addr:         kafka.TCP(k.brokers...),
		Topic:        topic,
		Transport:    k.transport,
		Balancer:     kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.WriterData.(int) % partitions }),
		BatchSize:    500,
		BatchTimeout: time.Millisecond,
		RequiredAcks: kafka.RequireAll,
	}
	defer w.Close()
	for i := range msgs {
		msgs[i].WriterData = i
	}
	if err := w.WriteMessages(t.Context(), msgs...); err != nil {
		t.Fatalf("producing %d messages: %v", len(msgs), err)
	}
}

// messages returns n messages whose value is their index, keyed "k<i>".
func testMessages(n int) []kafka.Message {
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{
			Key:     fmt.Appendf(nil, "k%d", i),
			Value:   fmt.Appendf(nil, "%d", i),
			Headers: []kafka.Header{{Key: "trace", Value: fmt.Appendf(nil, "t%d", i)}},
		}
	}
	return msgs
}

// committed returns the group's committed offset for each partition
// (-1 where nothing is committed).
func (k *testKafka) committed(t testing.TB, group, topic string, partitions int) map[int]int64 {
	t.Helper()
	ps := make([]int, partitions)
	for i := range ps {
		ps[i] = i
	}
	res, err := k.client.OffsetFetch(t.Context(), &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ps}})
	if err != nil {
		t.Fatalf("fetching committed offsets: %v", err)
	}
	if res.Error != nil {
		t.Fatalf("fetching committed offsets: %v", res.Error)
	}
	out := map[int]int64{}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			t.Fatalf("committed offset of partition %d: %v", p.Partition, p.Error)
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

// readAll reads exactly n messages from partition 0 of topic.
func (k *testKafka) readAll(t testing.TB, topic string, n int) []kafka.Message {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: k.brokers, Topic: topic, MaxWait: 50 * time.Millisecond})
	defer r.Close()
	// A guard against hanging forever, not a measurement.
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var out []kafka.Message
	for len(out) < n {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read %d of %d messages from %s: %v", len(out), n, topic, err)
		}
		out = append(out, m)
	}
	return out
}

// fastGroup makes consumer group membership quick, for tests.
func fastGroup(rc *kafka.ReaderConfig) {
	rc.HeartbeatInterval = 100 * time.Millisecond
	rc.SessionTimeout = time.Second
	rc.RebalanceTimeout = 2 * time.Second
	rc.JoinGroupBackoff = 100 * time.Millisecond
	rc.MaxWait = 100 * time.Millisecond
	rc.ReadBackoffMin = 10 * time.Millisecond
	rc.ReadBackoffMax = 100 * time.Millisecond
}

// started runs c in a goroutine; stop cancels it and returns Run's error.
func started(t testing.TB, c *consumer.Consumer) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-errc
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// consumeAll runs a consumer of cfg over lim whose handler records every
// message in rec, until rec has all it wants, stops it and returns it.
func consumeAll(t testing.TB, cfg consumer.Config, lim consumer.Limiter, rec *record, opts ...consumer.Option) *consumer.Consumer {
	t.Helper()
	c, err := consumer.New(cfg, lim, func(ctx context.Context, m kafka.Message) error {
		rec.add(m)
		return nil
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	stop := started(t, c)
	waitFor(t, rec.all, "every message handled")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	return c
}

// record counts handler calls per message value and closes all once every
// one of want distinct values was seen.
type record struct {
	mu    sync.Mutex
	calls map[string]int
	order map[int][]int64 // offsets per partition, in call order
	want  int
	all   chan struct{}
}

func newRecord(want int) *record {
	return &record{calls: map[string]int{}, order: map[int][]int64{}, want: want, all: make(chan struct{})}
}

func (r *record) add(m kafka.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[string(m.Value)]++
	r.order[m.Partition] = append(r.order[m.Partition], m.Offset)
	if len(r.calls) == r.want && r.calls[string(m.Value)] == 1 {
		close(r.all)
	}
}

// waitFor waits for ch, failing the test if the cluster seems stuck. The
// bound is a guard against a hung test, not a measurement.
func waitFor(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(90 * time.Second):
		t.Fatalf("gave up waiting for %s", what)
	}
}
