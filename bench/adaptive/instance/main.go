// Command instance is one instance of the adaptive-limit report
// (bench/adaptive): it offers calls to the provider stub at a steady rate
// and sends those its limiter admits, in one of two modes:
//
//   - sluice: it joins a provider through etcd with cluster.Join and admits
//     with its member's limiter (TryAcquire); every answer goes to
//     Limiter.Observe (limiter/feedback), so 429s pause it and are
//     reported, and configd's controller moves an adaptive provider's
//     limit.
//
//   - local: each instance adapts alone, as the AWS SDK's adaptive retry
//     mode or an x/time/rate limiter with backoff would: it starts at
//     -local-max calls/s, multiplies its rate by 0.7 on a 429 (at most once
//     per 100 ms), pauses until the Retry-After has passed, and adds 1% of
//     -local-max every quiet 100 ms.
//
//     instance -mode sluice -etcd http://127.0.0.1:2379 -provider p -url http://127.0.0.1:8080/ -rate 250
//
// It runs until stdin closes. It prints "joined t=T" once it sends calls.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/ratelimit"
	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice/internal/harness"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/cluster"
	"github.com/sluice-go/sluice/limiter/feedback"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "instance:", err)
		os.Exit(1)
	}
}

// admitter is the instance's limiter in either mode.
type admitter interface {
	admit() bool
	answer(status int, h http.Header)
}

func run() error {
	mode := flag.String("mode", "sluice", "sluice or local")
	endpoints := flag.String("etcd", "http://127.0.0.1:2379", "comma-separated etcd endpoints (sluice)")
	provider := flag.String("provider", "bench", "provider to join (sluice)")
	id := flag.String("id", "", "instance id")
	url := flag.String("url", "", "the provider stub's URL")
	offered := flag.Int("rate", 250, "calls offered per second")
	report := flag.Duration("report-interval", cluster.DefaultReportInterval, "member report interval (sluice)")
	localMax := flag.Float64("local-max", 125, "the most calls/s one instance sends (local)")
	flag.Parse()

	var adm admitter
	switch *mode {
	case "sluice":
		cli, err := harness.NewCounter().Dial(*endpoints)
		if err != nil {
			return err
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		m, err := cluster.Join(ctx, cli, *provider, harness.MemberOptions(*id, 2*time.Second, *report, time.Second, harness.NewLines(io.Discard))...)
		if err != nil {
			return err
		}
		defer m.Close()
		adm = sluiceAdmitter{m.Limiter()}
	case "local":
		adm = newLocal(*localMax, time.Now)
	default:
		return fmt.Errorf("unknown mode %q", *mode)
	}

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	sem := make(chan struct{}, 64) // calls in flight; beyond, the call is not made
	var stop atomic.Bool
	var wg sync.WaitGroup
	fmt.Printf("joined t=%d\n", time.Now().UnixNano())
	wg.Go(func() {
		rl := ratelimit.New(*offered) // a paced loop needs no cancellation: the flag stops it
		for !stop.Load() {
			rl.Take()
			if !adm.admit() {
				continue
			}
			select {
			case sem <- struct{}{}:
			default:
				continue
			}
			wg.Go(func() {
				defer func() { <-sem }()
				resp, err := client.Post(*url, "text/plain", strings.NewReader(""))
				if err != nil {
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				adm.answer(resp.StatusCode, resp.Header)
			})
		}
	})
	io.Copy(io.Discard, bufio.NewReader(os.Stdin))
	stop.Store(true)
	wg.Wait()
	return nil
}

type sluiceAdmitter struct{ lim *limiter.Limiter }

func (s sluiceAdmitter) admit() bool { return s.lim.TryAcquire() }
func (s sluiceAdmitter) answer(status int, h http.Header) {
	s.lim.Observe(feedback.Parse(status, h, time.Now()))
}

// local adapts one instance's rate alone: AIMD over an x/time/rate
// limiter, with a pause for Retry-After.
type local struct {
	max float64
	now func() time.Time

	mu        sync.Mutex
	lim       *rate.Limiter
	pause     time.Time
	lastCut   time.Time
	lastRaise time.Time
}

func newLocal(max float64, now func() time.Time) *local {
	return &local{max: max, now: now, lim: rate.NewLimiter(rate.Limit(max), max64(1, int(max/10)))}
}

func max64(a, b int) int {
	if a > b {
		return a
	}
	return b
}

func (l *local) admit() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if now.Before(l.pause) {
		return false
	}
	if now.Sub(l.lastRaise) >= 100*time.Millisecond && now.Sub(l.lastCut) >= 100*time.Millisecond {
		l.lastRaise = now
		l.lim.SetLimitAt(now, rate.Limit(min(float64(l.lim.Limit())+0.01*l.max, l.max)))
	}
	return l.lim.AllowN(now, 1)
}

func (l *local) answer(status int, h http.Header) {
	s := feedback.Parse(status, h, l.now())
	if !s.Pushback {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if now.Sub(l.lastCut) >= 100*time.Millisecond {
		l.lastCut = now
		l.lim.SetLimitAt(now, rate.Limit(max(float64(l.lim.Limit())*0.7, 1)))
	}
	if p := now.Add(s.RetryAfter); p.After(l.pause) {
		l.pause = p
	}
}
