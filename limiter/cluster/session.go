package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/follow"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

var errLeaseLost = errors.New("cluster: lease keep-alive ended")

// errLate: a write of the instance record that changed only how far the
// instance got (report) was not answered in time.
var errLate = errors.New("cluster: instance record not written in time")

// run owns the Member's state: it runs sessions with etcd until Close,
// waiting with capped, jittered backoff between them.
func (m *Member) run(ctx context.Context) {
	defer close(m.done)
	if mon := m.cfg.clock; mon != nil {
		var wg sync.WaitGroup
		wg.Go(func() { mon.Run(ctx) })
		defer wg.Wait()
	}
	if m.cfg.budget > 0 {
		m.followBudget(ctx)
		return
	}
	v := newView()
	// What New gave the limiter: the fallback.
	ap := applied{Source: follow.SourceFallback, Quota: m.cfg.fallbackQuota, Window: m.cfg.fallbackWindow}
	rep := &reporter{started: time.Now()}
	backoff := 100 * time.Millisecond
	connected := false
	for {
		start := time.Now()
		err := m.session(ctx, v, &ap, rep, &connected)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errLedger) {
			if !m.followLedger(ctx, *v.config) {
				return
			}
			// The provider was created again, coordinated by the shares,
			// which configd allows only once every grant of its ledger
			// ended: start over as a joining instance does, with nothing.
			v, ap = newView(), m.leftLedger()
			continue
		}
		if connected {
			connected = false
			m.log.Warn("etcd unreachable; keeping the last share (fail-static)", "err", err, "share", ap.Quota,
				"admits_until", m.Status().AdmitsUntil)
		}
		m.setStatus(func(s *Status) { s.Connected, s.LastError = false, err.Error() })
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (m *Member) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, m.cfg.opTimeout)
}

// session registers with a fresh lease, loads the provider and follows it
// until etcd fails or ctx ends; on ctx's end it says it is leaving and
// revokes the lease. A session that ends for any other reason leaves its
// lease to expire: revoking it would let the share go to others before
// the limiter's expiry, which counts from the lease's end.
func (m *Member) session(ctx context.Context, v *view, ap *applied, rep *reporter, connected *bool) error {
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel: deferred calls run last in, first out
	defer cancel()

	s, err := m.grant(sctx, v, ap, rep)
	if err != nil {
		return err
	}
	defer func() {
		if ctx.Err() != nil {
			s.leave()
		}
	}()
	s.startOver()
	if err := m.report(sctx, s.lease, ap, rep, true, false); err != nil {
		return err
	}
	// The latest lease end, never blocking the keep-alive loop: a renewal
	// replaces one the main loop has not read yet.
	renewed := make(chan time.Time, 1)
	kaDone := make(chan error, 1)
	wg.Go(func() { kaDone <- m.keepAlive(sctx, s.lease, s.leaseEnd, renewed) })

	rev, err := s.load(sctx)
	if err != nil {
		return err
	}
	m.connected(connected, s)
	if m.toLedger {
		return s.toLedger()
	}
	// Its config, its own share record, and the leader keys: nothing of
	// the other instances.
	s.w = m.watch(sctx, rev)
	defer func() { s.w.stop() }()
	tick := time.NewTicker(m.cfg.report)
	defer tick.Stop()
	news := m.lim.ProviderNews()
	// The even split's counts are polled at least every follow.MaxPoll,
	// whatever the report interval: the others' holds count on it.
	var poll <-chan time.Time
	if every := follow.PollEvery(m.cfg.report); every < m.cfg.report {
		pt := time.NewTicker(every)
		defer pt.Stop()
		poll = pt.C
	}
	for {
		var err error
		select {
		case <-ctx.Done():
			return ctx.Err() // the deferred call leaves
		case s.leaseEnd = <-renewed:
			rep.failStatic = m.arm(v, ap, s.leaseEnd)
		case err = <-kaDone:
			return err
		case wr, ok := <-s.w.config:
			err = s.keyEvents(sctx, wr, ok, "config")
		case wr, ok := <-s.w.share:
			err = s.shareEvents(sctx, wr, ok, "share record")
		case wr, ok := <-s.w.common:
			err = s.shareEvents(sctx, wr, ok, "common share record")
		case wr, ok := <-s.w.leader:
			err = s.leaderEvents(sctx, wr, ok)
		case <-tick.C:
			err = s.tick(sctx)
		case <-news:
			err = s.news(sctx)
		case <-poll:
			if err = s.m.pollEven(sctx, s.v); err == nil {
				s.applyView()
			}
		}
		if err != nil {
			return err
		}
		if m.toLedger {
			return s.toLedger()
		}
	}
}

