package consumer

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/limiter"
)

// sink is a MessageWriter that keeps what it is given. With a limit, it
// refuses a dead letter larger than that (key, value and headers) as a
// broker would (kafka.MessageSizeTooLarge in kafka.WriteErrors), and
// cancels the round when offered the same size twice: the consumer has
// nothing left to leave out.
type sink struct {
	msgs    []kafka.Message // every letter offered
	limit   int             // 0: none
	written bool
	cancel  context.CancelFunc
}

func (s *sink) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	for _, m := range msgs {
		if s.limit > 0 && dlSize(m) > s.limit {
			if n := len(s.msgs); n > 0 && dlSize(s.msgs[n-1]) == dlSize(m) {
				s.cancel()
			}
			s.msgs = append(s.msgs, m)
			return kafka.WriteErrors{kafka.MessageSizeTooLarge}
		}
		s.msgs = append(s.msgs, m)
	}
	s.written = true
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

// reserved reports whether an original header named k is renamed in a
// dead letter: its name, past any "original-", starts with "sluice-", in
// any case.
func reserved(k string) bool {
	for len(k) >= 9 && strings.EqualFold(k[:9], "original-") {
		k = k[9:]
	}
	return len(k) >= 7 && strings.EqualFold(k[:7], "sluice-")
}

