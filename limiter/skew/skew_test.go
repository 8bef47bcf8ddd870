package skew

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/beevik/ntp"

	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/internal/ntptest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startServer starts an SNTP responder closed at the end of the test.
func startServer(t testing.TB, offset time.Duration) *ntptest.Server {
	t.Helper()
	s, err := ntptest.Start()
	if err != nil {
		t.Fatal(err)
	}
	s.SetOffset(offset)
	t.Cleanup(func() { s.Close() })
	return s
}

func newMonitor(t testing.TB, opts ...Option) *Monitor {
	t.Helper()
	m, err := New(opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m
}

// recorder collects OnChange calls.
type recorder struct {
	mu  sync.Mutex
	got []Measurement
}

func (r *recorder) record(m Measurement) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, m)
}

func (r *recorder) calls() []Measurement {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Measurement(nil), r.got...)
}

// shiftedClock is the system clock shifted by an adjustable amount.
type shiftedClock struct {
	mu    sync.Mutex
	shift time.Duration
}

func (c *shiftedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.shift)
}

func (c *shiftedClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.shift += d
}

func within(got, want, tol time.Duration) bool { return (got - want).Abs() <= tol }

func TestNewInvalid(t *testing.T) {
	tests := []struct {
		name    string
		opts    []Option
		message string
	}{
		{"no servers", []Option{WithServers()}, "no NTP servers"},
		{"empty server", []Option{WithServers("a", "")}, "server 1 is empty"},
		{"zero interval", []Option{WithInterval(0)}, "interval 0s"},
		{"negative timeout", []Option{WithTimeout(-time.Second)}, "timeout -1s"},
		{"staleness below interval", []Option{WithInterval(time.Minute), WithStaleness(time.Second)}, "staleness 1s is shorter than the interval 1m0s"},
		{"negative staleness", []Option{WithStaleness(-1)}, "staleness -1ns"},
		{"nil clock", []Option{WithClock(nil)}, "WithClock(nil)"},
		{"nil logger", []Option{WithLogger(nil)}, "WithLogger(nil)"},
		{"zero max offset", []Option{WithMaxOffset(0)}, "max offset 0s; allowed is > 0"},
		{"negative max offset", []Option{WithMaxOffset(-time.Hour)}, "max offset -1h0m0s; allowed is > 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := New(tt.opts...)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("New: err = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.message) {
				t.Errorf("err = %q, want it to mention %q", err, tt.message)
			}
			if m != nil {
				t.Error("New returned a Monitor with an error")
			}
		})
	}
}

func TestNewDefaults(t *testing.T) {
	m := newMonitor(t, nil) // a nil Option is ignored
	c := m.cfg
	if len(c.servers) != 1 || c.servers[0] != DefaultServer || c.interval != DefaultInterval ||
		c.timeout != DefaultTimeout || c.staleness != DefaultStalenessFactor*DefaultInterval || c.maxOffset != DefaultMaxOffset {
		t.Errorf("defaults: %+v", c)
	}
	if got := m.Current(); got.Known || got.Offset != 0 || !got.At.IsZero() {
		t.Errorf("Current before any round = %+v, want zero and unknown", got)
	}
}

// TestMeasureOffset measures chosen offsets over real UDP within 1 ms; 3h
// is beyond the default sanity bound, so the bound is raised.
func TestMeasureOffset(t *testing.T) {
	srv := startServer(t, 0)
	m := newMonitor(t, WithServers(srv.Addr()), WithTimeout(2*time.Second), WithMaxOffset(4*time.Hour))
	for _, offset := range []time.Duration{0, 150 * time.Millisecond, -2 * time.Second, 3 * time.Hour, -750 * time.Microsecond} {
		srv.SetOffset(offset)
		before := time.Now()
		got, err := m.Measure(t.Context())
		if err != nil {
			t.Fatalf("offset %v: Measure: %v", offset, err)
		}
		if !got.Known || got.Answers != 1 || got.Server != srv.Addr() {
			t.Errorf("offset %v: %+v, want known, 1 answer, from %s", offset, got, srv.Addr())
		}
		if !within(got.Offset, offset, time.Millisecond) {
			t.Errorf("offset %v: measured %v, more than 1 ms off", offset, got.Offset)
		}
		// Root dispersion 1 ms plus half a loopback round trip.
		if got.Uncertainty < time.Millisecond || got.Uncertainty > 50*time.Millisecond {
			t.Errorf("offset %v: uncertainty %v, want 1 ms plus half the round trip", offset, got.Uncertainty)
		}
		if got.At.Before(before) || got.At.After(time.Now()) {
			t.Errorf("At %v not within the round", got.At)
		}
		if cur := m.Current(); cur != got {
			t.Errorf("Current() = %+v, Measure returned %+v", cur, got)
		}
	}
}

