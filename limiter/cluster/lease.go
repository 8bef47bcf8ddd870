package cluster

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/follow"
	"github.com/sluice-go/sluice/internal/schema"
)

// keepAlive renews the lease, which cannot expire before end, every third
// of its TTL until ctx ends, and sends on renewed, after each renewal, the
// new time before which the lease cannot expire: when the request was sent plus the TTL etcd granted (a
// response read late, by a process stopped and woken, counts from when its
// request left). A failed renewal is tried again at the next tick; the
// lease is given up as lost when etcd says it is gone, or when its end
// passes without a renewal.
func (m *Member) keepAlive(ctx context.Context, lease clientv3.LeaseID, end time.Time, renewed chan time.Time) error {
	tick := time.NewTicker(max(m.cfg.leaseTTL/3, 100*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		sent := time.Now() // monotonic, as end is
		if !sent.Before(end) {
			return errLeaseLost
		}
		octx, cancel := context.WithTimeout(ctx, min(m.cfg.opTimeout, end.Sub(sent)))
		resp, err := m.cli.KeepAliveOnce(octx, lease)
		cancel()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && resp.TTL <= 0):
			return errLeaseLost
		case err != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			m.log.Debug("lease renewal failed; trying again", "err", err)
			continue
		}
		end = sent.Add(time.Duration(resp.TTL) * time.Second)
		select {
		case <-renewed: // drop the unread older end
		default:
		}
		renewed <- end // the only sender: the slot is free
	}
}

// arm sets when the limiter stops admitting unless the lease is renewed
// first. Under configd's shares: the provider's fail_static past the
// lease's end, as long as configd keeps an expired instance's share
// reserved, so that an instance cut off from etcd (or stopped and woken)
// never enforces a share configd has handed to others. Under the even
// split: the lease's end, since the others grow as soon as its key goes,
// or sooner, follow.CountsValid and the fail_static past the last count read
// sent, since a newcomer it has not counted grows a hold after it
// registers.
// On the fallback: never (nobody hands it out).
//
// leaseEnd is on the monotonic clock; the expiry is set in the limiter's
// corrected time as that same instant, so that a clock correction between
// renewals never moves it (the limiter itself moves it with a correction).
func (m *Member) arm(v *view, ap *applied, leaseEnd time.Time) (failStatic time.Duration) {
	// Read and set on one clock: a Group's other Members move it.
	m.clk.mu.Lock()
	defer m.clk.mu.Unlock()
	var until time.Time
	switch {
	case ap.Source == follow.SourceShares && v.config != nil:
		failStatic = v.config.FailStaticOrDefault()
		until = m.lim.Now().Add(time.Until(leaseEnd) + failStatic)
	case ap.Source == follow.SourceEven:
		// No longer than the lease, nor than CountsValid and fail_static past
		// the last count read sent: a newcomer that registered after it
		// is one this instance has not counted, and it grows only a hold
		// after registering; else, with a lease of 10 s, a cut-off
		// instance would keep the whole limit beside a newcomer's half.
		// Re-armed by every poll.
		end := leaseEnd
		if v.config != nil {
			if byPoll := v.polledAt.Add(follow.CountsValid + v.config.FailStaticOrDefault()); byPoll.Before(end) {
				end = byPoll
			}
		}
		until = m.lim.Now().Add(time.Until(end))
	}
	m.lim.SetExpiry(until)
	m.setStatus(func(s *Status) { s.AdmitsUntil = until })
	return failStatic
}

// leave is the graceful end of a session: the limiter stops admitting, and
// the record says the instance is leaving, so that configd hands its share
// to the others at once when the lease is revoked instead of keeping it
// reserved for the provider's fail_static. Best effort: without it the
// share is only handed on later.
func (m *Member) leave(lease clientv3.LeaseID, rep *reporter) {
	m.lim.Close()
	if !rep.haveWrite {
		return
	}
	rec := rep.written
	rec.Leaving, rec.Updated = true, time.Now().UTC()
	b, err := schema.Encode(rec)
	if err != nil {
		return
	}
	// Bounded like every etcd operation: Close must return, and a loaded
	// etcd answers a write in well under it.
	ctx, cancel := m.opCtx(context.Background())
	defer cancel()
	if _, err := m.cli.Put(ctx, m.keys.Instance(m.provider, m.id), string(b), clientv3.WithLease(lease)); err != nil {
		m.log.Warn("could not say the instance is leaving; configd keeps its share reserved for the provider's fail_static", "err", err)
	}
}
