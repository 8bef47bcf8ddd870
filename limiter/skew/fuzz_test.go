package skew

import (
	"errors"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/ntptest"
)

// FuzzMeasure answers the Monitor's query with arbitrary bytes over real
// UDP (with the request's transmit timestamp echoed as origin when echo is
// set, so that more replies get past the first check). Whatever the bytes, a
// round must not panic, and must either fail with ErrNoAnswer or produce a
// known measurement with a non-negative uncertainty and an offset within the
// sanity bound (DefaultMaxOffset).
func FuzzMeasure(f *testing.F) {
	valid := make([]byte, 48)
	valid[0] = 4<<3 | 4 // version 4, server mode
	valid[1] = 1
	valid[40] = 0xe0 // a transmit time in era 0 (around 2019)
	f.Add(valid, true)
	f.Add([]byte{}, false)
	f.Add(make([]byte, 48), true)
	f.Add(append(valid, make([]byte, 100)...), true)

	srv, err := ntptest.Start()
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { srv.Close() })
	m, err := New(WithServers(srv.Addr()), WithTimeout(2*time.Second))
	if err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, reply []byte, echo bool) {
		reply = append([]byte(nil), reply...)
		if len(reply) == 0 {
			reply = []byte{0} // always answer, so no round waits for the timeout
		}
		srv.SetReplyFunc(func(req []byte) []byte {
			out := append([]byte(nil), reply...)
			if echo && len(out) >= 32 && len(req) >= 48 {
				copy(out[24:32], req[40:48])
			}
			return out
		})
		got, err := m.Measure(t.Context())
		if err != nil {
			if !errors.Is(err, ErrNoAnswer) {
				t.Fatalf("err = %v, want ErrNoAnswer", err)
			}
			return
		}
		if !got.Known || got.Uncertainty < 0 || got.Answers != 1 || got.Offset.Abs() > DefaultMaxOffset {
			t.Fatalf("accepted reply %x gave %+v", reply, got)
		}
	})
}
