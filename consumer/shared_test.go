package consumer_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// sharedChildEnv, when set, makes the test binary run one consumer that
// joins a provider through etcd (sharedChildMain) instead of the tests.
const sharedChildEnv = "SLUICE_CONSUMER_TEST_SHARED_CHILD"

type sharedSpec struct {
	Brokers  []string
	Topic    string
	Group    string
	Etcd     []string
	Provider string
	ID       string
	Window   time.Duration
}

// sharedChildMain is one instance of the service: it joins the provider
// with cluster.Join, consumes the group through the Member's limiter and
// reports on stdout, one line each:
//
//	J <ns>                          about to join the provider
//	S <from ns> <share> <logged ns> a share applied (from the Member's log)
//	C <value> <ns>                  a handler call, timed as it starts
//	X <ns>                          Run returned: no handler call after this
//
// It stops (drain, commit, leave) when its stdin is closed.
func sharedChildMain() int {
	var spec sharedSpec
	if err := json.Unmarshal([]byte(os.Getenv(sharedChildEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "child: bad spec:", err)
		return 2
	}
	var mu sync.Mutex
	emit := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: spec.Etcd, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: etcd client:", err)
		return 2
	}
	defer cli.Close()
	emit("J %d", time.Now().UnixNano())
	m, err := cluster.Join(context.Background(), cli, spec.Provider, cluster.WithID(spec.ID),
		cluster.WithFallback(0, spec.Window), // fail-closed until the share is known, in the provider's window
		cluster.WithLogger(slog.New(shareLog{emit: emit})))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: join:", err)
		return 2
	}
	defer m.Close() // after Run: the lease goes only once no more calls are made
	c, err := consumer.New(consumer.Config{
		Brokers: spec.Brokers, Topic: spec.Topic, GroupID: spec.Group,
		Workers: 4, MaxInFlight: 16,
	}, m.Limiter(), func(ctx context.Context, msg kafka.Message) error {
		now := time.Now().UnixNano()
		emit("C %s %d", msg.Value, now)
		return nil
	}, consumer.WithReaderConfig(fastGroup))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	err = c.Run(ctx)
	emit("X %d", time.Now().UnixNano())
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: Run:", err)
		return 1
	}
	return 0
}

// shareLog turns the Member's "share applied" log records into S lines;
// the record's "from" is the window boundary from which the share is in
// force, and "share" the permits per window.
type shareLog struct{ emit func(string, ...any) }

func (h shareLog) Enabled(context.Context, slog.Level) bool { return true }
func (h shareLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h shareLog) WithGroup(string) slog.Handler            { return h }
func (h shareLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "share applied" {
		return nil
	}
	logged := time.Now().UnixNano()
	share, from := int64(-1), ""
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "share":
			if v, ok := a.Value.Any().(int64); ok {
				share = v
			}
		case "from":
			from = a.Value.String()
		}
		return true
	})
	at, err := time.Parse(time.RFC3339Nano, from)
	if err != nil || share < 0 {
		h.emit("E unreadable share record: share=%d from=%q", share, from)
		return nil
	}
	h.emit("S %d %d %d", at.UnixNano(), share, logged)
	return nil
}

// sharedChild is the parent's handle on one child process and what it
// reported; the report fields are read after done is closed.
type sharedChild struct {
	id     string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr strings.Builder
	done   chan struct{} // stdout read to the end and the process waited for

	waitErr, parseErr error
	joined, stopped   int64 // ns; stopped 0 if no X line
	steps             []shareStep
	calls             []int64 // ns of each handler call
}

type shareStep struct{ from, share int64 }

// shareAt returns the share in force in the window starting at ws: 0
// (the fail-closed fallback) before the first share applied.
func (c *sharedChild) shareAt(ws int64) int64 {
	s := int64(0)
	for _, st := range c.steps {
		if st.from <= ws {
			s = st.share
		}
	}
	return s
}

// handledTally counts distinct messages handled by all children together.
type handledTally struct {
	mu      sync.Mutex
	seen    map[string]int
	first   int // messages handled before reached closes
	n       int
	reached chan struct{}
	all     chan struct{}
}

