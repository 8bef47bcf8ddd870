package consumer_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluice-go/sluice/consumer"
)

// history is everything that happened in one rebalance round, in one
// order: handler calls starting and ending, each consumer joining a group
// generation (kafka-go's "Joined group" log record) and giving its
// partitions up (the consumer's "partitions revoked" record), and, on
// kfake, the assignment of every generation (the leader's SyncGroup
// request) and every offset commit the broker received.
type history struct {
	mu     sync.Mutex
	events []event
}

type eventKind int

const (
	callStart eventKind = iota
	callEnd
	joined     // a consumer joined generation gen as member
	assignment // the leader assigned generation gen's partitions: member → partitions
	revoked
	commitSent
	stopped // a consumer's Run returned
)

type event struct {
	kind      eventKind
	inst      int // the consumer: 1 or 2; 0 for a commit
	partition int
	offset    int64
	ok        bool // callEnd: the handler returned nil
	gen       int64
	member    string           // joined
	assigned  map[string][]int // assignment: member → partitions of the topic
	parts     []int            // revoked
	inFlight  int64            // revoked: handler calls in progress, as the consumer counted them
	commits   map[int]int64    // commitSent: partition → offset committed (the next to read)
}

func (h *history) add(ev event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, ev)
}

// historyLog records a consumer's joins (kafka-go's "Joined group" debug
// record) and revocations ("partitions revoked") in the history.
type historyLog struct {
	h       *history
	inst    int
	onEvent func(event)
}

func (l historyLog) Enabled(context.Context, slog.Level) bool { return true }
func (l historyLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l historyLog) WithGroup(string) slog.Handler            { return l }
func (l historyLog) Handle(_ context.Context, r slog.Record) error {
	ev := event{inst: l.inst}
	switch {
	case r.Message == "partitions revoked":
		ev.kind = revoked
	case strings.HasPrefix(r.Message, "Joined group "):
		ev.kind = joined
		// "Joined group G as member M in generation N"; M holds spaces.
		_, rest, ok1 := strings.Cut(r.Message, " as member ")
		i := strings.LastIndex(rest, " in generation ")
		if !ok1 || i < 0 {
			return fmt.Errorf("kafka-go's join record changed: %q", r.Message)
		}
		ev.member = rest[:i]
		if _, err := fmt.Sscanf(rest[i:], " in generation %d", &ev.gen); err != nil {
			return fmt.Errorf("kafka-go's join record changed: %q: %v", r.Message, err)
		}
	default:
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		switch v := a.Value.Any().(type) {
		case int64:
			switch a.Key {
			case "generation":
				ev.gen = v
			case "in_flight":
				ev.inFlight = v
			}
		case []int:
			if a.Key == "partitions" {
				ev.parts = slices.Clone(v)
			}
		}
		return true
	})
	l.h.add(ev)
	if l.onEvent != nil {
		l.onEvent(ev)
	}
	return nil
}

// rebalanceRound is one random run of two consumers of one group: the
// second joins once the first has handled joinAfter messages.
type rebalanceRound struct {
	ordering    consumer.Ordering
	workers     int
	maxInFlight int
	quota       int64 // permits per 100 ms, each consumer
	joinAfter   int
	// block: from the join on until its revocation, the first consumer's
	// handler calls do not return until their context is cancelled, so
	// that the calls in flight at the revocation are abandoned (and
	// handled again by the partition's next owner).
	block bool
}

func (r rebalanceRound) String() string {
	return fmt.Sprintf("ordering %s, %d workers, MaxInFlight %d, %d permits per 100ms each, second consumer after %d messages, calls in flight at the revocation blocked until abandoned: %v",
		r.ordering, r.workers, r.maxInFlight, r.quota, r.joinAfter, r.block)
}

func drawRebalanceRound(rng *rand.Rand, n int) rebalanceRound {
	r := rebalanceRound{
		ordering:  consumer.Ordering(rng.IntN(3)),
		workers:   2 + rng.IntN(5),
		quota:     int64(20 + rng.IntN(30)),
		joinAfter: n/8 + rng.IntN(n/4),
	}
	r.maxInFlight = 50 + rng.IntN(250)
	// Only with OrderPartition does a blocked call hold back every later
	// message of its partition; with the other orderings, later messages
	// done behind an abandoned one are re-delivered with it.
	r.block = r.ordering == consumer.OrderPartition && rng.IntN(2) == 0
	return r
}

