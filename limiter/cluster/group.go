package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// Lane is one limit of a Group: the provider whose shares keep it, and
// the dimension it counts (limiter.Requests when empty), as in
// "requests 100/1s from provider api, tokens 200000/1m from provider
// api-tokens".
type Lane struct {
	Provider  string
	Dimension string
	// Fallback, when set, is this lane's quota and window until its
	// provider's config is read, in place of WithFallback's, which every
	// lane without one takes: a fallback of 100 requests per second says
	// nothing of how many tokens to admit meanwhile.
	Fallback *Fallback
	// budget is the window of a budget lane JoinProvider found
	// (schema.IsBudget): its limit is taken, not shared. 0: shared.
	budget time.Duration
}

// Fallback is a lane's own fallback quota and window (see WithFallback).
type Fallback struct {
	Quota  int64
	Window time.Duration
}

// Group is one instance's membership of several providers, each keeping
// one limit of a limiter.Multi at this instance's share of it: several
// limits, shared across the fleet, acquired all-or-nothing.
//
// Each limit is a provider of its own in etcd, with its own config, shares
// and handover, so the guarantee holds for each limit as for a lone
// Member: summed over all instances, at most that provider's limit in any
// aligned window of it. The Multi takes from every limit in the window
// that holds one instant, so an acquisition is granted only when each
// limit's share has room. The Members share the instance id; each holds
// its own lease. Its limits read one clock, so the Members share one
// clock state (WithClockMonitor): each measurement is folded in once,
// applied to every limit by whichever Member comes first — any lane whose
// provider is configured keeps it current — and every Member cuts its
// share by the same band. Each lane's mode comes from its provider: a
// lane in shadow mode admits past its share only where every lane an
// acquisition takes from is in shadow (see limiter.Multi). A lane's
// Fallback, or else WithFallback, is its quota until its provider's config
// is read.
//
// A Group is safe for concurrent use; Close stops every Member.
type Group struct {
	multi   *limiter.Multi
	members []*Member
}

// JoinGroup registers this instance under every lane's provider and
// returns a running Group, as Join does for one: it waits for the first
// view of each provider until ctx ends or the cold start timeout passes,
// and each limit starts on its fallback quota (Lane.Fallback, or
// WithFallback) until its provider's config is read. lanes holds 1 to limiter.MaxLimits providers,
// each named once; opts apply to every Member.
func JoinGroup(ctx context.Context, cli *clientv3.Client, lanes []Lane, opts ...Option) (*Group, error) {
	return joinLanes(ctx, cli, lanes, nil, opts)
}

// JoinProvider joins every limit of provider: its own and each further
// limit its config holds in force (configd set NAME --limit 100/1s
// --limit tokens=200000/1m), kept by the lane providers configd derives
// (schema.Lane), as JoinGroup does for lanes named by hand. The Multi's
// limits are in the order the config lists them, each counting its
// dimension: acquire with limiter.Cost for each (requests 1 by default).
//
// The limits are read when the instance joins. A limit an operator adds
// later is enforced by the instances that join after it: one that joined
// before lists it among its problems (Status.Problems) until it restarts.
// A limit removed binds nothing from then on (its lane is retired, not
// deleted). A limit of a window longer than an hour (up to a day: "50,000
// requests per day") is a budget: configd does not share it; each
// instance takes from the window's counter what it is about to spend
// (what its waiters need and about two seconds of what it spends, at most a
// quarter of what is left), so an instance that joins or restarts
// mid-window spends only what the others left, one cut off from etcd
// only what it took, and Close gives back what it took and did not
// spend; what a crashed process took is lost for the window. A budget
// admits nothing before its first take (a tenth of a second and a round
// trip to etcd after the first acquisition asks), nor without etcd at a
// cold start. Without a config yet, the Group holds the provider's own
// limit alone, on its fallback until the config comes.
func JoinProvider(ctx context.Context, cli *clientv3.Client, provider string, opts ...Option) (*Group, error) {
	o, keys, err := joinOptions(cli, []string{provider}, opts)
	if err != nil {
		return nil, err
	}
	if _, _, lane := schema.SplitLaneName(provider); lane {
		return nil, fmt.Errorf("cluster: %q is a lane of a provider; join that provider", provider)
	}
	rctx, cancel := context.WithTimeout(ctx, o.opTimeout)
	resp, err := cli.Get(rctx, keys.Config(provider))
	cancel()
	if err != nil {
		return nil, fmt.Errorf("cluster: reading the config of %q: %w", provider, err)
	}
	lanes := []Lane{{Provider: provider}}
	enforced := []schema.Lane{} // not nil: the first Member checks the config's limits against it
	if len(resp.Kvs) > 0 {
		// A malformed config joins the provider's own limit alone: its
		// Member lists the problem and keeps its fallback.
		if c, err := schema.DecodeProviderConfig(resp.Kvs[0].Value); err == nil && c.Name == provider {
			lanes[0].Dimension = c.DimensionOrDefault()
			enforced = c.InForce()[1:]
			for _, l := range enforced {
				ln := Lane{Provider: schema.LaneName(provider, l.Lane), Dimension: l.DimensionOrDefault()}
				if schema.IsBudget(l.Window.D()) {
					ln.budget = l.Window.D()
				}
				lanes = append(lanes, ln)
			}
		}
	}
	return joinLanes(ctx, cli, lanes, enforced, append(opts, WithID(o.id)))
}