func (h *handledTally) add(v string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen[v]++
	if h.seen[v] > 1 {
		return
	}
	switch len(h.seen) {
	case h.first:
		close(h.reached)
	case h.n:
		close(h.all)
	}
}

func startShared(t *testing.T, spec sharedSpec, tally *handledTally) *sharedChild {
	t.Helper()
	b, _ := json.Marshal(spec)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := &sharedChild{id: spec.ID, done: make(chan struct{})}
	c.cmd = exec.Command(self, "-test.run=^$")
	c.cmd.Env = append(os.Environ(), sharedChildEnv+"="+string(b))
	c.cmd.Stderr = &c.stderr
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		lines := bufio.NewScanner(out)
		var pending []shareStep
		for lines.Scan() {
			f := strings.Fields(lines.Text())
			ints := func(from int) []int64 {
				var v []int64
				for _, s := range f[from:] {
					x, err := strconv.ParseInt(s, 10, 64)
					if err != nil && c.parseErr == nil {
						c.parseErr = fmt.Errorf("line %q: %v", lines.Text(), err)
					}
					v = append(v, x)
				}
				return v
			}
			switch {
			case f[0] == "J" && len(f) == 2:
				c.joined = ints(1)[0]
			case f[0] == "X" && len(f) == 2:
				c.stopped = ints(1)[0]
			case f[0] == "C" && len(f) == 3:
				c.calls = append(c.calls, ints(2)[0])
				tally.add(f[1])
			case f[0] == "S" && len(f) == 4:
				v := ints(1)
				// SetLimit replaces a change not yet in force: drop the
				// steps still ahead when this one was applied.
				for len(pending) > 0 && pending[len(pending)-1].from > v[2] {
					pending = pending[:len(pending)-1]
				}
				pending = append(pending, shareStep{v[0], v[1]})
			default:
				if c.parseErr == nil {
					c.parseErr = fmt.Errorf("unexpected line %q", lines.Text())
				}
			}
		}
		c.steps = pending
		c.waitErr = c.cmd.Wait()
	}()
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	})
	return c
}

// stop closes the child's stdin (it drains, commits and leaves the
// provider) and waits for it to exit.
func (c *sharedChild) stop(t *testing.T) {
	t.Helper()
	_ = c.stdin.Close()
	waitFor(t, c.done, "child "+c.id+" to exit")
	if c.waitErr != nil || c.parseErr != nil || c.stopped == 0 {
		t.Fatalf("child %s: exit %v, report error %v, stopped line seen %v; stderr:\n%s",
			c.id, c.waitErr, c.parseErr, c.stopped != 0, c.stderr.String())
	}
}

