package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

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
