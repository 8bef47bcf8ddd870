// Package ntptest provides an SNTP responder for tests: a UDP server on
// 127.0.0.1 that answers NTPv3/v4 client queries with a clock offset the
// test chooses, and that can be switched at run time to drop requests or to
// answer with malformed replies.
//
// Its answers pass github.com/beevik/ntp's Response.Validate: the responder
// echoes each request's transmit timestamp as the reply's origin timestamp
// (beevik/ntp sends a random value there and rejects replies that do not
// carry it back), reports stratum 1, a reference time one second old, and a
// small root delay and dispersion that SetRootDistance can change.
//
// Usage:
//
//	srv, err := ntptest.Start()
//	if err != nil { t.Fatal(err) }
//	defer srv.Close()
//	srv.SetOffset(150 * time.Millisecond) // the server's clock runs 150 ms ahead
//	resp, err := ntp.QueryWithOptions(srv.Addr(), ntp.QueryOptions{Timeout: time.Second})
//	// resp.ClockOffset ≈ 150 ms
//
// The server time is the local system clock (time.Now) plus the offset.
package ntptest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode selects how the responder treats requests.
type Mode int32

const (
	// Answer replies with a valid SNTP response (the default).
	Answer Mode = iota
	// Silent reads requests and drops them, like an unreachable server.
	Silent
	// Garbage replies with a malformed or invalid response, cycling through
	// GarbageKinds different defects (too short, wrong mode, wrong origin,
	// zero transmit time, receive after transmit, kiss of death, leap
	// "not in sync", dispersion over 16 s, stratum 16, transmit before the
	// reference time, precision byte −128), one per request, starting from
	// the first. The last one makes beevik/ntp v1.6.0 panic inside
	// QueryWithOptions (a negative shift in its toInterval): clients must
	// recover from it.
	Garbage
)

// GarbageKinds is the number of distinct malformed replies Garbage mode
// cycles through; GarbageKinds consecutive queries see each one once.
const GarbageKinds = 11

// String returns the mode's name.
func (m Mode) String() string {
	switch m {
	case Answer:
		return "answer"
	case Silent:
		return "silent"
	case Garbage:
		return "garbage"
	}
	return fmt.Sprintf("Mode(%d)", int32(m))
}

// Server is a running SNTP responder. Its methods are safe for concurrent
// use; settings take effect from the next request.
type Server struct {
	conn *net.UDPConn

	offset     atomic.Int64 // time.Duration
	mode       atomic.Int32 // Mode
	rootDelay  atomic.Int64 // time.Duration
	rootDisp   atomic.Int64 // time.Duration
	requests   atomic.Int64
	garbageSeq atomic.Int64
	replyFunc  atomic.Pointer[func(req []byte) []byte]

	done      chan struct{} // closed when the serving goroutine has exited
	closeOnce sync.Once
	closeErr  error
}

// Start starts a responder on 127.0.0.1 on a free UDP port, answering with
// offset 0, root delay 0 and root dispersion 1 ms. The serving goroutine runs
// until Close.
func Start() (*Server, error) {
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, fmt.Errorf("ntptest: listen on 127.0.0.1: %w", err)
	}
	s := &Server{conn: conn, done: make(chan struct{})}
	s.rootDisp.Store(int64(time.Millisecond))
	go s.serve()
	return s, nil
}

// Addr returns the server's address, "127.0.0.1:PORT", ready for
// ntp.QueryWithOptions.
func (s *Server) Addr() string { return s.conn.LocalAddr().String() }

// SetOffset sets how far the server's clock is ahead of the local system
// clock (negative: behind). A client on this machine then measures a clock
// offset of about d.
func (s *Server) SetOffset(d time.Duration) { s.offset.Store(int64(d)) }

// Offset returns the offset set by SetOffset.
func (s *Server) Offset() time.Duration { return time.Duration(s.offset.Load()) }

// SetMode switches between answering, staying silent and answering garbage.
func (s *Server) SetMode(m Mode) { s.mode.Store(int32(m)) }

// SetRootDistance sets the root delay and root dispersion the server
// reports (both ≥ 0, at most about 18 h, the wire format's limit). A client
// computes its root distance as (RTT + rootDelay)/2 + rootDispersion.
func (s *Server) SetRootDistance(rootDelay, rootDispersion time.Duration) {
	s.rootDelay.Store(int64(rootDelay))
	s.rootDisp.Store(int64(rootDispersion))
}

// SetReplyFunc makes the server answer every request with f(request)
// instead of following its mode; an empty or nil result sends nothing. A
// nil f restores the mode. For fuzzing clients with arbitrary bytes.
func (s *Server) SetReplyFunc(f func(req []byte) []byte) {
	if f == nil {
		s.replyFunc.Store(nil)
		return
	}
	s.replyFunc.Store(&f)
}

// Requests returns how many datagrams the server has received, answered or
// not.
func (s *Server) Requests() int64 { return s.requests.Load() }

// Close stops the server and waits for its goroutine to exit. It is safe to
// call more than once; later calls return the first call's result.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = s.conn.Close()
		<-s.done
	})
	return s.closeErr
}

func (s *Server) serve() {
	defer close(s.done)
	buf := make([]byte, 2048)
	for {
		n, addr, err := s.conn.ReadFromUDP(buf)
		recv := time.Now()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // e.g. an ICMP error from an earlier reply; keep serving
		}
		s.requests.Add(1)
		reply := s.reply(buf[:n], recv)
		if len(reply) > 0 {
			_, _ = s.conn.WriteToUDP(reply, addr) // best effort, like UDP
		}
	}
}