// FuzzDeadLetter builds the dead letter of a message with arbitrary key,
// value, headers, topic, partition, offset and handler error, written to a
// sink that refuses letters above limit bytes (0: none), and picks its
// worker lane under every ordering. No panic; with no limit the one dead
// letter goes to the dead-letter topic with the message's key, value and
// headers in order, byte for byte (those named like the consumer's renamed
// "original-..."), followed by exactly the consumer's five headers saying
// the error, attempts, topic, partition and offset. With a limit, every
// letter offered is smaller than the one before until one fits (it is
// then written and the message is done) or nothing more can be left out;
// each says where the message is, and what it left out (error text cut,
// value, key, headers) with the sizes; what it keeps is the message's. In
// every letter each header name starting with "sluice-" (any case)
// appears once. The lane is in range.
func FuzzDeadLetter(f *testing.F) {
	f.Add([]byte("k"), []byte("v"), []byte("trace\xfft1\xff"), "boom", "orders", int32(0), int64(42), uint8(3), uint16(0))
	f.Add([]byte{}, []byte{}, []byte("\xff\xff\xff\xff"), "", "t", int32(-1), int64(-2), uint8(1), uint16(0))
	f.Add([]byte(nil), []byte{0, 1, 2}, []byte("dup\xff1\xffdup\xff2\xff"), "multi\nline\x00error", "a.b-c_d", int32(1<<30), int64(1<<62), uint8(255), uint16(0))
	f.Add([]byte("k"), []byte("v"), []byte(HeaderError+"\xffspoofed\xff"+HeaderOffset+"\xff-1\xff"), "\xff\xfe", "x", int32(7), int64(0), uint8(0), uint16(0))
	f.Add([]byte("k"), []byte("v"), []byte("original-SLUICE-error\xffold\xffOriginal-original-sluice-x\xffolder\xfforiginal-\xffnot\xff"), "e", "x", int32(7), int64(0), uint8(0), uint16(0))
	f.Add(bytes.Repeat([]byte("k"), 300), bytes.Repeat([]byte("v"), 3000), []byte("trace\xff"+strings.Repeat("t", 500)+"\xff"), strings.Repeat("é", 3000), "orders", int32(2), int64(9), uint8(3), uint16(1000))
	f.Add([]byte("k"), bytes.Repeat([]byte("v"), 3000), []byte("trace\xfft\xff"), "boom", "orders", int32(2), int64(9), uint8(3), uint16(1))
	f.Fuzz(func(t *testing.T, key, value, hdrs []byte, errText, topic string, partition int32, offset int64, attempts uint8, limit uint16) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		w := &sink{limit: int(limit), cancel: cancel}
		c := &Consumer{cfg: Config{DeadLetterTopic: "dead", RetryBackoff: time.Millisecond, MaxBackoff: time.Millisecond}, dlq: w, log: slog.New(slog.DiscardHandler)}
		c.col = newCollector(&c.count, "t", "g")
		msg := kafka.Message{Topic: topic, Partition: int(partition), Offset: offset, Key: key, Value: value, Headers: headersOf(hdrs)}
		orig := append([]kafka.Header(nil), msg.Headers...)
		out, err := c.deadLetter(ctx, msg, errors.New(errText), int(attempts))
		switch {
		case err != nil || len(w.msgs) == 0:
			t.Fatalf("deadLetter: %v, %v, %d offered", out, err, len(w.msgs))
		case w.written && out != outDone, !w.written && out != outAbandoned:
			t.Fatalf("deadLetter: %v, written %v", out, w.written)
		case limit == 0 && len(w.msgs) != 1:
			t.Fatalf("%d letters offered with no limit", len(w.msgs))
		}
		if st := c.Stats(); st.DeadLettered != int64(len(w.msgs[:boolInt(w.written)])) ||
			st.DeadLettersTrimmed != int64(boolInt(w.written && len(w.msgs) > 1)) {
			t.Fatalf("Stats %+v after %d letters, written %v", st, len(w.msgs), w.written)
		}
		for i, dl := range w.msgs {
			// Each smaller than the one before; but the last one not
			// written, which repeats the smallest.
			if repeat := i == len(w.msgs)-1 && !w.written; i > 0 && (dlSize(dl) >= dlSize(w.msgs[i-1]) != repeat || repeat && dlSize(dl) != dlSize(w.msgs[i-1])) {
				t.Fatalf("letter %d of %d bytes after one of %d", i, dlSize(dl), dlSize(w.msgs[i-1]))
			}
			checkLetter(t, dl, msg, orig, errText, int(attempts), limit == 0)
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

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// checkLetter checks one dead letter of msg (orig its headers): see
// FuzzDeadLetter. whole: nothing may be left out.
func checkLetter(t *testing.T, dl, msg kafka.Message, orig []kafka.Header, errText string, attempts int, whole bool) {
	t.Helper()
	if dl.Topic != "dead" {
		t.Fatalf("dead letter to topic %q", dl.Topic)
	}
	own := map[string]string{} // the consumer's headers
	var kept []kafka.Header    // the others, in order
	seen := map[string]bool{}
	for _, h := range dl.Headers {
		if strings.HasPrefix(strings.ToLower(h.Key), HeaderPrefix) {
			if seen[strings.ToLower(h.Key)] {
				t.Fatalf("header %q twice (any case) in %q", h.Key, dl.Headers)
			}
			seen[strings.ToLower(h.Key)] = true
			own[h.Key] = string(h.Value)
		} else {
			kept = append(kept, h)
		}
	}
	want := map[string]string{
		HeaderAttempts:  strconv.Itoa(attempts),
		HeaderTopic:     msg.Topic,
		HeaderPartition: strconv.Itoa(msg.Partition),
		HeaderOffset:    strconv.FormatInt(msg.Offset, 10),
	}
	if n, ok := own[HeaderErrorTruncated]; ok {
		e := own[HeaderError]
		if whole || n != strconv.Itoa(len(errText)) || len(e) > 4096 || len(errText) <= 4096 || !strings.HasPrefix(errText, e) {
			t.Fatalf("error header of %d bytes, %s=%s, for an error text of %d bytes", len(e), HeaderErrorTruncated, n, len(errText))
		}
		want[HeaderErrorTruncated], want[HeaderError] = n, e
	} else {
		want[HeaderError] = errText
	}
	wantValue := msg.Value
	if _, ok := own[HeaderValueDropped]; ok {
		wantValue, want[HeaderValueDropped] = nil, strconv.Itoa(len(msg.Value))
	}
	wantKey := msg.Key
	if _, ok := own[HeaderKeyDropped]; ok {
		wantKey, want[HeaderKeyDropped] = nil, strconv.Itoa(len(msg.Key))
	}
	wantHeaders := orig
	if _, ok := own[HeaderHeadersDropped]; ok {
		wantHeaders, want[HeaderHeadersDropped] = nil, strconv.Itoa(len(orig))
	}
	if whole && len(want) != 5 {
		t.Fatalf("headers %q with no limit: something left out", own)
	}
	if len(own) != len(want) {
		t.Fatalf("consumer headers %q, want %q", own, want)
	}
	for k, v := range want {
		if own[k] != v {
			t.Fatalf("header %s=%q, want %q", k, own[k], v)
		}
	}
	if !bytes.Equal(dl.Key, wantKey) || !bytes.Equal(dl.Value, wantValue) {
		t.Fatalf("dead letter key %q value %q, want %q %q", dl.Key, dl.Value, wantKey, wantValue)
	}
	if len(kept) != len(wantHeaders) {
		t.Fatalf("%d of the message's headers kept, want %d", len(kept), len(wantHeaders))
	}
	for i, h := range wantHeaders {
		k := h.Key
		if reserved(k) {
			k = "original-" + k
		}
		if g := kept[i]; g.Key != k || !bytes.Equal(g.Value, h.Value) {
			t.Fatalf("header %d: %q=%q, want %q=%q", i, g.Key, g.Value, k, h.Value)
		}
	}
	// The consumer's five come after the message's, in their order.
	if n := len(kept); len(dl.Headers) < n+5 || dl.Headers[n].Key != HeaderError || dl.Headers[n+4].Key != HeaderOffset {
		t.Fatalf("headers %q: want the message's, then the consumer's from %s", dl.Headers, HeaderError)
	}
}

// classCapture is a Limiter that keeps the class each acquisition's
// context named.
type classCapture struct {
	name  string
	named bool
}

func (c *classCapture) AcquireN(ctx context.Context, _ int64, _ time.Duration) error {
	c.name, c.named = limiter.ClassOf(ctx)
	return nil
}

func (c *classCapture) Backoff(time.Duration) {}

// FuzzClass takes the permit of a message with arbitrary headers under
// WithClass(ClassHeader("priority")). No panic; the limiter is asked for
// the class the last "priority" header names when that is a class name
// (limiter.ValidClassName), and for none otherwise.
func FuzzClass(f *testing.F) {
	f.Add([]byte("priority\xffcritical\xff"))
	f.Add([]byte("priority\xffbatch\xffpriority\xffcritical\xff"))
	f.Add([]byte("priority\xffcritical\xffpriority\xffNOT VALID\xff"))
	f.Add([]byte("Priority\xffcritical\xff"))
	f.Add([]byte("priority\xff\xff"))
	f.Add([]byte("priority\xff" + strings.Repeat("a", 33) + "\xff"))
	f.Add([]byte("trace\xfft1\xff"))
	f.Fuzz(func(t *testing.T, hdrs []byte) {
		lim := &classCapture{}
		take, err := newPermits(lim, nil, ClassHeader("priority"))
		if err != nil {
			t.Fatal(err)
		}
		msg := kafka.Message{Headers: headersOf(hdrs)}
		if _, err := take(t.Context(), msg, time.Second); err != nil {
			t.Fatal(err)
		}
		want := ""
		for _, h := range msg.Headers {
			if h.Key == "priority" {
				want = string(h.Value)
			}
		}
		if !limiter.ValidClassName(want) {
			want = ""
		}
		if lim.named != (want != "") || lim.name != want {
			t.Fatalf("headers %q: the limiter was asked for class %q (named %v), want %q", msg.Headers, lim.name, lim.named, want)
		}
	})
}