// joinLanes is JoinGroup; enforced are the further limits of the first
// lane's provider that the other lanes keep, for JoinProvider (nil: lanes
// named by hand).
func joinLanes(ctx context.Context, cli *clientv3.Client, lanes []Lane, enforced []schema.Lane, opts []Option) (*Group, error) {
	if len(lanes) < 1 || len(lanes) > limiter.MaxLimits {
		return nil, fmt.Errorf("cluster: a Group has 1 to %d lanes, got %d", limiter.MaxLimits, len(lanes))
	}
	providers := make([]string, len(lanes))
	for i, ln := range lanes {
		providers[i] = ln.Provider
		for _, p := range providers[:i] {
			if p == ln.Provider {
				return nil, fmt.Errorf("cluster: provider %q is in two lanes; each limit is a provider of its own", p)
			}
		}
	}
	o, keys, err := joinOptions(cli, providers, opts)
	if err != nil {
		return nil, err
	}
	laneOpts := make([]options, len(lanes))
	limits := make([]limiter.Limit, len(lanes))
	for i, ln := range lanes {
		laneOpts[i] = o
		if i == 0 {
			laneOpts[i].enforced = enforced
		}
		if f := ln.Fallback; f != nil {
			laneOpts[i].fallbackQuota, laneOpts[i].fallbackWindow = f.Quota, f.Window
			if err := laneOpts[i].validateFallback(); err != nil {
				return nil, fmt.Errorf("cluster: lane %q: %w", ln.Provider, err)
			}
		}
		if ln.budget > 0 {
			// A budget admits what was taken of it, and nothing before:
			// no fallback, in its own window from the start.
			laneOpts[i].budget, laneOpts[i].fallbackQuota, laneOpts[i].fallbackWindow = ln.budget, 0, ln.budget
		}
		limits[i] = limiter.Limit{Dimension: ln.Dimension, Quota: laneOpts[i].fallbackQuota, Window: laneOpts[i].fallbackWindow}
	}
	multi, err := limiter.NewMulti(limits, o.limiterOpts...)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	g := &Group{multi: multi, members: make([]*Member, len(lanes))}
	clk := &clock{to: multi} // one clock: every Member applies it to every limit
	errs := make([]error, len(lanes))
	named := multi.Limits() // each lane's dimension named (requests when empty)
	var wg sync.WaitGroup
	for i, ln := range lanes {
		wg.Go(func() {
			g.members[i], errs[i] = startMember(ctx, cli, ln.Provider, keys, laneOpts[i], multi.Limiter(i), clk, named[i].Dimension)
		})
	}
	wg.Wait() // the lanes wait for their first view, or the cold start, together
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(err, g.Close())
	}
	return g, nil
}

// Multi returns the limits the Group keeps, in the order of its lanes.
// Acquire from it; do not set its quotas yourself.
func (g *Group) Multi() *limiter.Multi { return g.multi }

// Members returns the Group's Members, in the order of its lanes: each
// one's Status says what it knows of its provider. Close the Group, not
// one of them: a Member closed alone closes its limit of the Multi.
func (g *Group) Members() []*Member { return append([]*Member(nil), g.members...) }

// Close leaves every provider (see Member.Close), together, and closes the
// Multi. It is idempotent.
func (g *Group) Close() error {
	var wg sync.WaitGroup
	for _, m := range g.members {
		if m != nil {
			wg.Go(func() { m.Close() })
		}
	}
	wg.Wait()
	return g.multi.Close()
}
