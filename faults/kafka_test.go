package faults

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/limiter"
)

// The Kafka scenarios run the consumer package (in-process consumers of
// one group, sharing one limiter of limit permits per aligned window)
// against a Kafka-protocol broker: an in-process kfake, or the Kafka named
// by KAFKA_BROKERS (comma-separated host:port), as the consumer package's
// tests do. A producer writes numbered messages; a ledger records every
// message acknowledged, every permit granted, every handler call and every
// offset handled, and the scenarios check that no acknowledged message is
// lost, count duplicates, check that the group's committed offsets never
// pass what was handled, and that no aligned window got more permits than
// the limit.

// ---- broker ----

// kafkaBroker is a Kafka-protocol cluster for one scenario.
type kafkaBroker struct {
	brokers   []string
	transport *kafka.Transport
	client    *kafka.Client

	// kfake only: it persists its log, groups and offsets in dir, so that
	// a cluster started again on dir and port is the same broker restarted.
	t       *testing.T
	dir     string
	port    int
	mu      sync.Mutex
	fake    *kfake.Cluster                  // nil while stopped
	commits func(*kmsg.OffsetCommitRequest) // see observeCommits
}

var kafkaNameSeq atomic.Int64

// kafkaName returns a topic or group name unique to this run.
func kafkaName(t *testing.T, what string) string {
	return fmt.Sprintf("%s-%s-%d-%d", t.Name(), what, os.Getpid(), kafkaNameSeq.Add(1))
}

// newKafka returns the brokers of KAFKA_BROKERS if set and allowExternal,
// else an in-process kfake with one broker on a loopback port, persisting
// to a temporary directory.
func newKafka(t *testing.T, allowExternal bool) *kafkaBroker {
	t.Helper()
	k := &kafkaBroker{t: t, transport: &kafka.Transport{}}
	t.Cleanup(k.transport.CloseIdleConnections)
	if env := os.Getenv("KAFKA_BROKERS"); env != "" && allowExternal {
		k.brokers = strings.Split(env, ",")
	} else {
		k.dir = t.TempDir()
		if err := k.start(0); err != nil {
			t.Fatalf("starting kfake: %v", err)
		}
		t.Cleanup(k.stop)
		addr := k.fake.ListenAddrs()[0]
		_, p, _ := net.SplitHostPort(addr)
		k.port, _ = strconv.Atoi(p)
		k.brokers = []string{addr}
	}
	k.client = &kafka.Client{Addr: kafka.TCP(k.brokers...), Transport: k.transport, Timeout: 5 * time.Second}
	return k
}

func (k *kafkaBroker) start(port int) error {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.DataDir(k.dir),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		return err
	}
	k.mu.Lock()
	k.fake = c
	if k.commits != nil {
		observe(c, k.commits)
	}
	k.mu.Unlock()
	return nil
}

// observeCommits calls fn with every offset commit request the broker
// receives, before it handles it, from now on, restarts included (kfake
// only).
func (k *kafkaBroker) observeCommits(fn func(*kmsg.OffsetCommitRequest)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.commits = fn
	if k.fake != nil {
		observe(k.fake, fn)
	}
}

func observe(c *kfake.Cluster, fn func(*kmsg.OffsetCommitRequest)) {
	c.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		fn(req.(*kmsg.OffsetCommitRequest))
		return nil, nil, false // observed, then handled by the broker as usual
	})
}

// stop closes the broker: its listener and every connection close, and it
// saves its state to its data dir. It is idempotent.
func (k *kafkaBroker) stop() {
	k.mu.Lock()
	c := k.fake
	k.fake = nil
	k.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// restart starts the broker again on its data dir and port.
func (k *kafkaBroker) restart() {
	k.t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		if err = k.start(k.port); err == nil {
			return
		}
		if !strings.Contains(err.Error(), "address already in use") || time.Now().After(deadline) {
			k.t.Fatalf("restarting kfake on port %d: %v", k.port, err)
		}
		time.Sleep(50 * time.Millisecond) // the port is not free again yet
	}
}

