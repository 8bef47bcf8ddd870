// Command instance is one sluice instance for the retune report
// (bench/retune): it joins a provider through etcd with cluster.Join,
// prints a line on stdout for every share it applies, and admits permits
// at the rate it is told on stdin. It counts every request its etcd client
// sends, client-side, with gRPC interceptors.
//
//	instance -etcd http://127.0.0.1:2379 -provider bench -id inst-1
//
// Commands, one per line on stdin:
//
//	load R   admit R permits per second from now on (TryAcquire; 0 stops)
//	stats    print a stats line
//	quit     leave gracefully (Close revokes the lease) and exit
//
// Closing stdin is quit. Lines on stdout, fields key=value, times in Unix
// nanoseconds:
//
//	joined id=ID t=T
//	applied id=ID t=T gen=G share=S from=F source=SRC   (F: when the share takes effect)
//	stats id=ID t=T unary=N stream_sent=N stream_recv=N streams=N admitted=N rejected=N methods=M:N,...
//
// "applied" comes from the Member's own "share applied" log record (the
// Member has no event API), so its time is the moment the share was handed
// to the limiter, not a poll's.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
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
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "instance:", err)
		os.Exit(1)
	}
}

func run() error {
	endpoints := flag.String("etcd", "http://127.0.0.1:2379", "comma-separated etcd endpoints")
	provider := flag.String("provider", "bench", "provider to join")
	id := flag.String("id", "", "instance id (default host-pid-random)")
	leaseTTL := flag.Duration("lease-ttl", cluster.DefaultLeaseTTL, "instance lease TTL")
	report := flag.Duration("report-interval", cluster.DefaultReportInterval, "how often the instance considers writing its record")
	window := flag.Duration("window", time.Second, "fallback window (the provider's, so the first share applies at its own boundary)")
	flag.Parse()

	o := harness.NewLines(os.Stdout)
	cnt := harness.NewCounter()
	cli, err := cnt.Dial(*endpoints)
	if err != nil {
		return err
	}
	defer cli.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := cluster.Join(ctx, cli, *provider, harness.MemberOptions(*id, *leaseTTL, *report, *window, o)...)
	if err != nil {
		return err
	}
	defer m.Close()
	*id = m.ID()
	o.Printf("joined id=%s t=%d", m.ID(), time.Now().UnixNano())

	var ld loader
	defer ld.stop()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "load":
			r, err := strconv.Atoi(f[1])
			if err != nil || r < 0 {
				return fmt.Errorf("bad load command %q", sc.Text())
			}
			ld.start(m.Limiter(), r)
		case "stats":
			st := m.Limiter().Stats()
			o.Printf("stats id=%s t=%d unary=%d stream_sent=%d stream_recv=%d streams=%d admitted=%d rejected=%d methods=%s",
				m.ID(), time.Now().UnixNano(), cnt.Unary.Load(), cnt.Sent.Load(), cnt.Recv.Load(), cnt.Streams.Load(),
				st.Admitted, st.Rejected, cnt.Methods())
		case "quit":
			return nil
		default:
			return fmt.Errorf("unknown command %q", sc.Text())
		}
	}
	return sc.Err()
}

// loader admits permits at a steady rate. Its loops are paced with
// go.uber.org/ratelimit (no cancellation needed: a flag stops them at the
// next tick).
type loader struct {
	stopFlag *atomic.Bool
	wg       sync.WaitGroup
}

func (l *loader) stop() {
	if l.stopFlag != nil {
		l.stopFlag.Store(true)
		l.wg.Wait()
		l.stopFlag = nil
	}
}

// start replaces the running loop by one taking rate permits per second
// with TryAcquire: one per tick up to 1,000/s, else rate/1000 per tick at
// 1,000 ticks/s (one wake-up a millisecond rather than one every 10 µs).
func (l *loader) start(lim *limiter.Limiter, rate int) {
	l.stop()
	if rate == 0 {
		return
	}
	stop := &atomic.Bool{}
	l.stopFlag = stop
	ticks, per := rate, 1
	if rate > 1000 {
		ticks, per = 1000, rate/1000
	}
	l.wg.Go(func() {
		rl := ratelimit.New(ticks)
		for !stop.Load() {
			rl.Take()
			for range per {
				lim.TryAcquire()
			}
		}
	})
}
