package cluster

import (
	"errors"
	"time"

	"github.com/sluice-go/sluice/internal/follow"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// apply sets the limiter to the share in force and reports whether a new
// shares generation was applied (which the caller acknowledges at once).
//
// With a configd leader alive, the share is the published one (0 for an
// instance not yet in it, or before the first publish: a joining instance
// starts with nothing). With no
// leader, it is total / live instances, from the first window boundary at
// least the change margin ahead. Without a provider config, the fallback.
func (m *Member) apply(v *view, ap *applied) bool {
	if v.config != nil {
		m.applyClasses(v.config)
	}
	if v.config != nil && v.config.Ledger() {
		// The ledger's Follower sets the limiter (followLedger): the
		// shares' rules neither apply nor count here.
		// Nothing it held before counts there: not the fallback New
		// gave it, nor a share of an earlier incarnation of the
		// provider. Dropped at once, at the length in force, until the
		// Follower's schedule replaces it.
		if !m.toLedger {
			if err := m.lim.SetQuota(0, time.Time{}); err != nil && !errors.Is(err, limiter.ErrClosed) {
				m.log.Error("cannot drop the quota held before the ledger", "err", err)
			}
		}
		m.toLedger = true
		return false
	}
	lim := m.lim
	fallback := applied{Source: follow.SourceFallback, Quota: m.cfg.fallbackQuota, Window: m.cfg.fallbackWindow}
	if v.budget {
		// A budget's config, refused: its limit is taken, not shared,
		// and no fallback stands in for it, from the window under way on:
		// a fallback of 100 per second would admit past a day's budget of 5.
		fallback.Quota = 0
		if ap.Source == follow.SourceFallback && ap.Quota > 0 {
			if err := lim.SetQuota(0, time.Time{}); err != nil && !errors.Is(err, limiter.ErrClosed) {
				m.log.Error("cannot drop the fallback", "err", err)
			}
		}
	}
	fv := follow.View{Leader: len(v.leaders) > 0}
	var grant int64 // the most this process's record lets it enforce, per window of the config
	if r := v.share; r != nil {
		fv.Shares = &follow.Shares{Generation: r.Generation, EffectiveFrom: r.EffectiveFrom, Window: r.Window.D(), Share: r.Share}
		if v.config != nil {
			own := *r
			if m.enforced == r.Generation {
				// It enforced this record: configd counts it at the share
				// from then on, not at the grant (share.Bound), and may
				// hand the rest on when it comes back.
				own.Granted = own.Share
			}
			grant = own.GrantPer(v.config.Window.D(), v.config.Limit)
			if m.enforced != r.Generation {
				// A record it never enforced: its grant beyond its share is
				// configd's count of an older record it may still enforce
				// (for one configd could not read at a takeover, the whole
				// limit), not room of its own. That older record is the
				// last it enforced: it may take no more than the larger
				// share of the two. Else a fleet counted at the whole limit
				// would each take limit/n on the even split beside a cut-off
				// instance on its old 60: 120 of 90.
				sh := own
				sh.Granted = sh.Share
				most := sh.GrantPer(v.config.Window.D(), v.config.Limit)
				if e := m.enforcedShare; e != nil {
					last := *e
					last.Granted = last.Share
					most = max(most, last.GrantPer(v.config.Window.D(), v.config.Limit))
				}
				grant = min(grant, most)
			}
		}
		if m.registered == 0 || v.shareRev < m.registered {
			// Published before this process registered: a share it names
			// for this id was a previous process's, which may have spent it
			// in the window under way and which configd may be handing on.
			// A new process starts with nothing (see Member.registered).
			fv.Shares.Share, grant = 0, 0
		}
	}
	if c := v.config; c != nil {
		fv.Config = &follow.Config{Limit: c.Limit, Window: c.Window.D()}
		if !fv.Leader {
			fv.Even = v.even.Share(c.Limit, grant, m.registeredAt, time.Now(), v.evenHold(time.Now()))
			if grant > 0 {
				fv.EvenFrom = v.share.EffectiveFrom
			}
		}
	}
	next := follow.Next(fv, fallback)
	if c := v.config; c != nil {
		lim.SetShadow(c.Mode == schema.ModeShadow)
		lim.SetPacing(c.Pacing)
		share := next.Quota
		next.Quota = m.clockCut(next.Quota, next.Window, c.ClockBound())
		next.ClockCut = next.Quota < share
		if next.Source == follow.SourceShares {
			next.Settled = m.settled(v, c)
		}
	}
	if next.Source == ap.Source && next.Quota == ap.Quota && next.Window == ap.Window && next.Generation == ap.Generation {
		return false
	}
	next.Quota = min(next.Quota, limiter.MaxQuota)
	// A quota without a boundary of its own applies from the first one at
	// least the margin ahead; a switch of source (fallback, the even
	// split, configd's shares) takes the smaller quota at once and the new
	// one only from such a boundary (see follow.Schedule).
	st := lim.Stats()
	cur := follow.InForce{Quota: st.Quota, Window: st.Window}
	now := lim.Now().UnixNano()
	step := follow.Schedule(*ap, next, cur, next.At, now, m.cfg.margin)
	step = follow.Returned(step, *ap, next, cur, now, v.evenHold(time.Now()))
	next.At, next.Switched = step.From, step.Switched
	from, err := follow.Move(lim, step, next)
	if err != nil {
		if !errors.Is(err, limiter.ErrClosed) {
			m.log.Error("cannot apply share", "share", next.Quota, "window", next.Window, "err", err)
		}
		return false
	}
	newGen := next.Generation != ap.Generation
	// What the acknowledgement says: from when this generation governs
	// whole windows, which is later than its boundary when it came late
	// or changed the window length. A later change within the generation
	// (a clock cut) does not move it: the generation's share bounds both.
	next.InForce = ap.InForce
	if newGen {
		next.InForce = from.UnixNano()
	}
	*ap = next
	if next.Source == follow.SourceShares && next.Generation != 0 {
		m.enforced = next.Generation
		if r := v.share; r != nil && r.Generation == next.Generation {
			e := *r
			e.Share = fv.Shares.Share // 0 for a record from before this process registered
			m.enforcedShare = &e
		}
	}
	m.log.Info("share applied", "share", next.Quota, "window", next.Window, "source", next.Source,
		"generation", next.Generation, "from", time.Unix(0, next.At).UTC().Format(time.RFC3339Nano),
		"in_force", from.UTC().Format(time.RFC3339Nano))
	m.setStatus(func(s *Status) {
		s.Source, s.Share, s.Window, s.Generation = next.Source, next.Quota, next.Window, next.Generation
		s.Instances = 0
		if next.Source == follow.SourceEven {
			s.Instances = int(v.even.Count())
		}
		if v.config != nil {
			s.Total = v.config.Limit
		}
	})
	return newGen && next.Generation != 0
}

// settled is follow.Applied.Settled for the share record in v, on the
// limiter's clock: twice the clock bound past the later of when this
// process registered and when it saw the config the record was computed
// under (0: either is not known yet).
func (m *Member) settled(v *view, c *schema.ProviderConfig) int64 {
	r := v.share
	if r == nil || m.registered == 0 || v.configAt.IsZero() || v.configRev < r.ConfigRevision {
		return 0
	}
	seen := v.configAt
	if m.registeredAt.After(seen) {
		seen = m.registeredAt
	}
	return m.lim.Now().Add(-time.Since(seen) + 2*c.ClockBound()).UnixNano()
}
