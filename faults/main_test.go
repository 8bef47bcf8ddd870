package faults

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/netcut"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// The binaries TestMain builds: configd, and the instance of the accuracy
// report (bench/accuracy/instance), which joins a provider, offers load at
// the rate it is told on stdin, calls the stub once per permit, and prints
// what it applies.
var configdBin, instanceBin string

func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_FAULTS") != "1" {
		fmt.Println("faults: skipped (slow fault suite; run with SLUICE_FAULTS=1 go test -count=1 -v ./faults/)")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "sluice-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		t0 := time.Now()
		cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "./configd", "./bench/accuracy/instance")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "faults: go build: %v\n%s", err, out)
			return 1
		}
		configdBin, instanceBin = filepath.Join(dir, "configd"), filepath.Join(dir, "instance")
		fmt.Printf("faults: built configd and instance in %v\n", time.Since(t0).Round(time.Millisecond))
		return m.Run()
	}()
	os.Exit(code)
}

// Defaults of every scenario.
const (
	window   = time.Second
	leaseTTL = 2 * time.Second // instances' lease TTL (the least whole second above 1s)
	limit    = 300             // the provider's total, permits per window
	offered  = 200             // requests per second each instance offers
)

// ---- processes ----

// lines is a process's output, one line at a time, that tests wait on.
type lines struct {
	mu      sync.Mutex
	all     []string
	changed chan struct{} // closed and replaced on every new line
	eof     bool
}

func newLines() *lines { return &lines{changed: make(chan struct{})} }

func (l *lines) add(s string) {
	l.mu.Lock()
	l.all = append(l.all, s)
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

func (l *lines) close() {
	l.mu.Lock()
	l.eof = true
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

// len returns how many lines were seen so far: an index to wait from.
func (l *lines) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.all)
}

// wait returns the first line at index from or later that match accepts,
// and its index, waiting for it up to timeout.
func (l *lines) wait(from int, timeout time.Duration, match func(string) bool) (string, int, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		for i := from; i < len(l.all); i++ {
			if match(l.all[i]) {
				s := l.all[i]
				l.mu.Unlock()
				return s, i, nil
			}
		}
		from = len(l.all)
		eof, ch := l.eof, l.changed
		l.mu.Unlock()
		if eof {
			return "", 0, errors.New("output ended")
		}
		select {
		case <-ch:
		case <-deadline.C:
			return "", 0, fmt.Errorf("no matching line within %v", timeout)
		}
	}
}

// snapshot returns the lines seen so far.
func (l *lines) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.all)
}

// proc is a child process in a process group of its own, killed by Linux
// if the test process dies (Pdeathsig) and by t.Cleanup otherwise.
type proc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *lines // stdout
	errs   *lines // stderr (also written to a log file)
	done   chan struct{}
	waitMu sync.Mutex
	err    error
}

func startProc(t *testing.T, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	logf, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, stdin: stdin, out: newLines(), errs: newLines(), done: make(chan struct{})}
	var readers sync.WaitGroup
	readers.Go(func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			p.out.add(sc.Text())
		}
		p.out.close()
	})
	readers.Go(func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			fmt.Fprintln(logf, sc.Text())
			p.errs.add(sc.Text())
		}
		p.errs.close()
	})
	go func() {
		readers.Wait()
		err := cmd.Wait()
		p.waitMu.Lock()
		p.err = err
		p.waitMu.Unlock()
		logf.Close()
		close(p.done)
	}()
	t.Cleanup(func() { p.kill() })
	return p
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// signal sends sig to the child's process group.
func (p *proc) signal(sig syscall.Signal) error { return syscall.Kill(-p.pid(), sig) }

// kill SIGKILLs the process group (continuing it first, in case it is
// stopped) and waits for the child.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	p.signal(syscall.SIGCONT)
	<-p.done
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// send writes one command line to the child's stdin.
func (p *proc) send(format string, args ...any) {
	fmt.Fprintf(p.stdin, format+"\n", args...)
}

// quit closes stdin (the instance leaves gracefully, revoking its lease;
// configd ignores stdin), sends SIGTERM, waits up to grace, then kills.
func (p *proc) quit(grace time.Duration) {
	p.stdin.Close()
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	p.kill()
}

