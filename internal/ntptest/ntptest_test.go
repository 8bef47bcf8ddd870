package ntptest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/beevik/ntp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t *testing.T) *Server {
	t.Helper()
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// query asks s, turning a panic of beevik/ntp into an error.
func query(s *Server, timeout time.Duration) (r *ntp.Response, err error) {
	defer func() {
		if p := recover(); p != nil {
			r, err = nil, fmt.Errorf("beevik/ntp panicked: %v", p)
		}
	}()
	return ntp.QueryWithOptions(s.Addr(), ntp.QueryOptions{Timeout: timeout})
}

// TestAnswer checks that replies pass beevik/ntp's validation and carry the
// chosen offset, also when it changes while the server runs.
func TestAnswer(t *testing.T) {
	s := start(t)
	for _, offset := range []time.Duration{0, 150 * time.Millisecond, -2 * time.Second, time.Hour, -37 * time.Microsecond} {
		s.SetOffset(offset)
		r, err := query(s, time.Second)
		if err != nil {
			t.Fatalf("offset %v: query: %v", offset, err)
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("offset %v: Validate: %v", offset, err)
		}
		// An exchange measures the offset within half its round trip,
		// whatever the load on the machine (a fixed 1 ms failed under it).
		if d, bound := (r.ClockOffset - offset).Abs(), r.RTT/2+time.Microsecond; d > bound {
			t.Errorf("offset %v: measured %v, off by %v, more than half the round trip %v", offset, r.ClockOffset, d, r.RTT)
		}
		if r.Stratum != 1 || r.Version != 4 {
			t.Errorf("stratum %d version %d, want 1 and 4", r.Stratum, r.Version)
		}
	}
	if got := s.Offset(); got != -37*time.Microsecond {
		t.Errorf("Offset() = %v", got)
	}
}

func TestRootDistance(t *testing.T) {
	s := start(t)
	s.SetRootDistance(40*time.Millisecond, 5*time.Millisecond)
	r, err := query(s, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d := (r.RootDelay - 40*time.Millisecond).Abs(); d > 20*time.Microsecond {
		t.Errorf("root delay %v, want 40ms", r.RootDelay)
	}
	if d := (r.RootDispersion - 5*time.Millisecond).Abs(); d > 20*time.Microsecond {
		t.Errorf("root dispersion %v, want 5ms", r.RootDispersion)
	}
	if r.RootDistance < 25*time.Millisecond {
		t.Errorf("root distance %v, want ≥ 25ms", r.RootDistance)
	}
}

func TestSilent(t *testing.T) {
	s := start(t)
	s.SetMode(Silent)
	_, err := query(s, 50*time.Millisecond)
	var ne interface{ Timeout() bool }
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("query of a silent server: err = %v, want a timeout", err)
	}
	if n := s.Requests(); n != 1 {
		t.Errorf("Requests() = %d, want 1", n)
	}
	s.SetMode(Answer)
	if _, err := query(s, time.Second); err != nil {
		t.Fatalf("after SetMode(Answer): %v", err)
	}
}

// TestGarbage checks that every kind of garbage is rejected by beevik/ntp,
// either when parsing or in Validate.
func TestGarbage(t *testing.T) {
	s := start(t)
	s.SetMode(Garbage)
	for kind := range GarbageKinds {
		r, err := query(s, time.Second)
		if err == nil {
			err = r.Validate()
		}
		if err == nil {
			t.Errorf("garbage kind %d was accepted", kind)
		}
		var ne interface{ Timeout() bool }
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("garbage kind %d: timeout, want a reply that is rejected", kind)
		}
	}
}

func TestReplyFunc(t *testing.T) {
	s := start(t)
	s.SetReplyFunc(func(req []byte) []byte { return []byte("hello") })
	if _, err := query(s, time.Second); err == nil {
		t.Error("a 5-byte reply was accepted")
	}
	s.SetReplyFunc(nil)
	if _, err := query(s, time.Second); err != nil {
		t.Errorf("after SetReplyFunc(nil): %v", err)
	}
}

func TestCloseTwice(t *testing.T) {
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestTimeFormats(t *testing.T) {
	unix := time.Date(1970, 1, 1, 0, 0, 0, 500_000_000, time.UTC)
	if got, want := longTime(unix), uint64(ntpEpochOffset)<<32|1<<31; got != want {
		t.Errorf("longTime(1970 + 0.5 s) = %#x, want %#x", got, want)
	}
	tests := []struct {
		d    time.Duration
		want uint32
	}{
		{0, 0}, {-time.Second, 0}, {time.Second, 1 << 16}, {1500 * time.Millisecond, 3 << 15},
		{100 * time.Hour, 0xffffffff}, {time.Duration(1<<63 - 1), 0xffffffff},
	}
	for _, tt := range tests {
		if got := shortTime(tt.d); got != tt.want {
			t.Errorf("shortTime(%v) = %#x, want %#x", tt.d, got, tt.want)
		}
	}
}

// FuzzRespond feeds arbitrary datagrams to the reply builder: it must never
// panic, must reject what is not a client request, and must echo the
// request's transmit timestamp as origin in what it answers.
func FuzzRespond(f *testing.F) {
	req := make([]byte, packetSize)
	req[0] = 4<<3 | modeClient
	binary.BigEndian.PutUint64(req[40:], 0x0123456789abcdef)
	f.Add(req, 0)
	f.Add([]byte{0x23}, 3)
	f.Add(make([]byte, 100), 9)
	f.Fuzz(func(t *testing.T, data []byte, kind int) {
		p := params{offset: time.Second, recv: time.Now(), now: time.Now}
		out, err := respond(data, p)
		if err != nil {
			if !errors.Is(err, errNotRequest) {
				t.Fatalf("respond: %v, want errNotRequest", err)
			}
		} else {
			if len(out) != packetSize || out[0]&7 != modeServer {
				t.Fatalf("reply %x: want %d bytes in server mode", out, packetSize)
			}
			if !bytes.Equal(out[24:32], data[40:48]) {
				t.Fatalf("origin %x, request transmit %x", out[24:32], data[40:48])
			}
		}
		if kind < 0 {
			kind = -(kind + 1)
		}
		_ = garbage(data, p, kind%GarbageKinds)
	})
}
