package netcut

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns add` leaves a handle on each named namespace.
const netnsDir = "/run/netns"

// namePrefix starts the name of every namespace this package makes; the
// test process's pid follows, so a later run can tell a leftover of a
// process that died from one in use.
const namePrefix = "sluice-"

// seq numbers the namespaces one process makes.
var seq atomic.Int64

// Namespaces is a pair of network namespaces made with `ip netns`: inside,
// where a test runs a process (Command), and a gateway, joined to inside by
// veth links (Link). The test's forwarders listen in the gateway on a
// link's address and pass each connection on to a server on the host's
// loopback (Link.Forward), so a process inside reaches those servers only
// over the links, and taking a link down (Link.Cut) partitions it the way
// a network does: packets vanish, connections hang instead of failing.
//
// Every address is a loopback address: link N carries 127.0.N.1 on the
// gateway side and 127.0.N.2 inside (route_localnet lets 127/8 cross a
// link), and inside's loopback keeps only 127.0.0.1/32. Nothing is
// reachable from outside the machine, and the host's own interfaces and
// routes are not touched. The namespaces, and their links, are deleted
// with the test.
type Namespaces struct {
	inside, gateway string

	mu    sync.Mutex // guards links
	links int        // links made so far; the next is links+1
}

// NewNamespaces makes the namespaces. Making them needs root and iproute2's
// ip; where either is missing, or the kernel refuses, it returns an error
// that says why, so the test can fall back to a Proxy and say so.
func NewNamespaces(tb testing.TB) (*Namespaces, error) {
	tb.Helper()
	if uid := os.Geteuid(); uid != 0 {
		return nil, fmt.Errorf("network namespaces need root, running as uid %d", uid)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("network namespaces need iproute2's ip: %w", err)
	}
	removeLeftovers()
	base := fmt.Sprintf("%s%d-%d", namePrefix, os.Getpid(), seq.Add(1))
	n := &Namespaces{inside: base + "-in", gateway: base + "-gw"}
	for _, ns := range []string{n.gateway, n.inside} {
		if err := ip("netns", "add", ns); err != nil {
			n.remove(tb)
			return nil, err
		}
	}
	tb.Cleanup(func() { n.remove(tb) })
	// Inside's loopback holds 127.0.0.1 alone: with the usual 127.0.0.0/8
	// on lo, every 127/8 address would be local, and the links' gateway
	// addresses unreachable.
	steps := [][]string{
		{"-n", n.inside, "link", "set", "lo", "up"},
		{"-n", n.inside, "addr", "del", "127.0.0.1/8", "dev", "lo"},
		{"-n", n.inside, "addr", "add", "127.0.0.1/32", "dev", "lo"},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return nil, err
		}
	}
	for _, ns := range []string{n.gateway, n.inside} {
		err := in(ns, func() error {
			return os.WriteFile("/proc/sys/net/ipv4/conf/all/route_localnet", []byte("1\n"), 0)
		})
		if err != nil {
			return nil, fmt.Errorf("route_localnet in namespace %s: %w", ns, err)
		}
	}
	return n, nil
}

// Inside names the namespace processes run in.
func (n *Namespaces) Inside() string { return n.inside }

// Command returns a command that runs name with arg inside (through
// `ip netns exec`, which execs it: the command's process is the program's).
func (n *Namespaces) Command(name string, arg ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.inside, name}, arg...)...)
}

// Link is one veth link between inside and the gateway.
type Link struct {
	gateway, dev string // the gateway's end
	gwAddr       string // 127.0.N.1
}

// Link adds a veth link, up, with 127.0.N.1 at the gateway and 127.0.N.2
// inside for the Nth link (N from 10).
func (n *Namespaces) Link() (*Link, error) {
	n.mu.Lock()
	n.links++
	k := n.links
	n.mu.Unlock()
	if k > 200 {
		return nil, fmt.Errorf("at most 200 links, asked for link %d", k)
	}
	gwDev, inDev := fmt.Sprintf("gw%d", k), fmt.Sprintf("in%d", k)
	gwAddr, inAddr := fmt.Sprintf("127.0.%d.1", 9+k), fmt.Sprintf("127.0.%d.2", 9+k)
	steps := [][]string{
		{"link", "add", gwDev, "netns", n.gateway, "type", "veth", "peer", "name", inDev, "netns", n.inside},
		{"-n", n.gateway, "addr", "add", gwAddr + "/24", "dev", gwDev},
		{"-n", n.inside, "addr", "add", inAddr + "/24", "dev", inDev},
		{"-n", n.gateway, "link", "set", gwDev, "up"},
		{"-n", n.inside, "link", "set", inDev, "up"},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return nil, err
		}
	}
	return &Link{gateway: n.gateway, dev: gwDev, gwAddr: gwAddr}, nil
}

// Forward listens on the link's gateway address and passes every connection
// to target (host:port on the host, 127.0.0.1 say) until the test ends. It
// returns the address a process inside dials.
func (l *Link) Forward(tb testing.TB, target string) (string, error) {
	tb.Helper()
	var ln net.Listener
	err := in(l.gateway, func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(l.gwAddr, "0"))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("listening in namespace %s: %w", l.gateway, err)
	}
	return serveProxy(tb, ln, target).Addr(), nil
}

// Cut takes the link's gateway end down. Packets either way are dropped
// without a word: open connections hang (their data is retransmitted, and
// arrives if Heal comes before TCP gives up) and new ones get no answer
// (a timeout, or "no route to host" once the kernel gives up resolving the
// gateway's address).
func (l *Link) Cut() error { return ip("-n", l.gateway, "link", "set", l.dev, "down") }

// Heal brings the link back up.
func (l *Link) Heal() error { return ip("-n", l.gateway, "link", "set", l.dev, "up") }

// in runs fn on an OS thread that is in namespace ns for the call. A
// socket made in fn stays in ns after the thread leaves it.
func in(ns string, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		// The thread is handed back only once it is in its own namespace
		// again; otherwise it ends with this goroutine, so no other
		// goroutine ever runs in the wrong namespace.
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer home.Close()
		there, err := os.Open(filepath.Join(netnsDir, ns))
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer there.Close()
		if err := unix.Setns(int(there.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("entering namespace %s: %w", ns, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- errors.Join(ferr, fmt.Errorf("leaving namespace %s: %w", ns, err))
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// remove deletes both namespaces (their links go with them).
func (n *Namespaces) remove(tb testing.TB) {
	for _, ns := range []string{n.inside, n.gateway} {
		if _, err := os.Stat(filepath.Join(netnsDir, ns)); err == nil {
			if err := ip("netns", "del", ns); err != nil {
				tb.Logf("netcut: %v", err)
			}
		}
	}
}

// removeLeftovers deletes namespaces this package made in processes that
// are gone (a test run killed before its cleanup).
func removeLeftovers() {
	ents, _ := os.ReadDir(netnsDir)
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), namePrefix)
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		ip("netns", "del", e.Name())
	}
}

// ip runs iproute2's ip with args; its output goes into the error.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
