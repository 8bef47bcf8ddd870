// Command demo is sluice on one machine, with nothing installed by hand
// (`make demo`, or `go run ./examples/demo`). One command starts:
//
//   - etcd, embedded in this process;
//   - configd (`configd serve`, a separate process built from ./configd),
//     and the provider's config set with `configd set`;
//   - a provider stub (HTTP on 127.0.0.1) with a known limit, which counts
//     calls per aligned window by arrival and flags any window over it;
//   - an SNTP responder, which every instance measures its clock against;
//   - instances, each a separate process: plain load loops
//     (examples/demo/instance -mode load), a Kafka consumer on an
//     in-process broker (-mode kafka), and the HTTP handler
//     (examples/httphandler) with a latency budget, driven by a load loop
//     here. Their offered load is uneven and above the limit.
//
// A view refreshed each second shows, per instance, the grant of configd's
// ledger it enforces, its demand, what it admits, what waits, its clock
// offset and where its quota comes from, and the provider's calls in the
// last window against the limit. Midway the demo moves load between
// instances, retunes the total with `configd set` (the command is printed
// as run), SIGKILLs one instance, starts another, and restarts one with
// its clock 400ms fast; the view shows the grants follow. It ends on its own with a summary: the most
// calls the provider saw in any aligned window against the limit, the
// utilization of the limit, and how fast the grants followed each event.
//
//	go run ./examples/demo                 # about 60s of scenario
//	go run ./examples/demo -duration 30s
//
// Ctrl-C stops everything: the children run in process groups of their own
// and are stopped (SIGTERM, then SIGKILL) before the demo exits; on Linux a
// child is also killed if the demo itself is, and the demo stops (as on
// Ctrl-C) when whatever started it — make, go run — is killed. When stdout is not a
// terminal the view is printed as plain lines, so it runs under CI.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

type config struct {
	duration time.Duration // of the scenario, once every instance holds a share
	limit    int64         // the provider's limit at the start
	retuneTo int64         // the limit after the retune
	plain    bool          // plain lines even on a terminal
	binDir   string        // prebuilt binaries (configd, instance, httphandler); "" builds them
	keep     bool          // keep the temp dir
	table    bool          // print the full table each second, not only the events
	shot     string        // save configd's console to this PNG at the scenario's end; "": not
}

func main() {
	var c config
	flag.DurationVar(&c.duration, "duration", 60*time.Second, "length of the scenario once the instances hold grants (10s..1h)")
	flag.Int64Var(&c.limit, "limit", 400, "the provider's limit at the start, calls per second")
	flag.Int64Var(&c.retuneTo, "retune-to", 600, "the limit the demo retunes to midway")
	flag.BoolVar(&c.plain, "plain", false, "print plain lines even when stdout is a terminal")
	flag.StringVar(&c.binDir, "bin-dir", "", "directory holding prebuilt configd, instance and httphandler binaries (default: build them)")
	flag.BoolVar(&c.keep, "keep", false, "keep the temp dir (logs of every process)")
	flag.BoolVar(&c.table, "table", false, "print the full per-instance table each second (on a terminal it is always shown, redrawn in place); the console shows it all live")
	flag.StringVar(&c.shot, "screenshot", "", "at the end of the scenario, save configd's console as headless Chromium shows it 1280 px wide to this PNG file (make screenshot)")
	flag.Parse()
	switch {
	case c.duration < 10*time.Second || c.duration > time.Hour:
		fail(2, fmt.Errorf("-duration %v: must be within 10s..1h", c.duration))
	case c.limit < 50 || c.retuneTo < 50:
		fail(2, errors.New("-limit and -retune-to must be at least 50"))
	}
	if c.shot != "" {
		// Before a minute of scenario, not after it.
		if _, err := chromiumPath(); err != nil {
			fail(2, err)
		}
	}
	// The first Ctrl-C cancels ctx: the demo stops its children and prints
	// its summary. stop() then restores the default, so a second one kills
	// the demo at once (its children die with it on Linux: Pdeathsig).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	dieWithParent() // after NotifyContext: its SIGTERM stops the demo gracefully
	go func() {
		<-ctx.Done()
		stop()
	}()
	err := run(ctx, c, os.Stdout, isTerminal(os.Stdout) && !c.plain)
	stop()
	if err != nil {
		fail(1, err)
	}
}

func fail(code int, err error) {
	fmt.Fprintln(os.Stderr, "demo:", err)
	os.Exit(code)
}

// isTerminal reports whether f is a terminal (a character device).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// printer writes the demo's output. In plain mode every line carries the
// scenario's time and the view is printed as lines each second. On a
// terminal the view is redrawn in place, with the latest lines below it.
type printer struct {
	w   io.Writer
	tty bool

	mu    sync.Mutex
	start time.Time // of the scenario; zero before
	log   []string  // on a terminal: lines shown under the view
}

func (p *printer) stamp() string {
	if p.start.IsZero() {
		return "[ setup]"
	}
	return fmt.Sprintf("[%5.1fs]", time.Since(p.start).Seconds())
}

// linef prints a line (a newline is added).
func (p *printer) linef(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.stamp() + " " + fmt.Sprintf(format, args...)
	if p.tty && !p.start.IsZero() {
		p.log = append(p.log, l)
		return
	}
	fmt.Fprintln(p.w, l)
}

// begin starts the scenario's clock.
func (p *printer) begin(t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.start = t
}

// startTime returns when the scenario started.
func (p *printer) startTime() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.start
}

// view shows the view: in place on a terminal, else as stamped lines.
func (p *printer) view(v string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	lines := strings.Split(strings.TrimRight(v, "\n"), "\n")
	if !p.tty {
		st := p.stamp()
		for _, l := range lines {
			fmt.Fprintf(p.w, "%s %s\n", st, l)
		}
		return
	}
	const keep = 14
	if len(p.log) > keep {
		p.log = p.log[len(p.log)-keep:]
	}
	var b strings.Builder
	b.WriteString("\x1b[H\x1b[2J") // home, clear
	fmt.Fprintf(&b, "sluice demo %s   (Ctrl-C stops everything)\n\n", p.stamp())
	b.WriteString(v)
	b.WriteString("\n")
	for _, l := range p.log {
		b.WriteString(l + "\n")
	}
	io.WriteString(p.w, b.String())
}

// endView leaves the terminal view: the summary follows in plain lines.
func (p *printer) endView() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		for _, l := range p.log {
			fmt.Fprintln(p.w, l)
		}
		p.log = nil
		p.tty = false
	}
}
