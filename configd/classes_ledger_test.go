package main

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// classCounter counts, per aligned window of true time, what each class
// is admitted across the members it floods.
type classCounter struct {
	w    time.Duration
	mu   sync.Mutex
	n    map[int64]map[string]int64
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup
}

func newClassCounter(t *testing.T, w time.Duration) *classCounter {
	ctx, stop := context.WithCancel(context.Background())
	c := &classCounter{w: w, n: map[int64]map[string]int64{}, ctx: ctx, stop: stop}
	t.Cleanup(func() { c.stop(); c.wg.Wait() })
	return c
}

// flood has m take every permit it can for class, decided at once.
func (c *classCounter) flood(m *cluster.Member, class string) {
	ctx := limiter.WithClass(c.ctx, class)
	c.wg.Go(func() {
		for c.ctx.Err() == nil {
			err := m.Limiter().Acquire(ctx, 0)
			k, key := time.Now().UnixNano()/int64(c.w), class
			if err != nil {
				key = class + " refused"
			}
			c.mu.Lock()
			if c.n[k] == nil {
				c.n[k] = map[string]int64{}
			}
			c.n[k][key]++
			c.mu.Unlock()
			if err != nil {
				time.Sleep(200 * time.Microsecond)
			}
		}
	})
}

// windows returns the counts of the complete windows from k on.
func (c *classCounter) windows(from int64) (ks []int64, n map[int64]map[string]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now().UnixNano() / int64(c.w)
	n = map[int64]map[string]int64{}
	for k, v := range c.n {
		if k >= from && k < now {
			n[k] = maps.Clone(v)
		}
	}
	return slices.Sorted(maps.Keys(n)), n
}

// TestCriticalKeepsItsReserveAcrossTheFleet: batch floods four members
// of a ledger provider of 400 per 100 ms, and critical, which reserves
// 50%, floods two of them. configd splits critical's reserve over the
// two that want it and raises their grants to hold it, so critical is
// admitted its 200 in every window, though the two hold half the
// fleet's quota; batch has the rest, and no window is over the limit.
// With each instance keeping the same part of its own quota (50% of
// 100), critical had 100.
func TestCriticalKeepsItsReserveAcrossTheFleet(t *testing.T) {
	srv := etcdtest.Start(t)
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	server := "--server=" + r.url()
	itCLI(t, "set", "api", "--limit", "400", "--window", itWindow.String(), "--coordination", "ledger",
		"--algorithm", "fair", "--class", "critical=50%", "--class", "batch", server)
	members := itJoin(t, srv, "api", "a", "b", "c", "d")
	c := newClassCounter(t, itWindow)
	for _, m := range members {
		c.flood(m, "batch")
	}
	for _, m := range members[:2] {
		c.flood(m, "critical")
	}
	start := time.Now()
	// Settled: three windows in a row in which critical had its reserve.
	var first int64
	itWait(t, "critical's reserve held by the two that want it", func() (bool, string) {
		var held []string
		for _, m := range members[:2] {
			for _, cs := range m.Limiter().Stats().Classes {
				if cs.Name == "critical" {
					held = append(held, fmt.Sprintf("%s %d", m.ID(), cs.Reserve))
				}
			}
		}
		ks, n := c.windows(0)
		run := 0
		for _, k := range ks {
			if n[k]["critical"] < 200-2 {
				run = 0
				continue
			}
			if run++; run == 1 {
				first = k
			}
		}
		return run >= 3, fmt.Sprintf("reserves %v; the windows counted %v", held, n)
	})
	t.Logf("critical had its reserve from a window %v after its demand began", time.Unix(0, first*int64(itWindow)).Sub(start).Round(time.Millisecond))
	from := time.Now().UnixNano()/int64(itWindow) + 1
	itWait(t, "30 windows more", func() (bool, string) {
		ks, _ := c.windows(from)
		return len(ks) >= 30, fmt.Sprintf("%d windows", len(ks))
	})
	ks, n := c.windows(from)
	var short int
	var critical, batch, worst int64
	for _, k := range ks {
		total := n[k]["critical"] + n[k]["batch"]
		worst = max(worst, total)
		if total > 400 {
			t.Errorf("window %d admitted %d, over the limit 400: %v", k, total, n[k])
		}
		// Critical refused while short of its reserve. (On a loaded
		// machine its callers may not ask for all of it in a window; a
		// permit taken at a window's edge may be counted in the next.)
		if n[k]["critical"] < 200-2 && n[k]["critical refused"] > 0 {
			short++
			t.Logf("window %d: critical admitted %d of its reserve 200 and refused %d; batch admitted %d", k, n[k]["critical"], n[k]["critical refused"], n[k]["batch"])
		}
		critical, batch = critical+n[k]["critical"], batch+n[k]["batch"]
	}
	t.Logf("%d windows: critical %.1f of its reserve 200, batch %.1f a window on average; refused below it in %d windows; the fullest window %d of 400", len(ks),
		float64(critical)/float64(len(ks)), float64(batch)/float64(len(ks)), short, worst)
	if short > 0 {
		t.Errorf("critical was refused below its reserve in %d of %d windows", short, len(ks))
	}
}

// TestProvidersAreCreatedOnTheLedger: a provider created with no
// --coordination, by the CLI or the admin API, with a class reserve (the
// docs' example), with classes and no reserve or with none, is
// coordinated by the ledger; named, the shares stay; a later write that
// names no coordination keeps the provider's.
func TestProvidersAreCreatedOnTheLedger(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	onLedger := regexp.MustCompile(`(?m)^coordination:\s+ledger$`)
	for name, args := range map[string][]string{
		"api":   {"--limit", "1000/1s", "--class", "critical=60%", "--class", "default", "--class", "batch"},
		"plain": {"--limit", "1000/1s", "--class", "critical", "--class", "batch"},
		"bare":  {"--limit", "1000/1s"},
	} {
		cliOK(t, append(append([]string{"set", name}, args...), "--server", r.url())...)
		if out := cliOK(t, "get", name, "--server", r.url()); !onLedger.MatchString(out) {
			t.Errorf("%s created with %v:\n%s\nwant coordination ledger", name, args, out)
		}
	}
	if status, body := do(t, "PUT", r.url()+"/v1/providers/byapi", nil, `{"limit":900}`); status != 200 || !strings.Contains(body, `"coordination": "ledger"`) {
		t.Errorf("PUT creating a provider naming no coordination: %d %s, want the ledger", status, body)
	}
	if status, body := do(t, "PUT", r.url()+"/v1/providers/api", nil, `{"limit":900,"classes":[{"name":"critical","reserve":"50%"}]}`); status != 200 || !strings.Contains(body, `"coordination": "ledger"`) {
		t.Errorf("PUT naming no coordination: %d %s, want the ledger kept", status, body)
	}
	cliOK(t, "set", "old", "--limit", "1000/1s", "--class", "critical=60%", "--class", "batch", "--coordination", "shares", "--server", r.url())
	cliOK(t, "set", "old", "--limit", "900/1s", "--server", r.url())
	if out := cliOK(t, "get", "old", "--server", r.url()); regexp.MustCompile(`(?m)^coordination:`).MatchString(out) {
		t.Errorf("created on the shares named, then changed naming none:\n%s\nwant no coordination line (the shares)", out)
	}
}