// following is one session's state: the lease it registered with and the
// watches it follows the provider through, beside the Member's view of
// the provider, what it applied and what it last reported, which outlive
// the session. Only the run goroutine touches it.
type following struct {
	m        *Member
	v        *view
	ap       *applied
	rep      *reporter
	lease    clientv3.LeaseID
	leaseEnd time.Time // on the monotonic clock: it bounds safety
	w        watches
}

// grant starts a session with a fresh lease.
func (m *Member) grant(ctx context.Context, v *view, ap *applied, rep *reporter) (*following, error) {
	octx, cancel := m.opCtx(ctx)
	sent := time.Now()
	lease, err := m.cli.Grant(octx, int64(math.Ceil(m.cfg.leaseTTL.Seconds())))
	cancel()
	if err != nil {
		return nil, fmt.Errorf("grant lease: %w", err)
	}
	// The lease cannot expire before leaseEnd: etcd counts its TTL from
	// when it received the request, which is after it was sent. A
	// duration that bounds safety: on the monotonic clock (time.Now's
	// reading), never on the corrected one, which NTP moves.
	leaseEnd := sent.Add(time.Duration(lease.TTL) * time.Second)
	return &following{m: m, v: v, ap: ap, rep: rep, lease: lease.ID, leaseEnd: leaseEnd}, nil
}

// leave is the end of a session on Close: stop admitting, say so, and
// leave at once rather than after the TTL. Best effort: etcd may be
// unreachable.
func (s *following) leave() {
	s.m.leave(s.lease, s.rep)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	s.m.cli.Revoke(ctx, s.lease)
	cancel()
}

// startOver drops a share that lapsed before this session, and forgets
// what the last session wrote and confirmed: both were on its lease.
func (s *following) startOver() {
	m, ap := s.m, s.ap
	if exp := m.lim.Expiry(); !exp.IsZero() && !m.lim.Now().Before(exp) {
		// The last share lapsed (the horizon passed before this lease):
		// configd may have handed it on since. Start from nothing, as a
		// joining instance does, so that no window before the shares
		// found now take effect admits the old share when the expiry
		// moves on (see follow.Schedule: a new source grows only from a
		// boundary ahead). At the length in force, dropping any change of
		// length still pending: at that length, the windows under way up
		// to the change would keep the old share (see follow.Move).
		if err := m.lim.SetQuota(0, time.Time{}); err != nil && !errors.Is(err, limiter.ErrClosed) {
			m.log.Error("cannot drop the lapsed share", "err", err)
		}
		*ap = applied{Source: follow.SourceLapsed, Window: ap.Window, Switched: ap.Switched}
		// And register as a new process: the others may have grown into
		// its room since its key went (configd, or the even split after
		// a hold), and count it again only at their next poll. A share
		// record from before gives it nothing, and the even split makes
		// it wait a hold (follow.Even, rule 4). Keeping the first
		// registration let its old grant cap the even split at once,
		// beside another instance still on the whole limit (found by
		// review: 60 in a window of 40).
		m.registered, m.registeredAt = 0, time.Time{}
		// Nor does what it counted before its key went count now: the
		// split starts again from this session's polls.
		s.v.even.Reset()
		m.log.Warn("the last share lapsed while etcd was out of reach; starting from nothing", "expired", exp.UTC())
	}
	s.rep.haveWrite = false
	m.evenMarked = false // a confirmation is on the lease of the session that wrote it
}