func (k *kafkaBroker) createTopic(t *testing.T, topic string, partitions int) {
	t.Helper()
	res, err := k.client.CreateTopics(t.Context(), &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}},
	})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
}

// committed returns the group's committed offset of each partition (-1:
// none).
func (k *kafkaBroker) committed(ctx context.Context, group, topic string, partitions int) (map[int]int64, error) {
	ps := make([]int, partitions)
	for i := range ps {
		ps[i] = i
	}
	res, err := k.client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ps}})
	if err != nil {
		return nil, err
	}
	if res.Error != nil {
		return nil, res.Error
	}
	out := map[int]int64{}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("partition %d: %w", p.Partition, p.Error)
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out, nil
}

// fastGroup makes group membership quick, as in the consumer package's
// tests.
func fastGroup(rc *kafka.ReaderConfig) {
	rc.HeartbeatInterval = 100 * time.Millisecond
	rc.SessionTimeout = time.Second
	rc.RebalanceTimeout = 2 * time.Second
	rc.JoinGroupBackoff = 100 * time.Millisecond
	rc.MaxWait = 100 * time.Millisecond
	rc.ReadBackoffMin = 10 * time.Millisecond
	rc.ReadBackoffMax = 100 * time.Millisecond
}

// ---- ledger ----

type partOffset struct {
	partition int
	offset    int64
}

// ledger is what the scenario knows: messages acknowledged to the
// producer, permits granted, handler calls, offsets handled.
type ledger struct {
	mu       sync.Mutex
	acked    map[int]bool           // message number → acknowledged by the broker
	handled  map[int]int            // message number → handler calls
	first    map[int]time.Time      // message number → its first handler call
	at       map[int][]partOffset   // message number → where it was handled from
	offsets  map[int]map[int64]bool // partition → offsets handled
	calls    []call                 // granted (Unix ns, by the limiter) or recv (handler call)
	dupAt    []time.Time            // when each call beyond a message's first was made
	changed  chan struct{}
	verified map[int]int64 // partition → offsets below it all handled
}

func newLedger() *ledger {
	return &ledger{acked: map[int]bool{}, handled: map[int]int{}, first: map[int]time.Time{}, at: map[int][]partOffset{},
		offsets: map[int]map[int64]bool{}, changed: make(chan struct{}), verified: map[int]int64{}}
}

func (l *ledger) notifyLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *ledger) ack(seqs []int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range seqs {
		l.acked[s] = true
	}
	l.notifyLocked()
}

func (l *ledger) granted(inst int, n int64, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for range n {
		l.calls = append(l.calls, call{granted: at.UnixNano(), inst: inst})
	}
}

// handle records one handler call; it is the handler's last act, so a
// message whose offset is committed has been recorded here.
func (l *ledger) handle(inst int, m kafka.Message) {
	now := time.Now()
	seq, _ := strconv.Atoi(string(m.Value))
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, call{recv: now.UnixNano(), inst: inst})
	if l.offsets[m.Partition] == nil {
		l.offsets[m.Partition] = map[int64]bool{}
	}
	l.offsets[m.Partition][m.Offset] = true
	l.handled[seq]++
	if l.handled[seq] == 1 {
		l.first[seq] = now
	} else {
		l.dupAt = append(l.dupAt, now)
	}
	if !slices.Contains(l.at[seq], partOffset{m.Partition, m.Offset}) {
		l.at[seq] = append(l.at[seq], partOffset{m.Partition, m.Offset})
	}
	l.notifyLocked()
}

