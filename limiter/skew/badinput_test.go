package skew

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"
)

// reply builds a valid SNTP reply to req as a server whose clock is ahead
// of ours by ahead, then lets mutate damage it.
func reply(req []byte, ahead time.Duration, mutate func(out []byte) []byte) []byte {
	ntp := func(t time.Time) uint64 {
		sec := uint64(t.Unix() + 2208988800)
		return sec<<32 | uint64(t.Nanosecond())<<32/1e9
	}
	now := time.Now().Add(ahead)
	out := make([]byte, 48)
	out[0] = 4<<3 | 4                               // version 4, server
	out[1] = 2                                      // stratum
	out[3] = 0xec                                   // precision
	binary.BigEndian.PutUint32(out[8:], 1<<16/1000) // root dispersion ≈ 1 ms
	binary.BigEndian.PutUint64(out[16:], ntp(now.Add(-time.Second)))
	if len(req) >= 48 {
		copy(out[24:32], req[40:48])
	}
	binary.BigEndian.PutUint64(out[32:], ntp(now))
	binary.BigEndian.PutUint64(out[40:], ntp(now))
	return mutate(out)
}

// TestGarbageReplyTable adds to ntptest's Garbage kinds (TestGarbage) and
// FuzzMeasure's seeds the defects they do not name: each reply must fail
// the round with ErrNoAnswer (ErrBadResponse when it parsed), naming the
// server, and leave the measurement unknown — or, for the replies that are
// valid however odd, be measured.
func TestGarbageReplyTable(t *testing.T) {
	put32 := func(i int, v uint32) func([]byte) []byte {
		return func(b []byte) []byte { binary.BigEndian.PutUint32(b[i:], v); return b }
	}
	set := func(i int, v byte) func([]byte) []byte { return func(b []byte) []byte { b[i] = v; return b } }
	cases := []struct {
		name   string
		ahead  time.Duration
		mutate func([]byte) []byte
		ok     bool
		bad    bool // must be ErrBadResponse too
	}{
		{"valid", 0, func(b []byte) []byte { return b }, true, false},
		{"poll -128", 0, set(2, 0x80), false, true},
		{"precision +127 (not used in the root distance)", 0, set(3, 0x7f), true, false},
		{"mode 3 (a client's)", 0, set(0, 4<<3|3), false, false},
		{"mode 5 (broadcast)", 0, set(0, 4<<3|5), false, false},
		{"mode 7 (private)", 0, set(0, 4<<3|7), false, false},
		// beevik/ntp does not check the reply's version for v3/v4 queries.
		{"version 0", 0, set(0, 0<<3|4), true, false},
		{"version 7", 0, set(0, 7<<3|4), true, false},
		{"stratum 17", 0, set(1, 17), false, true},
		{"stratum 255", 0, set(1, 255), false, true},
		{"root delay maximal", 0, put32(4, 0xffffffff), false, true},
		{"root dispersion 16s + 1", 0, put32(8, 16<<16+1), false, true},
		{"reference 40h old", 0, func(b []byte) []byte {
			binary.BigEndian.PutUint64(b[16:], binary.BigEndian.Uint64(b[40:])-40*3600<<32)
			return b
		}, false, true},
		// A receive time of 0 reads as the NTP era's start (1900): an
		// offset of decades, with as large a root distance.
		{"receive time zero", 0, func(b []byte) []byte { clear(b[32:40]); return b }, false, true},
		{"origin zero", 0, func(b []byte) []byte { clear(b[24:32]); return b }, false, false},
		{"all 0xff", 0, func(b []byte) []byte {
			for i := range b {
				b[i] = 0xff
			}
			return b
		}, false, false},
		{"47 bytes", 0, func(b []byte) []byte { return b[:47] }, false, false},
		{"one byte", 0, func(b []byte) []byte { return b[:1] }, false, false},
		{"leap second announced", 0, set(0, 1<<6|4<<3|4), true, false},
		{"20-byte MAC appended", 0, func(b []byte) []byte { return append(b, make([]byte, 20)...) }, true, false},
		{"1400 bytes of trailing junk (ignored like extension fields)", 0, func(b []byte) []byte { return append(b, make([]byte, 1400)...) }, true, false},
		// The sanity bound (WithMaxOffset, ±1h by default): beyond it a
		// reply is refused, whatever its precision, and the measurement
		// stays unknown (the instance cuts its share) rather than move
		// every window by years.
		{"server 30 years ahead", 30 * 365 * 24 * time.Hour, func(b []byte) []byte { return b }, false, true},
		{"server 30 years behind", -30 * 365 * 24 * time.Hour, func(b []byte) []byte { return b }, false, true},
		{"server 61 minutes behind", -61 * time.Minute, func(b []byte) []byte { return b }, false, true},
		{"server 59 minutes ahead (within the bound)", 59 * time.Minute, func(b []byte) []byte { return b }, true, false},
	}
	srv := startServer(t, 0)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := newMonitor(t, WithServers(srv.Addr()), WithTimeout(time.Second))
			srv.SetReplyFunc(func(req []byte) []byte { return reply(req, tc.ahead, tc.mutate) })
			got, err := m.Measure(t.Context())
			var problem string
			switch {
			case tc.ok && (err != nil || !got.Known):
				problem = "refused a valid reply: " + errString(err)
			case tc.ok:
			case err == nil:
				problem = "accepted: " + got.Offset.String() + " ± " + got.Uncertainty.String()
			case !errors.Is(err, ErrNoAnswer) || !strings.Contains(err.Error(), srv.Addr()):
				problem = "error does not wrap ErrNoAnswer or name the server: " + err.Error()
			case tc.bad && !errors.Is(err, ErrBadResponse):
				problem = "error does not wrap ErrBadResponse: " + err.Error()
			case tc.ahead.Abs() > DefaultMaxOffset && !strings.Contains(err.Error(), "beyond the sanity bound ±1h0m0s"):
				problem = "error does not name the sanity bound: " + err.Error()
			case got.Known:
				problem = "measurement known after a refused reply"
			}
			if problem != "" {
				t.Error(problem)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
