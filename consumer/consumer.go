package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/limiter"
)

// Limiter is what a Consumer needs from a rate limiter: one permit per
// handler call, and a way to pass on a provider's "retry after".
// *limiter.Limiter implements it.
type Limiter interface {
	// AcquireN returns nil when n permits are granted. When they cannot
	// be had within maxWait it returns an error matching
	// limiter.ErrTimeout at once; when ctx ends it returns ctx's error.
	AcquireN(ctx context.Context, n int64, maxWait time.Duration) error
	// Backoff grants no permit before now+d.
	Backoff(d time.Duration)
}

// Handler makes the outbound call for one message. A nil error means the
// message is done: its offset may be committed. An error makes the consumer
// retry the message (with backoff, up to Config.MaxAttempts calls), then
// send it to the dead-letter topic; return RetryAfter when the provider
// asked to slow down, Permanent when retrying cannot help.
//
// ctx is cancelled when the consumer abandons in-flight work (drain
// deadline passed, or the grace after its partition was revoked: see Run);
// it is not cancelled merely because Run's context is. Handlers run on several goroutines at once (Config.Workers).
// A message may be handled more than once (at-least-once delivery): make
// handlers idempotent. A panic in the handler is recovered and counts as a
// failed attempt.
type Handler func(ctx context.Context, msg kafka.Message) error

// Headers added to a dead letter, after the original headers. Every header
// name that starts with HeaderPrefix is the consumer's, and each appears
// once: an original header named so is kept, renamed with
// RenamedHeaderPrefix (see HeaderPrefix), so that a reader taking the first
// — or the last — header of a name reads the consumer's.
const (
	HeaderError     = "sluice-error"     // the last handler error's text
	HeaderAttempts  = "sluice-attempts"  // handler calls made, decimal
	HeaderTopic     = "sluice-topic"     // the original topic
	HeaderPartition = "sluice-partition" // the original partition, decimal
	HeaderOffset    = "sluice-offset"    // the original offset, decimal

	// Added only to a dead letter that was too large for the broker as a
	// whole, and written without part of the message (see deadLetter);
	// the topic, partition and offset headers say where to re-read the
	// original from. Each holds what was left out, decimal.
	HeaderErrorTruncated = "sluice-error-truncated" // HeaderError holds only the start of the error text; its full length in bytes
	HeaderValueDropped   = "sluice-value-dropped"   // the value is left out; its length in bytes
	HeaderKeyDropped     = "sluice-key-dropped"     // the key is left out; its length in bytes
	HeaderHeadersDropped = "sluice-headers-dropped" // the original headers are left out; how many there were
)

// HeaderPrefix starts the name of every header the consumer adds to a dead
// letter; the name is matched without regard to case. An original header
// whose name starts with it, after any number of RenamedHeaderPrefix —
// a message dead-lettered before, or one that tries to pass for a dead
// letter — is kept, in its place, with RenamedHeaderPrefix put in front:
// "sluice-error" becomes "original-sluice-error", and that one, on a
// second trip to a dead-letter topic, "original-original-sluice-error".
const (
	HeaderPrefix        = "sluice-"
	RenamedHeaderPrefix = "original-"
)

