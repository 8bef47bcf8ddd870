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
//	defer m.Close() // revokes the lease: the others' shares grow a window later
//
//	lim := m.Limiter()
//	if err := lim.Acquire(ctx, 200*time.Millisecond); err != nil {
//		return err
//	}
//
// Several limits — 100 requests per second and 200,000 tokens per minute,
// say — are one provider's: configd set llm-api --limit 100/1s --limit
// tokens=200000/1m. configd keeps each further limit as a lane provider
// of its own (llm-api~1), written with the config, and JoinProvider joins
// every limit the config holds: each keeps one limit of a limiter.Multi
// at this instance's share of it, and an acquisition takes from every
// limit all-or-nothing:
//
//	g, err := cluster.JoinProvider(ctx, cli, "llm-api")
//	if err != nil {
//		return err
//	}
//	defer g.Close()
//	grant, err := g.Multi().Acquire(ctx, time.Second, limiter.Cost("tokens", estimate))
//	if err != nil {
//		return err
//	}
//	// ... call the provider, then give back what the call did not use:
//	grant.Settle(limiter.Cost("tokens", used))
//
// JoinGroup does the same for limits kept by providers named by hand, one
// per limit, each Lane naming what it counts (a lane refuses a provider
// that counts another dimension than its own).
//
// Each limit keeps the guarantee below on its own, since each is a
// provider with its own shares and handover. A further limit of a window
// longer than an hour, up to a day (--limit 50000/24h), is a budget:
// not shared, but taken by each instance from the window's counter as it
// spends it (see JoinProvider), so that instances joining or restarting
// mid-day spend only what the others left.
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
// A provider's priority classes (schema.ProviderConfig.Classes) are the
// limiter's as soon as the Member reads the config, under the shares and
// the ledger alike: each reserve is the part of every window's quota that
// the class's reserve is of the limit (limiter.Class.Of), so it follows
// the quota wherever it comes from, and the instances' reserves add up to
// at most the class's. A config without classes leaves the limiter none,
// except those it was made with (limiter.WithClasses) if the Member never
// set any. The instance record reports the demand of each class
// (ClassDemand), smoothed as the total's, and what each class was admitted
// since the instance started (ClassAdmitted), a running total as the
// total's. A Group's Members do the same for each limit of its Multi:
// under JoinProvider, the provider's classes are its first limit's (a
// lane provider lists none), so the first limit keeps each class's reserve,
// of the config or of the ledger's grant, and the others keep none. A
// budget's Member applies no classes.
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
// revoking the lease, so configd hands the share on a window and twice
// the clock bound later (schema.ProviderConfig.Settle), without waiting
// for fail_static; a session
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
// What a Member reads does not grow with the fleet: the provider's config,
// its own share record (Keys.Share; configd's leader writes one per
// instance, only when it changes), the provider's common record, which
// its own may say it follows (Keys.CommonShare: read with its own in one
// snapshot when it changes, or taken from the watch event when it says
// unmoved), and the election prefix, watched from the revision of one
// transaction that read them; nothing of the other instances. With no configd alive it also reads two counts, each a
// count-only request, every report interval: the keys under the
// provider's instances/ prefix (each attached to an instance's lease:
// whatever its record holds, the key says the instance is alive) and the
// even-split confirmations under even/ (one per instance that follows the
// split, on its lease, written by this package).
//
// A provider created with coordination "ledger" (configd set NAME
// --coordination ledger) is followed otherwise: on reading its config
// the Member drops what it held at once and follows the provider's
// ledger for good (until the provider is created again on the shares):
// grants of room in numbered windows that configd writes, conditioned on
// what etcd holds, and that the Member enforces exactly, cut for its
// clock as a share is; its releases it writes itself. The limiter's
// expiry is the end of its grants, not its lease. With no configd
// alive, the live instance of the least ID that may write the ledger's
// grants runs configd's round in its stead. What it reads: its own
// grants, the provider's publishes, the config and configd's election.
// See docs/architecture.md, section 8.
//
// The even split without configd is a degraded mode. It must not overlap
// with what configd's last shares let another instance enforce, and the
// instances do not see each other's shares, so an instance takes at most
// its own last grant until, for a whole hold (the provider's fail_static,
// the clock bound and a report interval) since it saw configd go, every
// poll found every live instance confirmed; then total/n, n the largest
// count of the hold; a newcomer waits a hold after registering (follow.Even
// gives the four rules and why they suffice). When an instance joins, the
// others shrink at the boundary they compute on seeing it. The price:
// after configd goes, the split reaches total/n a hold later, and a key
// under instances/ with no member of this version behind it keeps the
// others at their grants.
package cluster