// ---- configd ----

type configd struct {
	*proc
	id   string // replica id
	addr string // admin API
}

// startConfigd runs `configd serve` against etcd with the replica id given
// and waits until it serves.
func startConfigd(t *testing.T, endpoint, id string, extra ...string) *configd {
	t.Helper()
	args := append([]string{"serve", "--etcd-endpoints", endpoint, "--listen", "127.0.0.1:0", "--replica-id", id,
		"--session-ttl", "2s"}, extra...)
	p := startProc(t, "configd-"+id, exec.Command(configdBin, args...))
	l, _, err := p.errs.wait(0, 30*time.Second, func(s string) bool { return strings.Contains(s, `msg="configd serving"`) })
	if err != nil {
		t.Fatalf("configd %s did not start: %v", id, err)
	}
	c := &configd{proc: p, id: id}
	for _, f := range strings.Fields(l) {
		if a, ok := strings.CutPrefix(f, "listen="); ok {
			c.addr = a
		}
	}
	return c
}

// cli runs the configd CLI against this daemon's admin API.
func (c *configd) cli(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(configdBin, append(args, "--server", "http://"+c.addr)...).CombinedOutput()
	if err != nil {
		t.Fatalf("configd %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// leaderChanges counts this replica's "became leader" lines.
func (c *configd) leaderChanges() int { return countMatching(c.errs.snapshot(), `msg="became leader"`) }

// ---- instances ----

type instance struct {
	*proc
	id    string
	index int
}

// startInstance starts instance index (id inst-INDEX) of provider against
// the etcd endpoint and waits until it joined.
func startInstance(t *testing.T, endpoint, provider, stubURL string, index int, extra ...string) *instance {
	t.Helper()
	return launchInstanceIn(t, nil, endpoint, provider, stubURL, index, extra...).joined(t)
}

// launchInstance starts the instance without waiting for it to join.
func launchInstance(t *testing.T, endpoint, provider, stubURL string, index int, extra ...string) *instance {
	t.Helper()
	return launchInstanceIn(t, nil, endpoint, provider, stubURL, index, extra...)
}

// launchInstanceIn starts the instance inside ns's network namespace (on
// the host's network when ns is nil).
func launchInstanceIn(t *testing.T, ns *netcut.Namespaces, endpoint, provider, stubURL string, index int, extra ...string) *instance {
	t.Helper()
	id := fmt.Sprintf("inst-%d", index)
	args := append([]string{"-etcd", endpoint, "-provider", provider, "-id", id, "-index", strconv.Itoa(index),
		"-stub", stubURL, "-lease-ttl", leaseTTL.String(), "-window", window.String(), "-max-wait", "10ms"}, extra...)
	cmd := exec.Command(instanceBin, args...)
	if ns != nil {
		cmd = ns.Command(instanceBin, args...)
	}
	return &instance{proc: startProc(t, id, cmd), id: id, index: index}
}

// joined waits until the instance has joined.
func (in *instance) joined(t *testing.T) *instance {
	t.Helper()
	if _, _, err := in.out.wait(0, 30*time.Second, func(s string) bool { return strings.HasPrefix(s, "joined ") }); err != nil {
		t.Fatalf("%s did not join: %v", in.id, err)
	}
	return in
}

// load makes the instance offer rate requests per second from now on.
func (in *instance) load(rate int) { in.send("load %d %d", rate, time.Now().UnixNano()) }

// applied is one "applied" line of an instance.
type applied struct {
	t, from    time.Time
	gen, share int64
	source     string
}

func fields(line string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}

func parseApplied(line string) (applied, bool) {
	if !strings.HasPrefix(line, "applied ") {
		return applied{}, false
	}
	f := fields(line)
	num := func(k string) int64 { n, _ := strconv.ParseInt(f[k], 10, 64); return n }
	return applied{t: time.Unix(0, num("t")), from: time.Unix(0, num("from")), gen: num("gen"), share: num("share"), source: f["source"]}, true
}

// applies returns every share the instance applied, in order.
func (in *instance) applies() []applied {
	var out []applied
	for _, l := range in.out.snapshot() {
		if a, ok := parseApplied(l); ok {
			out = append(out, a)
		}
	}
	return out
}

// waitApplied waits until the instance applied a generation ≥ gen.
func (in *instance) waitApplied(gen int64, timeout time.Duration) (applied, error) {
	l, _, err := in.out.wait(0, timeout, func(s string) bool {
		a, ok := parseApplied(s)
		return ok && a.gen >= gen
	})
	if err != nil {
		return applied{}, fmt.Errorf("%s: generation %d not applied: %w", in.id, gen, err)
	}
	a, _ := parseApplied(l)
	return a, nil
}

// stats asks the instance for its stats line.
func (in *instance) stats(t *testing.T) map[string]string {
	t.Helper()
	from := in.out.len()
	in.send("stats")
	l, _, err := in.out.wait(from, 10*time.Second, func(s string) bool { return strings.HasPrefix(s, "stats ") })
	if err != nil {
		t.Fatalf("%s stats: %v", in.id, err)
	}
	return fields(l)
}

// ---- the provider stub ----

// call is one call the stub received.
type call struct {
	recv, granted int64 // Unix ns: received by the stub; granted by the instance's limiter
	inst          int
}

// stub is the provider: it counts every call it receives, by the aligned
// window it arrives in.
type stub struct {
	srv *httptest.Server
	mu  sync.Mutex
	cs  []call
}

func startStub(t *testing.T) *stub {
	s := &stub{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now().UnixNano()
		inst, _ := strconv.Atoi(r.Header.Get("X-Instance"))
		g, _ := strconv.ParseInt(r.Header.Get("X-Granted"), 10, 64)
		s.mu.Lock()
		s.cs = append(s.cs, call{recv: now, granted: g, inst: inst})
		s.mu.Unlock()
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *stub) url() string { return s.srv.URL + "/call" }

func (s *stub) calls() []call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.cs)
}

// windowIndex is the aligned window t falls in.
func windowIndex(t time.Time) int64 { return t.UnixNano() / int64(window) }

// tally is the calls of a span of aligned windows.
type tally struct {
	first   int64   // first window index
	arrived []int64 // by the stub's receive time
	granted []int64 // by the instances' grant time
	perInst []map[int]int64
}

// count tallies the calls received in windows [from, to] (indexes).
func count(cs []call, from, to int64) tally {
	n := to - from + 1
	tl := tally{first: from, arrived: make([]int64, n), granted: make([]int64, n), perInst: make([]map[int]int64, n)}
	for i := range tl.perInst {
		tl.perInst[i] = map[int]int64{}
	}
	for _, c := range cs {
		if k := c.recv/int64(window) - from; k >= 0 && k < n {
			tl.arrived[k]++
			tl.perInst[k][c.inst]++
		}
		if k := c.granted/int64(window) - from; k >= 0 && k < n {
			tl.granted[k]++
		}
	}
	return tl
}

// max returns the largest arrival count and its window index, and the
// largest by grant time.
func (tl tally) max() (arrived, at, granted int64) {
	at = tl.first
	for i, v := range tl.arrived {
		if v > arrived {
			arrived, at = v, tl.first+int64(i)
		}
		granted = max(granted, tl.granted[i])
	}
	return arrived, at, granted
}

// over returns the windows (indexes) in which the instances granted more
// than lim permits: the invariant. spill returns those that received more
// than lim calls while no more than lim were granted in them: calls
// granted near the end of a window that arrived in the next one, when a
// process on this shared machine stalled (reported, not failed).
func (tl tally) over(lim int64) []int64 {
	var out []int64
	for i, v := range tl.granted {
		if v > lim {
			out = append(out, tl.first+int64(i))
		}
	}
	return out
}

func (tl tally) spill(lim int64) []int64 {
	var out []int64
	for i, v := range tl.arrived {
		if v > lim && tl.granted[i] <= lim {
			out = append(out, tl.first+int64(i))
		}
	}
	return out
}

// row prints window i (an index) as "HH:MM:SS N (inst:n ...)".
func (tl tally) row(k int64) string {
	i := k - tl.first
	if i < 0 || i >= int64(len(tl.arrived)) {
		return fmt.Sprintf("window %d: outside", k)
	}
	var parts []string
	for _, inst := range slices.Sorted(maps.Keys(tl.perInst[i])) {
		parts = append(parts, fmt.Sprintf("inst-%d:%d", inst, tl.perInst[i][inst]))
	}
	return fmt.Sprintf("%s %d calls (by grant time %d) [%s]", time.Unix(0, k*int64(window)).UTC().Format("15:04:05"),
		tl.arrived[i], tl.granted[i], strings.Join(parts, " "))
}

// series prints the arrival counts of windows [from, to].
func (tl tally) series(from, to int64) string {
	var b strings.Builder
	for k := from; k <= to; k++ {
		if i := k - tl.first; i >= 0 && i < int64(len(tl.arrived)) {
			fmt.Fprintf(&b, " %d", tl.arrived[i])
		}
	}
	return strings.TrimSpace(b.String())
}

// ---- etcd ----

// sharesEvent is the view of the provider's share records after a watch
// response that changed them (a publish, or a record's deletion).
type sharesEvent struct {
	seen time.Time
	rev  int64
	sh   schema.Shares
}

// watcher follows a provider's share records and instance keys in etcd.
// hook, if set, runs in the watch goroutine for every change of the share
// records, before it is recorded: a test injects a fault the moment a
// publish is seen.
type watcher struct {
	mu        sync.Mutex
	events    []sharesEvent
	changed   chan struct{}
	deletes   map[string]time.Time // instance id → when its key was last deleted
	rewatches int                  // watches started again after one ended
	hook      func(prev *schema.Shares, ev sharesEvent)
	set       *schema.ShareSet // the share records; the watch goroutine's
}

func newWatcher(t *testing.T, cli *clientv3.Client, provider string) *watcher {
	keys := schema.DefaultKeys()
	w := &watcher{changed: make(chan struct{}), deletes: map[string]time.Time{}, set: schema.NewShareSet(keys, provider)}
	ctx, cancel := context.WithCancel(context.Background())
	wch := cli.Watch(ctx, keys.Provider(provider), clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	created := <-wch
	next := created.Header.Revision + 1 // the first revision not yet seen
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for {
			for wr := range wch {
				if wr.Err() != nil {
					break // watch again from next
				}
				w.apply(keys, wr.Events)
				if n := len(wr.Events); n > 0 {
					next = wr.Events[n-1].Kv.ModRevision + 1
				}
			}
			// The watch ended (etcd stopped, say): watch again from the
			// first revision not seen, so that no publish is missed.
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			w.mu.Lock()
			w.rewatches++
			w.mu.Unlock()
			wctx, wcancel := context.WithCancel(ctx)
			wch = cli.Watch(wctx, keys.Provider(provider), clientv3.WithPrefix(), clientv3.WithRev(next))
			defer wcancel()
		}
	}()
	return w
}

func (w *watcher) apply(keys schema.Keys, evs []*clientv3.Event) {
	now := time.Now()
	var rev int64  // the last share record written or deleted in evs; 0: none
	wrote := false // a share record was written, not only deleted
	for _, ev := range evs {
		k, err := keys.Parse(string(ev.Kv.Key))
		if err != nil {
			continue
		}
		switch {
		case k.Kind == schema.KindShares:
			deleted := ev.Type == clientv3.EventTypeDelete
			if ok, _ := w.set.Apply(string(ev.Kv.Key), ev.Kv.Value, deleted); ok {
				rev = ev.Kv.ModRevision
				wrote = wrote || !deleted
			}
		case k.Kind == schema.KindInstance && ev.Type == clientv3.EventTypeDelete:
			w.mu.Lock()
			w.deletes[k.Instance] = now
			close(w.changed)
			w.changed = make(chan struct{})
			w.mu.Unlock()
		}
	}
	sh, ok := w.set.View()
	if rev == 0 || !ok {
		return
	}
	// One event per publish: its records come in one watch response.
	se := sharesEvent{seen: now, rev: rev, sh: sh}
	w.mu.Lock()
	var prev *schema.Shares
	if n := len(w.events); n > 0 {
		prev = &w.events[n-1].sh
		if !wrote {
			// Only deletions (a record no longer holding a grant): no
			// publish, and the view's generation, the newest of the
			// records left, may be lower than the publish's.
			se.sh.Generation = max(se.sh.Generation, prev.Generation)
		}
	}
	hook := w.hook
	w.mu.Unlock()
	if hook != nil && wrote {
		hook(prev, se)
	}
	w.mu.Lock()
	if n := len(w.events); n > 0 && w.events[n-1].sh.Generation == se.sh.Generation {
		// The same publish: a held record's deletion, or a publish
		// written in several transactions.
		w.events[n-1] = se
	} else {
		w.events = append(w.events, se)
	}
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

func (w *watcher) setHook(h func(prev *schema.Shares, ev sharesEvent)) {
	w.mu.Lock()
	w.hook = h
	w.mu.Unlock()
}

func (w *watcher) all() []sharesEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.events)
}

func (w *watcher) deleted(id string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.deletes[id]
	return t, ok
}

// waitFor waits until cond holds for the newest shares record, and
// returns it.
func (w *watcher) waitFor(timeout time.Duration, what string, cond func(schema.Shares) bool) (sharesEvent, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		ch := w.changed
		var last sharesEvent
		ok := len(w.events) > 0
		if ok {
			last = w.events[len(w.events)-1]
		}
		w.mu.Unlock()
		if ok && cond(last.sh) {
			return last, nil
		}
		select {
		case <-ch:
		case <-deadline.C:
			return last, fmt.Errorf("no shares record with %s within %v (newest: generation %d, %v)", what, timeout, last.sh.Generation, last.sh.Shares)
		}
	}
}

