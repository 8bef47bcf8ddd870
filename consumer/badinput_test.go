package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/logbuf"
)

// oddHeaders are messages whose headers a handler is likely never to have
// seen: empty keys, duplicated keys, binary and empty values, keys that
// spoof the consumer's own dead-letter headers, and large headers.
func oddHeaders() [][]kafka.Header {
	bin := make([]byte, 256)
	for i := range bin {
		bin[i] = byte(i)
	}
	many := make([]kafka.Header, 500)
	for i := range many {
		many[i] = kafka.Header{Key: "h" + strconv.Itoa(i%7), Value: []byte(strconv.Itoa(i))}
	}
	return [][]kafka.Header{
		{{Key: "", Value: []byte("empty key")}},
		{{Key: "", Value: nil}},
		{{Key: "dup", Value: []byte("1")}, {Key: "dup", Value: []byte("2")}, {Key: "dup", Value: []byte("1")}},
		{{Key: "bin", Value: bin}, {Key: "\x00\xff\xfe", Value: []byte{0}}},
		{{Key: "empty", Value: []byte{}}},
		{{Key: "nil", Value: nil}},
		{{Key: "ключ", Value: []byte("значение")}, {Key: "🔑", Value: []byte("\U0001F600")}},
		{{Key: consumer.HeaderError, Value: []byte("spoofed")}, {Key: consumer.HeaderAttempts, Value: []byte("99")}},
		{{Key: "big", Value: bytes.Repeat([]byte("v"), 256<<10)}, {Key: strings.Repeat("k", 32<<10), Value: []byte("big key")}},
		many,
		nil,
	}
}

// TestOddHeadersReachTheDeadLetterTopic sends messages with odd headers
// through the consumer, whose handler fails every one of them, into a real
// (kfake) dead-letter topic. Nothing may be lost, every dead letter must
// carry its message's key, value and headers in order and byte for byte
// (those named like the consumer's renamed "original-..."), then the
// consumer's own headers, each once, and the consumer must not stop or
// panic.
func TestOddHeadersReachTheDeadLetterTopic(t *testing.T) {
	k := newKafka(t)
	topic, dlq, group := name(t, "topic"), name(t, "dlq"), name(t, "group")
	k.createTopic(t, topic, 1)
	k.createTopic(t, dlq, 1)
	hs := oddHeaders()
	msgs := make([]kafka.Message, len(hs))
	for i, h := range hs {
		msgs[i] = kafka.Message{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "%d", i), Headers: h}
	}
	msgs = append(msgs, kafka.Message{Key: nil, Value: nil, Headers: []kafka.Header{{Key: "no key, no value"}}})
	k.produce(t, topic, 1, msgs)

	var mu sync.Mutex
	seen := map[int]int{}
	all := make(chan struct{})
	c, err := consumer.New(consumer.Config{
		Brokers: k.brokers, Topic: topic, GroupID: group, DeadLetterTopic: dlq, MaxAttempts: 2,
		RetryBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
	}, newLimiter(t, 1000, 100*time.Millisecond), func(ctx context.Context, m kafka.Message) error {
		mu.Lock()
		defer mu.Unlock()
		seen[int(m.Offset)]++
		if len(seen) == len(msgs) && seen[int(m.Offset)] == 2 {
			done := true
			for _, n := range seen {
				done = done && n == 2
			}
			if done {
				close(all)
			}
		}
		if m.Offset%2 == 0 {
			panic(fmt.Sprintf("handler panics on headers %d", len(m.Headers)))
		}
		return errors.New("handler refuses odd headers")
	}, consumer.WithReaderConfig(fastGroup))
	if err != nil {
		t.Fatal(err)
	}
	stop := started(t, c)
	waitFor(t, all, "every message tried twice")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if st := c.Stats(); st.DeadLettered != int64(len(msgs)) || st.Abandoned != 0 {
		t.Errorf("Stats %+v: want %d dead-lettered, none abandoned", st, len(msgs))
	}
	got := k.readAll(t, dlq, len(msgs))
	byOffset := map[string]kafka.Message{}
	for _, m := range got {
		var off string
		for _, h := range m.Headers {
			if h.Key == consumer.HeaderOffset {
				off = string(h.Value) // the last one: the consumer's
			}
		}
		byOffset[off] = m
	}
	for i, want := range msgs {
		m, ok := byOffset[strconv.Itoa(i)]
		if !ok {
			t.Errorf("message %d: no dead letter", i)
			continue
		}
		if !bytes.Equal(m.Key, want.Key) || !bytes.Equal(m.Value, want.Value) {
			t.Errorf("message %d: dead letter key %q value %q, want %q %q", i, m.Key, m.Value, want.Key, want.Value)
		}
		n := len(want.Headers)
		if len(m.Headers) != n+5 {
			t.Errorf("message %d: %d headers in the dead letter, want its %d and 5 more", i, len(m.Headers), n)
			continue
		}
		for j, h := range want.Headers {
			key := h.Key
			if strings.HasPrefix(key, "sluice-") {
				key = "original-" + key
			}
			if g := m.Headers[j]; g.Key != key || !bytes.Equal(g.Value, h.Value) {
				t.Errorf("message %d header %d: %.40q=%.40q, want %.40q=%.40q", i, j, g.Key, g.Value, key, h.Value)
			}
		}
		tail := map[string]string{}
		for _, h := range m.Headers[n:] {
			tail[h.Key] = string(h.Value)
		}
		for _, h := range m.Headers[:n] {
			if _, ok := tail[h.Key]; ok {
				t.Errorf("message %d: header %q both the message's and the consumer's", i, h.Key)
			}
		}
		if tail[consumer.HeaderAttempts] != "2" || tail[consumer.HeaderTopic] != topic || tail[consumer.HeaderPartition] != "0" ||
			!strings.Contains(tail[consumer.HeaderError], "handler") {
			t.Errorf("message %d: the consumer's headers %v", i, tail)
		}
	}
	if off := k.committed(t, group, topic, 1)[0]; off != int64(len(msgs)) {
		t.Errorf("committed offset %d, want %d: every message is done", off, len(msgs))
	}
}

