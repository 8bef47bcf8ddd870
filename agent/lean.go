package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The HTTP/1.1 connections of the API are served by a lean loop: one
// goroutine per connection reads a request, answers it and reads the
// next, with no goroutine, timer or deadline per request unless the
// request must wait. net/http spends more than the agent's own work on
// each small request (header maps, a background read per request, its
// response buffering). The loop answers only what it fully understands:
// the five POST operations of HTTP/1.1 with a Content-Length body that
// fits its buffer. Anything else — status, metrics, another method or
// version, chunked bodies, Expect, a header it does not accept, a wrong
// token — hands the whole connection, with the bytes read so far, to
// net/http with the same Handler, which answers as it always did.

// leanBufSize bounds a request the loop answers itself (head and body);
// a larger one goes to net/http.
const leanBufSize = 4096

// leanServer serves the HTTP listeners with the lean loop, and the
// connections it hands off with fallback.
type leanServer struct {
	a        *Agent
	drain    context.Context // ends when Serve shuts down: waits end with CLOSED
	fallback *http.Server
	handoff  *handoffListener

	mu       sync.Mutex
	conns    map[*leanConn]bool // true: answering a request
	lns      []net.Listener
	shutting bool
	wg       sync.WaitGroup // the connections' goroutines
}

func newLeanServer(a *Agent, drain context.Context, fallback *http.Server) *leanServer {
	return &leanServer{a: a, drain: drain, fallback: fallback, handoff: newHandoffListener(), conns: map[*leanConn]bool{}}
}

// serve accepts on l until it is closed.
func (s *leanServer) serve(l net.Listener) error {
	s.mu.Lock()
	if s.shutting {
		s.mu.Unlock()
		return http.ErrServerClosed
	}
	s.lns = append(s.lns, l)
	s.mu.Unlock()
	_, tcp := l.Addr().(*net.TCPAddr)
	var delay time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			shutting := s.shutting
			s.mu.Unlock()
			if shutting {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) || isTemporary(err) {
				// Out of file descriptors, say: back off as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		lc := &leanConn{s: s, c: c, tcp: tcp}
		s.mu.Lock()
		if s.shutting {
			s.mu.Unlock()
			c.Close()
			return http.ErrServerClosed
		}
		s.conns[lc] = false
		s.wg.Add(1)
		s.mu.Unlock()
		go lc.serve()
	}
}

func isTemporary(err error) bool {
	t, ok := err.(interface{ Temporary() bool })
	return ok && t.Temporary()
}

// shutdown stops accepting, closes the idle connections, lets the busy
// ones finish their request until ctx ends, then closes them too. Waits
// under way end with CLOSED through s.drain, which the caller ends first.
func (s *leanServer) shutdown(ctx context.Context) {
	s.mu.Lock()
	s.shutting = true
	for _, l := range s.lns {
		l.Close()
	}
	for c, busy := range s.conns {
		if !busy {
			c.c.Close()
		}
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.mu.Lock()
		for c := range s.conns {
			c.c.Close()
		}
		s.mu.Unlock()
		<-done
	}
}

// setBusy marks c busy or idle; it reports false when the server is
// shutting down and c should close instead.
func (s *leanServer) setBusy(c *leanConn, busy bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutting {
		return false
	}
	s.conns[c] = busy
	return true
}

func (s *leanServer) forget(c *leanConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.wg.Done()
}

// leanConn is one connection of the lean loop.
type leanConn struct {
	s   *leanServer
	c   net.Conn
	tcp bool
	br  *bufio.Reader
	// body, out (the answer's body) and wbuf (the whole answer) are
	// reused from request to request.
	body, out, wbuf []byte
}

