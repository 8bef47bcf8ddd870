package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/follow"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// A limit whose window is longer than configd's shares go (a day's quota:
// schema.IsBudget) is a budget: no instance has a share of it. Each takes
// from the window's counter (schema.BudgetRecord) what it is about to
// spend, in a transaction that checks neither the counter nor the limit
// changed since it read them, and its limiter admits in that window what
// it took and no more (limiter.SetWindowQuota). The window's total then
// never passes the limit, whatever instances join mid-window, restart,
// crash, or lose etcd: an instance cut off spends what it took and takes
// nothing more; one that joins takes from what is left; what a crashed
// process took and did not spend is lost for the window, and Close gives
// back what is left of it. A take whose outcome is unknown (etcd did not
// answer) counts as taken and is not spent.

const (
	// budgetTick is how often a budget's Member looks at what its
	// limiter has left and what is asked of it.
	budgetTick = 100 * time.Millisecond
	// budgetLead: a Member takes again when what is left would last less
	// than this at the rate it spends, so that it rarely runs dry.
	budgetLead = time.Second
	// budgetChunk: a take asks for this long of the rate it spends,
	// beyond what waiters need now and what it refused for want of room;
	// at most a quarter of what the window has left, so that the
	// window's last permits go to every instance that asks for them, not
	// to the first. Short: what one instance took and cannot spend (its
	// other limits refusing) is room the others lack (measured with
	// bench/multi -daily: ten seconds of the rate asked, refusals
	// included, left the tokens limit 56% used).
	budgetChunk = 2 * time.Second
)

// budget is a budget Member's state, owned by its goroutine and read by
// Close once that has ended.
type budget struct {
	window  time.Duration
	start   int64   // the window the taken permits are for (Unix ns, corrected clock)
	took    int64   // what this process took for it
	spent   int64   // permits admitted so far
	refused int64   // permits refused or timed out so far
	rate    float64 // permits admitted per tick, smoothed
	view    budgetView
	// blind says the instance's clock is not known (a clock monitor with
	// no measurement yet, or none recent): it takes nothing, since it
	// cannot tell which window of true time it would spend in.
	blind bool
}

// budgetView is what a read of the store says: the lane's limit and the
// window's counter, with the revisions a take is fenced on.
type budgetView struct {
	limit, cfgRev int64
	taken, rev    int64
	shadow        bool // the lane's config is in shadow mode
}

// budgetStore is where a budget is taken from: etcd (etcdBudget), or a
// model of it in tests.
type budgetStore interface {
	// read returns the lane's limit and the counter of the window that
	// starts at start.
	read(ctx context.Context, start int64) (budgetView, error)
	// put writes taken as that window's counter, if neither the config
	// nor the counter changed since v was read; it reports whether it did.
	put(ctx context.Context, start int64, v budgetView, taken int64) (bool, error)
}

// step takes more of the budget when what lim has left in the window
// under way runs short of what is asked of it, or reads the store when
// read says so (to keep what Status shows current); it returns what it
// took. lim is the budget's limit, in the budget's window.
func (b *budget) step(ctx context.Context, s budgetStore, lim *limiter.Limiter, read bool) (int64, error) {
	now := lim.Now().UnixNano()
	if start := now - now%int64(b.window); start != b.start {
		b.start, b.took = start, 0
	}
	st := lim.Stats()
	b.rate = follow.Smooth(b.rate, float64(st.Admitted-b.spent))
	// Refused since the last tick for want of this limit's room: what
	// was refused while it had room was another limit's doing.
	refused := st.Rejected + st.TimedOut - b.refused
	if st.Remaining >= refused {
		refused = 0
	}
	b.spent, b.refused = st.Admitted, st.Rejected+st.TimedOut
	need := max(st.WaitingPermits-st.Remaining, 0) + refused
	var want int64
	if !b.blind && (need > 0 || st.Remaining < int64(b.rate*float64(budgetLead/budgetTick))) {
		want = max(need+int64(b.rate*float64(budgetChunk/budgetTick)), 1)
	}
	if want == 0 && !read {
		return 0, nil
	}
	return b.acquire(ctx, s, lim, want, need)
}

// acquire takes what it can of want (at least need, if the window has
// that left) for the window under way and lets lim admit it there.
func (b *budget) acquire(ctx context.Context, s budgetStore, lim *limiter.Limiter, want, need int64) (int64, error) {
	got, err := b.take(ctx, s, want, need)
	if err != nil || got == 0 {
		return 0, err
	}
	b.took += got
	if ok, err := lim.SetWindowQuota(b.took, b.window, time.Unix(0, b.start)); err != nil || !ok {
		// The window ended while the take was on its way: what it took
		// is lost with that window.
		return 0, err
	}
	return got, nil
}