// TestMeasureFollowsChange checks that an offset change is followed and
// reported through OnChange, in order.
func TestMeasureFollowsChange(t *testing.T) {
	srv := startServer(t, 100*time.Millisecond)
	var rec recorder
	m := newMonitor(t, WithServers(srv.Addr()), OnChange(rec.record))
	for _, offset := range []time.Duration{100 * time.Millisecond, -40 * time.Millisecond, 5 * time.Second} {
		srv.SetOffset(offset)
		if _, err := m.Measure(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	calls := rec.calls()
	if len(calls) != 3 {
		t.Fatalf("OnChange called %d times, want 3: %+v", len(calls), calls)
	}
	for i, want := range []time.Duration{100 * time.Millisecond, -40 * time.Millisecond, 5 * time.Second} {
		if !calls[i].Known || !within(calls[i].Offset, want, time.Millisecond) {
			t.Errorf("call %d: %+v, want known offset %v", i, calls[i], want)
		}
	}
}

// TestSilentServerBecomesUnknown checks that the offset is measured against
// the clock given by WithClock and that staleness is judged by it: a silent
// server leaves the measurement known within the staleness limit, turns it
// unknown (keeping the last offset) past it, reported once through OnChange,
// and known again when the server answers.
func TestSilentServerBecomesUnknown(t *testing.T) {
	srv := startServer(t, 200*time.Millisecond)
	clock := &shiftedClock{shift: 50 * time.Millisecond} // this clock runs 50 ms ahead
	var rec recorder
	m := newMonitor(t, WithServers(srv.Addr()), WithClock(clock), WithTimeout(50*time.Millisecond),
		WithInterval(time.Minute), WithStaleness(5*time.Minute), OnChange(rec.record))

	got, err := m.Measure(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !within(got.Offset, 150*time.Millisecond, time.Millisecond) {
		t.Fatalf("offset against a clock 50 ms ahead of a server 200 ms ahead: %v, want 150ms", got.Offset)
	}

	srv.SetMode(ntptest.Silent)
	clock.add(4 * time.Minute) // within the staleness limit
	got, err = m.Measure(t.Context())
	if !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("silent server: err = %v, want ErrNoAnswer", err)
	}
	if !got.Known {
		t.Errorf("4 min after the last answer, staleness 5 min: %+v, want still known", got)
	}

	clock.add(2 * time.Minute) // 6 min: stale
	if cur := m.Current(); cur.Known {
		t.Errorf("Current after the staleness limit: %+v, want unknown", cur)
	}
	got, err = m.Measure(t.Context())
	if !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("err = %v, want ErrNoAnswer", err)
	}
	if got.Known || !within(got.Offset, 150*time.Millisecond, time.Millisecond) {
		t.Errorf("stale: %+v, want unknown with the last offset kept", got)
	}
	if _, err := m.Measure(t.Context()); !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("err = %v, want ErrNoAnswer", err)
	}
	calls := rec.calls()
	if len(calls) != 2 || !calls[0].Known || calls[1].Known {
		t.Fatalf("OnChange calls %+v, want one known then one unknown", calls)
	}

	srv.SetMode(ntptest.Answer)
	if got, err := m.Measure(t.Context()); err != nil || !got.Known {
		t.Fatalf("server back: %+v, %v; want known", got, err)
	}
	if n := len(rec.calls()); n != 3 {
		t.Errorf("OnChange called %d times, want 3 (known again)", n)
	}
}

// TestGarbage sends every kind of malformed reply: each round fails with an
// error naming the server, nothing panics, and nothing becomes known.
func TestGarbage(t *testing.T) {
	srv := startServer(t, 0)
	srv.SetMode(ntptest.Garbage)
	m := newMonitor(t, WithServers(srv.Addr()), WithTimeout(time.Second))
	for kind := range ntptest.GarbageKinds {
		got, err := m.Measure(t.Context())
		if !errors.Is(err, ErrNoAnswer) {
			t.Fatalf("garbage kind %d: err = %v, want ErrNoAnswer", kind, err)
		}
		if !strings.Contains(err.Error(), srv.Addr()) {
			t.Errorf("garbage kind %d: err %q does not name the server", kind, err)
		}
		// Kinds 5 and up parse but fail validation, or (10) make beevik/ntp
		// panic, which the Monitor turns into ErrBadResponse.
		if kind >= 5 && !errors.Is(err, ErrBadResponse) {
			t.Errorf("garbage kind %d: err = %v, want ErrBadResponse", kind, err)
		}
		if got.Known {
			t.Errorf("garbage kind %d: %+v, want unknown", kind, got)
		}
	}
}

