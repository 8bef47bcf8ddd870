package cluster

import (
	"time"

	"github.com/sluice-go/sluice/internal/follow"
	"github.com/sluice-go/sluice/internal/schema"
)

// replaced is what a config said before a change this Member saw — its
// fail_static and window length — kept until an instance cut off from etcd
// just before the change, counting with it, has stopped.
type replaced struct {
	failStatic, window time.Duration
	until              time.Time // monotonic
}

// noteReplaced remembers, when the config prev is replaced by c, a
// fail_static that was longer or a window of another length: an instance
// cut off before it read c admits until a fail_static past its lease's
// end by prev's, and to the end of a window of prev's length that began
// before then (limiter.SetExpiry).
func (v *view) noteReplaced(prev, c *schema.ProviderConfig, now time.Time, ttl time.Duration) {
	if prev == nil || c == nil {
		return
	}
	fs, w := prev.FailStaticOrDefault(), prev.Window.D()
	if fs <= c.FailStaticOrDefault() && w == c.Window.D() {
		return
	}
	// As long as configd remembers a replaced fail_static: the cut-off
	// instance's lease may be longer than this Member's (found by review).
	v.replaced = append(v.replaced, replaced{failStatic: fs, window: w, until: now.Add(max(replacedMemory, ttl+prev.HoldAfter(0)+w))})
}

// replacedMemory is how long a Member remembers a replaced fail_static
// or window length, as configd does: longer than any lease.
const replacedMemory = 2 * time.Hour

// evenHold is the hold of the even split (follow.Even), at now: as long
// as configd holds a lapsed share — the longest fail_static an instance
// cut off from etcd may count with (the provider's, or one this Member saw
// replaced), plus the clock bound — plus the longest interval between
// two polls of any instance and the time a cut-off one admits past its
// last poll (follow.CountsValid) for the poll that sees a
// change, plus a window of another length such an instance
// may keep past its horizon. An adversarial review found the split taking
// the whole limit while an instance cut off before fail_static was
// lowered from 10 s to 1 s still admitted its share (150 in a window of
// 90). A Member that joined after the change does not know the old value.
func (v *view) evenHold(now time.Time) time.Duration {
	c := v.config
	if c == nil {
		return schema.ProviderConfig{}.HoldAfter(0) + follow.CountsValid
	}
	h, extra := c.HoldAfter(0), time.Duration(0)
	keep := v.replaced[:0]
	for _, r := range v.replaced {
		if now.After(r.until) {
			continue
		}
		keep = append(keep, r)
		h = max(h, c.HoldAfter(r.failStatic))
		if r.window != c.Window.D() {
			extra = max(extra, r.window)
		}
	}
	v.replaced = keep
	return h + follow.CountsValid + extra
}