// renamed returns the name under which an original header named k is kept
// in a dead letter.
func renamed(k string) string {
	s := k
	for hasPrefixFold(s, RenamedHeaderPrefix) {
		s = s[len(RenamedHeaderPrefix):]
	}
	if hasPrefixFold(s, HeaderPrefix) {
		return RenamedHeaderPrefix + k
	}
	return k
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// A Consumer reads a topic as a member of a consumer group and calls a
// Handler for every message, taking one permit from a Limiter before each
// call. Make one with New and start it with Run; Stats is safe to call at
// any time, from any goroutine.
type Consumer struct {
	cfg     Config
	lim     Limiter
	take    permits // one permit, or the message's cost (WithCost)
	costed  bool    // WithCost: each call's Grant is in its context, for Settle
	handler Handler
	log     *slog.Logger
	rcfg    kafka.ReaderConfig
	dlq     MessageWriter // nil: no dead-letter topic
	ownDLQ  *kafka.Writer // the writer New made, closed by Run
	dlqConn *kafka.Transport
	count   counters
	col     *collector
	ran     atomic.Bool
	cur     atomic.Pointer[run] // set by Run, for revoke

	// For commitRevoked: the group's last join, and a client that commits
	// in the generation that ended (same security as the reader).
	joined    atomic.Pointer[groupJoin]
	group     *kafka.Client
	groupConn *kafka.Transport
}

// New checks cfg (see Config.Validate) and returns a Consumer that will
// call handler for each message of cfg.Topic, one permit of lim per call.
// It connects to nothing: Run does. The errors it returns wrap
// ErrInvalidConfig, or come from registering the metrics.
func New(cfg Config, lim Limiter, handler Handler, opts ...Option) (*Consumer, error) {
	var errs []error
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	o := buildOptions(opts)
	var take permits
	if lim == nil {
		errs = append(errs, &ConfigError{Field: "lim", Value: nil, Rule: "a Limiter is required"})
	} else if t, err := newPermits(lim, o.cost, o.class); err != nil {
		errs = append(errs, err)
	} else {
		take = t
	}
	if handler == nil {
		errs = append(errs, &ConfigError{Field: "handler", Value: nil, Rule: "a Handler is required"})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	c := &Consumer{cfg: cfg, lim: lim, take: take, costed: o.cost != nil, handler: handler, log: o.log.With("topic", cfg.Topic, "group", cfg.GroupID)}

	c.rcfg = kafka.ReaderConfig{
		// Closing the Reader waits for the fetches in progress, which the
		// broker holds for up to MaxWait when there is nothing new: kafka-go's
		// 10 s default would make every shutdown take that long.
		MaxWait:       500 * time.Millisecond,
		StartOffset:   kafka.FirstOffset,
		QueueCapacity: min(cfg.maxInFlight(), 100),
		Logger:        kafkaLogger(c.log, slog.LevelDebug),
		ErrorLogger:   kafkaLogger(c.log, slog.LevelWarn),
	}
	if o.readerConfig != nil {
		o.readerConfig(&c.rcfg)
	}
	c.rcfg.Brokers = cfg.Brokers
	c.rcfg.Topic = cfg.Topic
	c.rcfg.GroupID = cfg.GroupID
	c.rcfg.GroupTopics = nil
	c.rcfg.Partition = 0
	c.rcfg.CommitInterval = 0
	c.rcfg.GroupBalancers = wrapBalancers(c.rcfg.GroupBalancers, c.revoke)
	c.rcfg.Logger = joinLogger{next: c.rcfg.Logger, last: &c.joined}
	if err := c.rcfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: WithReaderConfig: %v", ErrInvalidConfig, err)
	}

	c.groupConn = c.transport()
	c.group = &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Transport: c.groupConn}

	if cfg.DeadLetterTopic != "" {
		if o.dlq != nil {
			c.dlq = o.dlq
		} else {
			c.dlqConn = c.transport()
			c.ownDLQ = &kafka.Writer{
				Addr:         kafka.TCP(cfg.Brokers...),
				Transport:    c.dlqConn,
				Balancer:     &kafka.Hash{},
				RequiredAcks: kafka.RequireAll,
				BatchTimeout: 5 * time.Millisecond,
				Logger:       kafkaLogger(c.log, slog.LevelDebug),
				ErrorLogger:  kafkaLogger(c.log, slog.LevelWarn),
			}
			c.dlq = c.ownDLQ
		}
	}

	c.col = newCollector(&c.count, cfg.Topic, cfg.GroupID)
	if o.reg != nil {
		if err := o.reg.Register(c.col); err != nil {
			return nil, fmt.Errorf("consumer: registering metrics for topic %q group %q: %w", cfg.Topic, cfg.GroupID, err)
		}
	}
	return c, nil
}

// transport returns a Transport with the reader's security (its Dialer's
// TLS, SASL and client ID).
func (c *Consumer) transport() *kafka.Transport {
	t := &kafka.Transport{}
	if d := c.rcfg.Dialer; d != nil {
		t.TLS, t.SASL, t.ClientID = d.TLS, d.SASLMechanism, d.ClientID
	}
	return t
}

