package faults

import (
	"flag"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluice-go/sluice/limiter"
)

var soakMessages = flag.Int("faults.soak-messages", 100_000,
	"messages TestKafkaSoak produces (at 2,500/s); the default runs about a minute")

// The Kafka soak's shape: a producer writes soakRate messages per second;
// every soakEvery one of two more consumers joins or leaves the group; the
// broker restarts once 30% of the messages are written, for soakDown; the
// limiter's quota goes from soakQuota1 to soakQuota2 per window once 60%
// are.
const (
	soakRate       = 2500
	soakEvery      = 2 * time.Second
	soakDown       = 3 * time.Second
	soakQuota1     = 2000 // below soakRate: a backlog builds up, the consumers are throttled
	soakQuota2     = 5000
	soakPartitions = 8
	// soakSettle is how long after the restart duplicates count as the
	// restart's: the group forms again and re-reads what was not committed.
	soakSettle = 5 * time.Second
)

// TestKafkaSoak: one consumer of a group runs throughout while two more
// join and leave it, one change every 2 s (each lives 4 s and leaves
// gracefully: drain, commit, LeaveGroup), so the group rebalances every
// 2 s; all share one limiter. A producer writes 100,000 numbered messages
// (-faults.soak-messages) at 2,500/s. Once 30% are written the broker
// (kfake, one node) is stopped and started again 3 s later on the same
// port and data dir (its log, groups and committed offsets kept: a real
// restart); once 60% are, the limiter's quota goes from 2,000 to 5,000 per
// 1 s window at the next boundary. Checked: no acknowledged message is
// lost; no offset commit the broker receives (every request, seen as it
// arrives, restarts included) passes what was handled; no window gets more
// permits than the quota in force. Duplicate handler calls are counted.
func TestKafkaSoak(t *testing.T) {
	k := newKafka(t, false)
	total := *soakMessages
	topic, group := kafkaName(t, "topic"), kafkaName(t, "group")
	k.createTopic(t, topic, soakPartitions)
	l := newLedger()
	lim, err := limiter.New(soakQuota1, window)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })

	var cmu sync.Mutex
	commitReqs, commitViolations := 0, []string{}
	k.observeCommits(func(req *kmsg.OffsetCommitRequest) {
		if req.Group != group {
			return
		}
		cm := map[int]int64{}
		for _, tp := range req.Topics {
			if tp.Topic == topic {
				for _, p := range tp.Partitions {
					cm[int(p.Partition)] = p.Offset
				}
			}
		}
		v := l.checkCommitted(cm)
		cmu.Lock()
		defer cmu.Unlock()
		commitReqs++
		if v != "" && len(commitViolations) < 10 {
			commitViolations = append(commitViolations, fmt.Sprintf("generation %d member %s: %s", req.Generation, req.MemberID, v))
		}
	})
	cw := watchCommits(t, k, l, group, topic, soakPartitions)
	p := newProducer(t, k, topic, l)

	began := time.Now()
	members := []*member{startMember(t, k, topic, group, lim, l, 1)}
	p.runTo(soakRate, total)

	var slots [2]*member
	joins, leaves := 0, 0
	var restartAt, upAt, quotaFrom time.Time
	tick := time.NewTicker(soakEvery)
	defer tick.Stop()
