package cluster

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

// TestBudgetOracle runs random histories of a budget taken by several
// instances — the very code of a budget Member (budget.step, giveBack)
// over a model of etcd that fails before or after writing or refuses the
// records, with other takers racing each take, limits changed at random,
// clocks off by up to their uncertainty, crashes, leaves with calls in
// flight, random costs and settles above and below the charge — and
// checks, for every aligned window of true time: what the instances
// admitted (less what their limiters count as overdrawn, which a settle
// above the charge is the caller's to answer for) is no more than the
// window's counter, and the counter never went past the limit in force
// when it grew.
//
//	go test ./limiter/cluster -run 'TestBudgetOracle$' -budget.seed=N -v
//
// replays a seed.
var (
	budgetSeed = flag.Uint64("budget.seed", 0, "TestBudgetOracle: replay this seed only")
	budgetN    = flag.Int("budget.n", 300, "TestBudgetOracle: random histories to check")
)

func TestBudgetOracle(t *testing.T) {
	seeds := []uint64{*budgetSeed}
	if *budgetSeed == 0 {
		seeds = seeds[:0]
		base := rand.Uint64()
		for i := range *budgetN {
			seeds = append(seeds, base+uint64(i))
		}
		t.Logf("%d histories from seed %d", len(seeds), base)
	}
	for _, seed := range seeds {
		if p := runBudgetOracle(seed); p != "" {
			t.Fatal(p)
		}
	}
}

// fakeClock is true time plus the error of the machine's clock.
type fakeClock struct {
	h   *bhist
	err time.Duration
}

func (c *fakeClock) Now() time.Time { return time.Unix(0, c.h.now+int64(c.err)) }

// bstore is the model of etcd: the lane's limit and each window's
// counter, and the faults and races a take meets.
type bstore struct {
	h        *bhist
	limit    int64
	cfgRev   int64
	counters map[int64]*bcounter
}

type bcounter struct{ taken, rev int64 }

var errModel = errors.New("model: etcd did not answer")

func (s *bstore) read(_ context.Context, start int64) (budgetView, error) {
	switch s.h.rng.IntN(30) {
	case 0, 1:
		return budgetView{}, errModel
	case 2:
		return budgetView{}, fmt.Errorf("%w: model: the config is gone, or the counter malformed", errBudgetRecord)
	}
	c := s.counter(start)
	return budgetView{limit: s.limit, cfgRev: s.cfgRev, taken: c.taken, rev: c.rev}, nil
}

func (s *bstore) counter(start int64) *bcounter {
	c := s.counters[start]
	if c == nil {
		c = &bcounter{}
		s.counters[start] = c
	}
	return c
}

func (s *bstore) put(_ context.Context, start int64, v budgetView, taken int64) (bool, error) {
	h := s.h
	switch h.rng.IntN(12) {
	case 0:
		return false, errModel // lost on its way
	case 1:
		h.changeLimit() // an operator, between the read and the write
	case 2:
		// Another instance takes and spends it all meanwhile.
		c := s.counter(start)
		if k := min(int64(h.rng.IntN(5)+1), s.limit-c.taken); k > 0 {
			c.taken += k
			c.rev = h.nextRev()
			h.admit(start, k, "ghost")
		}
	}
	c := s.counter(start)
	if v.cfgRev != s.cfgRev || v.rev != c.rev {
		return false, nil
	}
	if taken > c.taken && taken > s.limit {
		h.fail("window %d: counter raised to %d past the limit %d", start, taken, s.limit)
	}
	c.taken, c.rev = taken, h.nextRev()
	if h.rng.IntN(20) == 0 {
		return false, errModel // written, and the answer lost
	}
	return true, nil
}

// binst is one process of an instance.
type binst struct {
	clk    *fakeClock
	multi  *limiter.Multi
	b      *budget
	grants []bgrant
}

type bgrant struct {
	g      limiter.Grant
	n      int64
	window int64 // the true window it was admitted in
}

type bhist struct {
	seed    uint64
	rng     *rand.Rand
	now     int64 // true time, Unix ns
	window  time.Duration
	u       time.Duration // clock uncertainty: every clock is within it
	store   *bstore
	insts   []*binst
	rev     int64
	admits  map[int64]int64 // admitted per true window
	log     []string
	problem string
}

func (h *bhist) nextRev() int64 { h.rev++; return h.rev }

func (h *bhist) fail(format string, args ...any) {
	if h.problem == "" {
		h.problem = fmt.Sprintf(format, args...)
	}
}

func (h *bhist) logf(format string, args ...any) {
	h.log = append(h.log, fmt.Sprintf("%14.6fs ", float64(h.now%int64(24*time.Hour))/1e9)+fmt.Sprintf(format, args...))
}

func (h *bhist) admit(window, n int64, who string) {
	h.admits[window] += n
	h.logf("%s admitted %d in window %d (now %d)", who, n, window, h.admits[window])
}

// settle settles gr at actual: the provider saw actual where n was
// admitted, less what the limiter counts as overdrawn (beyond its quota,
// the caller's to answer for: Grant.Settle).
func (h *bhist) settle(i int, lim *limiter.Limiter, gr bgrant, actual int64, when string) {
	over := lim.Stats().Overdrawn
	if err := gr.g.Settle(limiter.Cost(limiter.Requests, actual)); err != nil {
		return
	}
	drawn := lim.Stats().Overdrawn - over
	h.admits[gr.window] += actual - gr.n - drawn
	h.logf("instance %d settled %d of %d%s, %d overdrawn (window %d now %d)", i, actual, gr.n, when, drawn, gr.window, h.admits[gr.window])
}

