package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sluice-go/sluice/limiter/skew"
)

// configd's own clock. The leader reads window boundaries on it: when a
// publish takes effect, and whether an instance's boundary has passed. No
// decision that lets a share grow depends on its accuracy: a growth is
// published from a boundary after now, so after every boundary the leader
// waited for, whatever its clock says. What it frees on its own clock (a
// higher limit, a gone instance's grant after its hold) an instance that
// receives it late grows into at once only where its own clock shows the
// room free for the whole window under way, and configd holds a gone
// instance's grant a window longer for it (follow.Schedule,
// schema.ProviderConfig.Settle). A clock that is off only makes publishes
// late (behind) or slow (ahead). So
// serve measures it with NTP, as the instances do (--ntp-server), and
// corrects it: publishes then reach the instances before their boundary.

// clock is configd's wall clock: the system's, corrected by the last
// known NTP measurement when --ntp-server is given.
type clock struct {
	mon    *skew.Monitor // nil: not measured
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startClock starts measuring the clock if cfg names NTP servers; stop
// ends it. It exports the measurement in m and logs it.
func startClock(ctx context.Context, cfg Config, m *metrics, log *slog.Logger) (*clock, error) {
	c := &clock{}
	if len(cfg.NTPServers) == 0 {
		log.Info("configd's clock is not measured (no --ntp-server): window boundaries are read on the system clock; its error can make publishes late or slow, never unsafe")
		return c, nil
	}
	mon, err := skew.New(skew.WithServers(cfg.NTPServers...), skew.WithInterval(cfg.NTPInterval),
		skew.WithLogger(log.With("component", "clock")),
		skew.OnChange(func(meas skew.Measurement) {
			known := 0.0
			if meas.Known {
				known = 1
			}
			m.clockKnown.Set(known)
			m.clockOffset.Set(meas.Offset.Seconds())
			m.clockUncertainty.Set(meas.Uncertainty.Seconds())
			log.Info("configd's clock measured", "known", meas.Known, "offset", meas.Offset, "uncertainty", meas.Uncertainty, "server", meas.Server)
		}))
	if err != nil {
		return nil, &ConfigError{"ntp-server", cfg.NTPServers[0], err}
	}
	rctx, cancel := context.WithCancel(ctx)
	c.mon, c.cancel = mon, cancel
	c.wg.Go(func() { mon.Run(rctx) })
	return c, nil
}

// now returns the wall clock, corrected by the measurement when known;
// without a monotonic reading, so that it is compared as wall time.
func (c *clock) now() time.Time {
	t := time.Now()
	if c.mon != nil {
		if meas := c.mon.Current(); meas.Known {
			t = t.Add(meas.Offset)
		}
	}
	return t.Round(0)
}

// uncertainty is how far now may be from true time: the measurement's
// uncertainty when known, 0 otherwise (nothing better is known).
func (c *clock) uncertainty() time.Duration {
	if c.mon == nil {
		return 0
	}
	if meas := c.mon.Current(); meas.Known {
		return meas.Uncertainty
	}
	return 0
}

// stop ends the measurements and waits for them.
func (c *clock) stop() {
	if c.cancel != nil {
		c.cancel()
		c.wg.Wait()
	}
}