// waitDeleted waits until instance id's key was deleted.
func (w *watcher) waitDeleted(id string, timeout time.Duration) (time.Time, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		t, ok := w.deletes[id]
		ch := w.changed
		w.mu.Unlock()
		if ok {
			return t, nil
		}
		select {
		case <-ch:
		case <-deadline.C:
			return time.Time{}, fmt.Errorf("%s's key not deleted within %v", id, timeout)
		}
	}
}

// checkGenerations checks that every shares record has a generation above
// the one before (no generation published twice, none going back), and
// that each adds up to at most its total.
func checkGenerations(t *testing.T, evs []sharesEvent) {
	t.Helper()
	for i, ev := range evs {
		var sum int64
		for _, v := range ev.sh.Shares {
			sum += v
		}
		if sum > ev.sh.Total {
			t.Errorf("generation %d: shares add up to %d > total %d", ev.sh.Generation, sum, ev.sh.Total)
		}
		if i > 0 && ev.sh.Generation <= evs[i-1].sh.Generation {
			t.Errorf("generation %d (by %s, revision %d) after generation %d (by %s, revision %d): conflicting generations",
				ev.sh.Generation, ev.sh.Leader, ev.rev, evs[i-1].sh.Generation, evs[i-1].sh.Leader, evs[i-1].rev)
		}
	}
}

