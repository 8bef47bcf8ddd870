package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-go/sluice/internal/follow"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

var errLeaseLost = errors.New("cluster: lease keep-alive ended")

// errLate: a write of the instance record that changed only how far the
// instance got (report) was not answered in time.
var errLate = errors.New("cluster: instance record not written in time")

// errLeaseTooLong: a key under configd's election prefix on a lease no
// configd replica's session has.
var errLeaseTooLong = fmt.Errorf("cluster: configd election key's lease was granted for longer than a replica's session (%v at most)", schema.MaxSessionTTL)

// view is what the Member knows of its provider: its config, its own share
// record, whether a configd leader is alive and, for the even split, the
// counts of live and confirmed instances. It reads nothing of the other
// instances' records: what it receives does not grow with the fleet. Only
// the run goroutine touches it.
type view struct {
	config    *schema.ProviderConfig
	configRev int64               // the etcd revision config was written at
	configAt  time.Time           // when (monotonic) this Member first saw configRev
	share     *schema.ShareRecord // this instance's record, resolved; nil: none
	shareRev  int64               // the etcd revision this instance's own key was written at
	// pointer says this instance's own record says Common: it follows the
	// provider's common record, which it reads with its own in one
	// snapshot (readShare), or takes from the watch event alone when the
	// record says Unmoved (shareEvent). shareSeen is the revision of the
	// last such read: the watches' events up to it are in it. own is this
	// instance's own record as last read or received (nil: none).
	pointer   bool
	shareSeen int64
	own       *mvccpb.KeyValue
	// followed is the revision of the last common record taken from its
	// watch event (Unmoved): a read may not answer from before it.
	followed int64
	leaders  map[string]bool
	even     follow.Even
	problems map[string]string // key → why its record was ignored
	// refused is this instance's last share record refused for its
	// config (nil: none), and refusedRev its revision: the config it was
	// computed under may not have arrived yet (another watch), so it is
	// checked again when the config changes.
	refused    *schema.ShareRecord
	refusedRev int64
	refusedAt  int64      // the revision its content was written at (acceptShare)
	replaced   []replaced // see evenHold
	// polledAt is when (monotonic) the last count read that succeeded
	// was sent; zero: none since configd was last seen alive. On the
	// even split the limiter admits no longer than follow.CountsValid and the
	// provider's fail_static past it (arm): a newcomer that registered
	// after it, unseen, waits a hold at least that long.
	polledAt time.Time
	// budget says the provider's config is a budget's, which this Member
	// refused: it admits nothing (apply), fallback or not.
	budget bool
	// lastConfig is the last good config seen, kept across a deletion
	// and a reload, so that a change seen through either is noted
	// (noteReplaced; found by review: a session restarted between the
	// change and the split forgot the old fail_static).
	lastConfig *schema.ProviderConfig
}

func newView() *view {
	return &view{leaders: map[string]bool{}, problems: map[string]string{}}
}

// applied is what the Member last set on its limiter.
type applied = follow.Applied