// Stats returns a snapshot of the consumer's counters.
func (c *Consumer) Stats() Stats { return c.count.stats() }

// item is one fetched message on its way through a worker.
type item struct {
	msg kafka.Message
	e   *entry
	g   *generation
}

// run holds what one Run shares between its goroutines.
type run struct {
	reader *kafka.Reader
	tr     *tracker
	slots  chan struct{} // one token per message fetched and not committed
	lanes  []chan *item
	dirty  chan struct{} // cap 1: there may be something new to commit

	work      context.Context // ends when Run abandons its work (drain deadline, abort)
	fetchDone chan struct{}   // closed when the fetch goroutine returns

	// genMu guards gen and revoking, and makes revoke's switch to a new
	// generation atomic with the fetch loop's recording of a message.
	genMu    sync.Mutex
	gen      *generation
	revoking bool // revoke is running: what is fetched is stale

	drain       chan chan<- struct{} // cap 1: revoke asks the fetch loop to drain kafka-go's queue
	fetchMu     sync.Mutex
	commitMu    sync.Mutex         // held while a commit is sent: commits of one generation do not overtake each other
	fetchCancel context.CancelFunc // of the FetchMessage call in progress

	stopFetch context.CancelFunc
	fatalOnce sync.Once
	fatal     error // the first fatal error; read after the goroutines end
}

// fail records a fatal error (the first one wins) and stops fetching.
func (r *run) fail(err error) {
	r.fatalOnce.Do(func() { r.fatal = err })
	r.stopFetch()
}

// Run joins the consumer group and handles messages until ctx is cancelled
// or a fatal error occurs. It can be called once.
//
// Delivery is at-least-once: an offset is committed only when every message
// before it in its partition is done (handled, or written to the
// dead-letter topic), so a crash re-delivers at most Config.MaxInFlight
// messages and loses none.
//
// When ctx is cancelled Run stops fetching, lets the messages already
// fetched finish for up to Config.DrainTimeout (cancelling the handlers'
// context after that), commits what is done, closes the Kafka reader and
// returns nil. The final commit is not cut by the drain's end: it has a
// bound of its own (10 s), so every partition's done prefix is committed
// however the drain ended (gracefully, at DrainTimeout, or by an abort).
// It returns early with an error wrapping ErrHandlerFailed (a message
// failed every attempt and there is no dead-letter topic) or
// ErrLimiterClosed, after the same drain. To cut a drain short (a second
// signal), use RunWithAbort.
//
// Rebalances: kafka-go rebalances eagerly, so a member gives up all its
// partitions before it joins the group again. The consumer learns of it
// before its JoinGroup request (through the GroupBalancers, which it wraps)
// and, before it lets the member join:
//   - drops every fetched message of the partitions given up that has not
//     started: no permit, no handler call (counted in Stats.Abandoned); a
//     worker whose permit came just as the revocation was known does not
//     call the handler either (the permit is spent);
//   - lets the handler calls in progress finish for up to
//     min(Config.DrainTimeout, half the group's rebalance timeout), then
//     cancels their context (counted in Stats.Abandoned);
//   - commits, in the generation that ended, each partition's done prefix:
//     every message before the first one not done, the calls that
//     finished in that time included. The broker takes this commit only
//     while the generation is still the group's (it is until every member
//     has joined again), so it never lands over the next owner's.
//
// So the partitions' next owners handle again only (a) the calls cut
// after that time, at most Config.Workers, and (b) with OrderKey or
// OrderNone, the messages done behind one that is not: offsets are
// committed contiguously, and a message dropped unstarted or cut leaves
// every later message of its partition uncommitted, however many are done
// (with OrderKey, up to MaxInFlight when one key's lane is backed up; with
// OrderPartition there are none). If the commit fails (the broker had
// already moved on to a new generation, or is unreachable), every message
// done since the previous commit is handled again; none is lost.
//
// A partition is committed again only after a message of it was fetched in
// the new generation.
func (c *Consumer) Run(ctx context.Context) error {
	return c.RunWithAbort(ctx, nil)
}