// TestSeveralServers combines answers: a bad server (garbage, silent, or
// answering a wrong time with a better root distance) is outvoted by two
// good ones; two servers that disagree give a measurement spanning both.
// TestSeveralServers: one bad server among three good ones does not move
// the result. A server that fails, is silent or is refused (beyond the
// sanity bound, 30 years or 2h ahead) is left out, its error logged at Warn;
// one that answers within the bound but disagrees with the others (a
// falseticker, even a more precise one) is outvoted by Marzullo's
// intersection (see Monitor): the answer chosen is from a truechimer.
func TestSeveralServers(t *testing.T) {
	const good = 50 * time.Millisecond
	tests := []struct {
		name    string
		bad     func(s *ntptest.Server)
		answers int
		logged  string // in the Warn log, "" for none
	}{
		{"garbage", func(s *ntptest.Server) { s.SetMode(ntptest.Garbage) }, 2, "NTP server failed; measured with the others"},
		{"silent", func(s *ntptest.Server) { s.SetMode(ntptest.Silent) }, 2, "NTP server failed; measured with the others"},
		{"falseticker", func(s *ntptest.Server) {
			s.SetOffset(5 * time.Second)
			s.SetRootDistance(0, 0) // looks more precise than the good ones
		}, 3, ""},
		{"falseticker 59 minutes ahead, within the bound", func(s *ntptest.Server) {
			s.SetOffset(59 * time.Minute)
			s.SetRootDistance(0, 0)
		}, 3, ""},
		{"liar 2 hours ahead", func(s *ntptest.Server) { s.SetOffset(2 * time.Hour) }, 2, "is beyond the sanity bound ±1h0m0s"},
		{"liar 30 years ahead", func(s *ntptest.Server) {
			s.SetOffset(30 * 365 * 24 * time.Hour)
			s.SetRootDistance(0, 0)
		}, 2, "is beyond the sanity bound ±1h0m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b, bad := startServer(t, good), startServer(t, good), startServer(t, good)
			tt.bad(bad)
			var log logbuf.Buffer
			m := newMonitor(t, WithServers(bad.Addr(), a.Addr(), b.Addr()), WithTimeout(200*time.Millisecond),
				WithLogger(slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelWarn}))))
			got, err := m.Measure(t.Context())
			if err != nil {
				t.Fatalf("Measure: %v", err)
			}
			if got.Answers != tt.answers || !got.Known || got.Server == bad.Addr() {
				t.Errorf("%+v, want %d answers, not from the bad server", got, tt.answers)
			}
			if !within(got.Offset, good, time.Millisecond) {
				t.Errorf("offset %v, want %v", got.Offset, good)
			}
			if out := log.String(); tt.logged == "" && out != "" || !strings.Contains(out, tt.logged) || tt.logged != "" && !strings.Contains(out, bad.Addr()) {
				t.Errorf("log %q, want it to say %q about %s", out, tt.logged, bad.Addr())
			}
		})
	}
	t.Run("two disagree", func(t *testing.T) {
		a, b := startServer(t, 0), startServer(t, 100*time.Millisecond)
		m := newMonitor(t, WithServers(a.Addr(), b.Addr()))
		got, err := m.Measure(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if got.Server != "" || got.Answers != 2 {
			t.Errorf("%+v, want a combined measurement of 2 answers", got)
		}
		if !within(got.Offset, 50*time.Millisecond, time.Millisecond) || got.Uncertainty < 51*time.Millisecond {
			t.Errorf("offset %v ± %v, want 50ms ± ≥51ms covering both servers", got.Offset, got.Uncertainty)
		}
	})
}

func TestMeasureContext(t *testing.T) {
	srv := startServer(t, 0)
	srv.SetMode(ntptest.Silent)
	m := newMonitor(t, WithServers(srv.Addr()), WithTimeout(time.Minute))

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := m.Measure(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: err = %v, want context.Canceled", err)
	}

	// A deadline far shorter than the timeout ends the round.
	ctx, cancel = context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := m.Measure(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Measure took %v with a 50ms deadline and a 1 min timeout", d)
	}
}

