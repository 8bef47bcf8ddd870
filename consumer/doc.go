// Package consumer reads a Kafka topic as a member of a consumer group and
// calls a handler for every message, taking one permit from a rate limiter
// before each call, so that a fleet of consumers never calls the provider
// behind the handler faster than its limit, and never loses a message
// because of that.
//
//	lim, err := limiter.New(500, time.Second) // the provider's limit, or this instance's share
//	if err != nil { … }
//	c, err := consumer.New(consumer.Config{
//		Brokers:         []string{"kafka:9092"},
//		Topic:           "orders",
//		GroupID:         "billing",
//		Workers:         16,
//		DeadLetterTopic: "orders.dead",
//	}, lim, func(ctx context.Context, m kafka.Message) error {
//		resp, err := provider.Charge(ctx, m.Value)
//		if resp.StatusCode == http.StatusTooManyRequests {
//			return consumer.RetryAfter(resp.RetryAfter, err) // slows the limiter down too
//		}
//		return err
//	}, consumer.WithLogger(slog.Default()), consumer.WithRegisterer(registry))
//	if err != nil { … }
//	err = c.Run(ctx) // until ctx is cancelled; then drains, commits and returns
//
// A provider that limits a cost too, such as tokens per minute beside
// requests, takes a limiter.Multi and WithCost: each call takes its
// message's estimated cost, and the handler reports what the call used:
//
//	m, err := limiter.NewMulti([]limiter.Limit{
//		{Quota: 500, Window: time.Minute},
//		{Dimension: "tokens", Quota: 200_000, Window: time.Minute},
//	})
//	c, err := consumer.New(cfg, m, func(ctx context.Context, msg kafka.Message) error {
//		resp, err := model.Complete(ctx, msg.Value)
//		…
//		return consumer.Settle(ctx, limiter.Cost("tokens", resp.Usage.TotalTokens))
//	}, consumer.WithCost(func(msg kafka.Message) []limiter.Amount {
//		return []limiter.Amount{limiter.Cost("tokens", maxTokens(msg))}
//	}))
//
// # Priority classes
//
// With a limiter that serves priority classes (limiter.WithClasses, or
// the limiter of a cluster.Member whose provider lists classes), WithClass
// names each message's class, here from its "priority" header, so that a
// flood of batch messages cannot take the permits kept for critical ones,
// and critical messages waiting for a permit go ahead of batch's:
//
//	c, err := consumer.New(cfg, lim, handle, consumer.WithClass(consumer.ClassHeader("priority")))
//
// Every permit of the message, its retries' included, is of that class. A
// message naming no class, a class the limiter does not list, or a string
// that is no class name, is served as the limiter's default class: it is
// never held back or dead-lettered for its class. Classes order the waits
// for permits, not the fetch: a message still waits its turn in its
// partition or key (Config.Ordering) and for a free worker, so give
// Config.Workers room beyond what a flood of lower classes keeps busy.
// With WithCost, the class is that of the limiter.Multi's acquisition.
//
// # Flow and guarantees
//
// One goroutine fetches messages (kafka-go's Reader, FetchMessage), a pool
// of Config.Workers goroutines takes a permit (Limiter.AcquireN) and calls
// the handler, and one goroutine commits offsets. Throttling never drops or
// skips a message: a worker waits for its permit as long as it takes
// (Config.MaxWait only decides when the wait is reported as throttling),
// and while it waits, fetching stops once Config.MaxInFlight messages are
// outstanding. That is the back-pressure: nothing sleeps in the fetch loop,
// and the group membership's heartbeats go on, so a throttled consumer is
// not thrown out of its group.
//
// Delivery is at-least-once. A partition's offset is committed only up to
// the last message before which every fetched message of that partition is
// done (handled, or written to the dead-letter topic). A message holds its
// place in MaxInFlight until its offset is committed, so a crash re-delivers
// at most MaxInFlight messages, and loses none. Handlers must therefore be
// idempotent.
//
// Memory: at most MaxInFlight messages are held by the consumer, plus
// kafka-go's own queue (min(MaxInFlight, 100) messages) and fetch buffers
// (ReaderConfig.MaxBytes per partition being read).
//
// # Ordering
//
// Config.Ordering picks what keeps its order: the messages of one
// partition (OrderPartition, the default), of one key (OrderKey), or
// nothing (OrderNone). A message that is being retried holds back the
// messages that must follow it.
//
// # Failures
//
// A handler error makes the consumer call the handler again after an
// exponential backoff with jitter (Config.RetryBackoff, Config.MaxBackoff),
// up to Config.MaxAttempts calls in all; each call takes its own permit.
// Then the message is produced to Config.DeadLetterTopic with its key,
// value and headers plus the HeaderError, HeaderAttempts, HeaderTopic,
// HeaderPartition and HeaderOffset headers, and counts as done once it is
// written (never before: a dead letter that cannot be written holds its
// partition's commits back). Header names starting with HeaderPrefix
// ("sluice-") are the consumer's alone: an original header named so is
// kept renamed with RenamedHeaderPrefix ("original-sluice-error"), so a
// message cannot pass its own values off as the consumer's. A dead letter
// too large for the broker is written smaller rather than retried forever:
// the error text cut, then the value left out, then the key and headers,
// each saying what it left out (HeaderErrorTruncated, HeaderValueDropped,
// HeaderKeyDropped, HeaderHeadersDropped; Stats.DeadLettersTrimmed), and
// the original can be read again from the topic, partition and offset the
// dead letter names. Without a dead-letter topic, Run stops with
// ErrHandlerFailed and the message stays uncommitted. A RetryAfter error (the provider answered 429 or 503) calls
// Limiter.Backoff and retries without using up an attempt; a Permanent
// error skips the retries.
//
// # Shutdown and rebalances
//
// When Run's context is cancelled, fetching stops, the messages already
// fetched are finished for up to Config.DrainTimeout, what is done is
// committed and the Reader is closed. Messages still unfinished at the
// deadline (or when RunWithAbort's abort channel closes) are abandoned:
// their handler's context is cancelled and they are delivered again later.
// What is done is committed however the drain ends: the final commit has
// a bound of its own, not cut by the deadline or the abort.
//
// A rebalance takes all of a member's partitions (kafka-go rebalances
// eagerly). Before the member joins the group again, the consumer drops
// the messages of those partitions that have not started (no permit is
// taken for them), lets the calls in progress finish for up to
// Config.DrainTimeout (at most half the rebalance timeout), then cancels
// their context, and commits what is done, in the generation that ended.
// The partitions' next owners handle again only the calls cut after that
// time (at most Config.Workers) and, with OrderKey or OrderNone, the
// messages done behind one that is not (offsets are committed
// contiguously). See Run for the details.
//
// Every offset commit names the group generation whose messages it
// covers, so the broker refuses one that arrives after the partitions
// were assigned again: a commit never lands over the next owner's, nor
// moves a committed offset back.
//
// # Observability
//
// Stats returns the counters at any time. WithRegisterer exports them to
// Prometheus as sluice_consumer_* metrics (consumed, handled, retried,
// dead-lettered, dead letters trimmed, abandoned, throttled, throttle wait, commits, rebalances,
// in flight, lag) and a permit-wait histogram, labelled with the topic and
// the group. Nothing is registered on the global registry. Logs go to the
// *slog.Logger given with WithLogger; by default they are discarded.
package consumer
