package consumer

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"testing"

	"github.com/segmentio/kafka-go"
)

// sink is a MessageWriter that keeps what it is given.
type sink struct{ msgs []kafka.Message }

func (s *sink) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	s.msgs = append(s.msgs, msgs...)
	return nil
}

// headersOf splits b into headers: each a key and a value, both ended by
// a 0xff byte (so keys and values may be empty and hold any other byte).
func headersOf(b []byte) []kafka.Header {
	parts := bytes.Split(b, []byte{0xff})
	var hs []kafka.Header
	for i := 0; i+1 < len(parts); i += 2 {
		var v []byte
		if len(parts[i+1]) > 0 {
			v = parts[i+1]
		}
		hs = append(hs, kafka.Header{Key: string(parts[i]), Value: v})
	}
	return hs
}

// FuzzDeadLetter builds the dead letter of a message with arbitrary key,
// value, headers, topic, partition, offset and handler error, and picks
// its worker lane under every ordering. No panic; the dead letter goes to
// the dead-letter topic with the message's key, value and headers in
// order, byte for byte, followed by exactly the consumer's five headers
// saying the error, attempts, topic, partition and offset; the lane is in
// range.
func FuzzDeadLetter(f *testing.F) {
	f.Add([]byte("k"), []byte("v"), []byte("trace\xfft1\xff"), "boom", "orders", int32(0), int64(42), uint8(3))
	f.Add([]byte{}, []byte{}, []byte("\xff\xff\xff\xff"), "", "t", int32(-1), int64(-2), uint8(1))
	f.Add([]byte(nil), []byte{0, 1, 2}, []byte("dup\xff1\xffdup\xff2\xff"), "multi\nline\x00error", "a.b-c_d", int32(1<<30), int64(1<<62), uint8(255))
	f.Add([]byte("k"), []byte("v"), []byte(HeaderError+"\xffspoofed\xff"+HeaderOffset+"\xff-1\xff"), "\xff\xfe", "x", int32(7), int64(0), uint8(0))
	f.Fuzz(func(t *testing.T, key, value, hdrs []byte, errText, topic string, partition int32, offset int64, attempts uint8) {
		w := &sink{}
		c := &Consumer{cfg: Config{DeadLetterTopic: "dead"}, dlq: w, log: slog.New(slog.DiscardHandler)}
		c.col = newCollector(&c.count, "t", "g")
		msg := kafka.Message{Topic: topic, Partition: int(partition), Offset: offset, Key: key, Value: value, Headers: headersOf(hdrs)}
		orig := append([]kafka.Header(nil), msg.Headers...)
		out, err := c.deadLetter(t.Context(), msg, errors.New(errText), int(attempts))
		if out != outDone || err != nil || len(w.msgs) != 1 {
			t.Fatalf("deadLetter: %v, %v, %d written", out, err, len(w.msgs))
		}
		dl := w.msgs[0]
		if dl.Topic != "dead" || !bytes.Equal(dl.Key, key) || !bytes.Equal(dl.Value, value) {
			t.Fatalf("dead letter topic %q key %q value %q", dl.Topic, dl.Key, dl.Value)
		}
		if len(dl.Headers) != len(orig)+5 {
			t.Fatalf("%d headers, want %d + 5", len(dl.Headers), len(orig))
		}
		for i, h := range orig {
			if g := dl.Headers[i]; g.Key != h.Key || !bytes.Equal(g.Value, h.Value) {
				t.Fatalf("header %d: %q=%q, want %q=%q", i, g.Key, g.Value, h.Key, h.Value)
			}
		}
		want := []kafka.Header{
			{Key: HeaderError, Value: []byte(errText)},
			{Key: HeaderAttempts, Value: []byte(strconv.Itoa(int(attempts)))},
			{Key: HeaderTopic, Value: []byte(topic)},
			{Key: HeaderPartition, Value: []byte(strconv.Itoa(int(partition)))},
			{Key: HeaderOffset, Value: []byte(strconv.FormatInt(offset, 10))},
		}
		for i, h := range want {
			if g := dl.Headers[len(orig)+i]; g.Key != h.Key || !bytes.Equal(g.Value, h.Value) {
				t.Fatalf("consumer header %d: %q=%q, want %q=%q", i, g.Key, g.Value, h.Key, h.Value)
			}
		}
		// The message handed on is not changed under the caller.
		for i, h := range msg.Headers {
			if h.Key != orig[i].Key || !bytes.Equal(h.Value, orig[i].Value) {
				t.Fatalf("the message's header %d changed", i)
			}
		}
		for _, o := range []Ordering{OrderPartition, OrderKey, OrderNone} {
			c.cfg.Ordering = o
			for _, n := range []int{1, 2, 7, 64} {
				if l := c.lane(msg, n); l < 0 || l >= n {
					t.Fatalf("lane %d of %d", l, n)
				}
			}
		}
	})
}