// TestDeadLetterHeadersAreNotAmbiguous: a message that already carries
// headers named like the consumer's (sluice-error...; in another case; or
// renamed by an earlier trip to a dead-letter topic) keeps them in the dead
// letter, in their place, renamed "original-...": each of the consumer's
// header names appears once, so a reader taking the first header of a name
// — as most do — or the last reads the consumer's value, never the
// producer's.
func TestDeadLetterHeadersAreNotAmbiguous(t *testing.T) {
	w := &captureWriter{}
	msg := kafka.Message{Topic: "in", Partition: 3, Offset: 7, Key: []byte("k"), Value: []byte("v"),
		Headers: []kafka.Header{
			{Key: consumer.HeaderError, Value: []byte("spoofed")},
			{Key: "trace", Value: []byte("t1")},
			{Key: consumer.HeaderAttempts, Value: []byte("99")},
			{Key: "SLUICE-Offset", Value: []byte("-1")},
			{Key: "original-sluice-error", Value: []byte("an earlier dead letter's")},
			{Key: consumer.HeaderValueDropped, Value: []byte("5")},
			{Key: "sluice", Value: []byte("not the prefix")},
			{Key: "original-trace", Value: []byte("not reserved")},
		}}
	dl := w.deadLetterOf(t, msg)
	want := []kafka.Header{
		{Key: "original-sluice-error", Value: []byte("spoofed")},
		{Key: "trace", Value: []byte("t1")},
		{Key: "original-sluice-attempts", Value: []byte("99")},
		{Key: "original-SLUICE-Offset", Value: []byte("-1")},
		{Key: "original-original-sluice-error", Value: []byte("an earlier dead letter's")},
		{Key: "original-sluice-value-dropped", Value: []byte("5")},
		{Key: "sluice", Value: []byte("not the prefix")},
		{Key: "original-trace", Value: []byte("not reserved")},
		{Key: consumer.HeaderError, Value: []byte("fails")},
		{Key: consumer.HeaderAttempts, Value: []byte("1")},
		// The message as produced again by deadLetterOf: its own topic,
		// partition 0, offset 0.
		{Key: consumer.HeaderTopic, Value: dl.Headers[10].Value},
		{Key: consumer.HeaderPartition, Value: []byte("0")},
		{Key: consumer.HeaderOffset, Value: []byte("0")},
	}
	if len(dl.Headers) != len(want) {
		t.Fatalf("dead letter headers %q, want %q", dl.Headers, want)
	}
	for i, h := range want {
		if g := dl.Headers[i]; g.Key != h.Key || !bytes.Equal(g.Value, h.Value) {
			t.Errorf("header %d: %q=%q, want %q=%q", i, g.Key, g.Value, h.Key, h.Value)
		}
	}
	seen := map[string]int{}
	for _, h := range dl.Headers {
		if strings.HasPrefix(strings.ToLower(h.Key), consumer.HeaderPrefix) {
			seen[strings.ToLower(h.Key)]++
		}
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("header %q appears %d times (any case), want once", k, n)
		}
	}
}