func (lc *leanConn) serve() {
	handedOff := false
	defer func() {
		if !handedOff {
			lc.c.Close()
		}
		lc.s.forget(lc)
	}()
	lc.br = bufio.NewReaderSize(lc.c, leanBufSize)
	for {
		// Idle until a request's first byte: no deadline, as net/http
		// keeps an idle connection without IdleTimeout.
		if _, err := lc.br.Peek(1); err != nil {
			return // closed
		}
		// From its first byte, the whole request must arrive within
		// HeaderTimeout. The deadline is set only when a read must wait
		// for more: a request that came in one read, the usual case,
		// costs no timer.
		timed := false
		wait := func() {
			if !timed {
				timed = true
				lc.c.SetReadDeadline(time.Now().Add(lc.s.a.cfg.HeaderTimeout))
			}
		}
		head, err := peekHead(lc.br, wait)
		if err != nil && !errors.Is(err, errHeadTooLarge) {
			lc.refuseIncomplete(err)
			return
		}
		if !lc.s.setBusy(lc, true) {
			return
		}
		h, ok := parseHead(head)
		ok = ok && err == nil && h.headLen+h.contentLength <= leanBufSize
		ok = ok && validHost(h.host)
		ok = ok && (!lc.tcp || lc.s.a.authorized(string(h.auth)))
		if !ok {
			// net/http answers it, and the rest of the connection, with
			// deadlines of its own.
			if timed {
				lc.c.SetReadDeadline(time.Time{})
			}
			handedOff = lc.s.handoff.give(&bufferedConn{Conn: lc.c, r: lc.br})
			return
		}
		if lc.br.Buffered() < h.headLen+h.contentLength {
			wait()
		}
		full, err := lc.br.Peek(h.headLen + h.contentLength)
		if err != nil {
			lc.refuseIncomplete(err)
			return
		}
		if timed {
			lc.c.SetReadDeadline(time.Time{})
		}
		// The body is copied out before anything else reads the
		// connection: a read may move the buffer's bytes.
		lc.body = append(lc.body[:0], full[h.headLen:]...)
		lc.br.Discard(len(full))
		if !lc.answer(h) || h.close || !lc.s.setBusy(lc, false) {
			return
		}
	}
}

// refuseIncomplete answers a request that did not arrive whole within
// HeaderTimeout with 408; the connection is closed after it. A request
// cut by the client's close has no one to answer.
func (lc *leanConn) refuseIncomplete(err error) {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return
	}
	b, _ := json.Marshal(errorJSON{Error: ReasonBadRequest, Message: fmt.Sprintf(
		"%v: the request did not arrive whole within %v of its first byte", ErrBadRequest, lc.s.a.cfg.HeaderTimeout)})
	b = append(b, '\n')
	lc.c.SetWriteDeadline(time.Now().Add(lc.s.a.cfg.HeaderTimeout))
	lc.c.Write(append(appendHead(nil, http.StatusRequestTimeout, len(b), true), b...))
}

// answer runs the request and writes its answer; it reports whether the
// connection is still good.
func (lc *leanConn) answer(h reqHead) bool {
	ctx := &reqCtx{parent: lc.s.drain, lc: lc}
	a := lc.s.a
	var status int
	var granted Granted
	var caller string
	var err error
	body := lc.body
	switch h.path {
	case "/v1/cancel", "/v1/settle":
		err = a.serveID(ctx, h.path, body)
		if err == nil {
			status, lc.out = http.StatusOK, append(lc.out[:0], "{}\n"...)
		}
	default:
		var req Request
		req, err = DecodeAcquire(body, a.cfg.MaxWait)
		if err == nil {
			caller = req.Caller
			switch h.path {
			case "/v1/acquire":
				granted, err = a.Acquire(ctx, req)
			case "/v1/try_acquire":
				granted, err = a.TryAcquire(ctx, req)
			default:
				granted, err = a.Reserve(ctx, req)
			}
		}
		if err == nil {
			status = http.StatusOK
			if h.path == "/v1/reserve" {
				d := float64(granted.Delay) / float64(time.Millisecond)
				b, _ := json.Marshal(grantedJSON{Reservation: granted.ID, DelayMS: &d, Cost: granted.Cost})
				lc.out = append(append(lc.out[:0], b...), '\n')
			} else {
				lc.out = appendGranted(lc.out[:0], granted)
			}
		}
	}
	gone := ctx.stop() // the peer closed while the request ran
	if err != nil {
		reason := Reason(err)
		b, _ := json.Marshal(errorJSON{Error: reason, Message: err.Error()})
		status, lc.out = outcomes[reason].http, append(append(lc.out[:0], b...), '\n')
	}
	lc.wbuf = appendHead(lc.wbuf[:0], status, len(lc.out), h.close)
	lc.wbuf = append(lc.wbuf, lc.out...)
	_, werr := lc.c.Write(lc.wbuf)
	if granted.ID != "" && (gone || werr != nil) {
		// A caller gone by now would never learn of its grant: give it back.
		a.Cancel(context.Background(), granted.ID, caller)
	}
	return werr == nil && !gone
}