// TestTwoProcessesShareOneDistributedLimit runs two consumer processes of
// one group, each joined to one provider through etcd (no configd: each
// holds total / live instances), and checks from what they report that
// their handler calls together stay within the provider's limit in every
// aligned window, and that every message was handled.
func TestTwoProcessesShareOneDistributedLimit(t *testing.T) {
	const (
		n, partitions = 1600, 4
		limit         = 20 // L: calls per window for both processes together
		window        = 100 * time.Millisecond
		// oneShare is what the documented degraded mode (package cluster,
		// "The even split without configd is a degraded mode") may add to
		// the total while a membership change propagates: one share, here
		// L / 2 for two instances.
		oneShare = limit / 2
	)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	provider := "kafka-shared"
	// A short fail_static: the even split holds a newcomer at nothing for
	// a hold (fail_static, the clock bound, a report interval) after it
	// registers, and the test runs for a few seconds.
	pc := schema.ProviderConfig{Name: provider, Limit: limit, Window: schema.Duration(window), FailStatic: schema.Duration(500 * time.Millisecond)}.WithDefaults()
	if err := pc.Validate(); err != nil {
		t.Fatal(err)
	}
	rec, err := schema.Encode(pc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(t.Context(), schema.DefaultKeys().Config(provider), string(rec)); err != nil {
		t.Fatal(err)
	}

	k := newKafka(t)
	topic, group := name(t, "topic"), name(t, "group")
	k.createTopic(t, topic, partitions)
	k.produce(t, topic, partitions, testMessages(n))

	tally := &handledTally{seen: map[string]int{}, first: n / 16, n: n, reached: make(chan struct{}), all: make(chan struct{})}
	spec := sharedSpec{Brokers: k.brokers, Topic: topic, Group: group, Etcd: srv.Endpoints(), Provider: provider, Window: window}
	// The first process runs alone (share L); the second joins mid-stream,
	// which changes both the group's partitions and the provider's split.
	spec.ID = "a"
	a := startShared(t, spec, tally)
	waitFor(t, tally.reached, "a sixteenth of the messages handled by the first process")
	spec.ID = "b"
	b := startShared(t, spec, tally)
	waitFor(t, tally.all, "every message handled")
	a.stop(t)
	b.stop(t)
	children := []*sharedChild{a, b}

	// At least once: every message handled by one process or the other.
	tally.mu.Lock()
	dups := 0
	for v := range n {
		switch c := tally.seen[strconv.Itoa(v)]; {
		case c == 0:
			t.Errorf("message %d never handled", v)
		case c > 1:
			dups += c - 1
		}
	}
	tally.mu.Unlock()
	for _, c := range children {
		if len(c.calls) == 0 {
			t.Fatalf("process %s made no call: the limit was not shared", c.id)
		}
		if len(c.steps) == 0 {
			t.Fatalf("process %s never applied a share", c.id)
		}
	}

	// Per aligned window: the calls of each process, and the share each
	// live process had in force (a process is live from its J line to its
	// X line; its share is 0, fail-closed, until its first one applies).
	w := int64(window)
	perWin := map[int64][]int{}
	lo, hi := int64(1<<62), int64(0)
	for i, c := range children {
		for _, at := range c.calls {
			win := at / w
			if perWin[win] == nil {
				perWin[win] = make([]int, len(children))
			}
			perWin[win][i]++
			lo, hi = min(lo, win), max(hi, win)
		}
	}
	changing, both, worst, worstChanging := 0, 0, 0, 0
	for win := lo; win <= hi; win++ {
		ws := win * w
		calls := perWin[win]
		if calls == nil {
			calls = make([]int, len(children))
		}
		total := 0
		var live []int64
		for i, c := range children {
			share := c.shareAt(ws)
			if calls[i] > int(share) {
				t.Errorf("window %d: process %s made %d calls with a share of %d in force", win-lo, c.id, calls[i], share)
			}
			if c.joined < ws+w && c.stopped >= ws {
				live = append(live, share)
			}
			total += calls[i]
		}
		// The membership is changing in this window when the live
		// processes' shares disagree: one has applied the split for the new
		// instance count and the other not yet (a joining process holds 0
		// until its first share). Only in such windows does the documented
		// degraded mode allow one share above the limit; in every other
		// window the bound is the limit itself.
		inChange := false
		for _, s := range live {
			inChange = inChange || s != live[0]
		}
		bound := limit
		if inChange {
			bound = limit + oneShare
			changing++
			worstChanging = max(worstChanging, total)
		} else {
			worst = max(worst, total)
		}
		if total > bound {
			t.Errorf("window %d: %d calls in all, bound %d (membership changing: %v; calls per process %v)", win-lo, total, bound, inChange, calls)
		}
		if !inChange && calls[0] > 0 && calls[1] > 0 {
			both++
		}
	}
	// The split was really exercised: some settled windows had calls from
	// both processes.
	if both == 0 {
		t.Errorf("no window outside a membership change had calls from both processes")
	}
	t.Logf("%d windows: most calls in a settled window %d (limit %d); %d window(s) while membership changed, most calls there %d (bound %d); %d with both processes calling; %d duplicate calls; calls a=%d b=%d",
		hi-lo+1, worst, limit, changing, worstChanging, limit+oneShare, both, dups, len(a.calls), len(b.calls))
}
