package main

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// elector runs this replica's part in the leader election and, while it
// leads, the publisher.
type elector struct {
	cli     *clientv3.Client
	prefix  string        // election prefix (schema.Keys.Election)
	id      string        // this replica's ID, the election value
	ttl     time.Duration // session TTL (whole seconds)
	pub     *publisher
	log     *slog.Logger
	metrics *metrics
	leading atomic.Bool
}

// run campaigns and publishes until ctx ends. After losing a session (etcd
// unreachable longer than the TTL) or leadership it campaigns again.
func (e *elector) run(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := e.term(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		e.log.Warn("leader election: retrying", "error", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// term is one session: campaign, lead until the session or ctx ends, then
// resign and revoke the session's lease.
func (e *elector) term(ctx context.Context) error {
	// Grant with ctx so shutdown is not held up by an unreachable etcd; the
	// session then keeps the lease alive on the client's own context, and
	// Close below revokes it with a bounded wait.
	lease, err := e.cli.Grant(ctx, int64(e.ttl/time.Second))
	if err != nil {
		return err
	}
	sess, err := concurrency.NewSession(e.cli, concurrency.WithLease(lease.ID), concurrency.WithTTL(int(e.ttl/time.Second)))
	if err != nil {
		return err
	}
	defer func() {
		sess.Orphan()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_, _ = e.cli.Revoke(rctx, lease.ID) // deletes our election key: a standby takes over at once
	}()

	// tctx ends with ctx or with the session, whichever is first: a replica
	// that loses its session stops publishing at once.
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-sess.Done():
			cancel()
		case <-tctx.Done():
		}
	}()

	el := concurrency.NewElection(sess, e.prefix)
	if err := el.Campaign(tctx, e.id); err != nil {
		return err
	}
	e.leading.Store(true)
	e.metrics.leader.Set(1)
	e.metrics.leaderChanges.Inc()
	e.log.Info("became leader", "replica", e.id, "key", el.Key(), "revision", el.Rev())
	defer func() {
		e.leading.Store(false)
		e.metrics.leader.Set(0)
		e.log.Info("no longer leader", "replica", e.id)
	}()
	err = e.pub.run(tctx, fence{key: el.Key(), rev: el.Rev()})
	select {
	case <-sess.Done():
		return errors.New("session lost (etcd unreachable for longer than the session TTL?)")
	default:
	}
	return err
}