// take reads the store and, when want > 0, takes what it can of want (at
// least need, if the window has that left). It returns what it took.
func (b *budget) take(ctx context.Context, s budgetStore, want, need int64) (int64, error) {
	for range 3 {
		v, err := s.read(ctx, b.start)
		if err != nil {
			return 0, err
		}
		b.view = v
		got := budgetGrant(want, need, v.limit-v.taken)
		if got == 0 {
			return 0, nil
		}
		ok, err := s.put(ctx, b.start, v, v.taken+got)
		if err != nil {
			// Whether it was written is unknown: it counts as taken
			// by all, and this process spends none of it.
			return 0, err
		}
		if ok {
			b.view.taken += got
			return got, nil
		}
	}
	return 0, nil // another took meanwhile, three times: next tick
}

// giveBack returns to the store what this process took of the window
// under way and did not spend, once lim is closed and so admits nothing
// more; it returns how much it gave back.
func (b *budget) giveBack(ctx context.Context, s budgetStore, lim *limiter.Limiter) int64 {
	st := lim.Stats()
	if b.took == 0 || !st.Closed || st.WindowStart.UnixNano() != b.start {
		return 0
	}
	back := min(st.Remaining, b.took)
	if back <= 0 {
		return 0
	}
	for range 3 {
		v, err := s.read(ctx, b.start)
		if err != nil || v.taken < back {
			return 0
		}
		ok, err := s.put(ctx, b.start, v, v.taken-back)
		if err != nil {
			return 0
		}
		if ok {
			return back
		}
	}
	return 0
}

// budgetGrant returns what a take gets of want when the window has left
// permits: never more than left, at least need when left has it, and
// otherwise at most a quarter of left (rounded up).
func budgetGrant(want, need, left int64) int64 {
	if want <= 0 || left <= 0 {
		return 0
	}
	return min(left, want, max(need, (left+3)/4))
}

