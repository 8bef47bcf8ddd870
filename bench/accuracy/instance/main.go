// Command instance is one sluice instance for the accuracy report
// (bench/accuracy): it joins a provider through etcd with cluster.Join and,
// at the rates it is told on stdin, offers requests to its limiter with
// Acquire(ctx, maxWait); every permit granted becomes one HTTP call to the
// provider stub (keep-alive client), every ErrTimeout a dropped request.
//
//	instance -etcd http://127.0.0.1:2379 -provider acc -id inst-1 -index 1 -stub http://127.0.0.1:PORT/call
//
// Commands, one per line on stdin:
//
//	load R AT   from AT (Unix ns) on, offer R requests per second (0 stops);
//	            each load command starts a new phase, numbered from 1
//	stats       print a stats line
//	step D      step the instance's clock by D (a duration, e.g. 300ms): what
//	            an operator or a bad NTP daemon does to a system clock; the
//	            limiter's clock and the clock monitor's (with -ntp) jump
//	            together, as they would with the system clock
//	quit        leave gracefully (Close revokes the lease) and exit
//
// Closing stdin is quit. Lines on stdout, fields key=value, times in Unix
// nanoseconds:
//
//	joined id=ID t=T
//	applied id=ID t=T gen=G share=S from=F source=SRC window=W in_force=I
//	stats id=ID t=T unary=N stream_sent=N stream_recv=N methods=M:N,... share=S source=SRC
//	      gen=G clock_offset=D clock_known=B clock_uncertainty=D
//	      phases=OFFERED/ADMITTED/REFUSED/OTHER/CALLERR/OVERLOAD;...
//
// OFFERED counts requests the paced loop generated, ADMITTED permits
// granted, REFUSED ErrTimeout, OTHER any other Acquire error (no share
// yet...), CALLERR stub calls that failed, OVERLOAD requests dropped
// because too many were in flight already (the instance could not keep up:
// it should stay 0).
//
// With -duty-on D the load is offered only in the last D of each
// -duty-period of true time (at its rate while on): bursts that start
// inside a window and cross a boundary, with which a skewed clock makes one
// aligned window receive the permits of two of the instance's windows.
//
// Clock skew is injected with -clock-offset (limiter.WithClockOffset: the
// limiter's time is the system clock plus D) or -clock-skew (the limiter's
// clock is the system clock plus D, limiter.WithClock, so that a clock
// monitor given -ntp measures, and cluster corrects, that very clock).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/ratelimit"

	"github.com/sluice-go/sluice/internal/harness"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/cluster"
	"github.com/sluice-go/sluice/limiter/skew"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "instance:", err)
		os.Exit(1)
	}
}

type flags struct {
	endpoints, provider, id, stub, ntp string
	index                              int
	leaseTTL, report, window, maxWait  time.Duration
	clockOffset, clockSkew, ntpEvery   time.Duration
	dutyOn, dutyPeriod                 time.Duration
	inflight                           int
}