// RunWithAbort is Run with a way to cut the drain short: when abort is
// closed (typically on a second SIGINT), messages still being handled are
// abandoned at once (their handlers' context is cancelled; they are not
// committed). What is done is committed all the same. A nil abort never
// fires.
func (c *Consumer) RunWithAbort(ctx context.Context, abort <-chan struct{}) error {
	if !c.ran.CompareAndSwap(false, true) {
		return ErrAlreadyRun
	}
	defer c.groupConn.CloseIdleConnections() // after the reader is closed: no revocation is in progress
	if c.ownDLQ != nil {
		defer func() {
			if err := c.ownDLQ.Close(); err != nil {
				c.log.Warn("closing the dead-letter writer", "err", err)
			}
			c.dlqConn.CloseIdleConnections()
		}()
	}

	fetchCtx, stopFetch := context.WithCancel(ctx)
	defer stopFetch()
	// Workers and commits outlive ctx by the drain; abortWork ends them.
	workCtx, abortWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer abortWork(nil)

	r := &run{
		reader: kafka.NewReader(c.rcfg), // rcfg was validated by New: no panic
		slots:  make(chan struct{}, c.cfg.maxInFlight()),
		dirty:  make(chan struct{}, 1),

		work:      workCtx,
		fetchDone: make(chan struct{}),
		gen:       newGeneration(workCtx),
		drain:     make(chan chan<- struct{}, 1),
		stopFetch: stopFetch,
	}
	r.tr = newTracker(func(n int) {
		for range n {
			<-r.slots
		}
		c.count.inFlight.Add(-int64(n))
	})
	nLanes := c.cfg.workers()
	if c.cfg.Ordering == OrderNone {
		r.lanes = []chan *item{make(chan *item, c.cfg.maxInFlight())}
	} else {
		r.lanes = make([]chan *item, nLanes)
		for i := range r.lanes {
			r.lanes[i] = make(chan *item, c.cfg.maxInFlight())
		}
	}
	c.cur.Store(r)
	defer c.cur.Store(nil)

	var workers sync.WaitGroup
	for i := range nLanes {
		lane := r.lanes[i%len(r.lanes)]
		workers.Go(func() { c.work(workCtx, r, lane) })
	}
	go func() {
		defer close(r.fetchDone)
		defer func() {
			for _, l := range r.lanes {
				close(l)
			}
		}()
		c.fetch(fetchCtx, r)
	}()
	commitStop := make(chan struct{})
	commitDone := make(chan struct{})
	go func() {
		defer close(commitDone)
		// Neither the drain's deadline nor an abort cancels a commit: each
		// has a bound of its own (commitTimeout), so that the final commit
		// is sent, and reported, whatever ended the drain.
		c.commitLoop(context.WithoutCancel(ctx), r, commitStop)
	}()
	c.log.Info("consumer started", "workers", nLanes, "max_in_flight", c.cfg.maxInFlight(), "ordering", c.cfg.Ordering.String())

	// Shutdown, step by step: stop fetching, drain, commit, close.
	<-r.fetchDone
	workersDone := make(chan struct{})
	go func() {
		workers.Wait()
		close(workersDone)
	}()
	drain := time.NewTimer(c.cfg.drainTimeout())
	select {
	case <-workersDone:
	case <-drain.C:
		c.log.Warn("drain deadline passed: abandoning in-flight messages", "deadline", c.cfg.drainTimeout())
		abortWork(errors.New("consumer: drain deadline passed"))
	case <-abort:
		c.log.Warn("drain aborted: abandoning in-flight messages")
		abortWork(errors.New("consumer: drain aborted"))
	}
	drain.Stop()
	<-workersDone
	close(commitStop)
	<-commitDone
	// Generations joined since the fetch loop last asked (it asks when a
	// message comes).
	c.count.rebalances.Add(r.reader.Stats().Rebalances)
	if err := r.reader.Close(); err != nil {
		c.log.Warn("closing the reader", "err", err)
	}
	st := c.Stats()
	c.log.Info("consumer stopped", "handled", st.Handled, "dead_lettered", st.DeadLettered,
		"abandoned", st.Abandoned, "uncommitted", st.InFlight)
	return r.fatal
}

