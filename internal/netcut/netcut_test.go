package netcut

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo starts a line echo server on the host's loopback.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	return ln.Addr().String()
}

// roundTrip writes a line on c and reads it back within d.
func roundTrip(c net.Conn, r *bufio.Reader, line string, d time.Duration) error {
	c.SetDeadline(time.Now().Add(d))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return errors.New("echoed " + got)
	}
	return nil
}

func timeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestProxyCutClosesAndRefuses(t *testing.T) {
	px := StartProxy(t, echo(t))
	c, err := net.Dial("tcp", px.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if err := roundTrip(c, r, "before", 10*time.Second); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	px.Cut()
	if err := roundTrip(c, r, "during", 10*time.Second); err == nil || timeout(err) {
		t.Errorf("open connection during a cut: %v, want it closed at once", err)
	}
	if c2, err := net.Dial("tcp", px.Addr()); err == nil {
		err = roundTrip(c2, bufio.NewReader(c2), "during", 10*time.Second)
		c2.Close()
		if err == nil || timeout(err) {
			t.Errorf("new connection during a cut: %v, want it closed at once", err)
		}
	}
	px.Heal()
	c3, err := net.Dial("tcp", px.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := roundTrip(c3, bufio.NewReader(c3), "after", 10*time.Second); err != nil {
		t.Errorf("after Heal: %v", err)
	}
}

// TestProxyDelay: with a delay, what the server sends arrives at least
// that much later, in order; the client's own writes are not held.
func TestProxyDelay(t *testing.T) {
	px := StartProxy(t, echo(t))
	const d = 150 * time.Millisecond
	px.SetDelay(d)
	c, err := net.Dial("tcp", px.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	for _, msg := range []string{"one", "two", "three"} {
		sent := time.Now()
		if err := roundTrip(c, r, msg, 10*time.Second); err != nil {
			t.Fatalf("%s: %v", msg, err)
		}
		if took := time.Since(sent); took < d {
			t.Errorf("%s echoed after %v, before the %v delay", msg, took, d)
		}
	}
	px.SetDelay(0)
	if err := roundTrip(c, r, "undelayed", 10*time.Second); err != nil {
		t.Errorf("after the delay is lifted: %v", err)
	}
}

func newNamespaces(t *testing.T) *Namespaces {
	t.Helper()
	ns, err := NewNamespaces(t)
	if err != nil {
		t.Skipf("no network namespaces here: %v", err)
	}
	return ns
}

// TestNamespacesCutIsAPartition: through a link a process inside reaches a
// server on the host's loopback; while the link is cut an open connection
// hangs (no reset) and a new one times out; after Heal the open connection
// carries on, with what was written during the cut delivered.
func TestNamespacesCutIsAPartition(t *testing.T) {
	ns := newNamespaces(t)
	link, err := ns.Link()
	if err != nil {
		t.Fatal(err)
	}
	addr, err := link.Forward(t, echo(t))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(addr, "127.0.") {
		t.Errorf("forward address %s, want a loopback address", addr)
	}
	var c net.Conn
	if err := in(ns.inside, func() (err error) {
		c, err = net.DialTimeout("tcp", addr, 10*time.Second)
		return err
	}); err != nil {
		t.Fatalf("dialing %s from inside: %v", addr, err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if err := roundTrip(c, r, "before", 10*time.Second); err != nil {
		t.Fatalf("through the link: %v", err)
	}

	if err := link.Cut(); err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(c, r, "during", 300*time.Millisecond); !timeout(err) {
		t.Errorf("open connection during the cut: %v, want a timeout (packets dropped, no reset)", err)
	}
	err = in(ns.inside, func() error {
		c2, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err == nil {
			c2.Close()
		}
		return err
	})
	if !timeout(err) {
		t.Errorf("new connection during the cut: %v, want a timeout", err)
	}

	if err := link.Heal(); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	got, err := r.ReadString('\n')
	if err != nil || got != "during\n" {
		t.Fatalf("after Heal the open connection gave %q, %v; want the line written during the cut", got, err)
	}
	if err := roundTrip(c, r, "after", 10*time.Second); err != nil {
		t.Errorf("after Heal: %v", err)
	}
}

// TestNamespacesCommandRunsInside: a command runs inside, where the link's
// inside address is and the host's interfaces are not.
func TestNamespacesCommandRunsInside(t *testing.T) {
	ns := newNamespaces(t)
	if _, err := ns.Link(); err != nil {
		t.Fatal(err)
	}
	out, err := ns.Command("ip", "-o", "-4", "addr").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	s := string(out)
	for _, want := range []string{"127.0.10.2/24", "127.0.0.1/32"} {
		if !strings.Contains(s, want) {
			t.Errorf("inside has no %s:\n%s", want, s)
		}
	}
	if strings.Count(s, "\n") != 2 {
		t.Errorf("inside has other addresses than lo's and the link's:\n%s", s)
	}
}

// TestNamespacesDeletedWithTheTest: the namespaces are gone after the
// test that made them, and leftovers of a dead process are removed.
func TestNamespacesDeletedWithTheTest(t *testing.T) {
	var names []string
	t.Run("make", func(t *testing.T) {
		ns := newNamespaces(t)
		names = []string{ns.inside, ns.gateway}
	})
	for _, n := range names {
		if _, err := os.Stat(netnsDir + "/" + n); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s still there after its test: %v", n, err)
		}
	}
	if names == nil {
		t.Skip("no network namespaces here (the subtest said why)")
	}
	// A pid that is surely dead: pid_max is at most 2^22.
	stale := namePrefix + "4194305-1-in"
	if err := ip("netns", "add", stale); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ip("netns", "del", stale) })
	removeLeftovers()
	if _, err := os.Stat(netnsDir + "/" + stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("leftover %s not removed: %v", stale, err)
	}
}
