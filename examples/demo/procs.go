package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// build builds each package (relative to the module root) into dir, once,
// and returns the binaries' paths.
func build(root, dir string, pkgs ...string) ([]string, error) {
	bins := make([]string, len(pkgs))
	for i, p := range pkgs {
		bins[i] = filepath.Join(dir, filepath.Base(p))
	}
	args := append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bins, nil
}

// moduleRoot is the directory of the sluice module's go.mod.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("run the demo from inside the sluice module (go run ./examples/demo)")
	}
	return filepath.Dir(gomod), nil
}

// startEtcd starts a single-member etcd in this process, data in dir, on
// free loopback ports, logging nothing.
func startEtcd(dir string) (*embed.Etcd, string, error) {
	cu, pu := url.URL{Scheme: "http", Host: freeAddr()}, url.URL{Scheme: "http", Host: freeAddr()}
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = "demo", dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.TickMs, cfg.ElectionMs = 10, 100
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, "", fmt.Errorf("embedded etcd: %w", err)
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, "", errors.New("embedded etcd: not ready after 30s")
	}
	return e, cu.String(), nil
}

// freeAddr returns a free TCP address on 127.0.0.1.
func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// proc is a child process in a process group of its own: Ctrl-C in the
// terminal reaches only the demo, which stops its children itself, and
// killing the group leaves nothing behind.
type proc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string   // stdout lines (closed at EOF)
	done  chan struct{} // closed once the process was reaped
	mu    sync.Mutex
	err   error
}

// startProc starts bin with args; its stderr goes to logPath.
func startProc(name, logPath, bin string, args ...string) (*proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = sysProcAttr()
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, stdin: stdin, lines: make(chan string, 64), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default: // nobody reads any more
			}
		}
		close(p.lines)
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// pid returns the child's process id (also its process group id).
func (p *proc) pid() int { return p.cmd.Process.Pid }

// waitLine waits for a stdout line starting with prefix.
func (p *proc) waitLine(prefix string, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				<-p.done
				return "", fmt.Errorf("%s exited before saying %q: %v", p.name, prefix, p.exitErr())
			}
			if strings.HasPrefix(l, prefix) {
				return l, nil
			}
		case <-t.C:
			return "", fmt.Errorf("%s did not say %q within %v", p.name, prefix, timeout)
		}
	}
}

func (p *proc) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// send writes a command line to the child's stdin.
func (p *proc) send(format string, args ...any) {
	fmt.Fprintf(p.stdin, format+"\n", args...)
}

// kill sends SIGKILL to the child's whole process group and waits for it.
func (p *proc) kill() {
	syscall.Kill(-p.pid(), syscall.SIGKILL)
	<-p.done
}

// stop asks the child to leave (SIGTERM), waits up to grace, then kills its
// process group. Either way nothing of it is left when stop returns.
func (p *proc) stop(grace time.Duration) {
	p.stdin.Close()
	syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	p.kill() // the group: anything the child started too
}

// exited reports whether the child has exited (and was reaped).
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// commandContext is exec.CommandContext with the child in its own process
// group, like every other child of the demo.
func commandContext(ctx context.Context, bin string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.SysProcAttr = sysProcAttr()
	return cmd
}