churn:
	for turn := 0; ; turn++ {
		select {
		case <-p.done:
			break churn
		case <-tick.C:
		}
		if s := turn % 2; slots[s] == nil {
			slots[s] = startMember(t, k, topic, group, lim, l, 10+joins)
			members = append(members, slots[s])
			joins++
		} else {
			slots[s].leave()
			slots[s] = nil
			leaves++
		}
		produced := l.ackedCount()
		if restartAt.IsZero() && produced >= total*3/10 {
			restartAt = time.Now()
			k.stop()
			waitUntil(restartAt.Add(soakDown)) // the outage: the churn pauses with it
			k.restart()
			upAt = time.Now()
			t.Logf("injected: broker restart at %s (%d of %d messages written): kfake.Close (listener and every connection closed, state saved to its data dir), then a new kfake on the same port and data dir after %v, which reloads the log, the groups and the committed offsets",
				restartAt.UTC().Format("15:04:05.000"), produced, total, upAt.Sub(restartAt).Round(time.Millisecond))
		}
		if quotaFrom.IsZero() && produced >= total*6/10 {
			quotaFrom = nextBoundary(0)
			if err := lim.SetQuota(soakQuota2, quotaFrom); err != nil {
				t.Fatal(err)
			}
			t.Logf("injected: quota %d → %d per %v from %s (%d of %d messages written)",
				soakQuota1, soakQuota2, window, quotaFrom.UTC().Format("15:04:05"), produced, total)
		}
	}
	produced := time.Now()
	if restartAt.IsZero() || quotaFrom.IsZero() {
		t.Fatalf("the producer finished before the faults were injected (restart %v, quota change %v)", !restartAt.IsZero(), !quotaFrom.IsZero())
	}
	for _, m := range slots {
		if m != nil {
			m.leave()
			leaves++
		}
	}
	last, err := l.waitAll(60 * time.Second)
	if err != nil {
		t.Fatalf("not every acknowledged message was handled: %v", err)
	}
	members[0].leave()
	for _, m := range members {
		m.wait(t)
		if m.err != nil {
			t.Errorf("consumer %d: Run: %v", m.inst, m.err)
		}
	}
	ended := time.Now()

	var rebalances, abandoned, commits, commitErrs, throttled int64
	for _, m := range members {
		st := m.c.Stats()
		rebalances += st.Rebalances
		abandoned += st.Abandoned
		commits += st.Commits
		commitErrs += st.CommitErrors
		throttled += st.Throttled
	}
	t.Logf("injected: %d consumers joined and %d left gracefully beside the one that ran throughout, one change every %v (each lived %v); %d group generations joined in all; the producer wrote %d messages at %d/s (%d write attempts failed, each retried until acknowledged)",
		joins, leaves, soakEvery, 2*soakEvery, rebalances, total, soakRate, p.failures)

	cmu.Lock()
	for _, v := range commitViolations {
		t.Errorf("offset commit beyond what was handled: %s", v)
	}
	t.Logf("invariant: no offset commit beyond what was handled: %d commit requests of the group checked as the broker received them, %d violations; consumers' commits accepted %d, failed %d",
		commitReqs, len(commitViolations), commits, commitErrs)
	cmu.Unlock()
	cw.report(t)
	logFinalCommits(t, k, l, group, topic, soakPartitions)
	checkDelivery(t, l)
	_, _, dups, _, _, _ := l.totals()
	afterRestart := l.dupsBetween(restartAt, upAt.Add(soakSettle))
	t.Logf("duplicates by when they were made: %d from the broker's stop to %v after its restart, %d at other times (%d rebalances of joins and leaves); abandoned (dropped unstarted at a revocation, or cut): %d; permits that took longer than MaxWait: %d",
		afterRestart, soakSettle, dups-afterRestart, joins+leaves, abandoned, throttled)
	checkSoakWindows(t, l, quotaFrom)
	t.Logf("timing: %v from the first consumer until the producer had written every message, %v until each was first handled, %v in all",
		produced.Sub(began).Round(time.Millisecond), last.Sub(began).Round(time.Millisecond), ended.Sub(began).Round(time.Millisecond))
}

// checkSoakWindows fails the test for every aligned window in which the
// limiter granted more than the quota in force (soakQuota1 before
// quotaFrom, soakQuota2 from it), and logs the windows.
func checkSoakWindows(t *testing.T, l *ledger, quotaFrom time.Time) {
	t.Helper()
	cs := l.snapshotCalls()
	from, to := int64(1<<62), int64(0)
	for _, c := range cs {
		if c.granted != 0 {
			from, to = min(from, c.granted/int64(window)), max(to, c.granted/int64(window))
		}
	}
	if from > to {
		t.Fatal("no permit granted")
	}
	tl := count(cs, from, to)
	change := windowIndex(quotaFrom)
	var most [2]int64
	over := 0
	var series [2][]string
	for i, g := range tl.granted {
		k, q, half := tl.first+int64(i), int64(soakQuota1), 0
		if k >= change {
			q, half = soakQuota2, 1
		}
		most[half] = max(most[half], g)
		series[half] = append(series[half], fmt.Sprint(g))
		if g > q {
			over++
			t.Errorf("window over the quota (%d): %s", q, tl.row(k))
		}
	}
	t.Logf("invariant: no aligned window gets more permits than the quota in force: %d windows, %d over; most granted in one window %d of %d before the change, %d of %d after",
		len(tl.granted), over, most[0], soakQuota1, most[1], soakQuota2)
	t.Logf("permits granted per window: %s | from the change: %s", strings.Join(series[0], " "), strings.Join(series[1], " "))
}