// captureWriter is a MessageWriter that keeps what it is given.
type captureWriter struct {
	mu   sync.Mutex
	msgs []kafka.Message
	got  chan struct{}
}

func (w *captureWriter) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msgs...)
	select {
	case w.got <- struct{}{}:
	default:
	}
	return nil
}

// deadLetterOf runs msg through a consumer whose handler always fails, on
// a kfake topic, and returns the dead letter written for it.
func (w *captureWriter) deadLetterOf(t *testing.T, msg kafka.Message) kafka.Message {
	t.Helper()
	w.got = make(chan struct{}, 1)
	k := newKafka(t)
	topic, group := name(t, "topic"), name(t, "group")
	k.createTopic(t, topic, 1)
	msg.Topic, msg.Partition, msg.Offset = "", 0, 0
	k.produce(t, topic, 1, []kafka.Message{msg})
	c, err := consumer.New(consumer.Config{Brokers: k.brokers, Topic: topic, GroupID: group, DeadLetterTopic: topic + ".dlq", MaxAttempts: 1},
		newLimiter(t, 1000, time.Second), func(context.Context, kafka.Message) error { return errors.New("fails") },
		consumer.WithReaderConfig(fastGroup), consumer.WithDeadLetterWriter(w))
	if err != nil {
		t.Fatal(err)
	}
	stop := started(t, c)
	waitFor(t, w.got, "the dead letter")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.msgs[0]
}