// load reads the provider's keys this instance follows, applies them, and
// returns the revision to watch from.
func (s *following) load(ctx context.Context) (int64, error) {
	rev, err := s.m.load(ctx, s.v)
	if err != nil {
		return 0, err
	}
	if err := s.follow(ctx); err != nil {
		return 0, err
	}
	return rev, s.m.confirmEven(ctx, s.v, s.lease)
}

// follow applies the view, moves the limiter's expiry with it, and
// acknowledges at once a new shares generation applied.
func (s *following) follow(ctx context.Context) error {
	if !s.applyView() {
		return nil
	}
	return s.report(ctx, true)
}

// applyView applies the view and moves the limiter's expiry with it, and
// reports whether a new shares generation was applied.
func (s *following) applyView() bool {
	acked := s.m.apply(s.v, s.ap)
	s.rep.failStatic = s.m.arm(s.v, s.ap, s.leaseEnd)
	return acked
}

// report writes the instance record (Member.report). A write that
// changed only how far the instance got and that etcd did not answer in
// time ends the session only if etcd does not renew the lease either:
// configd allows for an acknowledgement or a demand that comes late, and
// the next report writes it again (follow.Due still sees the
// difference). Ending the session made every instance register again on
// a new lease and read everything anew at once when etcd was slow for all
// of them: at a retune of 2,000 instances on 2 cores, 1,406 timed out
// together (BENCHMARKS.md, section 12). With etcd gone the renewal fails
// too, by the lease's end at the latest, and the Member says at once that
// it is disconnected.
func (s *following) report(ctx context.Context, force bool) error {
	return s.write(ctx, force, false)
}

// news writes the instance record when the provider's answers brought
// news (Limiter.ProviderNews), so that configd's controller hears of a
// pushback within its round rather than a report interval later, and of
// a window's remaining as the next window begins. Each kind at most so
// often, so traffic stays flat whatever the provider says: a pushback once
// per report interval (the controller needs the first; the count
// carries the rest), the end of a window twice (a pause for Retry-After
// can delay one window's end until just before the next's). News that
// comes sooner waits for the next report.
func (s *following) news(ctx context.Context) error {
	if !s.rep.haveWrite {
		return nil // the report writes it first
	}
	now, st, every := time.Now(), s.m.lim.Stats(), s.m.cfg.report
	pushback := st.Pushbacks != s.rep.written.Pushbacks && now.Sub(s.rep.pushbackAt) >= every
	ended := !st.ProviderWindowEnd.IsZero() && !st.ProviderWindowEnd.Equal(s.rep.written.RemainingAt) && now.Sub(s.rep.endAt) >= every/2
	if !pushback && !ended {
		return nil
	}
	if pushback {
		s.rep.pushbackAt = now
	}
	if ended {
		s.rep.endAt = now
	}
	return s.write(ctx, false, true)
}

// write is report, or news when news is set.
func (s *following) write(ctx context.Context, force, news bool) error {
	err := s.m.report(ctx, s.lease, s.ap, s.rep, force, news)
	if !errors.Is(err, errLate) || !s.renews(ctx) {
		return err
	}
	s.m.log.Warn("instance record not written in time; etcd renews the lease, so writing it again at the next report", "err", err)
	return nil
}

// renews reports whether etcd renews the session's lease now, before its
// end.
func (s *following) renews(ctx context.Context) bool {
	sent := time.Now() // monotonic, as leaseEnd is
	if !sent.Before(s.leaseEnd) {
		return false
	}
	octx, cancel := context.WithTimeout(ctx, min(s.m.cfg.opTimeout, s.leaseEnd.Sub(sent)))
	defer cancel()
	resp, err := s.m.cli.KeepAliveOnce(octx, s.lease)
	return err == nil && resp.TTL > 0
}

