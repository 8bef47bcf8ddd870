package consumer_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/limiter"
)

// childEnv, when set, makes the test binary run one consumer (childMain)
// instead of the tests: the process that TestKilledConsumerIsResumed kills.
const childEnv = "SLUICE_CONSUMER_TEST_CHILD"

type childSpec struct {
	Brokers     []string
	Topic       string
	Group       string
	MaxInFlight int
	Quota       int64
}

// childMain consumes as the spec in childEnv says, printing each message's
// value, partition and offset on stdout when the handler runs (so before it
// can be committed), until it is killed.
func childMain() int {
	var spec childSpec
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "child: bad spec:", err)
		return 2
	}
	// Paced, so that at any moment messages are fetched and waiting for a
	// permit: the kill then always finds work in flight.
	lim, err := limiter.New(spec.Quota, 100*time.Millisecond, limiter.WithPacing(true))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	var mu sync.Mutex
	c, err := consumer.New(consumer.Config{
		Brokers: spec.Brokers, Topic: spec.Topic, GroupID: spec.Group,
		Workers: 4, MaxInFlight: spec.MaxInFlight,
	}, lim, func(ctx context.Context, m kafka.Message) error {
		mu.Lock()
		defer mu.Unlock()
		_, err := fmt.Fprintf(os.Stdout, "%s %d %d\n", m.Value, m.Partition, m.Offset)
		return err
	}, consumer.WithReaderConfig(fastGroup))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	if err := c.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

func TestKilledConsumerIsResumed(t *testing.T) {
	const (
		n, partitions = 400, 4
		maxInFlight   = 16
		killAfter     = 100
	)
	k := newKafka(t)
	topic, group := name(t, "topic"), name(t, "group")
	k.createTopic(t, topic, partitions)
	k.produce(t, topic, partitions, testMessages(n))

	spec, _ := json.Marshal(childSpec{Brokers: k.brokers, Topic: topic, Group: group, MaxInFlight: maxInFlight, Quota: 40})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Read what the child handled; SIGKILL it mid-stream.
	byChild := map[string]int{}
	childOffsets := map[int]map[int64]bool{} // partition → offsets handled
	lines := bufio.NewScanner(out)
	killed := false
	for lines.Scan() {
		var v string
		var p int
		var off int64
		if _, err := fmt.Sscan(lines.Text(), &v, &p, &off); err != nil {
			t.Fatalf("child printed %q: %v", lines.Text(), err)
		}
		byChild[v]++
		if childOffsets[p] == nil {
			childOffsets[p] = map[int64]bool{}
		}
		childOffsets[p][off] = true
		if len(byChild) == killAfter && !killed {
			killed = true
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
		}
	}
	err = cmd.Wait()
	if !killed {
		t.Fatalf("the child exited (%v) after handling %d messages, before it was killed; stderr:\n%s", err, len(byChild), stderr.String())
	}
	if len(byChild) >= n {
		t.Fatalf("the child handled all %d messages before it died; the test needs a kill mid-stream", n)
	}

	// What the dead consumer committed, it had handled: every offset below
	// each partition's committed offset was handled by it.
	for p, committed := range k.committed(t, group, topic, partitions) {
		for off := range committed {
			if !childOffsets[p][off] {
				t.Fatalf("partition %d committed at %d, but offset %d was never handled", p, committed, off)
			}
		}
	}

	// The survivor finishes the rest, once the group has expelled the dead
	// member (after its session timeout).
	var mu sync.Mutex
	bySurvivor := map[string]int{}
	need, got := n-len(byChild), 0
	done := make(chan struct{})
	c, err := consumer.New(consumer.Config{Brokers: k.brokers, Topic: topic, GroupID: group, Workers: 4, MaxInFlight: 64},
		newLimiter(t, 1_000_000, 100*time.Millisecond), func(ctx context.Context, m kafka.Message) error {
			mu.Lock()
			defer mu.Unlock()
			v := string(m.Value)
			bySurvivor[v]++
			if bySurvivor[v] == 1 && byChild[v] == 0 {
				if got++; got == need {
					close(done)
				}
			}
			return nil
		}, consumer.WithReaderConfig(fastGroup))
	if err != nil {
		t.Fatal(err)
	}
	stop := started(t, c)
	waitFor(t, done, "the survivor to handle the rest")
	if err := stop(); err != nil {
		t.Fatalf("survivor Run: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for v := range bySurvivor {
		if byChild[v] > 0 {
			dups++
		}
	}
	if missing := countMissing(byChild, bySurvivor, n); missing != 0 {
		t.Fatalf("%d messages were never handled", missing)
	}
	if dups > maxInFlight {
		t.Fatalf("%d messages handled by both the killed consumer and the survivor, want ≤ MaxInFlight (%d)", dups, maxInFlight)
	}
	t.Logf("killed after %d messages; %d handled twice (bound %d)", len(byChild), dups, maxInFlight)
}

// countMissing counts the values 0..n-1 seen by neither map.
func countMissing(a, b map[string]int, n int) int {
	missing := 0
	for v := range n {
		s := fmt.Sprint(v)
		if a[s] == 0 && b[s] == 0 {
			missing++
		}
	}
	return missing
}
