package consumer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// This file makes a revocation known to the consumer. kafka-go's Reader
// has no revocation callback, but its consumer group (eager rebalancing:
// a member gives up all its partitions before it joins again) asks each
// GroupBalancer for its UserData just before every JoinGroup request, on
// its own goroutine, after the previous generation has ended and the
// Reader has stopped its partition readers. revokeBalancer turns that
// call into one to Consumer.revoke, which runs before the member (re)joins:
//   - the messages fetched so far belong to partitions given up: those
//     queued start no handler call and take no permit (dropped);
//   - the messages still in kafka-go's queue are fetched and dropped, so
//     that none of them is handled after the next assignment;
//   - the calls in progress may finish for a grace period (see
//     revokeGrace); then their context is cancelled. Either way their
//     outcome is not committed: the partition's next owner handles them
//     again.
// Only then does the member join the group again.

// generation is what the consumer fetched between two (re)joins of its
// group, and the handler calls made for it.
type generation struct {
	calls   context.Context // the handlers' context: ends when the revocation's grace ends, or at an abort
	abandon context.CancelCauseFunc
	queued  context.Context // child of calls; also ends at the revocation: no call starts
	drop    context.CancelFunc
	revoked context.Context // ends at the revocation only: cuts a commit of this generation
	revoke  context.CancelFunc

	mu   sync.Mutex
	busy int           // workers handling a message of this generation
	idle chan struct{} // made at the revocation; closed once busy is 0
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

// end revokes g: no call starts for it any more. It returns how many
// workers were busy with it, and a channel closed when none is.
func (g *generation) end() (busy int, idle <-chan struct{}) {
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
	return g.busy, g.idle
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
	rt := c.rcfg.RebalanceTimeout
	if rt <= 0 {
		rt = 30 * time.Second // kafka-go's default
	}
	return min(c.cfg.drainTimeout(), rt/2)
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
// in kafka-go's queue or the workers', and no call for one is in progress
// (or the grace passed), or when Run ends.
func (c *Consumer) revoke() {
	r := c.cur.Load()
	if r == nil {
		return // the first join, before Run set up
	}
	r.genMu.Lock()
	old := r.gen
	r.gen = newGeneration(r.work)
	r.revoking = true
	parts := r.tr.newEpoch()
	r.genMu.Unlock()
	defer func() {
		r.genMu.Lock()
		r.revoking = false
		r.genMu.Unlock()
	}()
	busy, idle := old.end()
	if len(parts) > 0 || busy > 0 {
		c.log.Info("partitions revoked", "partitions", parts, "in_flight", int64(busy))
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