// appendGranted appends what encoding/json makes of a grant's answer,
// {"grant":ID,"cost":{...}} and a newline, without its reflection: the ID
// is the agent's own (letters, digits, '-', '.') and dimensions are
// [a-z0-9_], so nothing needs escaping; keys are sorted as json sorts a
// map's.
func appendGranted(b []byte, g Granted) []byte {
	b = append(b, `{"grant":"`...)
	b = append(b, g.ID...)
	b = append(b, `","cost":{`...)
	var keys [16]string
	ks := keys[:0]
	for k := range g.Cost {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	for i, k := range ks {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, k...)
		b = append(b, `":`...)
		b = strconv.AppendInt(b, g.Cost[k], 10)
	}
	return append(b, "}}\n"...)
}

// appendHead appends a response's status line and headers.
func appendHead(b []byte, status, length int, close bool) []byte {
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, ' ')
	b = append(b, http.StatusText(status)...)
	b = append(b, "\r\nContent-Type: application/json\r\nDate: "...)
	b = append(b, httpDate()...)
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(length), 10)
	if close {
		b = append(b, "\r\nConnection: close"...)
	}
	return append(b, "\r\n\r\n"...)
}

// httpDate is the Date header's value, formatted once a second.
func httpDate() string {
	now := time.Now().Unix()
	if d := dateCache.Load(); d != nil && d.unix == now {
		return d.s
	}
	d := &cachedDate{unix: now, s: time.Unix(now, 0).UTC().Format(http.TimeFormat)}
	dateCache.Store(d)
	return d.s
}

type cachedDate struct {
	unix int64
	s    string
}

var dateCache atomic.Pointer[cachedDate]

var errHeadTooLarge = errors.New("agent: request head larger than the lean buffer")

// peekHead waits until br holds a whole request head (up to the blank
// line) and returns the buffered bytes, without consuming them; wait is
// called before a read that blocks. A head that does not fit the buffer
// gives errHeadTooLarge, with the bytes. A head whose lines end in a bare
// LF ends at "\n\n": parseHead refuses it and net/http, which reads such
// heads, answers it.
func peekHead(br *bufio.Reader, wait func()) ([]byte, error) {
	for {
		if n := br.Buffered(); n > 0 {
			buf, _ := br.Peek(n)
			if bytes.Contains(buf, crlfcrlf) || bytes.Contains(buf, lflf) {
				return buf, nil
			}
			if n == br.Size() {
				return buf, errHeadTooLarge
			}
		}
		wait()
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return nil, err
		}
	}
}

var lflf = []byte("\n\n")

var crlfcrlf = []byte("\r\n\r\n")

// reqHead is what the lean loop reads of a request's head.
type reqHead struct {
	path          string // one of the five operations
	headLen       int    // bytes up to and with the blank line
	contentLength int
	auth          []byte // the Authorization value (aliases the buffer)
	host          []byte // the Host value (aliases the buffer)
	close         bool   // Connection: close
}

// parseHead reads a request head from buf (which holds it whole, and
// maybe more). It reports false for anything the lean loop leaves to
// net/http: not a POST of an operation in HTTP/1.1, no or several
// Host or Content-Length headers, Transfer-Encoding, Expect, a
// Connection other than keep-alive or close, a malformed line.
func parseHead(buf []byte) (reqHead, bool) {
	var h reqHead
	end := bytes.Index(buf, crlfcrlf)
	if end < 0 {
		return h, false
	}
	h.headLen = end + 4
	lines := buf[:end+2] // every line ends with CRLF
	i := bytes.Index(lines, crlf)
	line := lines[:i]
	lines = lines[i+2:]
	rest, ok := bytes.CutPrefix(line, []byte("POST "))
	if !ok {
		return h, false
	}
	path, ok := bytes.CutSuffix(rest, []byte(" HTTP/1.1"))
	if !ok {
		return h, false
	}
	switch string(path) { // no allocation: the compiler compares in place
	case "/v1/acquire":
		h.path = "/v1/acquire"
	case "/v1/try_acquire":
		h.path = "/v1/try_acquire"
	case "/v1/reserve":
		h.path = "/v1/reserve"
	case "/v1/cancel":
		h.path = "/v1/cancel"
	case "/v1/settle":
		h.path = "/v1/settle"
	default:
		return h, false
	}
	hosts, lengths, auths := 0, 0, 0
	for len(lines) > 0 {
		i := bytes.Index(lines, crlf)
		line := lines[:i]
		lines = lines[i+2:]
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return h, false
		}
		name, value := line[:colon], bytes.Trim(line[colon+1:], " \t")
		for _, c := range name {
			if !isTokenByte(c) {
				return h, false
			}
		}
		for _, c := range value {
			if c < ' ' && c != '\t' || c == 0x7f {
				return h, false
			}
		}
		switch {
		case equalFold(name, "host"):
			hosts++
			h.host = value
		case equalFold(name, "content-length"):
			lengths++
			if len(value) == 0 || len(value) > 7 {
				return h, false
			}
			n := 0
			for _, c := range value {
				if c < '0' || c > '9' {
					return h, false
				}
				n = n*10 + int(c-'0')
			}
			h.contentLength = n
		case equalFold(name, "authorization"):
			auths++
			h.auth = value
		case equalFold(name, "connection"):
			switch {
			case equalFold(value, "close"):
				h.close = true
			case equalFold(value, "keep-alive"):
			default:
				return h, false
			}
		case equalFold(name, "transfer-encoding"), equalFold(name, "expect"), equalFold(name, "upgrade"),
			equalFold(name, "trailer"), equalFold(name, "te"):
			return h, false
		}
	}
	if hosts != 1 || lengths != 1 || auths > 1 {
		return h, false
	}
	return h, true
}

