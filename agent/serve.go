package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"strconv"
	"sync"
	"time"
)

// Listeners are the agent's open sockets, from Listen, for Serve. Their
// addresses are known before serving begins (a TCP port of 0 is chosen
// then).
type Listeners struct {
	HTTP, GRPC []net.Listener
}

// Addrs lists the listeners' addresses, HTTP first, for a start-up line.
func (ls *Listeners) Addrs() (http, grpc []string) {
	for _, l := range ls.HTTP {
		http = append(http, l.Addr().String())
	}
	for _, l := range ls.GRPC {
		grpc = append(grpc, l.Addr().String())
	}
	return http, grpc
}

func (ls *Listeners) close() {
	for _, l := range append(append([]net.Listener(nil), ls.HTTP...), ls.GRPC...) {
		l.Close()
	}
}

// Listen opens the sockets and loopback ports the config names. A Unix
// socket appears at its path with its mode and group already set (it is
// made under a temporary name and renamed), so no one can connect to it
// before its permissions hold; a stale socket file left by a crashed
// agent is replaced, a live one is not.
func (a *Agent) Listen() (*Listeners, error) {
	ls := &Listeners{}
	add := func(list *[]net.Listener, l net.Listener, err error) error {
		if err != nil {
			ls.close()
			return err
		}
		*list = append(*list, l)
		return nil
	}
	if a.cfg.Socket != "" {
		l, err := listenUnix(a.cfg.Socket, a.cfg.SocketMode, a.cfg.SocketGroup)
		if err := add(&ls.HTTP, l, err); err != nil {
			return nil, err
		}
	}
	if a.cfg.GRPCSocket != "" {
		l, err := listenUnix(a.cfg.GRPCSocket, a.cfg.SocketMode, a.cfg.SocketGroup)
		if err := add(&ls.GRPC, l, err); err != nil {
			return nil, err
		}
	}
	if a.cfg.Listen != "" {
		l, err := net.Listen("tcp", a.cfg.Listen)
		if err := add(&ls.HTTP, l, err); err != nil {
			return nil, err
		}
	}
	if a.cfg.GRPCListen != "" {
		l, err := net.Listen("tcp", a.cfg.GRPCListen)
		if err := add(&ls.GRPC, l, err); err != nil {
			return nil, err
		}
	}
	return ls, nil
}

// unixListener removes its socket file on Close: the file has been renamed
// since net bound it, so net's own unlink would miss it.
type unixListener struct {
	*net.UnixListener
	path string
	once sync.Once
}

// Addr is the socket's path, not the temporary name it was bound under.
func (l *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() { os.Remove(l.path) })
	return err
}

func listenUnix(path string, mode uint32, group string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("agent: %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("agent: another process serves on %s", path)
		}
		os.Remove(path) // stale: nothing answers on it
	}
	gid := -1
	if group != "" {
		g, err := lookupGroup(group)
		if err != nil {
			return nil, err
		}
		gid = g
	}
	tmp := path + ".new"
	os.Remove(tmp)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("agent: socket %s: %w", path, err)
	}
	if err := os.Chmod(tmp, os.FileMode(mode)); err != nil {
		return fail(err)
	}
	if gid >= 0 {
		if err := os.Chown(tmp, -1, gid); err != nil {
			return fail(err)
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	return &unixListener{UnixListener: ln, path: path}, nil
}

func lookupGroup(name string) (int, error) {
	if n, err := strconv.Atoi(name); err == nil && n >= 0 {
		return n, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, fmt.Errorf("agent: socket group: %w", err)
	}
	return strconv.Atoi(g.Gid)
}

// Serve answers requests on ls until ctx ends, then shuts down: it stops
// accepting, ends every wait under way with ErrClosed (CLOSED, 503), lets
// the answers go out within Config.ShutdownTimeout and closes the
// sockets. The providers stay joined until Close. An agent serves once.
func (a *Agent) Serve(ctx context.Context, ls *Listeners) error {
	drain, stopDrain := context.WithCancel(context.Background())
	defer stopDrain()
	hs := &http.Server{
		Handler:           a.Handler(),
		ReadHeaderTimeout: a.cfg.HeaderTimeout,
		BaseContext:       func(net.Listener) context.Context { return drain },
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}
	gs := a.GRPCServer()
	a.grpcDrain.Store(&drain)
	lean := newLeanServer(a, drain, hs)
	n := len(ls.HTTP) + len(ls.GRPC) + 1
	errc := make(chan error, n)
	for _, l := range ls.HTTP {
		go func() { errc <- lean.serve(l) }()
	}
	go func() { errc <- hs.Serve(lean.handoff) }()
	for _, l := range ls.GRPC {
		go func() { errc <- gs.Serve(l) }()
	}
	hs2, gs2 := ls.Addrs()
	a.log.Info("agent serving", "http", hs2, "grpc", gs2)
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		n--
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
	}
	a.draining.Store(true)
	stopDrain()
	sctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	lean.shutdown(sctx)
	hs.Shutdown(sctx)
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-sctx.Done():
		gs.Stop()
		<-stopped
	}
	ls.close()
	for range n {
		<-errc // every Serve has returned
	}
	return err
}