// followBudget keeps the Member's limiter at what it took of the budget,
// until ctx ends.
func (m *Member) followBudget(ctx context.Context) {
	b := &budget{window: m.cfg.budget}
	m.budget = b
	s := etcdBudget{m}
	m.setStatus(func(st *Status) { st.Source, st.Share, st.Window = follow.SourceBudget, 0, b.window })
	t := time.NewTicker(budgetTick)
	defer t.Stop()
	var lastRead time.Time
	for {
		read := time.Since(lastRead) >= m.cfg.report
		if mon := m.cfg.clock; mon != nil {
			b.blind = !mon.Current().Known
		}
		_, err := b.step(ctx, s, m.lim, read)
		if ctx.Err() != nil {
			return
		}
		if err == nil && read {
			m.lim.SetShadow(b.view.shadow)
		}
		// Connected says etcd answered: a config or counter it cannot
		// take from is a problem, listed, not an outage.
		connected := err == nil || errors.Is(err, errBudgetRecord)
		m.setStatus(func(st *Status) {
			st.Connected = connected
			if err != nil {
				st.LastError = err.Error()
			}
			st.Share, st.Total, st.Taken = b.took, b.view.limit, b.view.taken
		})
		if connected && read {
			lastRead = time.Now()
			select {
			case <-m.ready:
			default:
				close(m.ready)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// giveBack is budget.giveBack for a budget Member, once its goroutine
// has ended and its limiter is closed.
func (m *Member) giveBack() {
	if m.budget == nil {
		return
	}
	if n := m.budget.giveBack(context.Background(), etcdBudget{m}, m.lim); n > 0 {
		m.log.Info("gave back what was taken of the budget and not spent", "permits", n)
	}
}

// etcdBudget is a budget Member's store: the lane's config and the
// window's counter in etcd.
type etcdBudget struct{ m *Member }

func (s etcdBudget) read(ctx context.Context, start int64) (budgetView, error) {
	m := s.m
	rctx, cancel := m.opCtx(ctx)
	defer cancel()
	resp, err := m.cli.Txn(rctx).Then(clientv3.OpGet(m.keys.Config(m.provider)), clientv3.OpGet(m.keys.Budget(m.provider, m.cfg.budget, start))).Commit()
	if err != nil {
		return budgetView{}, err
	}
	var v budgetView
	if v.limit, v.cfgRev, v.shadow, err = m.budgetLimit(resp.Responses[0].GetResponseRange().Kvs); err != nil {
		return budgetView{}, err
	}
	if v.taken, v.rev, err = m.budgetTaken(start, resp.Responses[1].GetResponseRange().Kvs); err != nil {
		return budgetView{}, err
	}
	return v, nil
}

func (s etcdBudget) put(ctx context.Context, start int64, v budgetView, taken int64) (bool, error) {
	m := s.m
	rec, err := schema.Encode(schema.BudgetRecord{Provider: m.provider, Start: start, Window: schema.Duration(m.cfg.budget), Taken: taken})
	if err != nil {
		return false, err
	}
	cfgKey, key := m.keys.Config(m.provider), m.keys.Budget(m.provider, m.cfg.budget, start)
	ops := []clientv3.Op{clientv3.OpPut(key, string(rec))}
	if v.rev == 0 {
		// A window's first take: the counter of two windows back is
		// done with (a clock within its guard band spends no window but
		// the one under way), and goes.
		ops = append(ops, clientv3.OpDelete(m.keys.Budget(m.provider, m.cfg.budget, start-2*int64(m.cfg.budget))))
	}
	rctx, cancel := m.opCtx(ctx)
	defer cancel()
	tr, err := m.cli.Txn(rctx).If(
		clientv3.Compare(clientv3.ModRevision(cfgKey), "=", v.cfgRev),
		clientv3.Compare(clientv3.ModRevision(key), "=", v.rev),
	).Then(ops...).Commit()
	if err != nil {
		if taken > v.taken {
			m.budgetUnknown.Add(taken - v.taken)
		}
		return false, err
	}
	return tr.Succeeded, nil
}

// errBudgetRecord is a budget lane's config or counter that cannot be
// taken from: gone, malformed, or of another window than the one this
// Member keeps.
var errBudgetRecord = errors.New("cluster: budget lane")

// budgetLimit returns the limit of the budget lane's config in kvs, its
// revision and whether it is in shadow mode, or an error (also listed
// among the problems) when there is none to take from.
func (m *Member) budgetLimit(kvs []*mvccpb.KeyValue) (int64, int64, bool, error) {
	key := m.keys.Config(m.provider)
	if len(kvs) == 0 {
		return 0, 0, false, fmt.Errorf("%w: its config is gone: taking nothing more", errBudgetRecord)
	}
	c, err := schema.DecodeProviderConfig(kvs[0].Value)
	switch {
	case err != nil:
	case c.Name != m.provider:
		err = fmt.Errorf("config names provider %q", c.Name)
	case c.Window.D() != m.cfg.budget:
		err = fmt.Errorf("its window is %v, and this instance keeps the budget of window %v: restart it to follow the new one", c.Window.D(), m.cfg.budget)
	case m.dimension != "" && c.DimensionOrDefault() != m.dimension:
		err = fmt.Errorf("its limit counts %s, and this instance's lane of it %s", c.DimensionOrDefault(), m.dimension)
	}
	if err != nil {
		m.problem(key, err)
		return 0, 0, false, fmt.Errorf("%w: config: %w", errBudgetRecord, err)
	}
	m.noProblem(key)
	return c.Limit, kvs[0].ModRevision, c.Mode == schema.ModeShadow, nil
}

// budgetTaken returns the counter in kvs of the window that starts at
// start (0 when none yet) and its revision; a malformed one is listed
// among the problems and taken from no more (it may say less than was
// taken).
func (m *Member) budgetTaken(start int64, kvs []*mvccpb.KeyValue) (int64, int64, error) {
	if len(kvs) == 0 {
		m.noProblem(m.keys.Budgets(m.provider)) // those of the windows before
		return 0, 0, nil
	}
	key := m.keys.Budget(m.provider, m.cfg.budget, start)
	r, err := schema.DecodeBudgetRecord(kvs[0].Value)
	if err == nil && (r.Provider != m.provider || r.Start != start || r.Window.D() != m.cfg.budget) {
		err = fmt.Errorf("counter names provider %q, window %v from %d", r.Provider, r.Window.D(), r.Start)
	}
	if err != nil {
		m.problem(key, err)
		return 0, 0, fmt.Errorf("%w: counter %s: %w", errBudgetRecord, key, err)
	}
	m.noProblem(m.keys.Budgets(m.provider)) // and those of the windows before
	return r.Taken, kvs[0].ModRevision, nil
}

// problem lists err among the Member's problems under key, replacing
// what was listed under it, and logs it once.
func (m *Member) problem(key string, err error) {
	why := key + ": " + err.Error()
	m.setStatus(func(s *Status) {
		if slices.Contains(s.Problems, why) {
			return
		}
		m.log.Error("budget lane cannot be taken from", "key", key, "err", err)
		s.Problems = slices.DeleteFunc(s.Problems, func(p string) bool { return strings.HasPrefix(p, key+": ") })
		s.Problems = append(s.Problems, why)
		slices.Sort(s.Problems)
	})
}

// noProblem removes what was listed under key, or under keys it is the
// prefix of (ending in '/'), among the problems.
func (m *Member) noProblem(key string) {
	if !strings.HasSuffix(key, "/") {
		key += ": "
	}
	m.setStatus(func(s *Status) {
		s.Problems = slices.DeleteFunc(s.Problems, func(p string) bool { return strings.HasPrefix(p, key) })
	})
}