var crlf = []byte("\r\n")

// validHost reports whether net/http would take host as a Host value
// (httpguts.ValidHostHeader, whose bytes these are): a request it
// refuses with 400 the lean loop does not answer either.
func validHost(host []byte) bool {
	for _, c := range host {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			bytes.IndexByte([]byte("!$%&()*+,-.:;=[']_~"), c) >= 0) {
			return false
		}
	}
	return true
}

func equalFold(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// isTokenByte reports whether c may be in a header name (RFC 9110 tchar).
func isTokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c != 0 && bytes.IndexByte([]byte("!#$%&'*+-.^_`|~"), c) >= 0
}

// reqCtx is a request's context: Serve's drain, and the peer closing the
// connection. It watches the connection only once something asks for
// Done — a wait — so a request answered at once costs no goroutine.
type reqCtx struct {
	parent context.Context
	lc     *leanConn

	once      sync.Once
	done      chan struct{} // made by watch, which then sets watching
	watching  atomic.Bool   // Err reads done only after this
	closeOnce sync.Once
	err       error // set before done closes
	watcher   chan struct{}
	stopAfter func() bool
	peerGone  atomic.Bool
}

func (x *reqCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (x *reqCtx) Value(key any) any           { return x.parent.Value(key) }

func (x *reqCtx) Done() <-chan struct{} {
	x.once.Do(x.watch)
	return x.done
}

// Err is the parent's end even before anything asked for Done: the
// drain that began then ends this request too. It may be called while
// another goroutine calls Done: watching orders its read of done after
// watch's write.
func (x *reqCtx) Err() error {
	if !x.watching.Load() {
		return x.parent.Err()
	}
	select {
	case <-x.done:
		return x.err
	default:
		return x.parent.Err()
	}
}

func (x *reqCtx) cancel(err error) {
	x.closeOnce.Do(func() {
		x.err = err
		close(x.done)
	})
}

// watch starts watching: a read on the connection returns when the peer
// closes it (a client sends nothing more until it has its answer), and
// the parent's end is passed on.
func (x *reqCtx) watch() {
	x.done = make(chan struct{})
	x.watching.Store(true)
	x.watcher = make(chan struct{})
	x.stopAfter = context.AfterFunc(x.parent, func() { x.cancel(x.parent.Err()) })
	go func() {
		defer close(x.watcher)
		_, err := x.lc.br.Peek(1)
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			x.peerGone.Store(true)
			x.cancel(context.Canceled)
		}
	}()
}

// stop ends the watch, if one began, and reports whether the peer went
// away meanwhile. The connection can be read again after it.
func (x *reqCtx) stop() bool {
	started := false
	x.once.Do(func() {}) // no watch from now on
	if x.watcher != nil {
		started = true
		x.lc.c.SetReadDeadline(time.Unix(1, 0)) // wakes the watcher's read
		<-x.watcher
		x.lc.c.SetReadDeadline(time.Time{})
		x.stopAfter()
	}
	return started && x.peerGone.Load()
}

// handoffListener passes connections from the lean loop to net/http.
type handoffListener struct {
	ch     chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newHandoffListener() *handoffListener {
	return &handoffListener{ch: make(chan net.Conn), closed: make(chan struct{})}
}

// give hands c over; false if the listener is closed (the caller keeps c).
func (l *handoffListener) give(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.closed:
		return false
	}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *handoffListener) Addr() net.Addr { return handoffAddr{} }

type handoffAddr struct{}

func (handoffAddr) Network() string { return "handoff" }
func (handoffAddr) String() string  { return "handoff" }

// bufferedConn is a connection whose first bytes are in r already.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
