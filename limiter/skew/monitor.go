package skew

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beevik/ntp"
)

// Monitor measures the local clock's offset from a set of NTP servers.
//
// Each round (Measure, or Run every interval) queries every server at once
// and validates each answer (beevik/ntp's Response.Validate: no kiss of
// death, stratum 1–15, leap indicator synchronized, root distance under
// 16 s, fresh reference time; and, beyond beevik/ntp, an offset within
// ±WithMaxOffset, 1 h by default). Each valid answer i says the true offset lies
// in [θᵢ − λᵢ, θᵢ + λᵢ], θᵢ its offset and λᵢ its root distance. The
// answers are combined as NTP's selection algorithm does, by Marzullo's
// interval intersection: if more than half of the valid answers share a
// common point (the truechimers), the one among them with the smallest root
// distance is used; otherwise the servers disagree with no majority, and the
// measurement covers all of them — offset at the middle of the span of all
// intervals, uncertainty its half-width — which contains the true offset as
// long as any one server is right. So one bad server among three is
// outvoted, and two that disagree yield a large uncertainty (and a share
// cut) rather than a wrong offset.
//
// A Monitor is safe for concurrent use. Its goroutines are those of Run and
// of a round's queries, which end before Measure returns; there is nothing
// to close.
type Monitor struct {
	cfg config

	// query asks one server; tests replace it to run without sockets.
	query func(ctx context.Context, server string) (*ntp.Response, error)

	// roundMu serializes rounds and OnChange calls.
	roundMu  sync.Mutex
	reported Measurement // last value given to OnChange; guarded by roundMu

	mu   sync.Mutex
	last Measurement // latest valid measurement (Known) or zero; guarded by mu

	running atomic.Bool
}

// New returns a Monitor configured by opts (see the With… options and
// OnChange for defaults). It starts nothing: call Run, or Measure. Invalid
// options return an error wrapping ErrInvalid.
func New(opts ...Option) (*Monitor, error) {
	cfg, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	m := &Monitor{cfg: cfg}
	m.query = m.ntpQuery
	return m, nil
}

// now reads the Monitor's clock.
func (m *Monitor) now() time.Time {
	if m.cfg.clock != nil {
		return m.cfg.clock.Now()
	}
	return time.Now()
}

// Current returns the measurement now: the latest valid one, with Known
// false if it is older than the staleness limit or there has been none.
func (m *Monitor) Current() Measurement {
	m.mu.Lock()
	last := m.last
	m.mu.Unlock()
	return m.view(last, m.now())
}

// view applies the staleness limit to last at time now.
func (m *Monitor) view(last Measurement, now time.Time) Measurement {
	if last.Known && now.Sub(last.At) > m.cfg.staleness {
		last.Known = false
	}
	return last
}

// Measure runs one round: it queries every server, waits for their answers
// (each at most the timeout, and no longer than ctx allows), updates the
// current measurement, calls OnChange if it changed, and returns it.
//
// With at least one valid answer the error is nil (servers that failed are
// logged at Warn and counted out of Measurement.Answers). With none it
// returns the unchanged current measurement — unknown once stale — and an
// error wrapping ErrNoAnswer and every server's error. If ctx ends during
// the round, it returns ctx's error and leaves the measurement unchanged.
// Rounds are serialized: a Measure called during another waits for it.
func (m *Monitor) Measure(ctx context.Context) (Measurement, error) {
	if err := ctx.Err(); err != nil {
		return m.Current(), fmt.Errorf("skew: measure: %w", err)
	}
	m.roundMu.Lock()
	defer m.roundMu.Unlock()

	answers, errs := m.queryAll(ctx)
	if err := ctx.Err(); err != nil {
		return m.Current(), fmt.Errorf("skew: measure: %w", err)
	}
	now := m.now()
	if len(answers) > 0 {
		// A round with no answer at all is reported by the returned error.
		for _, err := range errs {
			m.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "NTP server failed; measured with the others", slog.Any("err", err))
		}
	}

	m.mu.Lock()
	if len(answers) > 0 {
		m.last = combine(answers)
		m.last.At = now
	}
	cur := m.view(m.last, now)
	m.mu.Unlock()

	if cur != m.reported {
		m.logChange(ctx, cur)
		m.reported = cur
		if m.cfg.onChange != nil {
			m.cfg.onChange(cur)
		}
	}
	if len(answers) == 0 {
		return cur, fmt.Errorf("%w (%d queried): %w", ErrNoAnswer, len(m.cfg.servers), errors.Join(errs...))
	}
	return cur, nil
}