// checkApplied checks that each instance applied generations in order and,
// for each, the share published for it in that generation (a conflicting
// generation would show as two shares for one generation).
func checkApplied(t *testing.T, evs []sharesEvent, insts ...*instance) {
	t.Helper()
	byGen := map[int64]schema.Shares{}
	for _, ev := range evs {
		byGen[ev.sh.Generation] = ev.sh
	}
	for _, in := range insts {
		last := int64(0)
		for _, a := range in.applies() {
			if a.source != "shares" || a.gen == 0 {
				continue
			}
			if a.gen < last {
				t.Errorf("%s applied generation %d after %d", in.id, a.gen, last)
			}
			last = a.gen
			if sh, ok := byGen[a.gen]; ok && sh.Shares[in.id] != a.share {
				t.Errorf("%s applied share %d for generation %d, which publishes %d for it", in.id, a.share, a.gen, sh.Shares[in.id])
			}
		}
	}
}

// describe prints a shares record briefly.
func describe(sh schema.Shares) string {
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(sh.Shares)) {
		p := fmt.Sprintf("%s:%d", id, sh.Shares[id])
		if g, ok := sh.Granted[id]; ok && g != sh.Shares[id] {
			p += fmt.Sprintf("(granted %d)", g)
		}
		parts = append(parts, p)
	}
	return fmt.Sprintf("gen %d by %s from %s: %s", sh.Generation, sh.Leader,
		sh.EffectiveTime().UTC().Format("15:04:05.000"), strings.Join(parts, " "))
}