// fetch is the only goroutine that calls FetchMessage and Stats on the
// reader. It returns when ctx ends or the reader is closed.
func (c *Consumer) fetch(ctx context.Context, r *run) {
	fetchErrs := 0
	for {
		select {
		case r.slots <- struct{}{}: // back-pressure: blocks while MaxInFlight are outstanding
		case drained := <-r.drain:
			c.drainQueue(ctx, r, drained)
			continue
		case <-ctx.Done():
			return
		}
		callCtx, ok := r.startFetch(ctx)
		if !ok { // revoke asked for a drain
			<-r.slots
			continue
		}
		msg, err := r.reader.FetchMessage(callCtx)
		r.endFetch()
		if err != nil {
			<-r.slots
			if ctx.Err() != nil {
				return
			}
			if callCtx.Err() != nil {
				continue // cut short by revoke, which asked for a drain
			}
			if errors.Is(err, io.EOF) {
				r.fail(fmt.Errorf("consumer: kafka reader closed unexpectedly: %w", err))
				return
			}
			fetchErrs++
			c.log.Warn("fetch failed; retrying", "err", err, "failures", fetchErrs)
			if !wait(ctx, backoff(fetchErrs, 100*time.Millisecond, 5*time.Second)) {
				return
			}
			continue
		}
		fetchErrs = 0
		c.count.inFlight.Add(1)
		c.count.consumed.Add(1)
		rs := r.reader.Stats() // counters since the previous call
		c.count.lag.Store(rs.Lag)
		if rs.Rebalances > 0 {
			c.count.rebalances.Add(rs.Rebalances)
			c.log.Info("consumer group generation changed: uncommitted progress will be re-delivered")
		}
		r.genMu.Lock()
		if r.revoking { // fetched before revoke, recorded after: stale
			r.genMu.Unlock()
			<-r.slots
			c.count.inFlight.Add(-1)
			c.count.abandoned.Add(1)
			continue
		}
		g := r.gen
		if rs.Rebalances > 0 {
			r.tr.newEpoch() // revoke did already; kept in case kafka-go joined without asking
		}
		e, rewound := r.tr.add(msg.Topic, msg.Partition, msg.Offset)
		r.genMu.Unlock()
		if rewound {
			c.log.Info("partition re-read from an earlier offset", "partition", msg.Partition, "offset", msg.Offset)
		}
		r.lanes[c.lane(msg, len(r.lanes))] <- &item{msg: msg, e: e, g: g} // never blocks: each lane holds MaxInFlight
	}
}

// lane picks the worker lane of msg so that messages that must keep their
// order share one.
func (c *Consumer) lane(msg kafka.Message, n int) int {
	if n == 1 {
		return 0
	}
	h := uint32(2166136261) // FNV-1a
	mix := func(b byte) { h = (h ^ uint32(b)) * 16777619 }
	if c.cfg.Ordering == OrderKey {
		for _, b := range msg.Key {
			mix(b)
		}
	} else {
		for i := 0; i < len(msg.Topic); i++ {
			mix(msg.Topic[i])
		}
		for p := uint32(msg.Partition); ; p >>= 8 {
			mix(byte(p))
			if p < 256 {
				break
			}
		}
	}
	return int(h % uint32(n))
}

// outcome is what became of one message.
type outcome int

const (
	outDone      outcome = iota // handled or dead-lettered: may be committed
	outAbandoned                // shutdown, or a revocation: not committed, delivered again later
	outFatal                    // Run must stop
)

// work handles the items of one lane, in order, until the lane is closed.
// An item whose partition was revoked (or is being re-read) is dropped
// without a permit or a call.
func (c *Consumer) work(ctx context.Context, r *run, lane <-chan *item) {
	for it := range lane {
		if ctx.Err() != nil {
			c.count.abandoned.Add(1)
			continue
		}
		if r.tr.isAbandoned(it.e) || !it.g.enter() {
			c.dropped(r, it)
			continue
		}
		out, err := c.process(it.g, it.msg)
		it.g.exit()
		if out != outFatal && r.tr.isAbandoned(it.e) {
			c.dropped(r, it) // done or not, no commit covers it any more
			continue
		}
		switch out {
		case outDone:
			if r.tr.done(it.e) {
				select {
				case r.dirty <- struct{}{}:
				default:
				}
			}
		case outAbandoned:
			c.dropped(r, it)
		case outFatal:
			c.count.abandoned.Add(1)
			c.log.Error("stopping the consumer", "err", err)
			r.fail(err)
		}
	}
}

