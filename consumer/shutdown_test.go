package consumer_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/consumer"
)

var seedFlag = flag.Uint64("consumer.seed", 0, "seed of the random rounds of the shutdown and rebalance tests (0: a new one)")

// seed returns the seed of t's random rounds, and logs how to replay them.
func seed(t *testing.T) uint64 {
	t.Helper()
	s := *seedFlag
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test -run '^%s$' ./consumer/ -consumer.seed=%d)", s, t.Name(), s)
	return s
}

// shutdownRound is one random shutdown: how the consumer is set up, which
// message gets stuck in its handler, when Run's context is cancelled and
// how the drain ends.
type shutdownRound struct {
	mode           string // "graceful": the stuck call returns; "deadline": DrainTimeout passes; "abort": RunWithAbort's channel closes
	ordering       consumer.Ordering
	workers        int
	maxInFlight    int
	commitInterval time.Duration // 1 h: nothing but the first and the final commit
	drainTimeout   time.Duration // "deadline" only
	stuckPartition int
	stuckOffset    int64
	waitAll        bool // cut once every other message is handled (OrderNone), else as soon as the stuck call starts
}

func (r shutdownRound) String() string {
	cut := "when the stuck call starts"
	if r.waitAll {
		cut = "when every other message is handled"
	}
	return fmt.Sprintf("%s, ordering %s, %d workers, MaxInFlight %d, CommitInterval %v, DrainTimeout %v; partition %d offset %d stuck; cut %s",
		r.mode, r.ordering, r.workers, r.maxInFlight, r.commitInterval, r.drainTimeout, r.stuckPartition, r.stuckOffset, cut)
}

func drawShutdownRound(rng *rand.Rand, partitions, perPartition int) shutdownRound {
	r := shutdownRound{
		mode:           []string{"graceful", "deadline", "abort"}[rng.IntN(3)],
		ordering:       consumer.Ordering(rng.IntN(3)),
		workers:        2 + rng.IntN(7),
		stuckPartition: rng.IntN(partitions),
		stuckOffset:    int64(rng.IntN(perPartition)),
	}
	r.maxInFlight = r.workers + rng.IntN(64)
	if rng.IntN(2) == 0 {
		// A message holds its place in MaxInFlight until it is committed:
		// room for every message, or fetching would stop for the hour.
		r.commitInterval = time.Hour
		r.maxInFlight = partitions*perPartition + rng.IntN(32)
	}
	if r.mode == "deadline" {
		r.drainTimeout = time.Duration(1+rng.IntN(30)) * time.Millisecond
	}
	if r.waitAll = r.ordering == consumer.OrderNone && rng.IntN(2) == 0; r.waitAll {
		// The stuck partition's messages after the stuck one are done but
		// not committed: each holds its place until the end.
		r.maxInFlight = max(r.maxInFlight, perPartition+1)
	}
	return r
}

// TestShutdownCommitsEveryDonePrefix cuts a consumer's shutdown short in
// many random rounds — one message stuck in its handler while the others
// go on, then Run's context cancelled and the drain ended by its deadline,
// by RunWithAbort's channel, or gracefully by the stuck call returning —
// and checks, against a record of every handler call, that each
// partition's committed offset is exactly its done prefix (every message
// before it handled, the one at it not), every time, with no commit error
// counted. A CommitInterval of an hour in half the rounds leaves all
// progress after the first commit to the final one.
func TestShutdownCommitsEveryDonePrefix(t *testing.T) {
	const partitions, perPartition, rounds = 8, 12, 48
	n := partitions * perPartition
	k := newKafka(t)
	topic := name(t, "topic")
	k.createTopic(t, topic, partitions)
	k.produce(t, topic, partitions, testMessages(n))
	rng := rand.New(rand.NewPCG(seed(t), 0))
	failed := 0
	for i := range rounds {
		r := drawShutdownRound(rng, partitions, perPartition)
		if !t.Run(fmt.Sprintf("round%02d", i), func(t *testing.T) { runShutdownRound(t, k, topic, partitions, n, r) }) {
			failed++
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d rounds left a done prefix uncommitted or counted a commit error", failed, rounds)
	}
}

// doneRecord is what the handler calls did: which offsets of each
// partition returned nil.
type doneRecord struct {
	mu      sync.Mutex
	done    map[int]map[int64]bool
	count   int
	want    int           // close others once count reaches it
	others  chan struct{} // closed when want messages are done
	stuckIn chan struct{} // closed when the stuck call starts
}

// prefix returns how many offsets of partition p from 0 on returned nil.
func (d *doneRecord) prefix(p int) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var off int64
	for d.done[p][off] {
		off++
	}
	return off
}

func runShutdownRound(t *testing.T, k *testKafka, topic string, partitions, n int, r shutdownRound) {
	t.Log(r)
	group := name(t, "group")
	rec := &doneRecord{done: map[int]map[int64]bool{}, want: n - 1, others: make(chan struct{}), stuckIn: make(chan struct{})}
	release := make(chan struct{})
	c, err := consumer.New(consumer.Config{
		Brokers: k.brokers, Topic: topic, GroupID: group,
		Workers: r.workers, MaxInFlight: r.maxInFlight, Ordering: r.ordering,
		CommitInterval: r.commitInterval, DrainTimeout: r.drainTimeout,
	}, newLimiter(t, 1_000_000, 100*time.Millisecond), func(ctx context.Context, m kafka.Message) error {
		if m.Partition == r.stuckPartition && m.Offset == r.stuckOffset {
			close(rec.stuckIn)
			select {
			case <-ctx.Done(): // abandoned: the drain was cut short
				return ctx.Err()
			case <-release:
			}
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if rec.done[m.Partition] == nil {
			rec.done[m.Partition] = map[int64]bool{}
		}
		rec.done[m.Partition][m.Offset] = true
		if rec.count++; rec.count == rec.want {
			close(rec.others)
		}
		return nil
	}, consumer.WithReaderConfig(fastGroup))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	abort := make(chan struct{})
	errc := make(chan error, 1)
	go func() { errc <- c.RunWithAbort(ctx, abort) }()

	waitFor(t, rec.stuckIn, "the stuck call to start")
	if r.waitAll {
		waitFor(t, rec.others, "every other message handled")
	}
	cancel()
	switch r.mode {
	case "graceful":
		close(release)
	case "abort":
		close(abort)
	}
	ran := make(chan struct{})
	go func() {
		err = <-errc
		close(ran)
	}()
	waitFor(t, ran, "Run to return")
	if err != nil {
		t.Fatalf("Run: %v", err)
	}

	committed := k.committed(t, group, topic, partitions)
	for p := range partitions {
		if got, want := max(committed[p], 0), rec.prefix(p); got != want {
			t.Errorf("partition %d committed at %d, but its done prefix ends at %d", p, committed[p], want)
		}
	}
	if st := c.Stats(); st.CommitErrors != 0 {
		t.Errorf("%d commit errors counted (Stats %+v)", st.CommitErrors, st)
	}
}