// rig is what every scenario starts from: etcd in this process, a client,
// the stub, a watcher of the provider.
type rig struct {
	cli      *clientv3.Client
	endpoint string
	stub     *stub
	w        *watcher
	provider string
}

// rigOn is the rig on the etcd cfg describes. Its own client has the
// instances' and configd's reconnect backoff (cluster.DialOptions): with
// gRPC's default it would find etcd back up to 13 s after an outage, later
// than the processes it measures.
func rigOn(t *testing.T, provider string, cfg clientv3.Config) *rig {
	t.Helper()
	cfg.DialOptions = cluster.DialOptions()
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return &rig{cli: cli, endpoint: strings.Join(cfg.Endpoints, ","), stub: startStub(t), w: newWatcher(t, cli, provider), provider: provider}
}

// newRig is the rig on an etcd of one member, embedded in the test.
func newRig(t *testing.T, provider string) *rig {
	t.Helper()
	return rigOn(t, provider, etcdtest.Start(t).Config(t))
}

// startInstances starts instances 1..n against the rig's etcd and stub
// and waits until each has joined.
func (r *rig) startInstances(t *testing.T, n int) []*instance {
	t.Helper()
	insts := make([]*instance, n)
	for i := range insts {
		insts[i] = startInstance(t, r.endpoint, r.provider, r.stub.url(), i+1)
	}
	return insts
}