func run() error {
	var f flags
	flag.StringVar(&f.endpoints, "etcd", "http://127.0.0.1:2379", "comma-separated etcd endpoints")
	flag.StringVar(&f.provider, "provider", "bench", "provider to join")
	flag.StringVar(&f.id, "id", "", "instance id (default host-pid-random)")
	flag.IntVar(&f.index, "index", 0, "instance number, sent to the stub with every call")
	flag.StringVar(&f.stub, "stub", "", "URL of the provider stub")
	flag.DurationVar(&f.leaseTTL, "lease-ttl", cluster.DefaultLeaseTTL, "instance lease TTL")
	flag.DurationVar(&f.report, "report-interval", cluster.DefaultReportInterval, "how often the instance considers writing its record")
	flag.DurationVar(&f.window, "window", time.Second, "fallback window (the provider's)")
	flag.DurationVar(&f.maxWait, "max-wait", 10*time.Millisecond, "Acquire's maxWait")
	flag.IntVar(&f.inflight, "max-inflight", 1024, "requests in flight (waiting for a permit or calling the stub) at most")
	flag.DurationVar(&f.clockOffset, "clock-offset", 0, "inject a clock error: limiter.WithClockOffset(D)")
	flag.DurationVar(&f.clockSkew, "clock-skew", 0, "inject a clock error: the limiter's clock (and the monitor's) is the system clock plus D")
	flag.DurationVar(&f.dutyOn, "duty-on", 0, "offer load only in the last D of each -duty-period of true (system) time; 0: all the time")
	flag.DurationVar(&f.dutyPeriod, "duty-period", time.Second, "the period of -duty-on, aligned to the Unix epoch")
	flag.StringVar(&f.ntp, "ntp", "", "NTP server (host:port) for a clock monitor (cluster.WithClockMonitor); none: no monitor")
	flag.DurationVar(&f.ntpEvery, "ntp-interval", 2*time.Second, "clock monitor interval")
	flag.Parse()
	if f.stub == "" {
		return errors.New("-stub is required")
	}

	o := harness.NewLines(os.Stdout)
	cnt := harness.NewCounter()
	cli, err := cnt.Dial(f.endpoints)
	if err != nil {
		return err
	}
	defer cli.Close()

	opts := harness.MemberOptions(f.id, f.leaseTTL, f.report, f.window, o)
	var lopts []limiter.Option
	if f.clockOffset != 0 {
		lopts = append(lopts, limiter.WithClockOffset(f.clockOffset))
	}
	// One clock for the limiter and the monitor, which step D moves.
	clock := &skewedClock{}
	clock.d.Store(int64(f.clockSkew))
	lopts = append(lopts, limiter.WithClock(clock))
	opts = append(opts, cluster.WithLimiterOptions(lopts...))
	if f.ntp != "" {
		sopts := []skew.Option{skew.WithServers(f.ntp), skew.WithInterval(f.ntpEvery), skew.WithTimeout(500 * time.Millisecond), skew.WithClock(clock)}
		mon, err := skew.New(sopts...)
		if err != nil {
			return err
		}
		opts = append(opts, cluster.WithClockMonitor(mon))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := cluster.Join(ctx, cli, f.provider, opts...)
	if err != nil {
		return err
	}
	defer m.Close()
	o.Printf("joined id=%s t=%d", m.ID(), time.Now().UnixNano())

	ld := newLoader(m.Limiter(), f)
	defer ld.close()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 0 {
			continue
		}
		switch fs[0] {
		case "load":
			if len(fs) != 3 {
				return fmt.Errorf("bad load command %q", sc.Text())
			}
			r, err1 := strconv.Atoi(fs[1])
			at, err2 := strconv.ParseInt(fs[2], 10, 64)
			if err1 != nil || err2 != nil || r < 0 {
				return fmt.Errorf("bad load command %q", sc.Text())
			}
			ld.schedule(r, time.Unix(0, at))
		case "stats":
			st := m.Status()
			o.Printf("stats id=%s t=%d unary=%d stream_sent=%d stream_recv=%d methods=%s share=%d source=%s gen=%d clock_offset=%v clock_known=%t clock_uncertainty=%v phases=%s",
				m.ID(), time.Now().UnixNano(), cnt.Unary.Load(), cnt.Sent.Load(), cnt.Recv.Load(), cnt.Methods(),
				st.Share, st.Source, st.Generation, m.Limiter().ClockOffset(), st.ClockKnown, st.ClockUncertainty, ld.phases())
		case "step":
			d, err := time.ParseDuration(strings.Join(fs[1:], ""))
			if len(fs) != 2 || err != nil {
				return fmt.Errorf("bad step command %q", sc.Text())
			}
			clock.d.Add(int64(d))
			o.Printf("stepped id=%s t=%d by=%v", m.ID(), time.Now().UnixNano(), d)
		case "quit":
			return nil
		default:
			return fmt.Errorf("unknown command %q", sc.Text())
		}
	}
	return sc.Err()
}

// skewedClock is the system clock off by d nanoseconds (positive: ahead).
type skewedClock struct{ d atomic.Int64 }

func (c *skewedClock) Now() time.Time { return time.Now().Add(time.Duration(c.d.Load())) }

// phase counts one load phase's requests.
type phase struct {
	offered, admitted, refused, other, callErr, overload atomic.Int64
}

