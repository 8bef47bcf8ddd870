package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/configd/adapt"
	"github.com/sluice-go/sluice/internal/schema"
)

// DefaultAdaptEvery is how often configd runs the controller of each
// adaptive provider it leads: half the instances' default report interval,
// so a record waits at most that long to be read (three reads per
// provider and round, all from configd).
const DefaultAdaptEvery = 500 * time.Millisecond

// adaptWho is the history's "who" of the controller's retunes.
const adaptWho = "configd adaptive"

// adaptor runs the adaptive controller (configd/adapt) of every adaptive
// provider whose owner key this replica holds. Its output is a retune: it
// writes the effective limit as the config's Limit through the store, in a
// transaction on the revision it read and with a history entry, like an
// operator's `configd set`, so the publisher and the instances treat it as
// any limit change, and an operator's concurrent edit is never overwritten
// (the round is skipped and runs again on what the operator wrote).
//
// Two replicas that both think they lead a provider, briefly during a
// handover, may both write: each write is conditioned on the revision it
// read, so one of them fails and the next round reads the other's.
type adaptor struct {
	cli     *clientv3.Client
	keys    schema.Keys
	store   *store
	replica string
	log     *slog.Logger
	metrics *metrics
	now     func() time.Time
	every   time.Duration
	// margin and uncertainty are the publisher's propagation margin and
	// its clock's uncertainty (nil: none): with publishSlack, how long a
	// limit written in a round may take to be in force (adapt.Config.Lead).
	margin      time.Duration
	uncertainty func() time.Duration
	// states is each provider's controller state, kept between rounds by
	// the run goroutine only. Lost on a restart or handover: the next
	// owner starts probing from the first step, which is the slow one.
	states map[string]*adaptState
}

type adaptState struct {
	s     adapt.State
	tally adapt.Tally // the instances' counters of the last round
}

// run calls round every a.every, at the phase adapt.Config.NextRound
// gives (a round just in time for each window boundary), until ctx ends;
// it returns then.
func (a *adaptor) run(ctx context.Context) {
	t := time.NewTimer(a.untilNext())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := a.round(ctx); err != nil && ctx.Err() == nil {
				a.log.Warn("adaptive round failed", "error", err)
			}
			t.Reset(a.untilNext())
		}
	}
}

// untilNext returns how long until the next round, on configd's clock.
func (a *adaptor) untilNext() time.Duration {
	now := a.now()
	return adapt.Config{Lead: a.lead()}.NextRound(now, a.every).Sub(now)
}

// round runs one step of the controller of each adaptive provider this
// replica leads.
func (a *adaptor) round(ctx context.Context) error {
	if a.states == nil {
		a.states = map[string]*adaptState{}
	}
	resp, err := a.cli.Get(ctx, a.keys.Owners(), clientv3.WithPrefix())
	if err != nil {
		return etcdError(err)
	}
	led := map[string]bool{}
	for _, kv := range resp.Kvs {
		if string(kv.Value) == a.replica {
			led[strings.TrimPrefix(string(kv.Key), a.keys.Owners())] = true
		}
	}
	for name := range a.states {
		if !led[name] {
			delete(a.states, name)
		}
	}
	var firstErr error
	for name := range led {
		if err := a.provider(ctx, name); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("provider %q: %w", name, err)
		}
	}
	return firstErr
}

