// Command instance runs many sluice instances in one process for the soak
// report (bench/soak): each is a real cluster.Member with an etcd client
// of its own (its own gRPC connection, lease, watches and records, as a
// separate process would have), and each admits a steady load that rises
// and falls slowly, so that its demand, its record and configd's fair
// split keep moving as they do in production.
//
//	instance -etcd http://127.0.0.1:2379 -provider soak -name p1 -members 10
//
// Commands, one per line on stdin:
//
//	stats    print a stats line
//	quit     leave gracefully (every Member's Close revokes its lease) and exit
//
// Closing stdin, SIGINT and SIGTERM are quit. Lines on stdout, fields
// key=value:
//
//	joined n=N
//	stats members=N connected=C admitted=A rejected=R restarts=S
//
// admitted and rejected count permits since the start, over all members;
// restarts counts the sessions that ended while connected (each logs
// "etcd unreachable; keeping …": a lost lease,
// a failed write, or a watch that ended, ErrCompacted included) after which
// the member registered again. Members' other warnings go to stderr.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/internal/harness"
	"github.com/sluice-go/sluice/limiter/cluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "instance:", err)
		os.Exit(1)
	}
}

// restartMsg begins what a Member logs when a session it was connected
// in ends: "… keeping the last share (fail-static)" on the shares,
// "… keeping its grants (fail-static)" on the ledger.
const restartMsg = "etcd unreachable; keeping "

func run() error {
	endpoints := flag.String("etcd", "http://127.0.0.1:2379", "comma-separated etcd endpoints")
	username := flag.String("etcd-username", "", "etcd user (configd's embedded etcd: instance)")
	passwordFile := flag.String("etcd-password-file", "", "file holding the etcd user's password (configd's embedded etcd: DATA-DIR/credentials/instance)")
	provider := flag.String("provider", "soak", "provider to join")
	name := flag.String("name", "p1", "this process's name: member ids are NAME-01, NAME-02, ...")
	members := flag.Int("members", 10, "members (instances) in this process, one etcd client each")
	rate := flag.Float64("rate", 100, "mean permits per second each member asks for")
	swing := flag.Float64("swing", 0.5, "each member's load swings by this fraction of -rate around it")
	period := flag.Duration("period", time.Minute, "how long one swing of the load takes (each member at its own phase)")
	window := flag.Duration("window", 100*time.Millisecond, "fallback window (the provider's)")
	leaseTTL := flag.Duration("lease-ttl", cluster.DefaultLeaseTTL, "members' lease TTL")
	report := flag.Duration("report-interval", cluster.DefaultReportInterval, "members' report interval")
	flag.Parse()
	var password string
	if *passwordFile != "" {
		b, err := os.ReadFile(*passwordFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "instance:", err)
			os.Exit(2)
		}
		password = strings.TrimSpace(string(b))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o := harness.NewLines(os.Stdout)
	var restarts atomic.Int64
	log := slog.New(&warnHandler{restarts: &restarts})

	type member struct {
		m   *cluster.Member
		cli *clientv3.Client
	}
	ms := make([]member, *members)
	var joinErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range ms {
		wg.Go(func() {
			cli, err := clientv3.New(clientv3.Config{
				Endpoints:   strings.Split(*endpoints, ","),
				DialTimeout: 5 * time.Second,
				Logger:      zap.NewNop(),
				DialOptions: cluster.DialOptions(),
				Username:    *username,
				Password:    password,
			})
			if err == nil {
				jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				var m *cluster.Member
				m, err = cluster.Join(jctx, cli, *provider,
					cluster.WithID(fmt.Sprintf("%s-%02d", *name, i+1)),
					cluster.WithLeaseTTL(*leaseTTL),
					cluster.WithReportInterval(*report),
					cluster.WithFallback(0, *window),
					cluster.WithLogger(log))
				cancel()
				if err == nil {
					ms[i] = member{m, cli}
					return
				}
				cli.Close()
			}
			mu.Lock()
			joinErr = err
			mu.Unlock()
		})
	}
	wg.Wait()
	defer func() {
		for _, x := range ms {
			if x.m != nil {
				wg.Go(func() {
					x.m.Close()
					x.cli.Close()
				})
			}
		}
		wg.Wait()
	}()
	if joinErr != nil {
		return joinErr
	}
	o.Printf("joined n=%d", len(ms))

	// The load: every 10 ms each member asks for what its rate says is
	// due, one TryAcquire per permit.
	loadCtx, stopLoad := context.WithCancel(ctx)
	var loadWG sync.WaitGroup
	defer loadWG.Wait()
	defer stopLoad()
	loadWG.Go(func() {
		const tick = 10 * time.Millisecond
		phase := make([]float64, len(ms))
		owed := make([]float64, len(ms))
		for i := range phase {
			phase[i] = rand.Float64() * 2 * math.Pi
		}
		start := time.Now()
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-loadCtx.Done():
				return
			case now := <-t.C:
				x := 2 * math.Pi * now.Sub(start).Seconds() / period.Seconds()
				for i, mb := range ms {
					owed[i] += *rate * (1 + *swing*math.Sin(x+phase[i])) * tick.Seconds()
					for ; owed[i] >= 1; owed[i]-- {
						mb.m.Limiter().TryAcquire()
					}
				}
			}
		}
	})

	lines := make(chan string)
	go func() { // ends with the process: a read on stdin cannot be interrupted
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case line, ok := <-lines:
			if !ok {
				return nil
			}
			switch strings.TrimSpace(line) {
			case "stats":
				var connected int
				var admitted, rejected int64
				for _, mb := range ms {
					if mb.m.Status().Connected {
						connected++
					}
					st := mb.m.Limiter().Stats()
					admitted += st.Admitted
					rejected += st.Rejected
				}
				o.Printf("stats members=%d connected=%d admitted=%d rejected=%d restarts=%d",
					len(ms), connected, admitted, rejected, restarts.Load())
			case "quit":
				return nil
			case "":
			default:
				return fmt.Errorf("unknown command %q", line)
			}
		}
	}
}

// warnHandler is the members' slog.Handler: it counts session restarts
// and writes warnings and errors to stderr.
type warnHandler struct {
	restarts *atomic.Int64
	attrs    []slog.Attr
}

func (h *warnHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *warnHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, restartMsg) {
		h.restarts.Add(1)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %q", r.Time.UTC().Format(time.RFC3339Nano), r.Level, r.Message)
	for _, a := range h.attrs {
		fmt.Fprintf(&b, " %s=%q", a.Key, a.Value.String())
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%q", a.Key, a.Value.String())
		return true
	})
	fmt.Fprintln(os.Stderr, b.String())
	return nil
}

func (h *warnHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &warnHandler{restarts: h.restarts, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h *warnHandler) WithGroup(string) slog.Handler { return h }
