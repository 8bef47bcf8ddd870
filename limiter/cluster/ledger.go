package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/configd/round"
	"github.com/sluice-go/sluice/internal/follow"
	"github.com/sluice-go/sluice/internal/ledger"
	ledgerstore "github.com/sluice-go/sluice/internal/ledger/store"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// errLedger ends the shares' session of a Member whose provider names
// the ledger (schema.CoordinationLedger).
var errLedger = errors.New("cluster: the provider is coordinated by the ledger")

// toLedger ends the shares' session on finding that the provider names
// the ledger. Its lease held nothing (apply set no share), so it goes at
// once; the limiter stays open for the ledger's Follower.
func (s *following) toLedger() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	s.m.cli.Revoke(ctx, s.lease)
	cancel()
	return errLedger
}

// followLedger keeps the limiter at what this incarnation's grants in
// the provider's ledger allow: a Follower enforces the grants and writes
// the releases they ask for, and sessions with a lease report the
// holder's demand, which configd grants to. cfg is the config that named
// the ledger. It returns false when ctx ends, and true when the
// provider's config names the shares again.
//
// Nothing here bounds safety: the Follower's grants end at their
// publish's end (the limiter's expiry), so a process cut off from etcd,
// paused or crashed admits nothing past what configd wrote for it.
func (m *Member) followLedger(ctx context.Context, cfg schema.ProviderConfig) bool {
	window := cfg.Window.D()
	cut := &cutLimiter{Limiter: m.lim, m: m, bound: cfg.ClockBound()}
	f, err := ledgerstore.NewFollower(m.cli, ledger.Keys(m.keys.Ledger(m.provider)), m.id, cut, window, m.log,
		ledgerstore.WithReserves(m.grantReserved))
	if err != nil {
		m.log.Error("cannot follow the ledger", "err", err)
		<-ctx.Done()
		return false
	}
	m.holder = f.Holder().Name()
	m.log.Info("following the provider's ledger", "holder", m.holder)
	fctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer m.grantReserved(nil, false) // after the Follower's last report
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { f.Run(fctx) })
	// A clean exit hands its room on before its lease goes: the Follower
	// stops, and the limiter admits nothing before the releases say so.
	release := func() {
		cancel()
		wg.Wait()
		lctx, lcancel := m.opCtx(context.Background())
		defer lcancel()
		if err := f.Leave(lctx); err != nil {
			m.log.Warn("could not release the ledger's grants on leaving; they hold their room until they end", "err", err)
		}
	}

	rep := &reporter{started: time.Now()}
	bound := cfg.ClockBound()
	backoff := 100 * time.Millisecond
	for {
		start := time.Now()
		err := m.ledgerSession(ctx, rep, window, bound, round.StandInEvery(cfg, m.cfg.report), release)
		if ctx.Err() != nil {
			return false
		}
		if errors.Is(err, errShares) {
			return true
		}
		if m.Status().Connected {
			m.log.Warn("etcd unreachable; keeping its grants (fail-static)", "err", err,
				"admits_until", m.lim.Expiry())
		}
		m.setStatus(func(s *Status) { s.Connected, s.LastError = false, err.Error() })
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// errShares ends a ledger session when the provider's config names the
// shares.
var errShares = errors.New("cluster: the provider is coordinated by the shares")

// leftLedger drops what the ledger's grants left in the limiter, at once,
// and returns what the shares' session starts from: nothing, as a new
// process, since a share record naming this ID was an earlier one's.
func (m *Member) leftLedger() applied {
	if err := m.lim.SetQuota(0, time.Time{}); err != nil && !errors.Is(err, limiter.ErrClosed) {
		m.log.Error("cannot drop the ledger's quota", "err", err)
	}
	m.toLedger, m.holder = false, ""
	m.registered, m.registeredAt = 0, time.Time{}
	m.log.Info("the provider is coordinated by the shares again; leaving the ledger")
	return applied{Source: follow.SourceLapsed, Window: m.lim.Stats().Window}
}

// ledgerSession registers the holder on a fresh lease and reports its
// demand every report interval, applying the clock monitor's measurement
// with each, until the lease is lost, the config names the shares, or ctx
// ends; on ctx's end it calls release, says it is leaving and revokes the
// lease.
func (m *Member) ledgerSession(ctx context.Context, rep *reporter, window, bound, standEvery time.Duration, release func()) error {
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	ap := &applied{Source: follow.SourceLedger, Window: window}
	s, err := m.grant(sctx, nil, ap, rep)
	if err != nil {
		return err
	}
	defer func() {
		if ctx.Err() != nil {
			release()
			s.leave()
		}
	}()
	rep.haveWrite = false
	m.clockCut(0, window, bound)
	m.ledgerStatus(ap)
	// The config as it is now, and its watch from there: a config that
	// names the shares written while no session ran (cut off past the
	// lease) is seen here, not missed for good.
	octx, ocancel := m.opCtx(sctx)
	cur, err := m.cli.Get(octx, m.keys.Config(m.provider))
	ocancel()
	if err != nil {
		return fmt.Errorf("cluster: reading the config: %w", err)
	}
	for _, kv := range cur.Kvs {
		c, err := schema.DecodeProviderConfig(kv.Value)
		if err == nil && !c.Ledger() {
			return errShares
		}
		if err == nil {
			m.applyClasses(&c)
		}
	}
	cfgs := m.cli.Watch(clientv3.WithRequireLeader(sctx), m.keys.Config(m.provider), clientv3.WithRev(cur.Header.Revision+1))
	leaders := m.cli.Watch(clientv3.WithRequireLeader(sctx), m.keys.Election()+"/", clientv3.WithPrefix(), clientv3.WithRev(cur.Header.Revision+1))
	alive := int64(-1) // configd's replicas alive; -1: not known (tryStandIn)
	if err := s.report(sctx, true); err != nil {
		return err
	}
	renewed := make(chan time.Time, 1)
	kaDone := make(chan error, 1)
	wg.Go(func() { kaDone <- m.keepAlive(sctx, s.lease, s.leaseEnd, renewed) })
	m.setStatus(func(st *Status) { st.Connected, st.LastError = true, "" })
	tick := time.NewTicker(m.cfg.report)
	defer tick.Stop()
	stand := time.NewTicker(standEvery)
	defer stand.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err() // the deferred call leaves
		case <-stand.C:
			m.tryStandIn(sctx, &alive)
		case wr, ok := <-leaders:
			if !ok || wr.Err() != nil {
				return fmt.Errorf("cluster: watching configd's election: %w", cmp.Or(wr.Err(), errors.New("the watch ended")))
			}
			alive = -1
		case s.leaseEnd = <-renewed:
		case err := <-kaDone:
			return err
		case wr, ok := <-cfgs:
			if err := m.configEvents(wr, ok); err != nil {
				return err
			}
		case <-tick.C:
			m.clockCut(0, window, bound)
			m.ledgerStatus(ap)
			if err := s.report(sctx, false); err != nil {
				return err
			}
		}
	}
}

// configEvents returns errShares when a config of the watch names the
// shares, and an error when the watch ended.
func (m *Member) configEvents(wr clientv3.WatchResponse, ok bool) error {
	if !ok {
		return errors.New("cluster: the config's watch ended")
	}
	if err := wr.Err(); err != nil {
		return fmt.Errorf("cluster: watching the config: %w", err)
	}
	for _, ev := range wr.Events {
		if ev.Type != clientv3.EventTypePut {
			continue
		}
		c, err := schema.DecodeProviderConfig(ev.Kv.Value)
		if err == nil && !c.Ledger() {
			return errShares
		}
		if err == nil {
			m.applyClasses(&c)
		}
	}
	return nil
}

// ledgerStatus puts what the limiter enforces now in ap, which the
// record reports, and in the status.
func (m *Member) ledgerStatus(ap *applied) {
	st := m.lim.Stats()
	ap.Quota, ap.Window = st.Quota, st.Window
	m.setStatus(func(s *Status) {
		s.Source, s.Share, s.Window, s.Generation, s.Instances = follow.SourceLedger, st.Quota, st.Window, 0, 0
		s.AdmitsUntil = m.lim.Expiry()
	})
}