// settleEven is settle for the even split among insts: each has
// limit/len(insts) and has applied it.
func (r *rig) settleEven(t *testing.T, insts ...*instance) schema.Shares {
	t.Helper()
	ids := make([]string, len(insts))
	for i, in := range insts {
		ids[i] = in.id
	}
	return r.settle(t, len(insts), 30*time.Second, evenShares(ids...), insts...)
}

// published logs every shares record the rig saw, checks that their
// generations never conflict, and returns them.
func (r *rig) published(t *testing.T) []sharesEvent {
	t.Helper()
	evs := r.w.all()
	for _, ev := range evs {
		t.Logf("published: %s (seen %s)", describe(ev.sh), ev.seen.UTC().Format("15:04:05.000"))
	}
	checkGenerations(t, evs)
	return evs
}

// settle waits until the newest shares record has n instances (and cond,
// if given) and every instance in insts applied it, and until it is in
// force (its first window began).
func (r *rig) settle(t *testing.T, n int, timeout time.Duration, cond func(schema.Shares) bool, insts ...*instance) schema.Shares {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ev, err := r.w.waitFor(time.Until(deadline), fmt.Sprintf("%d instances", n), func(sh schema.Shares) bool {
			return sh.Instances == n && (cond == nil || cond(sh))
		})
		if err != nil {
			t.Fatal(err)
		}
		ok := true
		for _, in := range insts {
			if _, err := in.waitApplied(ev.sh.GenerationOf(in.id), time.Until(deadline)); err != nil {
				t.Fatal(err)
			}
		}
		evs := r.w.all()
		if evs[len(evs)-1].sh.Generation != ev.sh.Generation {
			ok = false // a newer publish came meanwhile
		}
		if ok {
			waitUntil(ev.sh.EffectiveTime())
			return ev.sh
		}
	}
}

// waitUntil sleeps until t: used only to wait for a window boundary that
// a record names, never as synchronisation between processes.
func waitUntil(t time.Time) { time.Sleep(time.Until(t)) }

// nextBoundary is the first window boundary after now plus d.
func nextBoundary(d time.Duration) time.Time {
	k := windowIndex(time.Now().Add(d)) + 1
	return time.Unix(0, k*int64(window))
}