// TestRun runs the periodic loop over real UDP: the first round reports at
// once, an offset change is followed, and Run returns when ctx ends.
func TestRun(t *testing.T) {
	srv := startServer(t, 30*time.Millisecond)
	changes := make(chan Measurement, 100)
	m := newMonitor(t, WithServers(srv.Addr()), WithInterval(10*time.Millisecond),
		OnChange(func(m Measurement) {
			select {
			case changes <- m:
			default:
			}
		}), WithLogger(slog.New(slog.DiscardHandler)))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()

	wait := func(want time.Duration) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case got := <-changes:
				if got.Known && within(got.Offset, want, time.Millisecond) {
					return
				}
			case <-timeout:
				t.Fatalf("no measurement of %v within 10 s", want)
			}
		}
	}
	wait(30 * time.Millisecond)
	if err := m.Run(ctx); !errors.Is(err, ErrRunning) {
		t.Errorf("second Run: %v, want ErrRunning", err)
	}
	srv.SetOffset(-70 * time.Millisecond)
	wait(-70 * time.Millisecond)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v, want context.Canceled", err)
	}
}

func TestCombine(t *testing.T) {
	ms := time.Millisecond
	a := func(i int, offset, dist time.Duration) answer {
		return answer{server: string(rune('a' + i)), index: i, offset: offset, dist: dist}
	}
	tests := []struct {
		name string
		in   []answer
		want Measurement
	}{
		{"one", []answer{a(0, 10*ms, 2*ms)}, Measurement{Offset: 10 * ms, Uncertainty: 2 * ms, Server: "a"}},
		{"smallest distance wins", []answer{a(0, 10*ms, 3*ms), a(1, 11*ms, 1*ms)}, Measurement{Offset: 11 * ms, Uncertainty: ms, Server: "b"}},
		{"tie by list order", []answer{a(0, 10*ms, 2*ms), a(1, 11*ms, 2*ms)}, Measurement{Offset: 10 * ms, Uncertainty: 2 * ms, Server: "a"}},
		{"touching intervals agree", []answer{a(0, 0, 5*ms), a(1, 10*ms, 5*ms)}, Measurement{Offset: 0, Uncertainty: 5 * ms, Server: "a"}},
		{"falseticker outvoted", []answer{a(0, 5000*ms, ms/10), a(1, 50*ms, 2*ms), a(2, 51*ms, 3*ms)},
			Measurement{Offset: 50 * ms, Uncertainty: 2 * ms, Server: "b"}},
		{"no majority: hull", []answer{a(0, 0, ms), a(1, 100*ms, ms)},
			Measurement{Offset: 50 * ms, Uncertainty: 51 * ms}},
		{"2 of 4 is no majority", []answer{a(0, 0, ms), a(1, 0, ms), a(2, 100*ms, ms), a(3, 100*ms, ms)},
			Measurement{Offset: 50 * ms, Uncertainty: 51 * ms}},
		{"odd width rounds the uncertainty up", []answer{a(0, 0, 0), a(1, 3, 0)},
			Measurement{Offset: 1, Uncertainty: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.want.Known, tt.want.Answers = true, len(tt.in)
			if got := combine(tt.in); got != tt.want {
				t.Errorf("combine = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestEnforcedShare(t *testing.T) {
	ms := time.Millisecond
	known := func(u time.Duration) Measurement { return Measurement{Known: true, Uncertainty: u, Offset: 123 * ms} }
	tests := []struct {
		name   string
		q      int64
		window time.Duration
		m      Measurement
		bound  time.Duration
		want   int64
	}{
		{"within bound", 1000, time.Second, known(5 * ms), 20 * ms, 1000},
		{"at bound", 1000, time.Second, known(20 * ms), 20 * ms, 1000},
		{"default bound is 2%", 1000, time.Second, known(20 * ms), 0, 1000},
		{"above default bound", 1000, time.Second, known(21 * ms), 0, 958},      // 1000·(1 − 0.042)
		{"above bound", 1000, time.Second, known(50 * ms), 20 * ms, 900},        // 1000·(1 − 0.1)
		{"cut rounds down", 999, time.Second, known(50 * ms), 20 * ms, 899},     // 899.1
		{"cut stops at half", 1000, time.Second, known(300 * ms), 20 * ms, 500}, // 1000·0.4 < 500
		{"2u ≥ W", 1000, time.Second, known(time.Second), 20 * ms, 500},
		{"huge uncertainty", 1000, time.Second, known(time.Duration(1 << 62)), 20 * ms, 500},
		{"unknown", 1000, time.Second, Measurement{Offset: 5 * ms}, 20 * ms, 500},
		{"unknown odd", 7, time.Second, Measurement{}, 0, 3},
		{"unknown one", 1, time.Second, Measurement{}, 0, 0},
		{"zero share", 0, time.Second, known(0), 0, 0},
		{"negative share", -5, time.Second, known(0), 0, 0},
		{"bad window", 1000, 0, known(0), 0, 500},
		{"negative uncertainty treated as 0", 1000, time.Second, known(-time.Second), 0, 1000},
		{"huge share no overflow", 1 << 62, time.Second, known(50 * ms), 20 * ms, (1 << 62) - (1<<62)/10 - 1}, // cut rounds up
		{"short window", 100, 10 * ms, known(ms), 0, 80},                                                      // bound 200µs; 100·(1 − 0.2)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := EnforcedShare(tt.q, tt.window, tt.m, tt.bound); got != tt.want {
				t.Errorf("EnforcedShare(%d, %v, u=%v known=%v, %v) = %d, want %d",
					tt.q, tt.window, tt.m.Uncertainty, tt.m.Known, tt.bound, got, tt.want)
			}
		})
	}
}

// TestEnforcedShareBounds checks the properties the doc claims over a grid:
// never above q, never below ⌊q/2⌋ when q > 0, non-increasing in u, and
// under the rate assumption s·(1 + 2u/W) ≤ q.
func TestEnforcedShareBounds(t *testing.T) {
	const W = time.Second
	for _, q := range []int64{1, 2, 3, 10, 97, 1000, 123456789} {
		prev := q
		for u := time.Duration(0); u <= W; u += 7 * time.Millisecond {
			s := EnforcedShare(q, W, Measurement{Known: true, Uncertainty: u}, 0)
			if s > q || s < q/2 || s > prev {
				t.Fatalf("q=%d u=%v: share %d (previous %d), want in [q/2, q] and non-increasing", q, u, s, prev)
			}
			if u > DefaultBound(W) && float64(s)*(1+2*u.Seconds()/W.Seconds()) > float64(q) && s > q/2 {
				t.Fatalf("q=%d u=%v: share %d overshoots at twice the average rate", q, u, s)
			}
			prev = s
		}
	}
}

// TestRunStaleness drives Run's loop in a synctest bubble, with the query
// replaced (no sockets, so virtual time applies): known at once, unknown
// when no answer came within the staleness limit — reported at the first
// round after it — and known again when answers return.
func TestRunStaleness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval, staleness = time.Second, 3500 * time.Millisecond
		changes := make(chan Measurement, 10)
		m := newMonitor(t, WithServers("fake"), WithInterval(interval), WithStaleness(staleness),
			OnChange(func(m Measurement) { changes <- m }))
		var up atomic.Bool
		up.Store(true)
		var queries atomic.Int64
		m.query = func(ctx context.Context, server string) (*ntp.Response, error) {
			queries.Add(1)
			if !up.Load() {
				return nil, errors.New("i/o timeout")
			}
			now := time.Now()
			return &ntp.Response{ClockOffset: 7 * time.Millisecond, RootDistance: 2 * time.Millisecond,
				Stratum: 2, Version: 4, Time: now, ReferenceTime: now.Add(-time.Second)}, nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- m.Run(ctx) }()

		got := <-changes
		if !got.Known || got.Offset != 7*time.Millisecond || got.Uncertainty != 2*time.Millisecond || !got.At.Equal(start) {
			t.Fatalf("first round: %+v, want known 7ms ± 2ms at the start", got)
		}
		synctest.Wait() // Run is now waiting for its next tick
		up.Store(false)
		lastGood := time.Now()
		got = <-changes
		if got.Known {
			t.Fatalf("after the server went away: %+v, want unknown", got)
		}
		// Rounds are on whole intervals: the first after lastGood + 3.5 s is at + 4 s.
		if d := time.Since(lastGood); d != 4*time.Second {
			t.Errorf("unknown reported %v after the last answer, want 4s", d)
		}
		if got.Offset != 7*time.Millisecond {
			t.Errorf("unknown measurement lost the last offset: %+v", got)
		}
		synctest.Wait()
		up.Store(true)
		got = <-changes
		if !got.Known || time.Since(lastGood) != 5*time.Second {
			t.Errorf("server back: %+v after %v, want known at 5s", got, time.Since(lastGood))
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
		if n := queries.Load(); n != 6 {
			t.Errorf("%d queries, want 6 (one per second from 0 to 5 s)", n)
		}
	})
}
