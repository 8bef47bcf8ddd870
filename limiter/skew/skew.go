// Package skew measures how far the local clock is from true time with NTP
// (github.com/beevik/ntp), and decides how much of its share an instance may
// enforce when that measurement is poor.
//
// sluice's windows start at wall-clock multiples of their length on every
// instance, so the instances' clocks must agree: a Monitor queries a list of
// NTP servers every interval, combines their answers robustly, and reports a
// Measurement (offset, uncertainty, when, known or not). An answer claiming
// an offset beyond a sanity bound (WithMaxOffset, ±1h by default: what an
// instance record can carry) is refused like any other bad reply. The instance side
// passes the offset to the limiter (limiter.SetClockOffset) from the
// Monitor's OnChange callback, and cuts its share with EnforcedShare when
// the uncertainty is too large or the offset unknown.
//
// Usage:
//
//	mon, err := skew.New(
//		skew.WithServers("0.pool.ntp.org", "1.pool.ntp.org", "2.pool.ntp.org"),
//		skew.WithInterval(64*time.Second),
//		skew.WithLogger(logger),
//		skew.OnChange(func(m skew.Measurement) {
//			if m.Known {
//				lim.SetClockOffset(m.Offset)
//			}
//		}),
//	)
//	if err != nil { ... }
//	go mon.Run(ctx) // returns when ctx ends
//	...
//	share := skew.EnforcedShare(q, time.Second, mon.Current(), 0)
//
// Tests drive one round at a time with Measure instead of waiting for the
// interval; internal/ntptest provides a local SNTP responder.
package skew

import (
	"errors"
	"time"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrInvalid means an option was out of range; the message says which
	// and what is allowed.
	ErrInvalid = errors.New("skew: invalid option")

	// ErrNoAnswer means no server gave a valid answer in a round. The error
	// also wraps each server's own error.
	ErrNoAnswer = errors.New("skew: no valid answer from any NTP server")

	// ErrBadResponse means a server answered, but its answer failed
	// validation (kiss of death, unsynchronized, bad stratum, dispersion
	// over 16 s, malformed packet...). It wraps beevik/ntp's error.
	ErrBadResponse = errors.New("skew: invalid NTP response")

	// ErrRunning means Run was called while another Run of the same Monitor
	// was still running.
	ErrRunning = errors.New("skew: monitor already running")
)

// Measurement is the clock offset as last measured.
//
// Offset is what to add to the local clock to get true (NTP) time:
// true ≈ local + Offset, the sign convention of beevik/ntp's ClockOffset and
// of limiter.SetClockOffset. The true offset lies within Offset ± Uncertainty
// provided the servers used are truthful.
type Measurement struct {
	// Offset is the measured clock offset: positive when the local clock is
	// behind. When Known is false it is the last known offset (0 if there
	// never was one), kept so that a caller may go on correcting by it.
	Offset time.Duration

	// Uncertainty (≥ 0) bounds the error of Offset at time At: the root
	// distance of the chosen answer, (RTT + server root delay)/2 + server
	// root dispersion (RFC 5905's root distance without the jitter term,
	// which a single SNTP exchange cannot estimate). When servers disagree
	// with no majority, it is the half-width of the span covering all their
	// answers (see Monitor). It does not grow with age; the staleness limit
	// bounds how much the clock can drift meanwhile (a typical crystal:
	// 15 ppm, 4 ms over the default 256 s).
	Uncertainty time.Duration

	// At is the local time (of the Monitor's clock, uncorrected) when the
	// measurement was taken; zero if there never was one.
	At time.Time

	// Known reports whether Offset is usable: a round produced a valid
	// answer no longer ago than the staleness limit.
	Known bool

	// Server is the address of the server whose answer was chosen, or ""
	// when the answers were combined (no majority agreed) or none was valid.
	Server string

	// Answers is the number of valid answers in the round that produced
	// this measurement.
	Answers int
}

// Clock is the source of local time. It has the shape of limiter.Clock, so
// the clock given to a limiter can be passed here: the offset is then
// measured against that very clock.
type Clock interface {
	Now() time.Time
}