func (h *bhist) changeLimit() {
	h.store.limit = int64(h.rng.IntN(200))
	h.store.cfgRev = h.nextRev()
	h.logf("limit set to %d", h.store.limit)
}

func (h *bhist) start(i int) {
	// The machine's clock is off by anything; the correction a clock
	// monitor applies leaves it within the uncertainty.
	clk := &fakeClock{h: h, err: time.Duration(h.rng.Int64N(int64(20*time.Minute))) - 10*time.Minute}
	m, err := limiter.NewMulti([]limiter.Limit{{Window: h.window}}, limiter.WithClock(clk))
	if err != nil {
		panic(err)
	}
	m.SetClockOffset(h.clockErr() - clk.err)
	m.SetClockUncertainty(h.u)
	h.insts[i] = &binst{clk: clk, multi: m, b: &budget{window: h.window}}
}

func (h *bhist) clockErr() time.Duration {
	if h.u == 0 {
		return 0
	}
	return time.Duration(h.rng.Int64N(2*int64(h.u)+1)) - h.u
}

func (h *bhist) trueWindow() int64 { return h.now - h.now%int64(h.window) }

func runBudgetOracle(seed uint64) string {
	rng := rand.New(rand.NewPCG(seed, seed^0xb0d6e7))
	windows := []time.Duration{2 * time.Hour, 6 * time.Hour, 24 * time.Hour}
	h := &bhist{seed: seed, rng: rng, window: windows[rng.IntN(len(windows))], admits: map[int64]int64{}}
	h.now = int64(1_800_000_000)*int64(time.Second) + rng.Int64N(int64(48*time.Hour))
	if rng.IntN(3) > 0 {
		h.u = time.Duration(rng.Int64N(int64(time.Minute)))
	}
	h.store = &bstore{h: h, counters: map[int64]*bcounter{}}
	h.changeLimit()
	h.insts = make([]*binst, 2+rng.IntN(4))
	for i := range h.insts {
		h.start(i)
	}
	ctx := context.Background()
	for range 400 {
		i := rng.IntN(len(h.insts))
		in := h.insts[i]
		lim := in.multi.Limiter(0)
		switch op := rng.IntN(100); {
		case op < 15:
			d := []int64{int64(time.Millisecond), int64(time.Second), int64(time.Minute), int64(time.Hour)}[rng.IntN(4)]
			h.now += rng.Int64N(10 * d)
		case op < 45:
			n := int64(1 + rng.IntN(8))
			if g, ok := in.multi.TryAcquire(limiter.Cost(limiter.Requests, n)); ok {
				w := h.trueWindow()
				in.grants = append(in.grants, bgrant{g: g, n: n, window: w})
				h.admit(w, n, fmt.Sprintf("instance %d", i))
			}
		case op < 55 && len(in.grants) > 0:
			k := rng.IntN(len(in.grants))
			gr := in.grants[k]
			in.grants = append(in.grants[:k], in.grants[k+1:]...)
			actual := rng.Int64N(gr.n + 1)
			if rng.IntN(2) == 0 {
				actual = gr.n + rng.Int64N(9) // a call that cost more than charged
			}
			h.settle(i, lim, gr, actual, "")
		case op < 70:
			// Waiters, whose need a take serves first.
			want, need := int64(rng.IntN(60)), int64(rng.IntN(60))
			got, err := in.b.acquire(ctx, h.store, lim, want, need)
			h.logf("instance %d asked for %d, needing %d: took %d (%d for window %d), err %v, quota %d", i, want, need, got, in.b.took, in.b.start, err, lim.Stats().Quota)
		case op < 85:
			got, err := in.b.step(ctx, h.store, lim, rng.IntN(2) == 0)
			h.logf("instance %d stepped: took %d (%d for window %d), err %v, quota %d", i, got, in.b.took, in.b.start, err, lim.Stats().Quota)
		case op < 89:
			in.multi.Close() // a crash: nothing given back
			h.logf("instance %d crashed", i)
			h.start(i)
		case op < 93:
			in.multi.Close()
			back := in.b.giveBack(ctx, h.store, lim)
			h.logf("instance %d left, giving back %d", i, back)
			// Calls in flight during the leave answer now, at any cost.
			for _, gr := range in.grants {
				h.settle(i, lim, gr, rng.Int64N(2*gr.n+1), " after leaving")
			}
			h.start(i)
		case op < 96:
			e := h.clockErr()
			in.multi.SetClockOffset(e - in.clk.err)
			h.logf("instance %d clock corrected to %v off", i, e)
		default:
			h.changeLimit()
		}
		if h.problem != "" {
			break
		}
	}
	for w, n := range h.admits {
		if c := h.store.counters[w]; n > 0 && (c == nil || n > c.taken) {
			var taken int64
			if c != nil {
				taken = c.taken
			}
			h.fail("window %d: admitted %d, counter %d", w, n, taken)
		}
	}
	for _, in := range h.insts {
		in.multi.Close()
	}
	if h.problem == "" {
		return ""
	}
	return fmt.Sprintf("seed %d: %s\nreplay: go test ./limiter/cluster -run 'TestBudgetOracle$' -budget.seed=%d -v\nwindow %v, clock uncertainty %v\nhistory:\n%s",
		seed, h.problem, seed, h.window, h.u, strings.Join(h.log, "\n"))
}