// ackedCount returns how many messages were acknowledged.
func (l *ledger) ackedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// unhandled returns the acknowledged messages not handled (yet), in order.
func (l *ledger) unhandled() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []int
	for s := range l.acked {
		if l.handled[s] == 0 {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// waitDone waits until every message of seqs was handled, and returns when
// the last of them first was (the zero time if seqs is empty).
func (l *ledger) waitDone(seqs []int, timeout time.Duration) (time.Time, error) {
	var last time.Time
	err := l.wait(timeout, fmt.Sprintf("handling of all %d messages", len(seqs)), func() bool {
		last = time.Time{}
		for _, s := range seqs {
			at, ok := l.first[s]
			if !ok {
				return false
			}
			if at.After(last) {
				last = at
			}
		}
		return true
	})
	return last, err
}

// waitAll waits until every acknowledged message was handled (the producer
// has stopped), and returns when the last of them first was.
func (l *ledger) waitAll(timeout time.Duration) (time.Time, error) {
	l.mu.Lock()
	seqs := slices.Collect(maps.Keys(l.acked))
	l.mu.Unlock()
	return l.waitDone(seqs, timeout)
}

// checkCommitted checks that every offset below each committed offset was
// handled; it returns a description of the first that was not.
func (l *ledger) checkCommitted(committed map[int]int64) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for p, c := range committed {
		for off := l.verified[p]; off < c; off++ {
			if !l.offsets[p][off] {
				return fmt.Sprintf("partition %d committed at %d, but offset %d was never handled", p, c, off)
			}
			l.verified[p] = off + 1
		}
	}
	return ""
}

// ends returns, per partition, one past the highest offset handled.
func (l *ledger) ends() map[int]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[int]int64{}
	for p, offs := range l.offsets {
		for off := range offs {
			out[p] = max(out[p], off+1)
		}
	}
	return out
}

// totals returns the figures of the run: messages acknowledged, handler
// calls, duplicate calls (calls beyond the first of each message), messages
// handled more than once, messages found at more than one offset (written
// twice by a producer retry), and permits granted.
func (l *ledger) totals() (acked, calls, dups, dupMsgs, twiceInLog, grants int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.handled {
		calls += n
		if n > 1 {
			dups += n - 1
			dupMsgs++
		}
	}
	for _, at := range l.at {
		if len(at) > 1 {
			twiceInLog++
		}
	}
	for _, c := range l.calls {
		if c.granted != 0 {
			grants++
		}
	}
	return len(l.acked), calls, dups, dupMsgs, twiceInLog, grants
}