// TestRevokedPartitionsStartNoCall runs random rounds of a consumer group
// whose second member joins mid-stream, while the first has up to
// MaxInFlight messages fetched and waiting for permits. An oracle over the
// round's whole history — every handler call's start and end, every
// assignment and revocation each consumer logged, every offset commit the
// broker received — checks that:
//   - no handler call starts for a partition its consumer does not own
//     (after the revocation is known, before the next assignment);
//   - when a consumer gives its partitions up, each one's done prefix (what
//     it handled from where it started reading up to the first message it
//     did not handle) is committed;
//   - every message called more than once was, on each earlier call,
//     either unfinished at a revocation (in flight then: at most Workers
//     each time) or done behind a message of its partition that its
//     consumer did not handle (OrderKey, OrderNone: counted by the oracle),
//     never a message that was queued, nor one done in the done prefix;
//   - no commit covers an offset whose message was not handled before it;
//   - every message is handled, and everything is committed at the end.
var rebalanceRounds = flag.Int("consumer.rounds", 4, "rounds of TestRevokedPartitionsStartNoCall (make rebalance runs 100)")

func TestRevokedPartitionsStartNoCall(t *testing.T) {
	const partitions, perPartition = 8, 60
	rounds := *rebalanceRounds
	n := partitions * perPartition
	k := newKafka(t)
	topic := name(t, "topic")
	k.createTopic(t, topic, partitions)
	k.produce(t, topic, partitions, testMessages(n))
	if k.fake == nil {
		t.Skip("KAFKA_BROKERS is set: the oracle needs kfake to see each generation's assignment and every commit")
	}
	h := &history{} // the current round's; assignments and commits are recorded in it
	var hmu sync.Mutex
	{
		k.fake.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
			oc := req.(*kmsg.OffsetCommitRequest)
			ev := event{kind: commitSent, gen: int64(oc.Generation), commits: map[int]int64{}}
			for _, tp := range oc.Topics {
				if tp.Topic != topic {
					continue
				}
				for _, p := range tp.Partitions {
					ev.commits[int(p.Partition)] = p.Offset
				}
			}
			hmu.Lock()
			cur := h
			hmu.Unlock()
			cur.add(ev)
			return nil, nil, false // observed, then handled by the broker as usual
		})
		k.fake.ControlKey(int16(kmsg.SyncGroup), func(req kmsg.Request) (kmsg.Response, error, bool) {
			sg := req.(*kmsg.SyncGroupRequest)
			if len(sg.GroupAssignment) == 0 {
				return nil, nil, false // a follower's
			}
			ev := event{kind: assignment, gen: int64(sg.Generation), assigned: map[string][]int{}}
			for _, a := range sg.GroupAssignment {
				var ma kmsg.ConsumerMemberAssignment
				if err := ma.ReadFrom(a.MemberAssignment); err != nil {
					t.Errorf("decoding the assignment of %s: %v", a.MemberID, err)
				}
				parts := []int{}
				for _, tp := range ma.Topics {
					if tp.Topic == topic {
						for _, p := range tp.Partitions {
							parts = append(parts, int(p))
						}
					}
				}
				ev.assigned[a.MemberID] = parts
			}
			hmu.Lock()
			cur := h
			hmu.Unlock()
			cur.add(ev)
			return nil, nil, false
		})
	}
	rng := rand.New(rand.NewPCG(seed(t), 0))
	for i := range rounds {
		r := drawRebalanceRound(rng, n)
		hr := &history{}
		hmu.Lock()
		h = hr
		hmu.Unlock()
		t.Run(fmt.Sprintf("round%d", i), func(t *testing.T) { runRebalanceRound(t, k, topic, partitions, perPartition, r, hr) })
	}
}