// reply computes the answer to req received at recv, or nil for none.
func (s *Server) reply(req []byte, recv time.Time) []byte {
	if f := s.replyFunc.Load(); f != nil {
		return (*f)(req)
	}
	p := params{
		offset:    time.Duration(s.offset.Load()),
		recv:      recv,
		rootDelay: time.Duration(s.rootDelay.Load()),
		rootDisp:  time.Duration(s.rootDisp.Load()),
		now:       time.Now,
	}
	switch Mode(s.mode.Load()) {
	case Silent:
		return nil
	case Garbage:
		kind := int((s.garbageSeq.Add(1) - 1) % GarbageKinds)
		return garbage(req, p, kind)
	default:
		out, err := respond(req, p)
		if err != nil {
			return nil // not an NTP client request: a real server ignores it
		}
		return out
	}
}

// params are the inputs of one reply.
type params struct {
	offset              time.Duration
	recv                time.Time // local receive time
	rootDelay, rootDisp time.Duration
	now                 func() time.Time // local transmit time
}

const (
	packetSize = 48
	modeClient = 3
	modeServer = 4
)

// errNotRequest is returned by respond for datagrams that are not NTP
// client requests.
var errNotRequest = errors.New("ntptest: not an NTP client request")

// respond builds a valid server reply to the client request req. It never
// panics; it returns errNotRequest for anything that is not a 48-byte (or
// longer) mode-3 NTPv3/v4 request.
func respond(req []byte, p params) ([]byte, error) {
	if len(req) < packetSize {
		return nil, fmt.Errorf("%w: %d bytes, want at least %d", errNotRequest, len(req), packetSize)
	}
	version := (req[0] >> 3) & 7
	if mode := req[0] & 7; mode != modeClient {
		return nil, fmt.Errorf("%w: mode %d, want %d (client)", errNotRequest, mode, modeClient)
	}
	if version != 3 && version != 4 {
		return nil, fmt.Errorf("%w: version %d, want 3 or 4", errNotRequest, version)
	}
	out := make([]byte, packetSize)
	out[0] = 0<<6 | version<<3 | modeServer // leap: no warning
	out[1] = 1                              // stratum 1: primary reference
	out[2] = req[2]                         // poll: echo the client's
	out[3] = 0xec                           // precision: 2^-20 s ≈ 1 µs
	binary.BigEndian.PutUint32(out[4:], shortTime(p.rootDelay))
	binary.BigEndian.PutUint32(out[8:], shortTime(p.rootDisp))
	copy(out[12:16], "TEST") // reference id
	recv := p.recv.Add(p.offset)
	binary.BigEndian.PutUint64(out[16:], longTime(recv.Add(-time.Second))) // reference time
	copy(out[24:32], req[40:48])                                           // origin = request's transmit
	binary.BigEndian.PutUint64(out[32:], longTime(recv))
	binary.BigEndian.PutUint64(out[40:], longTime(p.now().Add(p.offset)))
	return out, nil
}

// garbage returns malformed reply number kind (0 ≤ kind < GarbageKinds) to
// req. Each has one defect that beevik/ntp detects, in QueryWithOptions or
// in Response.Validate.
func garbage(req []byte, p params, kind int) []byte {
	if len(req) < packetSize {
		req = append(make([]byte, 0, packetSize), req...)
		req = req[:packetSize]
		req[0] = 4<<3 | modeClient
	}
	req = append([]byte(nil), req...)
	req[0] = req[0]&^7 | modeClient
	if v := (req[0] >> 3) & 7; v != 3 && v != 4 {
		req[0] = req[0]&^(7<<3) | 4<<3
	}
	good, _ := respond(req, p) // cannot fail: req was made a valid request
	switch kind {
	case 0: // too short
		return good[:10]
	case 1: // all zero: mode 0
		return make([]byte, packetSize)
	case 2: // origin does not match the request
		good[24] ^= 0xff
	case 3: // transmit time zero
		clear(good[40:48])
	case 4: // receive after transmit: server ticked backwards
		binary.BigEndian.PutUint64(good[32:], binary.BigEndian.Uint64(good[40:])+1<<32)
	case 5: // kiss of death: stratum 0, code RATE
		good[1] = 0
		copy(good[12:16], "RATE")
	case 6: // leap indicator 3: clock not synchronized
		good[0] |= 3 << 6
	case 7: // root dispersion above 16 s
		binary.BigEndian.PutUint32(good[8:], shortTime(20*time.Second))
	case 8: // stratum 16: unsynchronized
		good[1] = 16
	case 9: // transmit time before the reference time
		binary.BigEndian.PutUint64(good[16:], binary.BigEndian.Uint64(good[40:])+10<<32)
	case 10: // precision 2^-128 s: beevik/ntp v1.6.0 panics decoding it
		good[3] = 0x80
	}
	return good
}

// ntpEpochOffset is the number of seconds from 1900-01-01 (NTP era 0) to
// 1970-01-01 (Unix epoch).
const ntpEpochOffset = 2208988800

// longTime converts t to a 64-bit NTP timestamp (era 0: until 2036).
func longTime(t time.Time) uint64 {
	sec := uint64(t.Unix() + ntpEpochOffset)
	frac := (uint64(t.Nanosecond())<<32 + 5e8) / 1e9
	return sec<<32 + frac
}

// shortTime converts d ≥ 0 to a 32-bit NTP short format (16.16 seconds),
// saturating at its maximum.
func shortTime(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	sec := uint64(d / time.Second)
	if sec > 0xffff {
		return 0xffffffff
	}
	frac := (uint64(d%time.Second)<<16 + 5e8) / 1e9 // ≤ 1<<16
	return uint32(min(sec<<16+frac, 0xffffffff))
}
