package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-go/sluice/internal/follow"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// reporter holds what the last record write said, to write again only on a
// meaningful change.
type reporter struct {
	started   time.Time
	lastAsked int64
	lastAt    time.Time
	demand    float64
	// classAsked and classDemand are lastAsked and demand by priority
	// class, for the classes the Member gave its limiter.
	classAsked  map[string]int64
	classDemand map[string]float64
	// failStatic is the fail_static the limiter's expiry counts with now,
	// reported so that configd holds a lapsed share at least as long.
	failStatic time.Duration
	written    schema.InstanceRecord
	wroteAt    time.Time
	haveWrite  bool
	// pushbackAt and endAt are when news of a pushback and of the end of
	// the provider's window were last written (following.news).
	pushbackAt, endAt time.Time
}

// report writes the instance record when something changed meaningfully —
// the applied generation, demand by more than 2% (and one permit), the clock
// offset by a millisecond, the fail_static the expiry counts with — or when
// it has not been written for ten report
// intervals; force writes it regardless. Traffic stays flat whatever the
// request rate: at most one small write per interval, and three more for
// the provider's news (news: the demand is not sampled, since the
// smoothing weighs each sample as a whole interval).
func (m *Member) report(ctx context.Context, lease clientv3.LeaseID, ap *applied, rep *reporter, force, news bool) error {
	now := time.Now()
	st := m.lim.Stats()
	if asked := st.Admitted + st.Rejected + st.TimedOut + st.Canceled; !news || rep.lastAt.IsZero() {
		if !rep.lastAt.IsZero() {
			elapsed := now.Sub(rep.lastAt)
			w := ap.Window
			if w <= 0 {
				w = m.cfg.fallbackWindow
			}
			if elapsed > 0 {
				perWindow := float64(asked-rep.lastAsked) * float64(w) / float64(elapsed)
				// Smoothed, with the queue that waits added, so a backlog
				// weighs even when admissions are capped at the share.
				rep.demand = follow.Smooth(rep.demand, perWindow)
				m.sampleClasses(rep, st.Classes, float64(w)/float64(elapsed))
			}
		}
		rep.lastAsked, rep.lastAt = asked, now
		rep.classAsked = classAsked(st.Classes, m.hasClasses())
	}
	demand := int64(math.Round(rep.demand)) + st.WaitingPermits
	m.setStatus(func(s *Status) { s.Demand = demand })

	host, _ := os.Hostname()
	rec := schema.InstanceRecord{
		Version:           1,
		ID:                m.id,
		Host:              host,
		PID:               os.Getpid(),
		Started:           rep.started.UTC(),
		Updated:           now.UTC(),
		Demand:            demand,
		Admitted:          st.Admitted,
		ClockOffset:       schema.Duration(m.lim.ClockOffset()),
		ClockKnown:        m.cfg.clock != nil && m.cfg.clock.Current().Known,
		AppliedGeneration: ap.Generation,
		AppliedFrom:       ap.InForce,
		FailStatic:        schema.Duration(rep.failStatic),
		Source:            ap.Source,
		Enforced:          ap.Quota,
		ClockUncertainty:  schema.Duration(st.ClockUncertainty),
		ReadsCommon:       true,
		ReadsUnmoved:      true,
		Pushbacks:         st.Pushbacks,
		Remaining:         st.ProviderRemaining,
		Holder:            m.holder,
		StandsIn:          m.holder != "" && !m.noStandIn,
		ClassDemand:       classDemand(rep, st.Classes),
		ClassAdmitted:     classAdmitted(st.Classes, m.hasClasses()),
	}
	if !st.RetryUntil.IsZero() {
		rec.RetryUntil = st.RetryUntil.UTC()
	}
	if !st.ProviderWindowEnd.IsZero() {
		rec.RemainingAt = st.ProviderWindowEnd.UTC()
	}
	if !force && rep.haveWrite && !follow.Due(written(rep.written), written(rec), now.Sub(rep.wroteAt), m.cfg.report) &&
		!classDemandMoved(rep.written.ClassDemand, rec.ClassDemand) {
		return nil
	}
	b, err := schema.Encode(rec)
	if err != nil {
		return fmt.Errorf("encode instance record: %w", err)
	}
	octx, cancel := m.opCtx(ctx)
	defer cancel()
	put := clientv3.OpPut(m.keys.Instance(m.provider, m.id), string(b), clientv3.WithLease(lease))
	var rev int64
	if !rep.haveWrite {
		// The key is created: with no configd alive, together with the
		// even-split confirmation, so that the others never count this
		// instance as live and unconfirmed (which would keep them at
		// their grants for a hold; follow.Even, rule 1). It enforces nothing
		// yet, which the split allows for.
		rev, err = m.register(octx, lease, put)
	} else {
		var resp clientv3.OpResponse
		if resp, err = m.cli.Do(octx, put); err == nil {
			rev = resp.Put().Header.Revision
		}
	}
	if err != nil {
		if rep.haveWrite && onlyProgress(rep.written, rec) && slow(err) {
			return fmt.Errorf("write instance record: %w: %w", errLate, err)
		}
		return fmt.Errorf("write instance record: %w", err)
	}
	if m.registered == 0 {
		// When the write has landed, not when it was sent: a newcomer's
		// hold (follow.Even, rule 4) must not start before the others
		// can count it. Taken before the write, a registration that took
		// a while to reach etcd counted its hold from before another
		// instance's last poll, which had not seen it.
		m.registered, m.registeredAt = rev, time.Now()
	}
	rep.written, rep.wroteAt, rep.haveWrite = rec, now, true
	return nil
}