// dropped records that it is given up unfinished, or finished after its
// partition was given up: its partition was revoked or is being re-read,
// or Run is ending. No commit covers it.
func (c *Consumer) dropped(r *run, it *item) {
	c.count.abandoned.Add(1)
	if r.tr.drop(it.e) {
		select {
		case r.dirty <- struct{}{}:
		default:
		}
	}
}

// process takes a permit and calls the handler for msg until it succeeds,
// or its attempts are used up and it is dead-lettered. Waits (for a
// permit, between attempts) end when g is revoked; calls go on until the
// revocation's grace ends.
func (c *Consumer) process(g *generation, msg kafka.Message) (outcome, error) {
	ctx := g.calls
	attempts := 0
	for {
		grant, err := c.acquire(g.queued, msg)
		switch {
		case errors.Is(err, limiter.ErrInvalid):
			// The message's cost (WithCost) is one the limiter cannot
			// take: no retry can help.
			return c.deadLetter(ctx, msg, Permanent(fmt.Errorf("the message's cost: %w", err)), attempts)
		case errors.Is(err, ErrLimiterClosed):
			return outFatal, err
		case err != nil:
			return outAbandoned, nil
		}
		callCtx := ctx
		if c.costed {
			callCtx = withGrant(ctx, &grant)
		}
		if !g.startCall() {
			return outAbandoned, nil // revoked while the permit came: its permit is spent, no call made
		}
		err = c.call(callCtx, msg)
		g.endCall()
		if err == nil {
			c.count.handled.Add(1)
			return outDone, nil
		}
		if ctx.Err() != nil {
			return outAbandoned, nil // the handler was cut short by shutdown
		}
		var ra *RetryAfterError
		if errors.As(err, &ra) {
			c.count.retried.Add(1)
			c.log.Debug("provider asked to retry later", "delay", ra.Delay, "partition", msg.Partition, "offset", msg.Offset)
			if ra.Delay > 0 {
				c.lim.Backoff(ra.Delay) // the next permit, this message's included, waits for it
			} else if !wait(g.queued, backoff(1, c.cfg.retryBackoff(), c.cfg.maxBackoff())) {
				return outAbandoned, nil
			}
			continue
		}
		attempts++
		if attempts >= c.cfg.maxAttempts() || IsPermanent(err) {
			return c.deadLetter(ctx, msg, err, attempts)
		}
		c.count.retried.Add(1)
		c.log.Debug("handler failed; retrying", "err", err, "attempt", attempts, "partition", msg.Partition, "offset", msg.Offset)
		if !wait(g.queued, backoff(attempts, c.cfg.retryBackoff(), c.cfg.maxBackoff())) {
			return outAbandoned, nil
		}
	}
}

// call runs the handler once, turning a panic into an error.
func (c *Consumer) call(ctx context.Context, msg kafka.Message) (err error) {
	if c.cfg.HandlerTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.HandlerTimeout)
		defer cancel()
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("consumer: handler panicked: %v", p)
		}
	}()
	return c.handler(ctx, msg)
}

// foreverWait is the maxWait used once a message is known to be throttled:
// it waits as long as needed, bounded only by ctx.
const foreverWait = 24 * time.Hour

