package netcut

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy in the test process in front of one address (an
// etcd member's client URL, say): a test points one client at it to cut
// that client off from the server and nothing else. Cut closes every
// connection through it and closes new ones as soon as they are accepted,
// so the client sees the cut at once; Heal lets connections through again.
// It stops with the test.
type Proxy struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // what the server sends reaches the client this much later
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

// SetDelay makes what the server sends reach the client d later, from now
// on (0: at once); what the client sends is not delayed. A watch's events
// then arrive late, while the client's own writes do not.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// StartProxy starts a proxy on 127.0.0.1 to target (host:port).
func StartProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	return serveProxy(tb, ln, target)
}

// serveProxy proxies every connection ln accepts to target until the test
// ends.
func serveProxy(tb testing.TB, ln net.Listener, target string) *Proxy {
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.wg.Go(p.accept)
	tb.Cleanup(func() {
		ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr returns the address the proxy listens on (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns the proxy's address as an etcd endpoint URL.
func (p *Proxy) URL() string { return "http://" + p.Addr() }

// Cut closes every open connection, and new ones as they come, until Heal.
func (p *Proxy) Cut() { p.set(true) }

// Heal lets connections through again.
func (p *Proxy) Heal() { p.set(false) }

func (p *Proxy) set(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
	}
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[up] = true, true
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			io.Copy(dst, src)
			dst.Close()
			src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		p.wg.Go(func() { pipe(up, c) })
		p.wg.Go(func() { p.delayed(c, up, pipe) })
	}
}

// delayed copies src to dst, each chunk held for the delay in force when
// it was read, in order.
func (p *Proxy) delayed(dst, src net.Conn, pipe func(dst, src net.Conn)) {
	type chunk struct {
		at time.Time
		b  []byte
	}
	chunks := make(chan chunk, 4096)
	var wg sync.WaitGroup
	wg.Go(func() {
		for c := range chunks {
			time.Sleep(time.Until(c.at)) // holds the chunk until its time: the delay itself
			if _, err := dst.Write(c.b); err != nil {
				break
			}
		}
		for range chunks { // drain after a write error
		}
	})
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			chunks <- chunk{time.Now().Add(time.Duration(p.delay.Load())), append([]byte(nil), buf[:n]...)}
		}
		if err != nil {
			break
		}
	}
	close(chunks)
	wg.Wait()
	pipe(dst, src) // closes both and forgets them
}