func runRebalanceRound(t *testing.T, k *testKafka, topic string, partitions, perPartition int, r rebalanceRound, h *history) {
	t.Log(r)
	n := partitions * perPartition
	group := name(t, "group")

	var blocking atomic.Bool
	var mu sync.Mutex
	handled := map[string]bool{}
	reachedJoin, all := make(chan struct{}), make(chan struct{})
	handler := func(inst int) consumer.Handler {
		return func(ctx context.Context, m kafka.Message) error {
			h.add(event{kind: callStart, inst: inst, partition: m.Partition, offset: m.Offset})
			if inst == 1 && blocking.Load() {
				<-ctx.Done()
				h.add(event{kind: callEnd, inst: inst, partition: m.Partition, offset: m.Offset})
				return ctx.Err()
			}
			h.add(event{kind: callEnd, inst: inst, partition: m.Partition, offset: m.Offset, ok: true})
			mu.Lock()
			defer mu.Unlock()
			if v := string(m.Value); !handled[v] {
				handled[v] = true
				switch len(handled) {
				case r.joinAfter:
					close(reachedJoin)
				case n:
					close(all)
				}
			}
			return nil
		}
	}
	cfg := consumer.Config{
		Brokers: k.brokers, Topic: topic, GroupID: group,
		Workers: r.workers, MaxInFlight: r.maxInFlight, Ordering: r.ordering,
		// How long calls in flight at a revocation may go on (with half the
		// rebalance timeout): short, for the rounds that block them.
		DrainTimeout: 500 * time.Millisecond,
	}
	readerConfig := consumer.WithReaderConfig(func(rc *kafka.ReaderConfig) {
		fastGroup(rc)
		rc.RebalanceTimeout = 10 * time.Second // room for the revocation's wait on a busy machine
	})
	stopBlocking := func(ev event) {
		if ev.kind == revoked {
			blocking.Store(false) // calls that start after the next assignment return
		}
	}
	a, err := consumer.New(cfg, newLimiter(t, r.quota, 100*time.Millisecond), handler(1), readerConfig,
		consumer.WithLogger(slog.New(historyLog{h: h, inst: 1, onEvent: stopBlocking})))
	if err != nil {
		t.Fatal(err)
	}
	b, err := consumer.New(cfg, newLimiter(t, r.quota, 100*time.Millisecond), handler(2), readerConfig,
		consumer.WithLogger(slog.New(historyLog{h: h, inst: 2})))
	if err != nil {
		t.Fatal(err)
	}
	stopA := started(t, a)
	waitFor(t, reachedJoin, "the first consumer to be mid-stream")
	blocking.Store(r.block)
	stopB := started(t, b)
	waitFor(t, all, "every message handled")
	if err := stopB(); err != nil {
		t.Fatalf("second Run: %v", err)
	}
	h.add(event{kind: stopped, inst: 2})
	if err := stopA(); err != nil {
		t.Fatalf("first Run: %v", err)
	}
	h.add(event{kind: stopped, inst: 1})
	if sa, sb := a.Stats(), b.Stats(); sb.Handled == 0 || sa.Rebalances < 2 {
		t.Errorf("no rebalance happened (first consumer: %d generations; second handled %d)", sa.Rebalances, sb.Handled)
	}
	checkRebalanceHistory(t, h, n, partitions, r)
	for p, off := range k.committed(t, group, topic, partitions) {
		if off != int64(perPartition) {
			t.Errorf("partition %d committed at %d, want %d", p, off, perPartition)
		}
	}
}

type msgKey struct {
	partition int
	offset    int64
}