// acquire waits for the permits of one handler call of msg, as long as it
// takes. It returns an error only when ctx ends, the limiter is closed, or
// the message's cost is invalid (limiter.ErrInvalid).
func (c *Consumer) acquire(ctx context.Context, msg kafka.Message) (limiter.Grant, error) {
	start := time.Now()
	g, err := c.take(ctx, msg, c.cfg.maxWait())
	if err == nil {
		c.col.observeWait(time.Since(start))
		return g, nil
	}
	throttled := false
	for failures := 0; ; {
		switch {
		case ctx.Err() != nil:
			return g, context.Cause(ctx)
		case errors.Is(err, limiter.ErrClosed):
			return g, fmt.Errorf("%w: %w", ErrLimiterClosed, err)
		case errors.Is(err, limiter.ErrInvalid):
			return g, err
		case errors.Is(err, limiter.ErrTimeout) && !throttled:
			throttled = true
			c.count.throttled.Add(1)
			c.log.Debug("throttled: permit further away than MaxWait; waiting for it", "max_wait", c.cfg.maxWait())
		default:
			// Not a first timeout (no quota yet, or no permit even within
			// foreverWait): try again later rather than spin.
			failures++
			c.log.Debug("no permit; trying again", "err", err, "failures", failures)
			if !wait(ctx, backoff(failures, 10*time.Millisecond, time.Second)) {
				return g, context.Cause(ctx)
			}
		}
		if g, err = c.take(ctx, msg, foreverWait); err == nil {
			c.col.observeWait(time.Since(start))
			return g, nil
		}
	}
}

// deadLetter writes msg to the dead-letter topic, retrying until it is
// written or ctx ends. Only a dead letter written makes the message done
// (committable): one that is never written holds its partition's commits
// back, it is never skipped.
//
// A dead letter the broker (or the writer's BatchBytes) refuses as too
// large is not retried as it is, which would stall the partition for good:
// it is written again at once, smaller, one step at a time until it fits —
// the error text cut to maxErrorText bytes, then the value left out, then
// the key and the original headers too — each step saying what it left out
// in a header (HeaderErrorTruncated...). The topic, partition and offset
// headers are always there, so the original can be read again from its
// topic while its retention keeps it.
func (c *Consumer) deadLetter(ctx context.Context, msg kafka.Message, cause error, attempts int) (outcome, error) {
	if c.dlq == nil {
		return outFatal, fmt.Errorf("%w: partition %d offset %d failed %d attempt(s): %w",
			ErrHandlerFailed, msg.Partition, msg.Offset, attempts, cause)
	}
	step, trimmed, errText := trimNothing, false, cause.Error()
	dl, _ := deadLetterAt(c.cfg.DeadLetterTopic, msg, errText, attempts, step)
	for failures := 1; ; failures++ {
		err := c.dlq.WriteMessages(ctx, dl)
		if err == nil {
			c.count.deadLettered.Add(1)
			if trimmed {
				c.count.deadLettersTrimmed.Add(1)
			}
			c.log.Warn("message dead-lettered", "partition", msg.Partition, "offset", msg.Offset,
				"attempts", attempts, "trimmed", trimmed, "err", cause)
			return outDone, nil
		}
		if tooLarge(err) {
			from := dlSize(dl)
			// The next step that makes the letter smaller: one may not
			// (a short key's "left out" header outweighs the key).
			for step < trimAll && dlSize(dl) >= from {
				step++
				if smaller, leftOut := deadLetterAt(c.cfg.DeadLetterTopic, msg, errText, attempts, step); dlSize(smaller) < from {
					dl, trimmed = smaller, true
					c.log.Warn("dead letter too large for the broker; writing a smaller one", "partition", msg.Partition,
						"offset", msg.Offset, "left_out", strings.Join(leftOut, ", "), "bytes", from, "now", dlSize(dl), "err", err)
				}
			}
			if dlSize(dl) < from {
				failures = 0
				continue // at once: a smaller letter is a new try, not a retry
			}
			// Nothing left to leave out: the broker's limit is below what
			// is left, the consumer's headers. Retried like any failure;
			// the partition waits, uncommitted, until the limit is raised.
		}
		c.log.Warn("writing a dead letter failed; retrying", "err", err, "failures", failures,
			"partition", msg.Partition, "offset", msg.Offset, "bytes", dlSize(dl))
		if !wait(ctx, backoff(failures, c.cfg.retryBackoff(), c.cfg.maxBackoff())) {
			return outAbandoned, nil
		}
	}
}