// reporter holds what the last record write said, to write again only on a
// meaningful change.
type reporter struct {
	started   time.Time
	lastAsked int64
	lastAt    time.Time
	demand    float64
	// failStatic is the fail_static the limiter's expiry counts with now,
	// reported so that configd holds a lapsed share at least as long.
	failStatic time.Duration
	written    schema.InstanceRecord
	wroteAt    time.Time
	haveWrite  bool
}

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
	if err := m.report(sctx, s.lease, ap, rep, true); err != nil {
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
	// Its config, its own share record, and the leader keys: nothing of
	// the other instances.
	s.w = m.watch(sctx, rev)
	defer func() { s.w.stop() }()
	tick := time.NewTicker(m.cfg.report)
	defer tick.Stop()
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
		case <-poll:
			if err = s.m.pollEven(sctx, s.v); err == nil {
				s.applyView()
			}
		}
		if err != nil {
			return err
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
	err := s.m.report(ctx, s.lease, s.ap, s.rep, force)
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
		// after registering (found by review: with a lease of 10 s, a cut
		// off instance kept the whole limit beside a newcomer's half, 60
		// in each of four windows of 40). Re-armed by every poll.
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

// generationJump is how far past the last one a new shares generation may
// be without a warning: configd counts one a publish.
const generationJump = 1 << 20

// observe folds one key's value (or deletion) into the view. A record that
// fails to decode or validate is ignored, logged once and listed in
// Status.Problems; the last good value stays. An instance record is the
// exception: its key alone makes the instance live, malformed or not.
func (m *Member) observe(v *view, key string, value []byte, deleted bool, rev int64) {
	k, err := m.keys.Parse(key)
	if err != nil || k.Provider != m.provider {
		return
	}
	bad := func(err error) {
		if v.problems[key] != err.Error() {
			m.log.Error("ignoring malformed record; keeping the last good value", "key", key, "err", err)
		}
		v.problems[key] = err.Error()
	}
	good := func() { delete(v.problems, key) }
	defer m.listProblems(v)
	switch k.Kind {
	case schema.KindConfig:
		if deleted {
			if v.config != nil {
				v.lastConfig = v.config
			}
			v.config = nil
			good()
			return
		}
		c, err := schema.DecodeProviderConfig(value)
		if err == nil && c.Name != m.provider {
			err = fmt.Errorf("config names provider %q", c.Name)
		}
		if err == nil && m.dimension != "" && c.DimensionOrDefault() != m.dimension {
			err = fmt.Errorf("its limit counts %s, and this instance's lane of it %s (cluster.Lane)", c.DimensionOrDefault(), m.dimension)
		}
		if err == nil {
			v.budget = c.Budget() // kept past a malformed or deleted config
		}
		if err == nil && v.budget {
			err = fmt.Errorf("its window, %v, is a budget's, which the instances take from a counter and do not share; join its provider %q with cluster.JoinProvider", c.Window.D(), c.Of)
		}
		if err != nil {
			bad(err)
			return
		}
		good()
		m.checkLimits(v, &c)
		prev := v.config
		if prev == nil {
			prev = v.lastConfig
		}
		v.noteReplaced(prev, &c, time.Now(), m.cfg.leaseTTL)
		// A config seen anew: another revision, or the same with other
		// content (an etcd restored from a backup counts revisions from
		// lower down again; found by review).
		if rev != v.configRev || v.configAt.IsZero() || v.config == nil || !reflect.DeepEqual(*v.config, c) {
			v.configAt = time.Now()
		}
		v.config, v.configRev = &c, rev
		if r := v.refused; r != nil {
			v.refused = nil
			m.acceptShare(v, *r, v.refusedRev, v.refusedAt)
		}
	case schema.KindShares:
		// This instance's own record, alone: one that says Common is read
		// again with the common record (readShare), not here.
		if k.Instance != m.id {
			return
		}
		var own []*mvccpb.KeyValue
		if !deleted {
			own = append(own, &mvccpb.KeyValue{Key: []byte(key), Value: value, ModRevision: rev})
		}
		m.observeShare(v, own, nil, 0)
	}
}

// observeShare folds into the view this instance's own share record and
// the provider's common record as read in one snapshot (own and common:
// none or one key each), at revision seen; seen 0: own alone, a record
// that does not say Common, or none (a deletion).
func (m *Member) observeShare(v *view, own, common []*mvccpb.KeyValue, seen int64) {
	key := m.keys.Share(m.provider, m.id)
	defer m.listProblems(v)
	v.shareSeen = max(v.shareSeen, seen)
	v.refused = nil // a newer write replaces it
	v.own = nil
	if len(own) == 0 {
		v.share, v.pointer = nil, false
		delete(v.problems, key)
		return
	}
	v.own = own[0]
	r, err := schema.DecodeShareRecord(own[0].Value)
	if err == nil && (r.Provider != m.provider || r.Instance != m.id) {
		err = fmt.Errorf("share record names provider %q, instance %q", r.Provider, r.Instance)
	}
	if err == nil {
		v.pointer = r.Common
		r, err = r.Resolve(m.commonRecord(v, common))
	}
	if err != nil {
		if v.problems[key] != err.Error() {
			m.log.Error("ignoring malformed record; keeping the last good value", "key", key, "err", err)
		}
		v.problems[key] = err.Error()
		return
	}
	at := own[0].ModRevision
	if v.pointer && len(common) > 0 {
		at = max(at, common[0].ModRevision) // its content is the common record's
	}
	m.acceptShare(v, r, own[0].ModRevision, at)
}

// commonRecord decodes the common record read (none or one key), listing
// it among the problems when it does not decode; nil: none good.
func (m *Member) commonRecord(v *view, kvs []*mvccpb.KeyValue) *schema.ShareRecord {
	key := m.keys.CommonShare(m.provider)
	delete(v.problems, key)
	if len(kvs) == 0 {
		return nil
	}
	c, err := schema.DecodeShareRecord(kvs[0].Value)
	if err != nil {
		v.problems[key] = err.Error()
		return nil
	}
	return &c
}

// acceptShare makes r, this instance's record (resolved) written at rev,
// the view's, unless it is inconsistent with the config known: then it
// waits for the next config (refused). at is the revision r's content was
// written at: the common record's for one that follows it.
func (m *Member) acceptShare(v *view, r schema.ShareRecord, rev, at int64) {
	key := m.keys.Share(m.provider, m.id)
	defer m.listProblems(v)
	var err error
	if v.config != nil {
		// Never more than the limit this instance knows: a record
		// that hands out more is forged, corrupt, from before a lower
		// limit (configd republishes under the new one at once), or
		// computed under a config still on its way here: kept, and
		// checked again when the config changes.
		if err = r.CheckAgainst(*v.config, v.configRev); err != nil {
			v.refused, v.refusedRev, v.refusedAt = &r, rev, at
		}
	}
	if err != nil && ahead(r, v.configRev, at) {
		// The config it was computed under was written before it, and
		// this instance's watch of the config has yet to bring it: the
		// two watches deliver independently. Nothing wrong: applied when
		// the config comes (at a retune of 2,000 instances, 100 of them
		// logged an error here).
		m.log.Debug("share record ahead of the config; waiting for the config", "key", key, "err", err)
		return
	}
	if err != nil {
		if v.problems[key] != err.Error() {
			m.log.Error("ignoring malformed record; keeping the last good value", "key", key, "err", err)
		}
		v.problems[key] = err.Error()
		return
	}
	if v.share != nil && (r.Generation < v.share.Generation || r.Generation-v.share.Generation > generationJump ||
		(r.Generation == v.share.Generation && rev != v.shareRev && !v.pointer)) {
		// etcd orders the writes to the key: the newest is configd's
		// word, whatever its generation (a replica recovering from a
		// forged record starts again below it). Followed, and said.
		m.log.Warn("share generation went backwards or jumped; following the newest record",
			"key", key, "revision", rev, "generation", r.Generation, "previous", v.share.Generation)
	}
	delete(v.problems, key)
	v.share, v.shareRev = &r, rev
}

// ahead reports whether r, a share record written at revision rev, was
// computed under a config newer than the one this instance has (at
// configRev), written before r: one its watch has yet to bring. A record
// that names a config revision not before its own was not written by
// configd, which computes it from a config it read.
func ahead(r schema.ShareRecord, configRev, rev int64) bool {
	return r.ConfigRevision > configRev && r.ConfigRevision < rev
}

// limitsProblem is the key of Status.Problems under which the first
// Member of a Group made by JoinProvider lists the provider's limits it
// does not enforce.
const limitsProblem = "limits"

// checkLimits lists among v's problems the further limits c holds in
// force that this instance does not enforce: a Member of Join enforces
// none, one of JoinProvider those in force when it joined (it reads them
// once). Members of a Group whose lanes were named by hand check nothing.
func (m *Member) checkLimits(v *view, c *schema.ProviderConfig) {
	if m.cfg.enforced == nil {
		return
	}
	var missing []string
	for _, l := range c.InForce()[1:] {
		if !slices.ContainsFunc(m.cfg.enforced, func(e schema.Lane) bool { return e.Lane == l.Lane }) {
			missing = append(missing, l.String())
		}
	}
	if len(missing) == 0 {
		delete(v.problems, limitsProblem)
		return
	}
	why := fmt.Sprintf("the provider's limits %s are not enforced by this instance: it joined with cluster.Join, which enforces the first limit alone, or before they were added (cluster.JoinProvider reads them once); join with JoinProvider, or restart it", strings.Join(missing, ", "))
	if v.problems[limitsProblem] != why {
		m.log.Error("provider has limits this instance does not enforce", "limits", missing)
	}
	v.problems[limitsProblem] = why
}

// listProblems copies the view's problems into Status.Problems.
func (m *Member) listProblems(v *view) {
	m.setStatus(func(s *Status) {
		s.Problems = s.Problems[:0]
		for key, why := range v.problems {
			s.Problems = append(s.Problems, key+": "+why)
		}
		slices.Sort(s.Problems)
	})
}

// apply sets the limiter to the share in force and reports whether a new
// shares generation was applied (which the caller acknowledges at once).
//
// With a configd leader alive, the share is the published one (0 for an
// instance not yet in it, or before the first publish: a joining instance
// starts with nothing). With no
// leader, it is total / live instances, from the first window boundary at
// least the change margin ahead. Without a provider config, the fallback.
func (m *Member) apply(v *view, ap *applied) bool {
	lim := m.lim
	fallback := applied{Source: follow.SourceFallback, Quota: m.cfg.fallbackQuota, Window: m.cfg.fallbackWindow}
	if v.budget {
		// A budget's config, refused: its limit is taken, not shared,
		// and no fallback stands in for it, from the window under way on
		// (found by review: a fallback of 100 per second admitted past a
		// day's budget of 5).
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
				// share of the two (found by review: a fleet counted at
				// the whole limit each took limit/n on the even split
				// beside a cut-off instance on its old 60: 120 of 90).
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

// report writes the instance record when something changed meaningfully —
// the applied generation, demand by more than 2% (and one permit), the clock
// offset by a millisecond, the fail_static the expiry counts with — or when
// it has not been written for ten report
// intervals; force writes it regardless. Traffic stays flat whatever the
// request rate: at most one small write per interval.
func (m *Member) report(ctx context.Context, lease clientv3.LeaseID, ap *applied, rep *reporter, force bool) error {
	now := time.Now()
	st := m.lim.Stats()
	asked := st.Admitted + st.Rejected + st.TimedOut + st.Canceled
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
		}
	}
	rep.lastAsked, rep.lastAt = asked, now
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
	}
	if !force && rep.haveWrite && !follow.Due(written(rep.written), written(rec), now.Sub(rep.wroteAt), m.cfg.report) {
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
		// instance's last poll, which had not seen it (found by review:
		// 60 in a window of 40).
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
	// while it follows configd's shares (found by review: 140 in a window
	// of 100, configd gone again with this instance cut off).
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
	return prev == rec
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
		Demand:      rec.Demand,
		Generation:  rec.AppliedGeneration,
		ClockOffset: time.Duration(rec.ClockOffset),
		ClockKnown:  rec.ClockKnown,
		FailStatic:  time.Duration(rec.FailStatic),
		Source:      rec.Source,
		Enforced:    rec.Enforced,
	}
}

