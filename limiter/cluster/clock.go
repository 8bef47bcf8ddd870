package cluster

import (
	"slices"
	"sync"
	"time"

	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/skew"
)

// stepCalm is how many consecutive measurements must agree with the offset
// a step led to before the guard band the step widened narrows again.
const stepCalm = 5

// clockSink is what clock measurements are applied to: a Limiter, or a
// Group's Multi, all of whose limits must read one clock.
type clockSink interface {
	SetClockUncertainty(time.Duration)
	SetClockOffset(time.Duration)
}

// clock is what clock measurements act on: the state of the measurements
// folded in, and where they are applied. A lone Member has its own; a
// Group's Members share one, since its Multi's limits read one clock:
// each measurement is then folded in once, applied to every limit by
// whichever Member comes first, and every Member cuts its share by the
// same band, whichever lanes are configured or connected.
type clock struct {
	mu sync.Mutex // held while a Member folds in, applies or reads the clock
	clockState
	to clockSink
}

// clockState is what the Member remembers of the clock measurements it
// applied, to tell a step of the measured offset from its usual noise.
type clockState struct {
	applied time.Duration // the offset last applied
	have    bool          // applied holds a measurement
	at      time.Time     // the measurement last folded in, so each counts once
	step    time.Duration // extra uncertainty since the last step; 0: none
	calm    int           // measurements agreeing with applied since the step
	// last is the measurement clockCut last cut a share by, the step's
	// widening included (a ledger member cuts its grants by it).
	last skew.Measurement
}

// clockCut corrects the limiter's clock by the latest measurement and
// returns the share to enforce under its uncertainty (see
// WithClockMonitor). Without a monitor it returns q.
//
// A step of the measured offset — a change larger than the measurement's
// uncertainty plus the provider's bound, as when the local clock is
// stepped or the server's time jumps — cannot be told apart, from one
// server, from a server gone wrong: either the old clock or the new one
// may be the true one. Until stepCalm measurements in a row agree with the
// new offset, the step is added to the uncertainty: the guard band then
// keeps every permit inside its aligned window whichever clock is right,
// and is widened before the offset moves, so the jump itself (which ends
// the current window early when the clock moves forward) admits nothing
// near a boundary of either clock.
func (m *Member) clockCut(q int64, w, bound time.Duration) int64 {
	mon := m.cfg.clock
	if mon == nil {
		return q
	}
	meas := mon.Current()
	c := m.clk
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.have {
		// The limiter's own offset (WithClockOffset, or 0) is the clock
		// before the first measurement: a first measurement far from it
		// is a step like any other.
		c.applied, c.have = m.lim.ClockOffset(), true
	}
	if meas.Known && !meas.At.Equal(c.at) {
		c.at = meas.At
		d := meas.Offset - c.applied
		d = max(d, -d)
		switch {
		case d > meas.Uncertainty+bound:
			c.step, c.calm = max(c.step, d), 0
			m.log.Warn("clock offset stepped; widening the guard band until it settles",
				"from", c.applied, "to", meas.Offset, "step", d, "measurements", stepCalm)
		case c.step > 0:
			if c.calm++; c.calm >= stepCalm {
				m.log.Info("clock offset settled after a step; guard band back to the measurement's uncertainty",
					"offset", meas.Offset, "step", c.step)
				c.step, c.calm = 0, 0
			}
		}
		c.applied = meas.Offset
	}
	meas.Uncertainty += c.step
	c.last = meas
	if meas.Known {
		// The band first, then the clock: see above.
		c.to.SetClockUncertainty(meas.Uncertainty)
		c.to.SetClockOffset(meas.Offset)
	}
	// With the offset unknown the guard band stays as the last measurement
	// left it: the halved share takes effect only from a boundary ahead,
	// and until then the band is what keeps permits inside their aligned
	// windows (dropping it at once let one permit spill into the next
	// window in the fault suite).
	m.setStatus(func(s *Status) { s.ClockKnown, s.ClockUncertainty = meas.Known, meas.Uncertainty })
	return skew.EnforcedShare(q, w, meas, bound)
}

// measured returns the measurement clockCut last applied (Known false
// before the first).
func (c *clock) measured() skew.Measurement {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// cutLimiter is the limiter a ledger member's Follower enforces on: each
// step of the grants' schedule cut for the clock as a share is
// (skew.EnforcedShare: half while the offset is unknown), and kept so cut
// until two windows after a cut last applied, so that a quota grows back
// only in windows that begin after the clock was corrected, which no
// window of the uncorrected clock overlaps.
type cutLimiter struct {
	*limiter.Limiter
	m     *Member
	bound time.Duration
	mu    sync.Mutex
	cut   skew.Measurement // the measurement of the last cut
	until time.Time        // on the limiter's clock: cut until then
}

// SetSchedule cuts steps and sets them (limiter.Limiter.SetSchedule).
func (c *cutLimiter) SetSchedule(steps []limiter.Step, expiry time.Time) (time.Time, error) {
	if c.m.cfg.clock == nil {
		return c.Limiter.SetSchedule(steps, expiry)
	}
	meas := c.m.clk.measured()
	now := c.Limiter.Now()
	c.mu.Lock()
	cut := slices.Clone(steps)
	for i, s := range cut {
		q := skew.EnforcedShare(s.Quota, s.Window, meas, c.bound)
		switch {
		case q < s.Quota:
			c.cut, c.until = meas, laterOf(c.until, now.Add(2*s.Window))
		case now.Before(c.until):
			q = skew.EnforcedShare(s.Quota, s.Window, c.cut, c.bound)
		}
		cut[i].Quota = q
	}
	c.mu.Unlock()
	return c.Limiter.SetSchedule(cut, expiry)
}

func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
