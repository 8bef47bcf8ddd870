// Package cluster joins an instance's limiter to a provider shared through
// etcd: it registers the instance with a lease, keeps the limiter's quota
// equal to the instance's share, and reports demand for configd to
// redistribute.
//
//	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
//	if err != nil {
//		return err
//	}
//	m, err := cluster.Join(ctx, cli, "payments-api", cluster.WithLogger(slog.Default()))
//	if err != nil {
//		return err
//	}
//	defer m.Close() // revokes the lease: the others' shares grow at once
//
//	lim := m.Limiter()
//	if err := lim.Acquire(ctx, 200*time.Millisecond); err != nil {
//		return err
//	}
//
// Where the share comes from, in order: the shares configd's leader
// published (an instance not yet in them gets 0: joining never pushes the
// total over); with no configd alive, total / live instances, switched at a
// window boundary every instance computes alike; before the provider is
// configured, or at a cold start with etcd unreachable, the fallback of
// WithFallback (0 by default: fail-closed). Once a share is known, an etcd
// outage keeps it (fail-static, Status.Connected false), and the Member
// registers again by itself, with a new lease, when etcd is back.
//
// The even split without configd is a degraded mode: when an instance
// joins, the others shrink at the boundary they compute on seeing it, so
// for at most one window plus the watch's propagation the total can exceed
// the limit by one share. configd's handover does not have that gap.
package cluster