// TestHugeHandlerErrorDoesNotStallThePartition: the dead letter carries the
// handler's error text in a header. A handler whose error quotes a large
// message makes the dead letter about twice the message's size, beyond
// what the writer sends (kafka.MessageTooLargeError): it is written with
// the error text cut — the message whole — not retried forever while the
// partition stalls behind it, and the partition is committed past it.
func TestHugeHandlerErrorDoesNotStallThePartition(t *testing.T) {
	k := newKafka(t)
	topic, dlq, group := name(t, "topic"), name(t, "dlq"), name(t, "group")
	k.createTopic(t, topic, 1)
	k.createTopic(t, dlq, 1)
	big := bytes.Repeat([]byte("x"), 700<<10)
	k.produce(t, topic, 1, []kafka.Message{{Key: []byte("big"), Value: big, Headers: []kafka.Header{{Key: "trace", Value: []byte("t0")}}}, {Value: []byte("next")}})
	next := make(chan struct{})
	var once sync.Once
	var logs logbuf.Buffer
	errText := ""
	c, err := consumer.New(consumer.Config{Brokers: k.brokers, Topic: topic, GroupID: group, DeadLetterTopic: dlq, MaxAttempts: 1,
		RetryBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, DrainTimeout: time.Second},
		newLimiter(t, 1000, time.Second), func(_ context.Context, m kafka.Message) error {
			if string(m.Value) == "next" {
				once.Do(func() { close(next) })
				return nil
			}
			err := fmt.Errorf("provider refused %q", m.Value)
			errText = err.Error()
			return err
		}, consumer.WithReaderConfig(fastGroup), consumer.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		t.Fatal(err)
	}
	stop := started(t, c)
	select {
	case <-next:
	case <-time.After(15 * time.Second): // a guard, not a measurement
		stop()
		t.Fatalf("the partition stalled behind a dead letter too large for the broker: after 15s Stats %+v; log: %.600s", c.Stats(), logs.String())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.DeadLettered != 1 || st.DeadLettersTrimmed != 1 || st.Handled != 1 {
		t.Errorf("Stats %+v: want 1 dead-lettered (trimmed) and 1 handled", st)
	}
	dl := k.readAll(t, dlq, 1)[0]
	h := headerMap(dl)
	if !bytes.Equal(dl.Value, big) || string(dl.Key) != "big" || h["trace"] != "t0" {
		t.Errorf("dead letter key %q, %d bytes of value, headers %.200q: want the message whole", dl.Key, len(dl.Value), h)
	}
	if e := h[consumer.HeaderError]; len(e) > 4<<10 || !strings.HasPrefix(errText, e) || !strings.HasPrefix(e, `provider refused "xxx`) {
		t.Errorf("error header of %d bytes %.60q...: want the start of the error text, at most 4 KiB", len(e), e)
	}
	if h[consumer.HeaderErrorTruncated] != strconv.Itoa(len(errText)) || h[consumer.HeaderValueDropped] != "" {
		t.Errorf("headers %s=%q %s=%q: want the error text's length, and the value kept", consumer.HeaderErrorTruncated,
			h[consumer.HeaderErrorTruncated], consumer.HeaderValueDropped, h[consumer.HeaderValueDropped])
	}
	if h[consumer.HeaderTopic] != topic || h[consumer.HeaderPartition] != "0" || h[consumer.HeaderOffset] != "0" {
		t.Errorf("dead letter does not say where the message is: %s", h.where())
	}
	if !strings.Contains(logs.String(), "dead letter too large for the broker; writing a smaller one") {
		t.Errorf("no log line says the dead letter was written smaller:\n%.600s", logs.String())
	}
	if off := k.committed(t, group, topic, 1)[0]; off != 2 {
		t.Errorf("committed offset %d, want 2: both messages are done", off)
	}
}

// TestDeadLetterTooLargeForItsTopic: the dead-letter topic takes smaller
// messages (max.message.bytes) than the topic read. A dead letter the
// broker refuses (kafka.MessageSizeTooLarge, inside kafka.WriteErrors) is
// written without its value, and if that is not enough without its key
// and headers too, each left out part named with its size; the topic,
// partition and offset it names find the original, whole. Nothing stalls,
// every message is committed.
func TestDeadLetterTooLargeForItsTopic(t *testing.T) {
	k := newKafka(t)
	topic, dlq, group := name(t, "topic"), name(t, "dlq"), name(t, "group")
	k.createTopic(t, topic, 1)
	limit := "65536"
	res, err := k.client.CreateTopics(t.Context(), &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: dlq, NumPartitions: 1,
		ReplicationFactor: 1, ConfigEntries: []kafka.ConfigEntry{{ConfigName: "max.message.bytes", ConfigValue: limit}}}}})
	if err != nil || res.Errors[dlq] != nil {
		t.Fatalf("creating %s: %v %v", dlq, err, res.Errors[dlq])
	}
	msgs := []kafka.Message{
		// Too large by its value.
		{Key: []byte("k0"), Value: bytes.Repeat([]byte("v"), 200<<10), Headers: []kafka.Header{{Key: "trace", Value: []byte("t0")}}},
		// Too large by its headers.
		{Key: []byte("k1"), Value: []byte("small"), Headers: []kafka.Header{{Key: "trace", Value: []byte("t1")}, {Key: "big", Value: bytes.Repeat([]byte("h"), 100<<10)}}},
		// Small enough.
		{Key: []byte("k2"), Value: []byte("fine"), Headers: []kafka.Header{{Key: "trace", Value: []byte("t2")}}},
	}
	k.produce(t, topic, 1, msgs)
	c, err := consumer.New(consumer.Config{Brokers: k.brokers, Topic: topic, GroupID: group, DeadLetterTopic: dlq, MaxAttempts: 1,
		RetryBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond},
		newLimiter(t, 1000, time.Second), func(context.Context, kafka.Message) error {
			return errors.New("refused")
		}, consumer.WithReaderConfig(fastGroup))
	if err != nil {
		t.Fatal(err)
	}
	stop := started(t, c)
	got := k.readAll(t, dlq, len(msgs)) // fails after 60s if any stalls
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.DeadLettered != 3 || st.DeadLettersTrimmed != 2 {
		t.Errorf("Stats %+v: want 3 dead-lettered, 2 of them trimmed", st)
	}
	wants := []struct {
		key, value string
		headers    map[string]string // besides where the message is
	}{
		{"k0", "", map[string]string{"trace": "t0", consumer.HeaderValueDropped: strconv.Itoa(200 << 10)}},
		{"", "", map[string]string{consumer.HeaderValueDropped: "5", consumer.HeaderKeyDropped: "2", consumer.HeaderHeadersDropped: "2"}},
		{"k2", "fine", map[string]string{"trace": "t2"}},
	}
	for i, dl := range got {
		h := headerMap(dl)
		w := wants[i]
		if string(dl.Key) != w.key || string(dl.Value) != w.value {
			t.Errorf("dead letter %d: key %q value %.20q, want %q %q", i, dl.Key, dl.Value, w.key, w.value)
		}
		w.headers[consumer.HeaderError] = "refused"
		w.headers[consumer.HeaderAttempts] = "1"
		w.headers[consumer.HeaderTopic] = topic
		w.headers[consumer.HeaderPartition] = "0"
		w.headers[consumer.HeaderOffset] = strconv.Itoa(i)
		if len(h) != len(w.headers) {
			t.Errorf("dead letter %d: headers %.300q, want %q", i, h, w.headers)
		}
		for k, v := range w.headers {
			if h[k] != v {
				t.Errorf("dead letter %d: header %s=%.40q, want %q", i, k, h[k], v)
			}
		}
	}
	// What the dead letters name is the original, whole.
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: k.brokers, Topic: topic, Partition: 0, MaxWait: 50 * time.Millisecond})
	defer r.Close()
	for i, dl := range got[:2] {
		off, _ := strconv.ParseInt(headerMap(dl)[consumer.HeaderOffset], 10, 64)
		if err := r.SetOffset(off); err != nil {
			t.Fatal(err)
		}
		m, err := r.ReadMessage(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(m.Key, msgs[i].Key) || !bytes.Equal(m.Value, msgs[i].Value) || len(m.Headers) != len(msgs[i].Headers) {
			t.Errorf("offset %d re-read: key %q, %d bytes of value, %d headers: not message %d", off, m.Key, len(m.Value), len(m.Headers), i)
		}
	}
	if off := k.committed(t, group, topic, 1)[0]; off != 3 {
		t.Errorf("committed offset %d, want 3", off)
	}
}