// connected says the session is up: in the status, once in the log, and
// to Join, which waits for the first.
func (m *Member) connected(was *bool, s *following) {
	if !*was {
		*was = true
		m.log.Info("connected to etcd", "lease", fmt.Sprintf("%x", s.lease), "share", s.ap.Quota, "source", s.ap.Source)
	}
	m.setStatus(func(st *Status) { st.Connected, st.LastError = true, "" })
	select {
	case <-m.ready:
	default:
		close(m.ready)
	}
}

// keyEvents folds in the events of the config's or the share record's
// watch, acknowledging a new generation at once.
func (s *following) keyEvents(ctx context.Context, wr clientv3.WatchResponse, ok bool, what string) error {
	if ended, err := s.ended(ctx, wr, ok, what); ended || err != nil {
		return err
	}
	acked := s.m.observeAll(s.v, wr, s.applyView)
	// A config that appears, goes, or becomes readable (a lane's
	// dimension) changes whether this instance follows the even split:
	// without its confirmation the split never grows past its grant.
	if err := s.m.confirmEven(ctx, s.v, s.lease); err != nil {
		return err
	}
	if acked {
		return s.report(ctx, true)
	}
	return nil
}

// shareEvents folds in the events of the watch of this instance's own
// share record or of the common record. A record of its own that says
// Common, and a change of the common record while it follows it, are
// read again with the other in one snapshot (readShare): the two watches
// deliver independently, and a common record seen before this instance's
// own newer record may be one meant for others.
func (s *following) shareEvents(ctx context.Context, wr clientv3.WatchResponse, ok bool, what string) error {
	if ended, err := s.ended(ctx, wr, ok, what); ended || err != nil {
		return err
	}
	acked := false
	for _, ev := range wr.Events {
		changed, err := s.m.shareEvent(ctx, s.v, ev)
		if err != nil {
			return err
		}
		if changed {
			acked = s.applyView() || acked
		}
	}
	if acked {
		return s.report(ctx, true)
	}
	return nil
}

// shareEvent folds into the view one event of the watch of this
// instance's own share record or of the common record, and reports
// whether it may have changed the view.
func (m *Member) shareEvent(ctx context.Context, v *view, ev *clientv3.Event) (bool, error) {
	if ev.Kv.ModRevision <= v.shareSeen {
		return false, nil // in the last snapshot read
	}
	switch {
	case string(ev.Kv.Key) != m.keys.Share(m.provider, m.id):
		if !v.pointer {
			return false, nil // the common record, which this instance does not follow
		}
		if c, err := schema.DecodeShareRecord(ev.Kv.Value); err == nil && ev.Type == clientv3.EventTypePut && c.Unmoved && v.own != nil {
			// configd wrote no record but pointers since the common record
			// before this one, which this instance resolved its own with
			// (the common watch delivers every write of the key in order,
			// from the snapshot it read on): its own record at this
			// revision is the one it has, or a pointer its own watch has
			// yet to bring (which it then reads). One read per instance
			// per retune, all at once, took 2,000 instances on 2 cores
			// past the retune's boundary (BENCHMARKS.md, section 12).
			m.observeShare(v, []*mvccpb.KeyValue{v.own}, []*mvccpb.KeyValue{ev.Kv}, 0)
			v.followed = max(v.followed, ev.Kv.ModRevision)
			return true, nil
		}
		return true, m.readShare(ctx, v, ev.Kv.ModRevision)
	case ev.Type == clientv3.EventTypeDelete:
		m.observeShare(v, nil, nil, 0)
	default:
		if r, err := schema.DecodeShareRecord(ev.Kv.Value); err == nil && r.Common {
			return true, m.readShare(ctx, v, ev.Kv.ModRevision)
		}
		m.observeShare(v, []*mvccpb.KeyValue{ev.Kv}, nil, 0)
	}
	return true, nil
}

