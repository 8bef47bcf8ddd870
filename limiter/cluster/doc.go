// Package cluster joins an instance's limiter to a provider shared through
// etcd: it registers the instance with a lease, keeps the limiter's quota
// equal to the instance's share, and reports demand for configd to
// redistribute.
//
//	cli, err := clientv3.New(clientv3.Config{
//		Endpoints:   []string{"127.0.0.1:2379"},
//		DialOptions: cluster.DialOptions(), // reconnect within 2 s of etcd's return
//	})
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
// outage keeps it (fail-static, Status.Connected false) until
// Status.AdmitsUntil, and the Member registers again by itself, with a new
// lease, when etcd is back.
//
// Fail-static has a horizon, so that it never overlaps with the share
// being handed to others: every lease renewal sets the limiter's expiry
// (limiter.SetExpiry) to the time the renewal was sent plus the lease TTL —
// before which etcd cannot expire the lease — plus the provider's
// fail_static under configd's shares (configd keeps an expired instance's
// share reserved for that long after its key goes), or plus nothing under
// the even split (the others grow when its key goes). Windows that begin
// after it admit nothing. The expiry lives in the limiter, not in a timer:
// a process stopped past it (SIGSTOP, a long pause) and woken later admits
// nothing, before any goroutine of its own has run. Not so a suspended
// machine: the limiter reads the monotonic clock, which stops during a
// suspend, so its time lags by the suspension until the next clock
// correction. Close stops admitting and writes a leaving mark before
// revoking the lease, so configd hands the share on at once; a session
// that ends on an error leaves its lease to expire, never revoking it
// early. When a new lease comes after the horizon has passed, the member
// starts from nothing, as a joining instance does.
//
// configd is alive while a key a configd replica can hold is under its
// election prefix: one on a lease granted for at most a session's TTL
// (schema.MaxSessionTTL), named after that lease, holding a replica ID
// (schema.Keys.CheckElectionKey). Any other key there is foreign: it is
// listed in Status.Problems and logged once, and does not count, so that a
// leaseless or long-lived key left there does not keep the instances on
// the last shares (or on nothing) with configd gone. configd removes such
// keys when it runs. A replica's key always counts.
//
// Live instances are the keys under the provider's instances/ prefix: each
// is attached to its instance's lease. A record there that does not decode
// or validate (written by hand, or by a newer version) is listed in
// Status.Problems under its key, like any malformed record, but its
// instance still counts in the even split, as configd counts it: the lease
// says it is alive, and counting it can only make the shares smaller.
//
// The even split without configd is a degraded mode: when an instance
// joins, the others shrink at the boundary they compute on seeing it, so
// for at most one window plus the watch's propagation the total can exceed
// the limit by one share. configd's handover does not have that gap. When
// configd goes, the split also leaves room for what configd's last shares
// may still have others enforce: an instance that has not confirmed the
// split (a record saying applied generation 0, written after the last
// leader went) may keep its grant — cut off from etcd, it never learns of
// the split — and so may one whose key went without a leaving mark, for
// the longest fail_static it may count with after. Each instance takes
// min(total/N, total − what the others may enforce), growing from a
// boundary ahead as they confirm (within a report interval) or their
// holds end. The price: while no configd is alive, a live instance whose
// record does not decode counts at its last grant, and a member that
// (re)loads holds every instance the last shares name that is gone, for
// fail_static, and counts the others at their grants until their records
// are written again (within ten report intervals).
package cluster