// register writes put, the first instance record on lease, and with it
// this instance's even-split confirmation if the provider's config exists
// and no key is under configd's election prefix. It returns the revision.
func (m *Member) register(ctx context.Context, lease clientv3.LeaseID, put clientv3.Op) (int64, error) {
	noConfigd := clientv3.Compare(clientv3.CreateRevision(m.keys.Election()+"/"), "=", 0).WithPrefix()
	configured := clientv3.Compare(clientv3.CreateRevision(m.keys.Config(m.provider)), ">", 0)
	mark := clientv3.OpPut(m.keys.EvenMark(m.provider, m.id), "", clientv3.WithLease(lease))
	// With configd alive, a confirmation left by an earlier session of
	// this id (on a lease that lives on after the session ended on an
	// error) goes: it would count this instance as following the split
	// while it follows configd's shares, and once configd is gone again
	// with this instance cut off, the others would take its room.
	stale := clientv3.OpDelete(m.keys.EvenMark(m.provider, m.id))
	resp, err := m.cli.Txn(ctx).If(noConfigd, configured).Then(put, mark).Else(put, stale).Commit()
	if errors.Is(err, rpctypes.ErrPermissionDenied) {
		// A role from before confirmations (docs/security.md gives the
		// prefix to grant): register without; the even split then holds
		// the others at their grants.
		m.warnNoMarks()
		r, err := m.cli.Do(ctx, put)
		if err != nil {
			return 0, err
		}
		return r.Put().Header.Revision, nil
	}
	if err != nil {
		return 0, err
	}
	m.evenMarked = resp.Succeeded
	return resp.Header.Revision, nil
}

// onlyProgress reports whether rec, the instance record to write, differs
// from prev, the last one written, only in what says how far the instance
// got (its demand, admissions, the generation it applied, from when, what
// it enforces): nothing configd bounds a grant or a hold by (the source,
// fail_static, the clock).
func onlyProgress(prev, rec schema.InstanceRecord) bool {
	prev.Updated, prev.Demand, prev.Admitted, prev.AppliedGeneration, prev.AppliedFrom, prev.Enforced =
		rec.Updated, rec.Demand, rec.Admitted, rec.AppliedGeneration, rec.AppliedFrom, rec.Enforced
	prev.Pushbacks, prev.RetryUntil, prev.Remaining, prev.RemainingAt =
		rec.Pushbacks, rec.RetryUntil, rec.Remaining, rec.RemainingAt
	prev.ClassDemand, prev.ClassAdmitted = rec.ClassDemand, rec.ClassAdmitted
	return reflect.DeepEqual(prev, rec)
}

