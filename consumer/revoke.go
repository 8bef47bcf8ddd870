package consumer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
)

// This file makes a revocation known to the consumer. kafka-go's Reader
// has no revocation callback, but its consumer group (eager rebalancing:
// a member gives up all its partitions before it joins again) asks each
// GroupBalancer for its UserData just before every JoinGroup request, on
// its own goroutine, after the previous generation has ended and the
// Reader has stopped its partition readers and its commit loop.
// revokeBalancer turns that call into one to Consumer.revoke, which runs
// before the member (re)joins:
//   - the messages fetched so far belong to partitions given up: those
//     queued start no handler call and take no permit (dropped);
//   - the messages still in kafka-go's queue are fetched and dropped, so
//     that none of them is handled after the next assignment;
//   - the calls in progress may finish for a grace period (see
//     revokeGrace); then their context is cancelled. A worker whose
//     permit came just before the revocation does not call the handler
//     (generation.startCall): the permit is spent, the call not made;
//   - the done prefix of every partition given up is committed, in the
//     generation that ended (commitRevoked): what was handled before the
//     first message not done, the calls that finished in the grace
//     included, is not handled again by the partition's next owner.
// Only then does the member join the group again.
//
// The commit of a generation that ended: the broker accepts commits of a
// group's current generation from its members while the group prepares
// its rebalance (PreparingRebalance: the generation changes only once
// every member has joined again, or the rebalance timeout passed), and
// refuses them once a new generation has begun (ILLEGAL_GENERATION,
// UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS). So the commit cannot land
// over the partitions' next owners: either it is in the old generation,
// before anyone was assigned them, or it is refused and its messages are
// handled again. Every other commit is sent the same way (commit.go).
// kafka-go keeps the generation's ID and the member's to itself; it logs
// them when it joins ("Joined group G as member M in generation N"), and
// joinLogger, the Reader's Logger, keeps them from that record's
// arguments. If a kafka-go version logs it otherwise, no revocation is
// committed (messages done since the last commit are handled again; none
// is lost), and other commits go through the Reader (see sendCommit);
// TestJoinRecordKnown fails on such a version.

// generation is what the consumer fetched between two (re)joins of its
// group, and the handler calls made for it.
type generation struct {
	calls   context.Context // the handlers' context: ends when the revocation's grace ends, or at an abort
	abandon context.CancelCauseFunc
	queued  context.Context // child of calls; also ends at the revocation: no call starts
	drop    context.CancelFunc
	revoked context.Context // ends at the revocation only: cuts a commit of this generation
	revoke  context.CancelFunc

	mu      sync.Mutex
	busy    int           // workers handling a message of this generation
	calling int           // of them, those in a handler call
	idle    chan struct{} // made at the revocation; closed once busy is 0
}

func newGeneration(work context.Context) *generation {
	g := &generation{}
	g.calls, g.abandon = context.WithCancelCause(work)
	g.queued, g.drop = context.WithCancel(g.calls)
	g.revoked, g.revoke = context.WithCancel(context.Background())
	return g
}

// enter reports whether a worker may start on a message of g, and counts
// it busy if so.
func (g *generation) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.idle != nil {
		return false
	}
	g.busy++
	return true
}

func (g *generation) exit() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.busy--; g.busy == 0 && g.idle != nil {
		close(g.idle)
	}
}

// startCall reports whether a busy worker, holding its permit, may call
// the handler: not once g is revoked, even if the permit came just
// before. It is the one gate a handler call passes, so that the calls in
// progress at a revocation are exactly those end counts.
func (g *generation) startCall() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.idle != nil {
		return false
	}
	g.calling++
	return true
}

func (g *generation) endCall() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calling--
}

// end revokes g: no call starts for it any more. It returns how many
// handler calls were in progress, and a channel closed when no worker is
// busy with g.
func (g *generation) end() (calling int, idle <-chan struct{}) {
	g.revoke()
	g.drop()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.idle == nil {
		g.idle = make(chan struct{})
		if g.busy == 0 {
			close(g.idle)
		}
	}
	return g.calling, g.idle
}

// isRevoked reports whether g's partitions were given up.
func (g *generation) isRevoked() bool { return g.revoked.Err() != nil }

// errRevoked is the cause of a handler's context cancelled because its
// partition was given up and the grace for calls in progress ended.
var errRevoked = errors.New("consumer: partition revoked by a rebalance")

// revokeGrace is how long calls in progress at a revocation may go on
// before their context is cancelled: Config.DrainTimeout, but at most half
// the group's rebalance timeout, so that the member joins again in time.
func (c *Consumer) revokeGrace() time.Duration {
	return min(c.cfg.drainTimeout(), c.rebalanceTimeout()/2)
}

// rebalanceTimeout is the group's: how long the broker waits for every
// member to join again once a rebalance began.
func (c *Consumer) rebalanceTimeout() time.Duration {
	if rt := c.rcfg.RebalanceTimeout; rt > 0 {
		return rt
	}
	return 30 * time.Second // kafka-go's default
}

