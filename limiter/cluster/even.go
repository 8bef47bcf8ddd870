package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/follow"
	"github.com/sluice-go/sluice/internal/schema"
)

// The Member's side of the even split, which it follows while no configd
// replica is alive (the rules and why they suffice: internal/follow,
// even.go). Per report interval it polls two counts (pollEven); it writes
// its confirmation on its lease while it follows the split, and deletes it
// once configd is back (confirmEven); its hold covers the fail_static and
// window of a config replaced within the last two hours (noteReplaced,
// evenHold). What the split lets it enforce is worked out in apply, with
// configd's shares.

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
	// instance's lease may be longer than this Member's.
	v.replaced = append(v.replaced, replaced{failStatic: fs, window: w, until: now.Add(max(replacedMemory, ttl+prev.HoldAfter(0)+w))})
}

// replacedMemory is how long a Member remembers a replaced fail_static
// or window length, as configd does: longer than any lease.
const replacedMemory = 2 * time.Hour

// evenHold is the hold of the even split (follow.Even), at now: as long
// as configd holds a lapsed share to cover the horizon of the instance
// that had it (its Settle beyond that is for late records of configd's,
// which the split does not grow at once) — the longest fail_static an instance
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

// pollEven reads the counts of the even split while no configd leader is
// alive: two count-only requests, whatever the fleet's size.
func (m *Member) pollEven(ctx context.Context, v *view) error {
	if len(v.leaders) > 0 {
		return nil
	}
	sent := time.Now()
	octx, cancel := m.opCtx(ctx)
	defer cancel()
	resp, err := m.cli.Txn(octx).Then(
		clientv3.OpGet(m.keys.Instances(m.provider), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(m.keys.Even(m.provider), clientv3.WithPrefix(), clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		return fmt.Errorf("count instances of %s: %w", m.provider, err)
	}
	rs := resp.Responses
	v.even.Observe(time.Now(), rs[0].GetResponseRange().Count, rs[1].GetResponseRange().Count, v.evenHold(time.Now()))
	v.polledAt = sent
	return nil
}

// confirmEven writes this instance's even-split confirmation, on its
// lease, while no configd leader is alive, and deletes it once one is:
// the others count it (follow.Even).
func (m *Member) confirmEven(ctx context.Context, v *view, lease clientv3.LeaseID) error {
	want := len(v.leaders) == 0 && v.config != nil
	if want == m.evenMarked {
		return nil
	}
	octx, cancel := m.opCtx(ctx)
	defer cancel()
	key := m.keys.EvenMark(m.provider, m.id)
	var err error
	if want {
		_, err = m.cli.Put(octx, key, "", clientv3.WithLease(lease))
	} else {
		_, err = m.cli.Delete(octx, key)
	}
	if errors.Is(err, rpctypes.ErrPermissionDenied) {
		m.warnNoMarks()
		return nil
	}
	if err != nil {
		return fmt.Errorf("even split confirmation: %w", err)
	}
	m.evenMarked = want
	return nil
}

// warnNoMarks says, once, that this instance may not write its even-split
// confirmation.
func (m *Member) warnNoMarks() {
	m.noMarks.Do(func() {
		m.log.Warn("may not write the even-split confirmation (permission denied): grant the instance's role read-write on the provider's even/ prefix; until then, with configd gone, the instances stay at their grants",
			"key", m.keys.EvenMark(m.provider, m.id))
	})
}