// refusingWriter refuses every dead letter as too large, as a broker whose
// limit is below even the consumer's headers would, and keeps the sizes it
// was offered.
type refusingWriter struct {
	mu    sync.Mutex
	sizes []int
}

func (w *refusingWriter) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range msgs {
		n := len(m.Key) + len(m.Value)
		for _, h := range m.Headers {
			n += len(h.Key) + len(h.Value)
		}
		w.sizes = append(w.sizes, n)
	}
	return kafka.WriteErrors{kafka.MessageSizeTooLarge}
}

func (w *refusingWriter) offered() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]int(nil), w.sizes...)
}

// TestDeadLetterNeverWrittenIsNeverCommitted: when no dead letter fits,
// even the smallest (the consumer's headers alone), the message is not
// done: the partition is not committed past it, though the message after
// it was handled; the consumer keeps trying (with backoff) and abandons
// it, uncommitted, at shutdown.
func TestDeadLetterNeverWrittenIsNeverCommitted(t *testing.T) {
	k := newKafka(t)
	topic, group := name(t, "topic"), name(t, "group")
	k.createTopic(t, topic, 1)
	k.produce(t, topic, 1, []kafka.Message{
		{Key: bytes.Repeat([]byte("k"), 100), Value: bytes.Repeat([]byte("v"), 1000), Headers: []kafka.Header{{Key: "trace", Value: bytes.Repeat([]byte("t"), 200)}}},
		{Value: []byte("next")},
	})
	w := &refusingWriter{}
	next := make(chan struct{})
	c, err := consumer.New(consumer.Config{Brokers: k.brokers, Topic: topic, GroupID: group, DeadLetterTopic: topic + ".dlq", MaxAttempts: 1,
		Workers: 2, Ordering: consumer.OrderNone, RetryBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, DrainTimeout: 200 * time.Millisecond},
		newLimiter(t, 1000, time.Second), func(_ context.Context, m kafka.Message) error {
			if string(m.Value) == "next" {
				close(next)
				return nil
			}
			return errors.New(strings.Repeat("e", 5000))
		}, consumer.WithReaderConfig(fastGroup), consumer.WithDeadLetterWriter(w))
	if err != nil {
		t.Fatal(err)
	}
	stop := started(t, c)
	waitFor(t, next, "the message after the one that cannot be dead-lettered")
	deadline := time.Now().Add(10 * time.Second) // a guard, not a measurement
	for len(w.offered()) < 6 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	sizes := w.offered()
	// Whole, error text cut, value left out, key and headers left out;
	// then the smallest again, with backoff.
	if len(sizes) < 6 || !(sizes[0] > sizes[1] && sizes[1] > sizes[2] && sizes[2] > sizes[3]) || sizes[4] != sizes[3] || sizes[5] != sizes[3] {
		t.Errorf("dead letter sizes offered %v: want each step smaller, then the smallest again", sizes)
	}
	if st := c.Stats(); st.DeadLettered != 0 || st.DeadLettersTrimmed != 0 || st.Handled != 1 || st.Abandoned != 1 {
		t.Errorf("Stats %+v: want nothing dead-lettered, 1 handled, 1 abandoned", st)
	}
	if off := k.committed(t, group, topic, 1)[0]; off >= 0 {
		t.Errorf("committed offset %d: committed past a message whose dead letter was never written", off)
	}
}

// headers maps a message's header names to their last value.
type headers map[string]string

func headerMap(m kafka.Message) headers {
	h := headers{}
	for _, x := range m.Headers {
		h[x.Key] = string(x.Value)
	}
	return h
}

// where says what h says of where the original message is.
func (h headers) where() string {
	return fmt.Sprintf("topic %q partition %q offset %q", h[consumer.HeaderTopic], h[consumer.HeaderPartition], h[consumer.HeaderOffset])
}
