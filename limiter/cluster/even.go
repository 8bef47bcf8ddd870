package cluster

import (
	"time"

	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/internal/share"
)

// The even split (no configd alive) must not overlap with a grant from
// configd's last shares that another instance may still enforce: one cut
// off from etcd when configd went keeps its share until its fail-static
// horizon, and never learns of the split. So each instance counts what the
// others may still enforce: an instance that confirmed the split — its
// record says applied generation 0 and was written after the last configd
// leader went — takes at most total/N like this one; any other, live or
// gone without saying it was leaving, may enforce its last grant — gone,
// until the longest fail_static it may count with (the provider's or its
// record's; plus the clock bound) has passed since its key went, as
// configd holds it.

// evenShare returns this instance's share under the even split: total/N,
// or less if that is more than the total leaves once the others have what
// they may enforce (total/N each for those that confirmed the split, their
// last grant if larger for the others, and the grants held for gone ones).
func (m *Member) evenShare(v *view, now time.Time) int64 {
	c := v.config
	n := int64(max(1, len(v.instances)))
	even := c.Limit / n
	s := v.shares
	if s == nil {
		return even
	}
	budget := c.Limit
	for id := range v.instances {
		if id == m.id {
			continue
		}
		if v.confirmed(id) {
			budget -= even
			continue
		}
		budget -= max(even, grantIn(s, id, c.Window.D()))
	}
	v.pruneHeld(now)
	for id := range v.held {
		budget -= grantIn(s, id, c.Window.D())
	}
	return max(0, min(even, budget))
}

// leaderEvent applies a configd leader key's creation or deletion (at
// etcd revision rev) to the view. The deletion of any key under the
// election prefix counts as a leader's going, also one the view never
// took for a leader's: records older than it are then not confirmations,
// which can only make the even split smaller.
func (v *view) leaderEvent(key string, deleted bool, rev int64) {
	if !deleted {
		v.leaders[key] = true
		return
	}
	delete(v.leaders, key)
	v.leaderGone = max(v.leaderGone, rev)
}

// confirmed reports whether live instance id applies the even split: its
// record says applied generation 0 (no shares of configd's), written after
// the last leader went. An older such record may predate shares it
// applied since.
func (v *view) confirmed(id string) bool {
	r, ok := v.records[id]
	return ok && r.AppliedGeneration == 0 && r.rev > v.leaderGone
}

// grantIn returns the most permits the shares s may have id admit in one
// window of w: its share or its grant, whichever is larger, counted into
// windows of w (share.In).
func grantIn(s *schema.Shares, id string, w time.Duration) int64 {
	return share.In(s.Enforcing(id), s.Window.D(), w)
}

// holdFor is how long after a gone instance's key went the even split
// keeps its grant out (schema.ProviderConfig.HoldAfter): for the longest
// fail_static it may count with — the provider's or its record's — plus
// the clock bound.
func holdFor(c *schema.ProviderConfig, failStatic time.Duration) time.Duration {
	if c == nil {
		return schema.ProviderConfig{}.HoldAfter(failStatic)
	}
	return c.HoldAfter(failStatic)
}

// gone records that id's key went: unless its record said it was leaving
// or it confirmed the even split (its horizon is then its lease's end),
// the even split keeps its last grant out for holdFor.
func (v *view) gone(id string, now time.Time) {
	r, known := v.records[id]
	confirmed := v.confirmed(id)
	delete(v.instances, id)
	delete(v.records, id)
	if (known && r.Leaving) || confirmed {
		return
	}
	if v.shares == nil || grantIn(v.shares, id, v.shares.Window.D()) == 0 {
		return
	}
	v.held[id] = now.Add(holdFor(v.config, r.FailStatic.D()))
}

// holdMissing holds, from now, every instance the shares name with a grant
// that is not live: a member that (re)loads cannot know when they left, nor
// how.
func (v *view) holdMissing(now time.Time) {
	v.pruneHeld(now)
	s := v.shares
	if s == nil {
		return
	}
	for _, id := range s.Named() {
		if _, live := v.instances[id]; live || s.Enforcing(id) == 0 {
			continue
		}
		if _, ok := v.held[id]; !ok {
			v.held[id] = now.Add(holdFor(v.config, 0))
		}
	}
}

// pruneHeld forgets the holds that ended by now.
func (v *view) pruneHeld(now time.Time) {
	for id, until := range v.held {
		if !now.Before(until) {
			delete(v.held, id)
		}
	}
}