// checkRebalanceHistory is the oracle of TestRevokedPartitionsStartNoCall.
//
// A consumer's tenure is one generation it joined: from its join record to
// its next one, or to the end of its Run. It owns the partitions the
// generation's assignment gave it until its revocation record; the calls
// the record counts in progress (at most Workers) may have their start
// recorded by the handler after it, and only those. When the
// tenure ends, the consumer has given its partitions up: for each of them,
// what it handled from where it started reading (the offset committed when
// the generation was assigned) up to the first message it did not handle —
// its done prefix — must be committed by then. What it handled behind that
// first unhandled message cannot be committed (offsets are committed
// contiguously): with OrderKey or OrderNone such messages are handled again
// by the partition's next owner, and the oracle counts them. So every
// message called more than once must have had, on each of its earlier
// calls, one that was either unfinished when its tenure ended (in flight
// at the revocation, at most Workers of them) or done behind an unhandled
// message of its partition; any other duplicate is a failure.
func checkRebalanceHistory(t *testing.T, h *history, n, partitions int, r rebalanceRound) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	type tenure struct {
		gen     int64
		member  string
		revoked bool
	}
	type callRec struct {
		key          msgKey
		inst, start  int
		tn           *tenure
		ok           bool
		atRevocation bool // in flight at a revocation of its consumer
		unfinished   bool // not done when its tenure ended
		behindGap    bool // done, behind a message of its partition that its tenure did not handle
	}
	cur := map[int]*tenure{}                    // consumer → its tenure
	calls := map[int][]*callRec{}               // consumer → the calls of its tenure
	assignments := map[int64]map[string][]int{} // generation → member → partitions
	genStart := map[int64][]int64{}             // generation → per partition, the offset committed when it was assigned
	owns := func(inst, p int) bool {
		tn := cur[inst]
		return tn != nil && !tn.revoked && slices.Contains(assignments[tn.gen][tn.member], p)
	}
	open := map[int]map[msgKey][]*callRec{} // consumer → calls in progress
	byKey := map[msgKey][]*callRec{}
	handledTo := make([]int64, partitions)   // per partition: every offset below was handled
	committedTo := make([]int64, partitions) // per partition: the offset of the last commit
	handled := map[msgKey]bool{}
	var errs, notOwned []string
	notOwnedN, revocations, atRevocation, unfinished, behindGap, uncommitted := 0, 0, 0, 0, 0, 0
	firstRevoked := false
	late := map[int]int{} // consumer → calls in progress at its revocation not started in the history yet

	// end ends inst's tenure at event i.
	end := func(i, inst int) {
		tn := cur[inst]
		if tn == nil {
			return
		}
		done := map[msgKey]bool{}
		for _, c := range calls[inst] {
			if c.ok {
				done[c.key] = true
			}
		}
		prefix := map[int]int64{}
		for _, p := range assignments[tn.gen][tn.member] {
			o := genStart[tn.gen][p]
			for done[msgKey{p, o}] {
				o++
			}
			prefix[p] = o
			if committedTo[p] < o {
				uncommitted += int(o - committedTo[p])
				errs = append(errs, fmt.Sprintf("event %d: consumer %d gave up partition %d (generation %d) with offsets %d to %d handled, but committed only to %d",
					i, inst, p, tn.gen, genStart[tn.gen][p], o-1, committedTo[p]))
			}
		}
		for _, c := range calls[inst] {
			p, ok := prefix[c.key.partition]
			switch {
			case !c.ok:
				c.unfinished = true
				unfinished++
				if !c.atRevocation {
					errs = append(errs, fmt.Sprintf("event %d: consumer %d's call of partition %d offset %d (event %d) was neither done nor in flight at a revocation when generation %d ended",
						i, inst, c.key.partition, c.key.offset, c.start, tn.gen))
				}
			case ok && c.key.offset >= p:
				c.behindGap = true
				behindGap++
			}
		}
		cur[inst], calls[inst] = nil, nil
	}

	for i, ev := range h.events {
		key := msgKey{ev.partition, ev.offset}
		switch ev.kind {
		case joined:
			end(i, ev.inst)
			late[ev.inst] = 0
			cur[ev.inst] = &tenure{gen: ev.gen, member: ev.member}
		case stopped:
			end(i, ev.inst)
		case assignment:
			assignments[ev.gen] = ev.assigned
			genStart[ev.gen] = slices.Clone(committedTo)
		case revoked:
			revocations++
			firstRevoked = firstRevoked || ev.inst == 1
			inFlight := 0
			for _, cs := range open[ev.inst] {
				for _, c := range cs {
					c.atRevocation = true
					inFlight++
				}
			}
			// The consumer counted the calls that passed its gate before
			// the revocation; those whose start the handler had not
			// recorded yet may start after this record.
			late[ev.inst] = int(ev.inFlight) - inFlight
			atRevocation += int(ev.inFlight)
			if inFlight > r.workers || ev.inFlight > int64(r.workers) || int64(inFlight) > ev.inFlight {
				errs = append(errs, fmt.Sprintf("event %d: consumer %d revoked generation %d with %d calls in flight (it counted %d), Workers %d",
					i, ev.inst, ev.gen, inFlight, ev.inFlight, r.workers))
			}
			if tn := cur[ev.inst]; tn != nil {
				tn.revoked = true
			}
		case callStart:
			startedLate := false
			if tn := cur[ev.inst]; tn != nil && tn.revoked && late[ev.inst] > 0 {
				late[ev.inst]--
				startedLate = true
			}
			if !startedLate && !owns(ev.inst, ev.partition) {
				if notOwnedN++; len(notOwned) < 5 {
					notOwned = append(notOwned, fmt.Sprintf("event %d: consumer %d, partition %d offset %d", i, ev.inst, ev.partition, ev.offset))
				}
			}
			c := &callRec{key: key, inst: ev.inst, start: i, tn: cur[ev.inst], atRevocation: startedLate}
			if open[ev.inst] == nil {
				open[ev.inst] = map[msgKey][]*callRec{}
			}
			open[ev.inst][key] = append(open[ev.inst][key], c)
			calls[ev.inst] = append(calls[ev.inst], c)
			byKey[key] = append(byKey[key], c)
		case callEnd:
			cs := open[ev.inst][key]
			if len(cs) == 0 {
				errs = append(errs, fmt.Sprintf("event %d: a call ended that never started", i))
				continue
			}
			c := cs[0]
			if open[ev.inst][key] = cs[1:]; len(cs) == 1 {
				delete(open[ev.inst], key)
			}
			if c.tn != cur[ev.inst] {
				continue // ended after its tenure: unfinished then
			}
			c.ok = ev.ok
			if ev.ok {
				handled[key] = true
				for handled[msgKey{ev.partition, handledTo[ev.partition]}] {
					handledTo[ev.partition]++
				}
			}
		case commitSent:
			for p, off := range ev.commits {
				if off > handledTo[p] {
					errs = append(errs, fmt.Sprintf("event %d: commit of partition %d at %d (generation %d), but offset %d was not handled yet",
						i, p, off, ev.gen, handledTo[p]))
				}
				committedTo[p] = off
			}
		}
	}
	if notOwnedN > 0 {
		t.Errorf("%d handler calls started for a partition their consumer did not own (revoked, or not assigned yet); the first: %v", notOwnedN, notOwned)
	}
	if !firstRevoked {
		t.Errorf("the first consumer logged no revocation: the rebalance was not seen")
	}
	for _, s := range errs {
		t.Error(s)
	}
	dups, inFlightDups, gapDups := 0, 0, 0
	var unexplained []string
	for key, cs := range byKey {
		for _, c := range cs[:len(cs)-1] {
			dups++
			switch {
			case c.unfinished:
				inFlightDups++
			case c.behindGap:
				gapDups++
			default:
				if len(unexplained) < 5 {
					unexplained = append(unexplained, fmt.Sprintf("partition %d offset %d: call by consumer %d (event %d, ok %v), then %d more",
						key.partition, key.offset, c.inst, c.start, c.ok, len(cs)-1))
				}
			}
		}
	}
	lost := 0
	for p := range partitions {
		lost += int(int64(n/partitions) - handledTo[p])
	}
	if lost > 0 {
		t.Errorf("%d messages never handled (handled prefixes %v)", lost, handledTo)
	}
	if d := dups - inFlightDups - gapDups; d > 0 {
		t.Errorf("%d duplicate handler calls; %d of them unfinished at a revocation, %d done behind an unhandled message; the %d others (done, in the done prefix, so to be committed): %v",
			dups, inFlightDups, gapDups, d, unexplained)
	}
	t.Logf("%d events; %d revocations with %d calls in flight in all (Workers %d); %d duplicate calls: %d unfinished at a revocation (of %d), %d done behind an unhandled message (of %d); %d handled messages left uncommitted at a revocation; %d calls for partitions not owned",
		len(h.events), revocations, atRevocation, r.workers, dups, inFlightDups, unfinished, gapDups, behindGap, uncommitted, notOwnedN)
}