// provider runs one round of provider name's controller.
func (a *adaptor) provider(ctx context.Context, name string) error {
	resp, err := a.cli.Get(ctx, a.keys.Config(name))
	if err != nil {
		return etcdError(err)
	}
	if len(resp.Kvs) == 0 {
		delete(a.states, name)
		return nil
	}
	rev := resp.Kvs[0].ModRevision
	cfg, err := schema.DecodeProviderConfig(resp.Kvs[0].Value)
	if err != nil || cfg.Adaptive == nil {
		delete(a.states, name) // a malformed config is the publisher's to report
		a.metrics.effective.DeleteLabelValues(name)
		return nil
	}
	ad := *cfg.Adaptive
	c := controller(cfg)
	c.Lead = a.lead()
	st := a.states[name]
	first := st == nil
	if first {
		st = &adaptState{s: c.Start()}
		a.states[name] = st
	}
	// The stored config is the truth: an operator may have moved it.
	st.s.Limit, st.s.PauseUntil = cfg.Limit, ad.PauseUntil
	if ad.Shadow {
		st.s.Limit = ad.Ceiling
		if ad.Effective != 0 {
			st.s.Limit = ad.Effective
		}
	}

	ins, err := a.cli.Get(ctx, a.keys.Instances(name), clientv3.WithPrefix())
	if err != nil {
		return etcdError(err)
	}
	var reps []adapt.Report
	for _, kv := range ins.Kvs {
		rec, err := schema.DecodeInstanceRecord(kv.Value)
		if err != nil {
			continue // the publisher logs and shows malformed records
		}
		reps = append(reps, adapt.Report{ID: rec.ID, Started: rec.Started, Pushbacks: rec.Pushbacks,
			Enforced: rec.Enforced, Demand: rec.Demand, RetryUntil: rec.RetryUntil,
			Remaining: rec.Remaining, RemainingAt: rec.RemainingAt})
	}
	r, ok := st.tally.Round(a.now(), cfg.Window.D(), reps)
	a.metrics.ceiling.WithLabelValues(name).Set(float64(ad.Ceiling))
	if !ok { // the baselines only
		st.s.Last = r.At
		a.metrics.effective.WithLabelValues(name).Set(float64(st.s.Limit))
		return nil
	}
	next, why := c.Step(st.s, r)
	st.s = next
	a.metrics.effective.WithLabelValues(name).Set(float64(next.Limit))
	if why == "" {
		return nil
	}
	upd := cfg
	na := ad
	na.Reason = truncate(why, 256)
	if !next.PauseUntil.IsZero() {
		na.PauseUntil = next.PauseUntil.UTC()
	}
	if ad.Shadow {
		na.Effective = next.Limit
	} else {
		upd.Limit = next.Limit
	}
	upd.Adaptive = &na
	ch, err := a.store.write(ctx, name, &upd, rev, adaptWho)
	if err != nil {
		return err // a conflict: an operator wrote; the next round reads it
	}
	if ch.Changed {
		switch {
		case next.Limit < cfg.Limit || (ad.Shadow && next.Limit < ad.Effective):
			a.metrics.adaptMoves.WithLabelValues(name, "lowered").Inc()
		case next.Limit > cfg.Limit || (ad.Shadow && next.Limit > ad.Effective):
			a.metrics.adaptMoves.WithLabelValues(name, "raised").Inc()
		}
		a.log.Info("adaptive limit", "provider", name, "limit", next.Limit, "ceiling", ad.Ceiling, "shadow", ad.Shadow, "why", why)
	}
	return nil
}

// publishSlack is what the lead allows for the publisher to see a written
// limit and publish it: a watch event and a decision, a few milliseconds
// (stepGap paces the decisions). A publish later than that only makes the
// controller read one remaining of the old limit as the new one's.
const publishSlack = 100 * time.Millisecond

// lead returns how long a limit written now may take to be in force,
// before the window boundary it starts at.
func (a *adaptor) lead() time.Duration {
	d := a.margin + publishSlack
	if a.uncertainty != nil {
		d += max(0, a.uncertainty())
	}
	return d
}

// controller returns the controller's config for an adaptive provider.
func controller(cfg schema.ProviderConfig) adapt.Config {
	ad := cfg.Adaptive
	c := adapt.DefaultConfig(ad.Ceiling, cfg.Window.D())
	c.Floor = ad.Floor
	if ad.Decrease > 0 {
		c.Decrease = ad.Decrease
	}
	if ad.Probe > 0 {
		c.Probe = ad.Probe
	}
	return c
}
