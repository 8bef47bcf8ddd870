package limiter_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice/limiter"
	uber "go.uber.org/ratelimit"
	"golang.org/x/time/rate"
)

// The hot-path benchmarks compare, in one run, sluice with a permit
// available against the two local limiters the brief names and against a
// single atomic add, the floor. Every limiter is configured so that it never
// has to wait: the figures are the cost of a decision, not of a sleep.

const plenty = limiter.MaxQuota // permits per window: never exhausted in a run

func newPlenty(b *testing.B, opts ...limiter.Option) *limiter.Limiter {
	l, err := limiter.New(plenty, time.Hour, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}

func BenchmarkHotPath(b *testing.B) {
	ctx := context.Background()
	cases := []benchCase{
		{"floor=atomic.Add", func(b *testing.B) func() {
			var n atomic.Int64
			return func() { n.Add(1) }
		}},
		{"sluice=TryAcquire", func(b *testing.B) func() {
			l := newPlenty(b)
			return func() {
				if !l.TryAcquire() {
					b.Fatal("refused")
				}
			}
		}},
		{"sluice=Acquire", func(b *testing.B) func() {
			l := newPlenty(b)
			return func() {
				if err := l.Acquire(ctx, time.Second); err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"x-time-rate=Allow", func(b *testing.B) func() {
			l := rate.NewLimiter(rate.Inf, 1)
			l.SetLimit(1e12)
			l.SetBurst(1 << 40)
			return func() {
				if !l.Allow() {
					b.Fatal("refused")
				}
			}
		}},
		{"uber-ratelimit=Take", func(b *testing.B) func() {
			l := uber.New(1e9, uber.WithoutSlack) // 1ns apart: never sleeps here
			return func() { l.Take() }
		}},
	}
	runSerialParallel(b, cases)
}

// BenchmarkPaced is the paced hot path: a window of one hour whose slots
// are 1ns apart, so a slot is always due.
func BenchmarkPaced(b *testing.B) {
	l := newPlenty(b, limiter.WithPacing(true))
	b.ReportAllocs()
	for b.Loop() {
		l.TryAcquire()
	}
}

// BenchmarkSlowPath measures the queue: a reservation made in a future
// window and cancelled (the bookkeeping of a waiter, no sleep), and a
// waiter queued and woken, reporting how late after its permit became
// valid it returned (the sleep itself is the window's length).
func BenchmarkSlowPath(b *testing.B) {
	b.Run("reserve+cancel", func(b *testing.B) {
		l, err := limiter.New(1, time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		l.TryAcquire()
		b.ReportAllocs()
		for b.Loop() {
			r, err := l.Reserve(1, 2*time.Hour)
			if err != nil {
				b.Fatal(err)
			}
			r.Cancel()
		}
	})
	b.Run("wait", func(b *testing.B) {
		l, err := limiter.New(1<<20, 10*time.Millisecond)
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		ctx := context.Background()
		var late time.Duration
		b.ReportAllocs()
		for b.Loop() {
			r, err := l.Reserve(1<<20, time.Second) // the whole of the next window
			if err != nil {
				b.Fatal(err)
			}
			due := r.ReadyAt()
			if err := r.Wait(ctx); err != nil {
				b.Fatal(err)
			}
			late += time.Since(due)
		}
		b.ReportMetric(float64(late.Microseconds())/float64(b.N), "late-µs/op")
	})
}

// BenchmarkWaiters queues 10,000 concurrent waiters on a limiter with one
// permit per window and reports the memory each costs while it waits.
func BenchmarkWaiters(b *testing.B) {
	for _, n := range []int{10_000} {
		b.Run(fmt.Sprintf("waiters=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				l, err := limiter.New(1, time.Hour)
				if err != nil {
					b.Fatal(err)
				}
				l.TryAcquire()
				ctx, cancel := context.WithCancel(context.Background())
				var wg sync.WaitGroup
				var before, after runtimeMem
				before.read()
				for range n {
					wg.Go(func() { l.Acquire(ctx, 100*365*24*time.Hour) })
				}
				for l.Stats().Waiting < n {
					time.Sleep(time.Millisecond)
				}
				after.read()
				cancel()
				wg.Wait()
				l.Close()
				b.ReportMetric(float64(after.heap-before.heap)/float64(n), "heap-B/waiter")
				b.ReportMetric(float64(after.stack-before.stack)/float64(n), "stack-B/waiter")
			}
		})
	}
}

// BenchmarkMulti is the hot path of several limits (Multi) beside one
// limit, in the same run: a permit available in every limit. The issue's
// bound: two limits at most about twice one, 0 allocations.
func BenchmarkMulti(b *testing.B) {
	ctx := context.Background()
	newMulti := func(b *testing.B, limits ...limiter.Limit) *limiter.Multi {
		m, err := limiter.NewMulti(limits)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { m.Close() })
		return m
	}
	perSecond := limiter.Limit{Quota: plenty, Window: time.Hour}
	perDay := limiter.Limit{Quota: plenty, Window: 24 * time.Hour}
	tokens := limiter.Limit{Dimension: "tokens", Quota: plenty, Window: time.Hour}
	cases := []benchCase{
		{"limits=1/sluice=TryAcquire", func(b *testing.B) func() {
			l := newPlenty(b)
			return func() {
				if !l.TryAcquire() {
					b.Fatal("refused")
				}
			}
		}},
		{"limits=1/multi=TryAcquire", func(b *testing.B) func() {
			m := newMulti(b, perSecond)
			return func() {
				if _, ok := m.TryAcquire(); !ok {
					b.Fatal("refused")
				}
			}
		}},
		{"limits=2/requests+day/multi=TryAcquire", func(b *testing.B) func() {
			m := newMulti(b, perSecond, perDay)
			return func() {
				if _, ok := m.TryAcquire(); !ok {
					b.Fatal("refused")
				}
			}
		}},
		{"limits=2/requests+tokens/multi=TryAcquire", func(b *testing.B) func() {
			m := newMulti(b, perSecond, tokens)
			return func() {
				if _, ok := m.TryAcquire(limiter.Cost("tokens", 700)); !ok {
					b.Fatal("refused")
				}
			}
		}},
		{"limits=2/requests+tokens/multi=Acquire", func(b *testing.B) func() {
			m := newMulti(b, perSecond, tokens)
			return func() {
				if _, err := m.Acquire(ctx, time.Second, limiter.Cost("tokens", 700)); err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"limits=2/requests+tokens/multi=Acquire+Settle", func(b *testing.B) func() {
			m := newMulti(b, perSecond, tokens)
			return func() {
				g, err := m.Acquire(ctx, time.Second, limiter.Cost("tokens", 700))
				if err != nil {
					b.Fatal(err)
				}
				g.Settle(limiter.Cost("tokens", 500))
			}
		}},
		{"x-time-rate=Allow", func(b *testing.B) func() {
			l := rate.NewLimiter(1e12, 1<<40)
			return func() {
				if !l.Allow() {
					b.Fatal("refused")
				}
			}
		}},
	}
	runSerialParallel(b, cases)
}

// benchCase is one decision to measure: make returns the call, made once
// per iteration.
type benchCase struct {
	name string
	make func(b *testing.B) func()
}

// runSerialParallel runs each case from one goroutine and from
// GOMAXPROCS goroutines at once.
func runSerialParallel(b *testing.B, cases []benchCase) {
	for _, c := range cases {
		b.Run(c.name+"/serial", func(b *testing.B) {
			f := c.make(b)
			b.ReportAllocs()
			for b.Loop() {
				f()
			}
		})
		b.Run(c.name+"/parallel", func(b *testing.B) {
			f := c.make(b)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					f()
				}
			})
		})
	}
}