// leaderEvents folds in the election's keys: a configd replica alive
// or not decides between the shares and the even split.
func (s *following) leaderEvents(ctx context.Context, wr clientv3.WatchResponse, ok bool) error {
	if ended, err := s.ended(ctx, wr, ok, "configd leader"); ended || err != nil {
		return err
	}
	m, v := s.m, s.v
	for _, ev := range wr.Events {
		if err := m.leaderKey(ctx, v, ev.Kv, ev.Type == clientv3.EventTypeDelete); err != nil {
			return err
		}
	}
	if len(v.leaders) > 0 {
		v.even.Reset()
		v.polledAt = time.Time{}
	} else if err := m.pollEven(ctx, v); err != nil {
		return err // counted at once: the even split's expiry runs from the read
	}
	if err := m.confirmEven(ctx, v, s.lease); err != nil {
		return err
	}
	return s.follow(ctx)
}

// tick is the report interval's work: the even split's counts, the clock
// measurement and the counts applied, and the instance record written if
// something in it moved.
func (s *following) tick(ctx context.Context) error {
	if err := s.m.pollEven(ctx, s.v); err != nil {
		return err
	}
	s.applyView()
	return s.report(ctx, false)
}

// ended reports whether wr ended its watch; where reading the keys again
// is enough (reload) the session goes on, else the error ends it.
func (s *following) ended(ctx context.Context, wr clientv3.WatchResponse, ok bool, what string) (bool, error) {
	if err := watchErr(wr, ok, what); err != nil {
		return true, s.reload(ctx, err)
	}
	return false, nil
}

// reload reads the three keys again and watches from there, keeping the
// lease, after a watch ended on a compaction (etcd no longer has the
// revision it would resume from): after a jitter of up to a report
// interval or a second, so that a fleet does not read all at once. Any
// other end of a watch ends the session: etcd or the leader is gone.
func (s *following) reload(ctx context.Context, err error) error {
	if !errors.Is(err, rpctypes.ErrCompacted) {
		return err
	}
	m := s.m
	s.w.stop()
	m.log.Warn("watch behind etcd's compaction; reading this instance's keys again", "err", err)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(rand.N(min(m.cfg.report, time.Second))):
	}
	rev, err := s.load(ctx)
	if err != nil {
		return err
	}
	s.w = m.watch(ctx, rev)
	return nil
}