func (m *Monitor) logChange(ctx context.Context, cur Measurement) {
	switch {
	case cur.Known && !m.reported.Known:
		m.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "clock offset known",
			slog.Duration("offset", cur.Offset), slog.Duration("uncertainty", cur.Uncertainty),
			slog.String("server", cur.Server), slog.Int("answers", cur.Answers))
	case !cur.Known && m.reported.Known:
		m.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "clock offset unknown: no valid NTP answer within the staleness limit",
			slog.Duration("staleness", m.cfg.staleness), slog.Time("last", cur.At),
			slog.Duration("last_offset", cur.Offset))
	case cur.Known:
		m.cfg.logger.LogAttrs(ctx, slog.LevelDebug, "clock offset measured",
			slog.Duration("offset", cur.Offset), slog.Duration("uncertainty", cur.Uncertainty),
			slog.String("server", cur.Server), slog.Int("answers", cur.Answers))
	}
}

// Run measures at once and then every interval until ctx ends, and returns
// ctx's error. Round failures are logged, not returned; their effect is seen
// in Current and OnChange. Run returns ErrRunning at once if another Run of
// this Monitor is still running. It starts no goroutine that outlives it.
func (m *Monitor) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer m.running.Store(false)
	t := time.NewTicker(m.cfg.interval)
	defer t.Stop()
	for {
		if _, err := m.Measure(ctx); err != nil && ctx.Err() == nil {
			m.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "NTP round failed", slog.Any("err", err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// answer is one valid server answer.
type answer struct {
	server string
	index  int           // position in the server list, for tie-breaks
	offset time.Duration // θ
	dist   time.Duration // λ, root distance
}

// queryAll asks every server at once and returns the valid answers, sorted
// by server index, and one error per failed server.
func (m *Monitor) queryAll(ctx context.Context) ([]answer, []error) {
	type result struct {
		a   answer
		err error
	}
	results := make([]result, len(m.cfg.servers))
	var wg sync.WaitGroup
	for i, server := range m.cfg.servers {
		wg.Go(func() {
			r, err := m.safeQuery(ctx, server)
			if err == nil {
				err = check(r, m.cfg.maxOffset)
			}
			if err != nil {
				results[i].err = fmt.Errorf("server %q: %w", server, err)
				return
			}
			results[i].a = answer{server: server, index: i, offset: r.ClockOffset, dist: r.RootDistance}
		})
	}
	wg.Wait()
	var answers []answer
	var errs []error
	for _, r := range results {
		if r.err != nil {
			errs = append(errs, r.err)
		} else {
			answers = append(answers, r.a)
		}
	}
	return answers, errs
}

// safeQuery calls m.query and turns a panic into an error: beevik/ntp
// v1.6.0 panics on some malformed replies (a poll or precision byte of
// −128 makes toInterval shift by a negative amount), and a reply from the
// network must never crash the process.
func (m *Monitor) safeQuery(ctx context.Context, server string) (r *ntp.Response, err error) {
	defer func() {
		if p := recover(); p != nil {
			r, err = nil, fmt.Errorf("%w: the NTP client panicked on the reply: %v", ErrBadResponse, p)
		}
	}()
	return m.query(ctx, server)
}

// maxDispersion is NTP's largest meaningful root distance (RFC 5905).
const maxDispersion = 16 * time.Second

// check validates a response; maxOffset bounds its offset either way.
func check(r *ntp.Response, maxOffset time.Duration) error {
	if r == nil {
		return fmt.Errorf("%w: no response", ErrBadResponse)
	}
	if err := r.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadResponse, err)
	}
	if r.RTT < 0 || r.RootDistance < 0 {
		return fmt.Errorf("%w: negative round trip %v or root distance %v", ErrBadResponse, r.RTT, r.RootDistance)
	}
	if r.RootDistance > maxDispersion {
		// RFC 5905's MAXDISP: a server this unsure, or a reply whose
		// timestamps are nonsense (a receive time of 0), says nothing.
		return fmt.Errorf("%w: root distance %v exceeds %v", ErrBadResponse, r.RootDistance, maxDispersion)
	}
	if r.ClockOffset > maxOffset || r.ClockOffset < -maxOffset {
		// A server (or a forged reply) claiming a time this far away is
		// not believed: moving every window by it would do more harm
		// than the share cut an unknown offset brings.
		return fmt.Errorf("%w: offset %v is beyond the sanity bound ±%v (see WithMaxOffset)", ErrBadResponse, r.ClockOffset, maxOffset)
	}
	return nil
}

// ntpQuery asks server once with beevik/ntp, honouring ctx: the UDP socket
// is dialled with ctx and closed when ctx ends, which ends the wait.
func (m *Monitor) ntpQuery(ctx context.Context, server string) (*ntp.Response, error) {
	var (
		mu   sync.Mutex
		conn net.Conn
		done bool
	)
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		done = true
		if conn != nil {
			conn.Close()
		}
	})
	defer stop()
	opts := ntp.QueryOptions{
		Timeout: m.cfg.timeout,
		Dialer: func(_, remote string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "udp", remote)
			if err != nil {
				return nil, err
			}
			mu.Lock()
			defer mu.Unlock()
			if done {
				c.Close()
				return nil, ctx.Err()
			}
			conn = c
			return c, nil
		},
	}
	if m.cfg.clock != nil {
		// Timestamps from the Monitor's clock (this disables kernel
		// receive timestamps, which read the system clock).
		opts.GetSystemTime = m.cfg.clock.Now
	}
	r, err := ntp.QueryWithOptions(server, opts)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, err
	}
	return r, nil
}