// leaderKey applies a key under configd's election prefix (its put, or
// deleted) to the view. Only a key a configd replica can hold makes
// configd alive: one that cannot be (schema.Keys.CheckElectionKey: no
// lease, not named after its lease, no replica ID; or on a lease granted
// for longer than any replica's session) is ignored, logged once and
// listed in Status.Problems. Otherwise such a key — which configd removes
// when it runs — would keep the instances, with configd gone, on the last
// shares (or on nothing, for one that joined since) for as long as it
// stays: for good if it has no lease. A replica's key passes every check,
// so an instance never takes a live configd for gone; a key that imitates
// one exactly counts as configd's until its lease ends.
func (m *Member) leaderKey(ctx context.Context, v *view, kv *mvccpb.KeyValue, deleted bool) error {
	key := string(kv.Key)
	defer m.listProblems(v)
	if deleted {
		delete(v.problems, key)
		delete(v.leaders, key)
		return nil
	}
	why := m.keys.CheckElectionKey(key, kv.Lease, kv.Value)
	if why == nil {
		octx, cancel := m.opCtx(ctx)
		resp, err := m.cli.TimeToLive(octx, clientv3.LeaseID(kv.Lease))
		cancel()
		if err != nil {
			return fmt.Errorf("configd leader key %s: lease: %w", key, err)
		}
		switch {
		case resp.TTL < 0:
			// Its lease is gone, and the key with it (the deletion is on
			// its way): configd is not alive through it.
			if v.leaders[key] {
				delete(v.leaders, key)
			}
			return nil
		case time.Duration(resp.GrantedTTL)*time.Second > schema.MaxSessionTTL:
			why = fmt.Errorf("%w: granted %ds", errLeaseTooLong, resp.GrantedTTL)
		}
	}
	if why == nil {
		delete(v.problems, key)
		v.leaders[key] = true
		return nil
	}
	if v.leaders[key] {
		delete(v.leaders, key) // rewritten: no longer a replica's
	}
	if v.problems[key] != why.Error() {
		m.log.Warn("ignoring a foreign key in configd's election: it does not make configd alive", "key", key, "err", why)
	}
	v.problems[key] = why.Error()
	return nil
}