// classAsked returns what each class asked for so far (admitted, refused
// and canceled permits), by name; nil unless on: the Member reports the
// demand of the provider's classes only.
func classAsked(cs []limiter.ClassStats, on bool) map[string]int64 {
	if !on || len(cs) == 0 {
		return nil
	}
	out := make(map[string]int64, len(cs))
	for _, c := range cs {
		out[c.Name] = c.Admitted + c.Refused + c.Canceled
	}
	return out
}

// classAdmitted is the record's ClassAdmitted: each class's running total
// of admissions, by name; nil unless on, as classAsked.
func classAdmitted(cs []limiter.ClassStats, on bool) map[string]int64 {
	if !on || len(cs) == 0 {
		return nil
	}
	out := make(map[string]int64, len(cs))
	for _, c := range cs {
		out[c.Name] = min(c.Admitted, schema.MaxLimit)
	}
	return out
}

// sampleClasses smooths each class's demand as report does the total:
// scale turns what a class asked since the last sample into permits per
// window. A class not in the last sample starts from its next one.
func (m *Member) sampleClasses(rep *reporter, cs []limiter.ClassStats, scale float64) {
	asked := classAsked(cs, m.hasClasses())
	if asked == nil {
		rep.classDemand = nil
		return
	}
	next := make(map[string]float64, len(asked))
	for name, n := range asked {
		last, ok := rep.classAsked[name]
		if !ok || n < last {
			continue // new, or its counters restarted
		}
		next[name] = follow.Smooth(rep.classDemand[name], float64(n-last)*scale)
	}
	rep.classDemand = next
}

// classDemand is the record's ClassDemand: each class's smoothed demand
// with its waiters' permits added, as Demand has; nil when the Member
// reports no classes.
func classDemand(rep *reporter, cs []limiter.ClassStats) map[string]int64 {
	if rep.classAsked == nil {
		return nil
	}
	out := make(map[string]int64, len(cs))
	for _, c := range cs {
		if _, ok := rep.classAsked[c.Name]; ok {
			out[c.Name] = min(int64(math.Round(rep.classDemand[c.Name]))+c.WaitingPermits, schema.MaxLimit)
		}
	}
	return out
}

// classDemandMoved reports whether a class's demand moved as much as
// follow.Meaningful asks of the total's (more than 2% and more than one
// permit), or the classes changed: configd's allocation by class needs
// it as soon as the total's.
func classDemandMoved(old, cur map[string]int64) bool {
	if len(old) != len(cur) {
		return true
	}
	for name, d := range cur {
		o, ok := old[name]
		if !ok {
			return true
		}
		dd := d - o
		if dd < 0 {
			dd = -dd
		}
		if dd > 1 && float64(dd) > 0.02*float64(max(o, 1)) {
			return true
		}
	}
	return false
}

// slow reports whether err is etcd not answering in time (the request may
// yet land): not a refusal, nor etcd out of reach.
func slow(err error) bool {
	return status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, rpctypes.ErrTimeout) || errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail)
}

// written is what of rec decides whether it is written again.
func written(rec schema.InstanceRecord) follow.Record {
	return follow.Record{
		Demand:       rec.Demand,
		Generation:   rec.AppliedGeneration,
		ClockOffset:  time.Duration(rec.ClockOffset),
		ClockKnown:   rec.ClockKnown,
		FailStatic:   time.Duration(rec.FailStatic),
		Source:       rec.Source,
		Enforced:     rec.Enforced,
		Pushbacks:    rec.Pushbacks,
		Remaining:    rec.Remaining,
		RemainingEnd: remainingEnd(rec),
	}
}

// remainingEnd is the end of the provider window rec's remaining is of, in
// Unix ns; 0: none.
func remainingEnd(rec schema.InstanceRecord) int64 {
	if rec.RemainingAt.IsZero() {
		return 0
	}
	return rec.RemainingAt.UnixNano()
}