// combine turns one round's valid answers (at least one) into a
// measurement by Marzullo's algorithm; see Monitor. Deterministic: ties go
// to the server listed first.
func combine(answers []answer) Measurement {
	n := len(answers)
	type edge struct {
		at    time.Duration
		start bool
	}
	edges := make([]edge, 0, 2*n)
	for _, a := range answers {
		edges = append(edges, edge{a.offset - a.dist, true}, edge{a.offset + a.dist, false})
	}
	// Starts before ends at the same point: touching intervals intersect.
	slices.SortFunc(edges, func(x, y edge) int {
		if c := cmp.Compare(x.at, y.at); c != 0 {
			return c
		}
		switch {
		case x.start == y.start:
			return 0
		case x.start:
			return -1
		}
		return 1
	})
	best, count := 0, 0
	var point time.Duration
	for _, e := range edges {
		if e.start {
			count++
			if count > best {
				best, point = count, e.at
			}
		} else {
			count--
		}
	}
	if 2*best > n {
		var chosen *answer
		for i := range answers {
			a := &answers[i]
			if a.offset-a.dist > point || a.offset+a.dist < point {
				continue // a falseticker
			}
			if chosen == nil || a.dist < chosen.dist || a.dist == chosen.dist && a.index < chosen.index {
				chosen = a
			}
		}
		return Measurement{Offset: chosen.offset, Uncertainty: chosen.dist, Known: true, Server: chosen.server, Answers: n}
	}
	lo, hi := edges[0].at, edges[0].at
	for _, e := range edges {
		lo, hi = min(lo, e.at), max(hi, e.at)
	}
	// Offsets are within ±68 years (one NTP era) and root distances under
	// 16 s, so hi − lo cannot overflow.
	width := hi - lo
	return Measurement{Offset: lo + width/2, Uncertainty: width - width/2, Known: true, Answers: n}
}