// The steps by which deadLetter makes a dead letter smaller, each leaving
// out what the previous ones did and more.
const (
	trimNothing = iota
	trimError   // the error text cut to maxErrorText bytes
	trimValue   // the value left out
	trimAll     // the key and the original headers left out: the consumer's headers alone
)

// maxErrorText is how much of the handler's error text a dead letter too
// large as a whole keeps: enough to say what went wrong.
const maxErrorText = 4 << 10

// deadLetterAt returns the dead letter of msg at a trim step, and what it
// leaves out.
func deadLetterAt(topic string, msg kafka.Message, errText string, attempts, step int) (kafka.Message, []string) {
	dl := kafka.Message{Topic: topic, Key: msg.Key, Value: msg.Value}
	var own []kafka.Header
	var leftOut []string
	if step >= trimError && len(errText) > maxErrorText {
		own = append(own, kafka.Header{Key: HeaderErrorTruncated, Value: []byte(strconv.Itoa(len(errText)))})
		n := maxErrorText
		for n > 0 && !utf8.RuneStart(errText[n]) {
			n-- // not in the middle of a character
		}
		errText = errText[:n]
		leftOut = append(leftOut, "the error text past "+strconv.Itoa(n)+" bytes")
	}
	if step >= trimValue && len(msg.Value) > 0 {
		own = append(own, kafka.Header{Key: HeaderValueDropped, Value: []byte(strconv.Itoa(len(msg.Value)))})
		dl.Value = nil
		leftOut = append(leftOut, "the value")
	}
	headers := msg.Headers
	if step >= trimAll {
		if len(msg.Key) > 0 {
			own = append(own, kafka.Header{Key: HeaderKeyDropped, Value: []byte(strconv.Itoa(len(msg.Key)))})
			dl.Key = nil
			leftOut = append(leftOut, "the key")
		}
		if len(msg.Headers) > 0 {
			own = append(own, kafka.Header{Key: HeaderHeadersDropped, Value: []byte(strconv.Itoa(len(msg.Headers)))})
			headers = nil
			leftOut = append(leftOut, "the headers")
		}
	}
	dl.Headers = make([]kafka.Header, 0, len(headers)+5+len(own))
	for _, h := range headers {
		h.Key = renamed(h.Key)
		dl.Headers = append(dl.Headers, h)
	}
	dl.Headers = append(dl.Headers,
		kafka.Header{Key: HeaderError, Value: []byte(errText)},
		kafka.Header{Key: HeaderAttempts, Value: []byte(strconv.Itoa(attempts))},
		kafka.Header{Key: HeaderTopic, Value: []byte(msg.Topic)},
		kafka.Header{Key: HeaderPartition, Value: []byte(strconv.Itoa(msg.Partition))},
		kafka.Header{Key: HeaderOffset, Value: []byte(strconv.FormatInt(msg.Offset, 10))},
	)
	dl.Headers = append(dl.Headers, own...)
	return dl, leftOut
}

// dlSize is the bytes of a dead letter's key, value and headers.
func dlSize(m kafka.Message) int {
	n := len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// tooLarge reports whether a write failed because the message was too
// large: for the broker (kafka.MessageSizeTooLarge, inside the
// kafka.WriteErrors a kafka.Writer returns, which does not unwrap) or for
// the writer's BatchBytes (kafka.MessageTooLargeError).
func tooLarge(err error) bool {
	if errors.Is(err, kafka.MessageSizeTooLarge) {
		return true
	}
	var we kafka.WriteErrors
	if errors.As(err, &we) {
		for _, e := range we {
			if e != nil && errors.Is(e, kafka.MessageSizeTooLarge) {
				return true
			}
		}
	}
	return false
}

// wait waits for d or until ctx ends; it reports whether d passed.
func wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// kafkaLogger adapts kafka-go's printf logging to l at level.
func kafkaLogger(l *slog.Logger, level slog.Level) kafka.LoggerFunc {
	return func(format string, args ...any) {
		if l.Enabled(context.Background(), level) {
			l.Log(context.Background(), level, fmt.Sprintf(format, args...), "component", "kafka-go")
		}
	}
}