// dupsBetween counts the calls beyond a message's first made in [from, to).
func (l *ledger) dupsBetween(from, to time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, at := range l.dupAt {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// snapshotCalls returns the permits and handler calls so far.
func (l *ledger) snapshotCalls() []call {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// wait waits until cond holds (it is called with l.mu held).
func (l *ledger) wait(timeout time.Duration, what string, cond func() bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		ok, ch := cond(), l.changed
		l.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-deadline.C:
			return fmt.Errorf("no %s within %v", what, timeout)
		}
	}
}

// waitHandled waits until n distinct messages were handled.
func (l *ledger) waitHandled(n int, timeout time.Duration) error {
	return l.wait(timeout, fmt.Sprintf("%d messages handled", n), func() bool { return len(l.handled) >= n })
}

// waitCallAfter waits for a handler call at or after t and returns its
// time.
func (l *ledger) waitCallAfter(t time.Time, timeout time.Duration) (time.Time, error) {
	var first int64
	err := l.wait(timeout, "handler call", func() bool {
		for _, c := range l.calls {
			if c.recv >= t.UnixNano() && (first == 0 || c.recv < first) {
				first = c.recv
			}
		}
		return first != 0
	})
	return time.Unix(0, first), err
}

// handledBy counts the handler calls of consumer inst.
func (l *ledger) handledBy(inst int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.calls {
		if c.recv != 0 && c.inst == inst {
			n++
		}
	}
	return n
}

// last is the last window of the tally.
func (tl tally) last() int64 { return tl.first + int64(len(tl.arrived)) - 1 }

// checkKafkaWindows logs the permits and calls per aligned window while
// the consumers ran and fails the test for every window in which the
// shared limiter granted more than the limit.
func checkKafkaWindows(t *testing.T, l *ledger, name string) tally {
	t.Helper()
	cs := l.snapshotCalls()
	from, to := int64(1<<62), int64(0)
	for _, c := range cs {
		if c.granted != 0 {
			from, to = min(from, c.granted/int64(window)), max(to, c.granted/int64(window))
		}
	}
	if from > to {
		t.Fatal("no permit granted")
	}
	tl := count(cs, from, to)
	logWindows(t, tl, name)
	for _, k := range tl.over(limit) {
		t.Errorf("window over the limit: %s", tl.row(k))
	}
	return tl
}

// ---- limiter ----

// spy is one consumer's view of the shared limiter: it records every
// permit granted, at the moment AcquireN returns (as the instances of the
// other scenarios time their grants).
type spy struct {
	inner *limiter.Limiter
	l     *ledger
	inst  int
}

func (s spy) AcquireN(ctx context.Context, n int64, maxWait time.Duration) error {
	err := s.inner.AcquireN(ctx, n, maxWait)
	if err == nil {
		s.l.granted(s.inst, n, time.Now())
	}
	return err
}

func (s spy) Backoff(d time.Duration) { s.inner.Backoff(d) }

// ---- producer ----

// producer writes numbered messages (the value is the number) at a steady
// rate, each batch again until the broker acknowledges it.
type producer struct {
	w        *kafka.Writer
	l        *ledger
	next     int
	failures int // write attempts that failed
	cancel   context.CancelFunc
	done     chan struct{} // closed when run's goroutine returns
}

func newProducer(t *testing.T, k *kafkaBroker, topic string, l *ledger) *producer {
	p := &producer{
		w: &kafka.Writer{
			Addr:            kafka.TCP(k.brokers...),
			Topic:           topic,
			Transport:       k.transport,
			Balancer:        &kafka.RoundRobin{},
			BatchSize:       200,
			BatchTimeout:    2 * time.Millisecond,
			RequiredAcks:    kafka.RequireAll,
			MaxAttempts:     3,
			WriteBackoffMin: 50 * time.Millisecond,
			WriteBackoffMax: 500 * time.Millisecond,
		},
		l: l,
	}
	t.Cleanup(func() {
		p.stop()
		p.w.Close()
	})
	return p
}

// write writes n new messages, again and again until they are
// acknowledged or ctx ends.
func (p *producer) write(ctx context.Context, n int) error {
	msgs := make([]kafka.Message, n)
	seqs := make([]int, n)
	for i := range msgs {
		seqs[i] = p.next
		msgs[i] = kafka.Message{Key: fmt.Appendf(nil, "k%d", p.next), Value: fmt.Appendf(nil, "%d", p.next)}
		p.next++
	}
	for {
		err := p.w.WriteMessages(ctx, msgs...)
		if err == nil {
			p.l.ack(seqs)
			return nil
		}
		p.failures++
		if ctx.Err() != nil {
			return err
		}
		select { // the writer backed off already; pause before the next round
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// run writes rate messages per second, in batches every 100 ms, until stop.
// A batch that takes longer (the broker is down) delays the next ones; the
// ticks missed meanwhile are not made up.
func (p *producer) run(rate int) { p.runTo(rate, 0) }

// runTo is run that stops by itself (closing p.done) once total messages
// were written in all, the backlog included; 0 means no bound.
func (p *producer) runTo(rate, total int) {
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel, p.done = cancel, make(chan struct{})
	go func() {
		defer close(p.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return
			}
			n := rate / 10
			if total > 0 {
				if n = min(n, total-p.next); n <= 0 {
					return
				}
			}
			if p.write(ctx, n) != nil {
				return
			}
		}
	}()
}

// stop stops run and waits for it; a batch being written is abandoned (its
// messages are not counted as acknowledged). It is idempotent.
func (p *producer) stop() {
	if p.cancel != nil {
		p.cancel()
		<-p.done
	}
}

// ---- consumers ----

// cutDialer is a consumer's connection to Kafka, which cut closes and
// refuses from then on: the consumer crashes, as the broker sees it (no
// LeaveGroup, no commit).
type cutDialer struct {
	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
}

func (d *cutDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cut {
		return nil, errors.New("faults: consumer crashed")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		d.conns[c] = true
	}
	return c, err
}

func (d *cutDialer) cutAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cut = true
	for c := range d.conns {
		c.Close()
	}
}

// member is one in-process consumer of the group.
type member struct {
	inst   int
	c      *consumer.Consumer
	d      *cutDialer
	cancel context.CancelFunc
	abort  chan struct{}
	done   chan struct{}
	err    error
}

// startMember runs a consumer of topic in group, handling each message by
// recording it in l, with a permit of lim per call.
func startMember(t *testing.T, k *kafkaBroker, topic, group string, lim *limiter.Limiter, l *ledger, inst int) *member {
	t.Helper()
	m := &member{inst: inst, d: &cutDialer{conns: map[net.Conn]bool{}}, abort: make(chan struct{}), done: make(chan struct{})}
	c, err := consumer.New(consumer.Config{
		Brokers: k.brokers, Topic: topic, GroupID: group,
		Workers: 4, MaxInFlight: 64, DrainTimeout: 3 * time.Second,
	}, spy{inner: lim, l: l, inst: inst}, func(ctx context.Context, msg kafka.Message) error {
		l.handle(inst, msg)
		return nil
	}, consumer.WithReaderConfig(func(rc *kafka.ReaderConfig) {
		fastGroup(rc)
		rc.Dialer = &kafka.Dialer{Timeout: 5 * time.Second, DialFunc: m.d.dial}
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.c, m.cancel = c, cancel
	go func() {
		defer close(m.done)
		m.err = c.RunWithAbort(ctx, m.abort)
	}()
	t.Cleanup(func() {
		m.crash()
		m.wait(t)
	})
	return m
}

// leave stops the consumer gracefully (drain, commit, leave the group)
// without waiting.
func (m *member) leave() { m.cancel() }

// crash cuts the consumer's connections and abandons its work: no commit,
// no LeaveGroup reaches the broker. It is idempotent.
func (m *member) crash() {
	m.d.cutAll()
	m.cancel()
	select {
	case <-m.abort:
	default:
		close(m.abort)
	}
}

// wait waits for Run to return.
func (m *member) wait(t *testing.T) {
	t.Helper()
	select {
	case <-m.done:
	case <-time.After(60 * time.Second):
		t.Errorf("consumer %d: Run did not return within 60s of its stop", m.inst)
	}
}

// ---- committed offsets ----

// commitWatch reads the group's committed offsets every 100 ms while the
// scenario runs and checks each reading against the ledger: an offset
// committed must have been handled, with every offset before it.
type commitWatch struct {
	mu         sync.Mutex
	reads      int
	failed     int // reads that failed (the broker was down, say)
	violations []string
	back       int      // readings in which a partition's committed offset went back
	backs      []string // the first of them
	stopc      chan struct{}
	done       chan struct{}
}

func watchCommits(t *testing.T, k *kafkaBroker, l *ledger, group, topic string, partitions int) *commitWatch {
	w := &commitWatch{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		last := map[int]int64{}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
			case <-w.stopc:
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			cm, err := k.committed(ctx, group, topic, partitions)
			cancel()
			w.mu.Lock()
			w.reads++
			if err != nil {
				w.failed++
				w.mu.Unlock()
				continue
			}
			if v := l.checkCommitted(cm); v != "" && len(w.violations) < 10 {
				w.violations = append(w.violations, v)
			}
			for p, c := range cm {
				if prev, ok := last[p]; ok && c < prev {
					if w.back++; len(w.backs) < 5 {
						w.backs = append(w.backs, fmt.Sprintf("%s p%d %d→%d", time.Now().UTC().Format("15:04:05.000"), p, prev, c))
					}
				}
				last[p] = c
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(w.stop)
	return w
}

func (w *commitWatch) stop() {
	select {
	case <-w.stopc:
	default:
		close(w.stopc)
	}
	<-w.done
}

// report stops the watch, fails the test for every violation and logs the
// figures.
func (w *commitWatch) report(t *testing.T) {
	t.Helper()
	w.stop()
	for _, v := range w.violations {
		t.Errorf("committed offset beyond what was handled: %s", v)
	}
	t.Logf("invariant: committed offsets never beyond what was handled: %d readings of the group's offsets every 100 ms (%d failed, the broker unreachable), %d violations; a partition's committed offset went back in %d readings (a commit of a partition that moved: more duplicates, never a loss)",
		w.reads, w.failed, len(w.violations), w.back)
	if w.back > 0 {
		t.Logf("committed offsets that went back (first %d): %s", len(w.backs), strings.Join(w.backs, ", "))
	}
}

// checkDelivery fails the test for every acknowledged message never
// handled and logs the delivery figures.
func checkDelivery(t *testing.T, l *ledger) {
	t.Helper()
	lost := l.unhandled()
	if len(lost) > 0 {
		t.Errorf("%d acknowledged messages never handled (first: %v)", len(lost), lost[:min(len(lost), 10)])
	}
	acked, calls, dups, dupMsgs, twice, grants := l.totals()
	t.Logf("invariant: every acknowledged message handled at least once: %d acknowledged, %d lost; %d handler calls (%d permits granted); duplicates (at-least-once): %d calls beyond the first, on %d messages (%.1f%% of the messages); %d messages in the log twice (a producer retry)",
		acked, len(lost), calls, grants, dups, dupMsgs, 100*float64(dupMsgs)/float64(max(acked, 1)), twice)
}

// logFinalCommits logs each partition's committed offset after the
// consumers stopped gracefully, against the end of what was handled.
func logFinalCommits(t *testing.T, k *kafkaBroker, l *ledger, group, topic string, partitions int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cm, err := k.committed(ctx, group, topic, partitions)
	if err != nil {
		t.Errorf("reading the committed offsets: %v", err)
		return
	}
	if v := l.checkCommitted(cm); v != "" {
		t.Errorf("committed offset beyond what was handled, at the end: %s", v)
	}
	ends := l.ends()
	var parts []string
	behind := int64(0)
	for p := range partitions {
		parts = append(parts, fmt.Sprintf("p%d %d/%d", p, cm[p], ends[p]))
		behind += ends[p] - max(cm[p], 0)
	}
	t.Logf("committed at the end (committed/handled end): %s; %d handled messages left uncommitted (re-delivered to the group's next consumer)", strings.Join(parts, " "), behind)
}

// ---- scenarios ----

// brokerDown is how long the broker stays down.
const brokerDown = 5 * time.Second

// kafkaScenario sets up what both Kafka scenarios start from: a topic of
// partitions, a group name, the ledger of what was produced and handled,
// the limiter every consumer shares, a producer that has written a backlog
// of backlog acknowledged messages, and the watch of the group's commits.
func kafkaScenario(t *testing.T, k *kafkaBroker, partitions, backlog int) (topic, group string, l *ledger, lim *limiter.Limiter, p *producer, cw *commitWatch) {
	t.Helper()
	topic, group = kafkaName(t, "topic"), kafkaName(t, "group")
	k.createTopic(t, topic, partitions)
	l = newLedger()
	lim, err := limiter.New(limit, window)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	p = newProducer(t, k, topic, l)
	if err := p.write(t.Context(), backlog); err != nil {
		t.Fatalf("producing the backlog: %v", err)
	}
	return topic, group, l, lim, p, watchCommits(t, k, l, group, topic, partitions)
}

// TestKafkaBrokerRestart: two consumers of one group share a limiter of
// limit permits per aligned window; a producer writes a backlog, then 200
// messages per second. Mid-stream the broker (kfake, one node) is stopped
// and, 5 s later, started again on the same port and data dir, which keeps
// its log, groups and committed offsets: a real restart. No acknowledged
// message may be lost, the committed offsets never pass what was handled,
// no window gets more permits than the limit; duplicates are counted.
func TestKafkaBrokerRestart(t *testing.T) {
	k := newKafka(t, false)
	if os.Getenv("KAFKA_BROKERS") != "" {
		t.Logf("KAFKA_BROKERS is set, but the test cannot restart an external Kafka: this scenario runs its own kfake")
	}
	const partitions = 4
	topic, group, l, lim, p, cw := kafkaScenario(t, k, partitions, 3*limit)
	members := []*member{
		startMember(t, k, topic, group, lim, l, 1),
		startMember(t, k, topic, group, lim, l, 2),
	}
	p.run(200)
	if err := l.waitHandled(limit, 30*time.Second); err != nil {
		t.Fatalf("the consumers did not start: %v", err)
	}
	waitUntil(nextBoundary(2 * window).Add(300 * time.Millisecond))

	down := time.Now()
	k.stop()
	stopped := time.Now()
	t.Logf("injected: the Kafka broker (kfake, one node, %s) stopped at %s for %v — method: a real restart: kfake.Close (listener and every connection closed, state saved to its data dir), then a new kfake on the same port and data dir (kfake.Ports, kfake.DataDir), which reloads the log, the groups and the committed offsets; no proxy",
		k.brokers[0], down.UTC().Format("15:04:05.000"), brokerDown)
	waitUntil(down.Add(brokerDown))
	k.restart()
	up := time.Now()
	pending := l.unhandled()
	t.Logf("injected: broker restarted after %v down (stop took %v); %d acknowledged messages not handled yet", up.Sub(down).Round(time.Millisecond), stopped.Sub(down).Round(time.Millisecond), len(pending))
	firstAfter, err := l.waitCallAfter(up, 30*time.Second)
	if err != nil {
		t.Fatalf("no message handled after the restart: %v", err)
	}
	caughtUp, err := l.waitDone(pending, 60*time.Second)
	if err != nil {
		t.Fatalf("not recovered: %v", err)
	}
	waitUntil(up.Add(3 * time.Second))
	p.stop()
	stoppedProducing := time.Now()
	last, err := l.waitAll(60 * time.Second)
	if err != nil {
		t.Fatalf("not recovered: %v", err)
	}
	for _, m := range members {
		m.leave()
	}
	for _, m := range members {
		m.wait(t)
		if m.err != nil {
			t.Errorf("consumer %d: Run: %v", m.inst, m.err)
		}
	}
	cw.report(t)
	logFinalCommits(t, k, l, group, topic, partitions)
	checkDelivery(t, l)
	tl := checkKafkaWindows(t, l, "whole run, restart included")
	for w := windowIndex(down) - 1; w <= min(windowIndex(caughtUp), tl.last()); w++ {
		t.Logf("around the outage: %s", tl.row(w))
	}
	t.Logf("producer: %d write attempts failed while the broker was down (each batch retried until acknowledged)", p.failures)
	t.Logf("recovery: first message handled %v after the restart; the %d messages acknowledged and not handled at the restart all handled %v after it; the producer went on for %v, and the last of every acknowledged message was first handled %v after the restart",
		firstAfter.Sub(up).Round(time.Millisecond), len(pending), caughtUp.Sub(up).Round(time.Millisecond),
		stoppedProducing.Sub(up).Round(time.Millisecond), last.Sub(up).Round(time.Millisecond))
}

// stormEvery, stormLife and stormJoins shape the rebalance storm: a
// consumer joins every stormEvery and leaves stormLife later.
const (
	stormEvery = 500 * time.Millisecond
	stormLife  = 1500 * time.Millisecond
	stormJoins = 20
)

// TestKafkaRebalanceStorm: one consumer of a group runs throughout while
// 20 more join, one every 500 ms over 10 s, each living 1.5 s; every other
// one leaves gracefully (drain, commit, LeaveGroup), the rest crash (their
// connections cut: no commit, no LeaveGroup; the group expels them after
// the session timeout). All share one limiter of limit permits per aligned
// window, while a producer writes a backlog of two windows' worth, then
// limit messages per second until the storm ends. No acknowledged
// message may be lost, the committed offsets never pass what was handled,
// no window gets more permits than the limit; duplicates are counted.
func TestKafkaRebalanceStorm(t *testing.T) {
	k := newKafka(t, true)
	const partitions = 6
	topic, group, l, lim, p, cw := kafkaScenario(t, k, partitions, 2*limit)
	steady := startMember(t, k, topic, group, lim, l, 1)
	p.run(limit)
	if err := l.waitHandled(limit/2, 30*time.Second); err != nil {
		t.Fatalf("the consumer did not start: %v", err)
	}
	waitUntil(nextBoundary(window))

	type shortLived struct {
		m     *member
		start time.Time
		gone  bool
	}
	var storm []*shortLived
	began := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	graceful, crashed := 0, 0
	for left := stormJoins; left > 0; <-tick.C {
		now := time.Now()
		if len(storm) < stormJoins && !now.Before(began.Add(time.Duration(len(storm))*stormEvery)) {
			storm = append(storm, &shortLived{m: startMember(t, k, topic, group, lim, l, 10+len(storm)), start: now})
		}
		for i, s := range storm {
			if s.gone || now.Before(s.start.Add(stormLife)) {
				continue
			}
			s.gone = true
			if i%2 == 0 {
				s.m.leave()
				graceful++
			} else {
				s.m.crash()
				crashed++
			}
			left--
		}
	}
	ended := time.Now()
	active := 0
	for _, s := range storm {
		if l.handledBy(s.m.inst) > 0 {
			active++
		}
	}
	t.Logf("injected: rebalance storm — %d more consumers joined the group, one every %v, each living %v, %v from the first join to the last leave (in-process consumer.Run, one group, one shared limiter); %d left gracefully (drain, commit, LeaveGroup), %d crashed (connections cut, work abandoned: no commit, no LeaveGroup; session timeout 1s); %d of them handled messages; one consumer ran throughout",
		stormJoins, stormEvery, stormLife, ended.Sub(began).Round(time.Millisecond), graceful, crashed, active)
	if active < stormJoins/4 {
		t.Errorf("only %d of %d short-lived consumers handled a message: the storm did not happen", active, stormJoins)
	}
	p.stop()
	pending := l.unhandled()
	last, err := l.waitAll(60 * time.Second)
	if err != nil {
		t.Fatalf("not recovered: %v", err)
	}
	steady.leave()
	steady.wait(t)
	for _, s := range storm {
		s.m.wait(t)
	}
	if steady.err != nil {
		t.Errorf("steady consumer: Run: %v", steady.err)
	}
	cw.report(t)
	logFinalCommits(t, k, l, group, topic, partitions)
	checkDelivery(t, l)
	tl := checkKafkaWindows(t, l, "whole run, storm included")
	for w := windowIndex(began); w <= min(windowIndex(ended)+1, tl.last()); w++ {
		t.Logf("during the storm: %s", tl.row(w))
	}
	t.Logf("recovery: when the storm ended (the producer stopped with it, %d write attempts failed) %d acknowledged messages were not handled yet; every acknowledged message handled %v after the storm ended",
		p.failures, len(pending), last.Sub(ended).Round(time.Millisecond))
}
