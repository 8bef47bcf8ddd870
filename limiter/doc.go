// Package limiter admits at most a quota of permits in every
// wall-clock-aligned window, deciding each call locally in nanoseconds.
//
// It is the part of sluice that every instance of a service links. Many
// instances share one downstream API's limit by each enforcing a share of
// it in the same windows: a window of length W starts at every multiple of
// W since the Unix epoch, on the instance's clock corrected by its measured
// offset (SetClockOffset), so the instances agree on boundaries. Joining a
// provider through etcd, which sets the share with SetQuota as it moves,
// lives in the subpackage cluster; clock measurement in skew; Prometheus
// metrics in metrics. This package imports only the standard library.
//
// A handler with a latency budget waits for a permit only as long as the
// budget allows:
//
//	lim, err := limiter.New(100, time.Second) // 100 calls per aligned second
//	if err != nil {
//		return err
//	}
//	defer lim.Close()
//
//	if err := lim.Acquire(ctx, 200*time.Millisecond); err != nil {
//		// errors.Is(err, limiter.ErrTimeout): no permit within 200ms;
//		// decided at once, without sleeping.
//		return err
//	}
//	callProvider(ctx)
//
// The outcomes are typed: ErrTimeout (the permit lies further away than
// the wait allowed), ErrCanceled (the context ended while waiting; the
// permit went back), ErrClosed, ErrNoQuota (no share yet) and ErrInvalid.
// Shadow mode (WithShadow) admits everything and counts what it would have
// refused; pacing (WithPacing) spreads a window's permits across it;
// Backoff pauses admissions when the provider answers 429 with Retry-After;
// SetExpiry stops admissions from a time on unless re-armed, so that an
// instance cut off from its cluster's coordinator gives up its share by
// itself.
//
// A provider with several limits — 100 requests per second and 50,000 per
// day, or 500 requests and 200,000 tokens per minute — is a Multi: each
// acquisition names its cost per dimension and is granted only when every
// limit has room in its own aligned window, taking nothing otherwise; its
// Grant settles the actual cost once the provider answered:
//
//	m, err := limiter.NewMulti([]limiter.Limit{
//		{Quota: 500, Window: time.Minute},
//		{Dimension: "tokens", Quota: 200_000, Window: time.Minute},
//	})
//	…
//	g, err := m.Acquire(ctx, 200*time.Millisecond, limiter.Cost("tokens", maxTokens))
//	…
//	g.Settle(limiter.Cost("tokens", usedTokens))
//
// Priority classes (WithClasses) keep part of every window for the calls
// that matter most: a call names its class with WithClass(ctx,
// "critical"); each class's reserve is kept from the others, and a class
// may always take of its own while the window has permits the others'
// reserves leave; waiters of a higher class are served ahead of lower
// ones, and the room beyond the reserves goes to whoever asks. SetClasses
// changes them at run time, keeping what each class took of the window
// under way; a reserve given with Of is a part of each window's quota, so
// that it follows the quota (cluster.Member gives each instance the
// provider's classes so). TryAcquireContext and ReserveContext name a
// class as Acquire does; TryAcquire and Reserve are of the default class.
// A Multi serves classes too, each limit keeping its reserves of its own
// quota, all-or-nothing as ever. Stats counts admissions and refusals per
// class. A Limiter or Multi without classes pays nothing for them.
//
// Time comes from the system clock, or from a Clock given to WithClock.
// Tests of waits run under testing/synctest, whose fake time the system
// clock follows.
package limiter
