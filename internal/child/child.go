// Package child runs the child processes of sluice's report programs and
// demo: each in a process group of its own, so that Ctrl-C in a terminal
// reaches only the parent, which stops its children itself, and killing
// the group leaves nothing behind; on Linux a child also dies with its
// parent.
package child

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a child process: its stdout read as lines, its stdin for
// commands, its stderr in a log file.
type Proc struct {
	Name  string
	Log   string // the path of its stderr
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string   // stdout lines (closed at EOF)
	done  chan struct{} // closed once the process was reaped
	mu    sync.Mutex
	err   error
}

// Start starts bin with args; its stderr goes to logPath. Stdout lines
// nobody waits for are dropped.
func Start(name, logPath, bin string, args ...string) (*Proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = SysProcAttr()
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
	p := &Proc{Name: name, Log: logPath, cmd: cmd, stdin: stdin, lines: make(chan string, 64), done: make(chan struct{})}
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

// Command is exec.CommandContext with the child in a process group of its
// own, like every child Start starts.
func Command(ctx context.Context, bin string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.SysProcAttr = SysProcAttr()
	return cmd
}

// Pid returns the child's process id (also its process group id).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// WaitLine waits for a stdout line starting with prefix, for at most
// timeout or until ctx ends.
func (p *Proc) WaitLine(ctx context.Context, prefix string, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				<-p.done
				return "", fmt.Errorf("%s exited before saying %q (%v); see %s", p.Name, prefix, p.ExitErr(), p.Log)
			}
			if strings.HasPrefix(l, prefix) {
				return l, nil
			}
		case <-t.C:
			return "", fmt.Errorf("%s did not say %q within %v; see %s", p.Name, prefix, timeout, p.Log)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// ExitErr returns how the child exited (nil while it runs, or when it
// exited with status 0).
func (p *Proc) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Send writes a command line to the child's stdin.
func (p *Proc) Send(format string, args ...any) {
	fmt.Fprintf(p.stdin, format+"\n", args...)
}

// Kill sends SIGKILL to the child's whole process group and waits for it.
func (p *Proc) Kill() {
	if err := syscall.Kill(-p.Pid(), syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		fmt.Fprintf(os.Stderr, "killing process group %d (%s): %v\n", p.Pid(), p.Name, err)
	}
	<-p.done
}

// Stop asks the child to leave (stdin closed, SIGTERM), waits up to grace,
// then kills its process group. Either way nothing of it is left when Stop
// returns.
func (p *Proc) Stop(grace time.Duration) {
	p.stdin.Close()
	syscall.Kill(-p.Pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	p.Kill() // the group: anything the child started too
}

// Exited reports whether the child has exited (and was reaped).
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