// loader runs the paced load loop. Loops are paced with
// go.uber.org/ratelimit's Take, which fits: a load generator needs no
// cancellation, and a flag stops the loop at its next tick. Each request
// runs in its own goroutine (bounded by -max-inflight), so that a wait for
// a permit or a slow stub call never slows the offered rate.
type loader struct {
	lim    *limiter.Limiter
	f      flags
	client *http.Client
	sem    chan struct{}

	mu       sync.Mutex
	all      []*phase
	stopLoop *atomic.Bool
	loops    sync.WaitGroup // the paced loops
	sched    sync.WaitGroup // scheduled switches
	reqs     sync.WaitGroup // requests in flight
	closed   chan struct{}
}

func newLoader(lim *limiter.Limiter, f flags) *loader {
	tr := &http.Transport{MaxIdleConns: f.inflight, MaxIdleConnsPerHost: f.inflight, IdleConnTimeout: time.Minute, DisableCompression: true}
	return &loader{
		lim: lim, f: f,
		client: &http.Client{Transport: tr, Timeout: 5 * time.Second},
		sem:    make(chan struct{}, f.inflight),
		closed: make(chan struct{}),
	}
}

// schedule switches to rate at time at (a new phase).
func (l *loader) schedule(rate int, at time.Time) {
	l.sched.Go(func() {
		select {
		case <-time.After(time.Until(at)):
		case <-l.closed:
			return
		}
		l.start(rate)
	})
}

func (l *loader) close() {
	close(l.closed)
	l.sched.Wait()
	l.mu.Lock()
	if l.stopLoop != nil {
		l.stopLoop.Store(true)
	}
	l.mu.Unlock()
	l.loops.Wait()
	l.reqs.Wait()
}

// start replaces the running loop by one offering rate requests per second:
// one per tick up to 1,000/s, else 1,000 ticks/s of rate/1000 each (the
// remainder spread by an accumulator): one wake-up a millisecond rather
// than one every few hundred microseconds.
func (l *loader) start(rate int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopLoop != nil {
		l.stopLoop.Store(true)
	}
	ph := &phase{}
	l.all = append(l.all, ph)
	if rate == 0 {
		l.stopLoop = nil
		return
	}
	stop := &atomic.Bool{}
	l.stopLoop = stop
	ticks := min(rate, 1000)
	l.loops.Go(func() {
		rl := ratelimit.New(ticks)
		acc := 0
		for !stop.Load() {
			rl.Take()
			if d, p := l.f.dutyOn, l.f.dutyPeriod; d > 0 && time.Now().UnixNano()%int64(p) < int64(p-d) {
				continue // off: the rate holds within the on part of each window
			}
			acc += rate
			n := acc / ticks
			acc -= n * ticks
			for range n {
				ph.offered.Add(1)
				select {
				case l.sem <- struct{}{}:
				default:
					ph.overload.Add(1)
					continue
				}
				l.reqs.Go(func() {
					defer func() { <-l.sem }()
					l.request(ph)
				})
			}
		}
	})
}

func (l *loader) request(ph *phase) {
	err := l.lim.Acquire(context.Background(), l.f.maxWait)
	switch {
	case err == nil:
		ph.admitted.Add(1)
	case errors.Is(err, limiter.ErrTimeout):
		ph.refused.Add(1)
		return
	default:
		ph.other.Add(1)
		return
	}
	granted := time.Now().UnixNano()
	req, _ := http.NewRequest(http.MethodPost, l.f.stub, nil)
	req.Header.Set("X-Instance", strconv.Itoa(l.f.index))
	req.Header.Set("X-Granted", strconv.FormatInt(granted, 10))
	resp, err := l.client.Do(req)
	if err != nil {
		ph.callErr.Add(1)
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		ph.callErr.Add(1)
	}
}

func (l *loader) phases() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for i, p := range l.all {
		if i > 0 {
			b.WriteByte(';')
		}
		fmt.Fprintf(&b, "%d/%d/%d/%d/%d/%d", p.offered.Load(), p.admitted.Load(), p.refused.Load(), p.other.Load(), p.callErr.Load(), p.overload.Load())
	}
	return b.String()
}