// load reads the config, this instance's share record, the leader keys and
// (with no leader) the counts of the even split, in one transaction whose
// revision the watches start from.
func (m *Member) load(ctx context.Context, v *view) (int64, error) {
	sent := time.Now()
	octx, cancel := m.opCtx(ctx)
	resp, err := m.cli.Txn(octx).Then(
		clientv3.OpGet(m.keys.Config(m.provider)),
		clientv3.OpGet(m.keys.Share(m.provider, m.id)),
		clientv3.OpGet(m.keys.CommonShare(m.provider)),
		// With values: a replica's ID says the key may be a replica's.
		clientv3.OpGet(m.keys.Election()+"/", clientv3.WithPrefix()),
		clientv3.OpGet(m.keys.Instances(m.provider), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(m.keys.Even(m.provider), clientv3.WithPrefix(), clientv3.WithCountOnly()),
	).Commit()
	cancel()
	if err != nil {
		return 0, fmt.Errorf("load provider %s: %w", m.provider, err)
	}
	if v.config != nil {
		v.lastConfig = v.config
	}
	// What this read saw is all there is: an etcd restored from a backup
	// counts revisions from lower down.
	v.config, v.share, v.refused, v.pointer, v.shareSeen, v.own, v.followed = nil, nil, nil, false, 0, nil, 0
	clear(v.leaders)
	// Every record is read again: a key deleted while etcd was out of
	// reach takes its problem with it.
	clear(v.problems)
	rs := resp.Responses
	for _, kv := range rs[0].GetResponseRange().Kvs {
		m.observe(v, string(kv.Key), kv.Value, false, kv.ModRevision)
	}
	m.observeShare(v, rs[1].GetResponseRange().Kvs, rs[2].GetResponseRange().Kvs, resp.Header.Revision)
	for _, kv := range rs[3].GetResponseRange().Kvs {
		if err := m.leaderKey(ctx, v, kv, false); err != nil {
			return 0, err
		}
	}
	v.polledAt = time.Time{}
	if len(v.leaders) == 0 {
		v.even.Observe(time.Now(), rs[4].GetResponseRange().Count, rs[5].GetResponseRange().Count, v.evenHold(time.Now()))
		v.polledAt = sent
	}
	m.listProblems(v)
	return resp.Header.Revision, nil
}

// readShare reads this instance's own share record and the provider's
// common record in one snapshot, at revision at or later, and folds them
// into the view: the common record resolves a record that says Common
// only as it was at the same revision (schema.ShareRecord.Resolve). One
// read per instance per change of the common record, by the instances
// that follow it, all at once: a serializable read, which the etcd
// member the client talks to serves from its own store (a linearizable
// one from each of 2,000 instances, with their acknowledgements, held
// etcd up long enough on 2 cores for instances' writes to time out). A
// snapshot older than at, from a member behind the one that sent the
// event, is read again from the leader: the instance must not go back
// to records older than it followed.
func (m *Member) readShare(ctx context.Context, v *view, at int64) error {
	at = max(at, v.followed) // never from before a common record followed
	for _, opts := range [][]clientv3.OpOption{{clientv3.WithSerializable()}, nil} {
		octx, cancel := m.opCtx(ctx)
		resp, err := m.cli.Txn(octx).Then(
			clientv3.OpGet(m.keys.Share(m.provider, m.id), opts...),
			clientv3.OpGet(m.keys.CommonShare(m.provider), opts...),
		).Commit()
		cancel()
		if err != nil {
			return fmt.Errorf("read share record of %s: %w", m.provider, err)
		}
		if resp.Header.Revision >= at {
			m.observeShare(v, resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs, resp.Header.Revision)
			return nil
		}
	}
	return fmt.Errorf("read share record of %s: etcd's leader answered at revision before %d, which it sent", m.provider, at)
}

// watches are a session's watches, from one revision on: its config, its
// own share record, configd's election; nothing of the other instances.
type watches struct {
	config, share, common, leader clientv3.WatchChan
	stop                          context.CancelFunc
}

// watch starts the session's watches from the revision after rev.
func (m *Member) watch(ctx context.Context, rev int64) watches {
	wctx, cancel := context.WithCancel(ctx)
	rctx := clientv3.WithRequireLeader(wctx)
	return watches{
		config: m.cli.Watch(rctx, m.keys.Config(m.provider), clientv3.WithRev(rev+1)),
		share:  m.cli.Watch(rctx, m.keys.Share(m.provider, m.id), clientv3.WithRev(rev+1)),
		common: m.cli.Watch(rctx, m.keys.CommonShare(m.provider), clientv3.WithRev(rev+1)),
		leader: m.cli.Watch(rctx, m.keys.Election()+"/", clientv3.WithPrefix(), clientv3.WithRev(rev+1)),
		stop:   cancel,
	}
}

// watchErr is the error of a watch response that ends the session: the
// watch closed or failed (compacted, or cancelled).
func watchErr(wr clientv3.WatchResponse, ok bool, what string) error {
	if !ok {
		return fmt.Errorf("watch %s: closed", what)
	}
	if err := wr.Err(); err != nil {
		return fmt.Errorf("watch %s: %w", what, err)
	}
	return nil
}

// observeAll folds a watch response's events into the view, applying after
// each, in order: several generations can arrive in one response, and
// each must be scheduled at its own boundary before it is acknowledged. It
// reports whether any was a new generation to acknowledge.
func (m *Member) observeAll(v *view, wr clientv3.WatchResponse, follow func() bool) bool {
	acked := false
	for _, ev := range wr.Events {
		m.observe(v, string(ev.Kv.Key), ev.Kv.Value, ev.Type == clientv3.EventTypeDelete, ev.Kv.ModRevision)
		acked = follow() || acked
	}
	return acked
}
