package harness

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Configd is a `configd serve` process.
type Configd struct {
	Cmd  *exec.Cmd
	Addr string // its admin API, host:port
	bin  string
	log  *os.File
}

// StartConfigd runs `bin serve` against the etcd at endpoint, listening on
// a free loopback port, with extra flags (space-separated) appended. Its
// log (stderr) goes to logPath. It returns once configd says it serves.
func StartConfigd(bin, endpoint, logPath, extra string) (*Configd, error) {
	args := append([]string{"--etcd-endpoints", endpoint, "--listen", "127.0.0.1:0", "--replica-id", "bench"}, strings.Fields(extra)...)
	return StartServe(bin, logPath, nil, args...)
}

// StartServe runs `bin serve args...` with the process attributes attr
// (nil: none), its log (stderr) going to logPath, and returns once configd
// says it serves. args must include --listen.
func StartServe(bin, logPath string, attr *syscall.SysProcAttr, args ...string) (*Configd, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, append([]string{"serve"}, args...)...)
	cmd.SysProcAttr = attr
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	cd := &Configd{Cmd: cmd, bin: bin, log: logf}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logf, line)
			if strings.Contains(line, `msg="configd serving"`) {
				for _, f := range strings.Fields(line) {
					if a, ok := strings.CutPrefix(f, "listen="); ok {
						addr <- a
					}
				}
			}
		}
	}()
	select {
	case cd.Addr = <-addr:
		return cd, nil
	case <-time.After(30 * time.Second):
		cd.Stop()
		b, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("configd serve did not start:\n%s", b)
	}
}

// Run runs the configd CLI (`bin args... --server http://ADDR`) against
// this daemon's admin API and returns its combined output.
func (c *Configd) Run(args ...string) ([]byte, error) {
	cmd := exec.Command(c.bin, append(args, "--server", "http://"+c.Addr)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("configd %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// Stop sends SIGTERM, waits up to 15 s, then kills.
func (c *Configd) Stop() {
	c.Cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { c.Cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		c.Cmd.Process.Kill()
		<-done
	}
	c.log.Close()
}