// revokeBalancer is a GroupBalancer that calls revoke before it hands out
// its UserData, which kafka-go asks for at every JoinGroup request.
type revokeBalancer struct {
	kafka.GroupBalancer
	revoke func() // nil on all but the first balancer: one call per join
}

func (b revokeBalancer) UserData() ([]byte, error) {
	if b.revoke != nil {
		b.revoke()
	}
	return b.GroupBalancer.UserData()
}

// wrapBalancers puts revokeBalancer around bs (kafka-go's default ones if
// empty).
func wrapBalancers(bs []kafka.GroupBalancer, revoke func()) []kafka.GroupBalancer {
	if len(bs) == 0 {
		bs = []kafka.GroupBalancer{kafka.RangeGroupBalancer{}, kafka.RoundRobinGroupBalancer{}}
	}
	out := make([]kafka.GroupBalancer, len(bs))
	for i, b := range bs {
		out[i] = revokeBalancer{GroupBalancer: b}
		if i == 0 {
			out[i] = revokeBalancer{GroupBalancer: b, revoke: revoke}
		}
	}
	return out
}

// revoke runs on kafka-go's group goroutine before each JoinGroup request:
// the partitions of the generation that ended are given up (see the top
// of this file). It returns once no message of that generation is queued,
// in kafka-go's queue or the workers', no call for one is in progress (or
// the grace passed), and what was done is committed (or the commit
// failed), or when Run ends.
func (c *Consumer) revoke() {
	r := c.cur.Load()
	if r == nil {
		return // the first join, before Run set up
	}
	r.genMu.Lock()
	old := r.gen
	r.gen = newGeneration(r.work)
	r.revoking = true
	parts := r.tr.fetched()
	r.genMu.Unlock()
	defer func() {
		r.genMu.Lock()
		r.tr.newEpoch() // what is not committed now is given up
		r.revoking = false
		r.genMu.Unlock()
	}()
	calling, idle := old.end()
	if len(parts) > 0 || calling > 0 {
		c.log.Info("partitions revoked", "partitions", parts, "in_flight", int64(calling))
	}

	// kafka-go's queue: the fetch loop drains it.
	drained := make(chan struct{})
	select {
	case r.drain <- drained:
	case <-r.fetchDone:
	}
	r.cutFetch()
	select {
	case <-drained:
	case <-r.fetchDone:
	}

	grace := time.NewTimer(c.revokeGrace())
	defer grace.Stop()
	select {
	case <-idle:
	case <-grace.C:
		c.log.Warn("calls in progress for revoked partitions did not end in time: cancelling them", "grace", c.revokeGrace())
		old.abandon(errRevoked)
	case <-r.work.Done():
	}
	c.commitRevoked(r)
}

// groupJoin is a member's join of its group: its member ID and generation.
type groupJoin struct {
	member     string
	generation int32
}

// joinedFormat is kafka-go's log record of a join (consumergroup.go,
// nextGeneration), with the group ID, the member ID and the generation ID.
const joinedFormat = "Joined group %s as member %s in generation %d"

// joinLogger is the Reader's Logger: it keeps the member ID and the
// generation of the last join in last, and passes every record on to next
// (nil: none).
type joinLogger struct {
	next kafka.Logger
	last *atomic.Pointer[groupJoin]
}

func (l joinLogger) Printf(format string, args ...any) {
	if format == joinedFormat && len(args) == 3 {
		member, ok1 := args[1].(string)
		gen, ok2 := args[2].(int32)
		if ok1 && ok2 {
			l.last.Store(&groupJoin{member: member, generation: gen})
		}
	}
	if l.next != nil {
		l.next.Printf(format, args...)
	}
}

// startFetch returns the context of one FetchMessage call, which revoke
// may cut short; ok is false when a drain is asked for first.
func (r *run) startFetch(ctx context.Context) (_ context.Context, ok bool) {
	r.fetchMu.Lock()
	defer r.fetchMu.Unlock()
	if len(r.drain) > 0 {
		return nil, false
	}
	ctx, r.fetchCancel = context.WithCancel(ctx)
	return ctx, true
}

func (r *run) endFetch() {
	r.fetchMu.Lock()
	defer r.fetchMu.Unlock()
	r.fetchCancel()
	r.fetchCancel = nil
}

// cutFetch ends the FetchMessage call in progress, if any.
func (r *run) cutFetch() {
	r.fetchMu.Lock()
	defer r.fetchMu.Unlock()
	if r.fetchCancel != nil {
		r.fetchCancel()
	}
}

// drainQueue fetches and drops every message left in kafka-go's queue.
// It runs on the fetch goroutine, when revoke asks: kafka-go has stopped
// the partition readers of the generation that ended and starts the next
// ones only after revoke returns, so all that is queued is stale.
func (c *Consumer) drainQueue(ctx context.Context, r *run, drained chan<- struct{}) {
	defer close(drained)
	for {
		rs := r.reader.Stats()
		c.count.rebalances.Add(rs.Rebalances)
		if rs.QueueLength == 0 {
			return
		}
		if _, err := r.reader.FetchMessage(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			continue // an error queued by a partition reader
		}
		c.count.consumed.Add(1)
		c.count.abandoned.Add(1)
	}
}
