package cluster

import (
	"math"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter/skew"
)

// The even split (no configd alive) must not overlap with a grant from
// configd's last shares that another instance may still enforce: one cut
// off from etcd when configd went keeps its share until its fail-static
// horizon, and never learns of the split. So each instance counts what the
// others may still enforce: an instance whose record says it applies the
// even split (applied generation 0) takes at most total/N like this one;
// any other, live or gone without saying it was leaving, may enforce its
// last grant — gone, until the longest fail_static it may count with (plus
// the clock bound) has passed since its key went, as configd holds it.

// evenShare returns this instance's share under the even split: total/N,
// less what the others may enforce beyond their own total/N.
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
		if r, ok := v.records[id]; ok && r.AppliedGeneration == 0 {
			budget -= even
			continue
		}
		budget -= max(even, grantIn(s, id, c.Window.D()))
	}
	for id, until := range v.held {
		if now.Before(until) {
			budget -= grantIn(s, id, c.Window.D())
		}
	}
	return max(0, min(even, budget))
}

// grantIn returns the most shares s leave id enforcing, in windows of w:
// its share or its grant, whichever is larger, scaled up when s was
// published for another window length.
func grantIn(s *schema.Shares, id string, w time.Duration) int64 {
	g := max(s.Shares[id], s.Granted[id])
	if sw := s.Window.D(); sw > 0 && sw != w && g > 0 {
		g = int64(math.Ceil(float64(g) * float64(w) / float64(sw)))
	}
	return g
}

// holdFor is how long after id's key went the even split keeps its grant
// out: the longest fail_static it may count with, plus the clock bound.
func holdFor(c *schema.ProviderConfig, r schema.InstanceRecord) time.Duration {
	fs := schema.DefaultFailStatic
	w := schema.DefaultWindow
	bound := time.Duration(0)
	if c != nil {
		fs, w, bound = c.FailStaticOrDefault(), c.Window.D(), c.MaxClockOffset.D()
	}
	if bound <= 0 {
		bound = skew.DefaultBound(w)
	}
	return max(fs, r.FailStatic.D()) + bound
}

// gone records that id's key went: unless its record said it was leaving
// or that it applies the even split (its horizon is then its lease's end),
// the even split keeps its last grant out for holdFor.
func (v *view) gone(id string, now time.Time) {
	r, known := v.records[id]
	delete(v.instances, id)
	delete(v.records, id)
	if known && (r.Leaving || r.AppliedGeneration == 0) {
		return
	}
	if v.shares == nil || grantIn(v.shares, id, v.shares.Window.D()) == 0 {
		return
	}
	v.held[id] = now.Add(holdFor(v.config, r))
}

// holdMissing holds, from now, every instance the shares name with a grant
// that is not live: a member that (re)loads cannot know when they left, nor
// how.
func (v *view) holdMissing(now time.Time) {
	s := v.shares
	if s == nil {
		return
	}
	for _, m := range []map[string]int64{s.Shares, s.Granted} {
		for id, g := range m {
			if _, live := v.instances[id]; live || g == 0 {
				continue
			}
			if _, ok := v.held[id]; !ok {
				v.held[id] = now.Add(holdFor(v.config, schema.InstanceRecord{}))
			}
		}
	}
	for id, until := range v.held {
		if !now.Before(until) {
			delete(v.held, id)
		}
	}
}
