package round

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/schema"
)

// slackFleet is ten instances flooding batch under a limit of 1,000,
// critical reserving 10% (100), run through configd's rounds: Target,
// Policy with its reserves, Plan until a round writes nothing (as
// Publisher.Rounds does), then the holders' releases (State.ToRelease,
// as a Follower writes them).
type slackFleet struct {
	t    *testing.T
	cfg  schema.ProviderConfig
	live []schema.InstanceRecord
	s    *ledger.State
	now  int64
}

func newSlackFleet(t *testing.T) *slackFleet {
	f := &slackFleet{t: t, s: ledger.NewState(), now: ledger.StartOf(1000, time.Second),
		cfg: schema.ProviderConfig{Version: 1, Name: "api", Limit: 1000, Window: schema.Duration(time.Second),
			Algorithm: schema.AlgorithmFair, Coordination: schema.CoordinationLedger,
			Classes: []schema.Class{{Name: "critical", Reserve: schema.Reserve{Share: 1000}}, {Name: "batch"}}}}
	f.live = make([]schema.InstanceRecord, 10)
	for i := range f.live {
		f.live[i] = schema.InstanceRecord{ID: fmt.Sprintf("i%02d", i), Holder: fmt.Sprintf("h%02d", i)}
	}
	return f
}

// ask has critical asked 200 a window on instances from..to-1, batch
// 1,000 on each.
func (f *slackFleet) ask(from, to int) {
	for i := range f.live {
		f.live[i].Demand, f.live[i].ClassDemand = 1000, map[string]int64{"batch": 1000}
		if i >= from && i < to {
			f.live[i].Demand += 200
			f.live[i].ClassDemand["critical"] = 200
		}
	}
}

// rounds runs n of configd's rounds, the holders releasing after each,
// and returns Target's reserves of the last.
func (f *slackFleet) rounds(n int) (want map[string]map[string]int64) {
	for range n {
		target, reserves, err := Target(f.cfg, f.live)
		if err != nil {
			f.t.Fatal(err)
		}
		p := Policy(f.cfg)
		p.Reserves = reserves
		for range 8 {
			c, err := ledger.Plan(f.s, p, target, f.now)
			if err != nil {
				f.t.Fatal(err)
			}
			if c.Empty() {
				break
			}
			f.s.Commit(c)
		}
		for _, rec := range f.live {
			for _, rel := range f.s.ToRelease(rec.Holder, f.now, 0) {
				f.s.Apply(rel)
			}
		}
		f.now += int64(Tick(time.Second))
		want = reserves
	}
	return want
}

// kept returns what the holders where critical is asked (from..to-1)
// keep for it in the current window, each its newest grant's reserve
// within its allowance (State.Reserves, as memberClasses gives the
// limiter), and what every grant reserves.
func (f *slackFleet) kept(from, to int) (sum int64, held []string) {
	e, _ := f.s.Head.Current()
	k := ledger.WindowOf(f.now, time.Second)
	for i, rec := range f.live {
		res, _ := f.s.Reserves(rec.Holder, f.now)
		c := res["critical"]
		if c > 0 {
			held = append(held, fmt.Sprintf("%s:%d", rec.Holder, c))
		}
		if i >= from && i < to {
			sum += min(c, f.s.Allowance(rec.Holder, e.Seq, k))
		}
	}
	return sum, held
}

// TestAReserveSplitWithinTheSlackIsPublished: critical reserves 10%
// (100 of 1,000) and is asked 200 a window on each of five of ten
// instances: Target gives each of the five 20 of its reserve, no more
// than the slack (2% of the limit) by which a holder's part may lag.
// The fleet must still keep the whole 100 for critical where it is
// asked, whether it comes to be asked after a publish without it or
// moves to five other instances.
func TestAReserveSplitWithinTheSlackIsPublished(t *testing.T) {
	t.Run("comes to be asked", func(t *testing.T) {
		f := newSlackFleet(t)
		f.ask(0, 0)
		f.rounds(8) // two windows with critical idle
		f.ask(0, 5)
		want := f.rounds(40) // ten windows
		got, held := f.kept(0, 5)
		t.Logf("Target's reserves %v, Policy's slack %d; the grants reserve %v", want, Policy(f.cfg).Slack, held)
		if got < 100 {
			t.Errorf("ten windows after critical came to ask 1,000 a window, the fleet keeps %d of its reserve 100 for it", got)
		}
	})
	t.Run("moves", func(t *testing.T) {
		f := newSlackFleet(t)
		f.ask(0, 5)
		f.rounds(8)
		if got, held := f.kept(0, 5); got < 100 {
			t.Fatalf("critical asked from the start: the fleet keeps %d (%v)", got, held)
		}
		f.ask(5, 10)
		want := f.rounds(40)
		got, held := f.kept(5, 10)
		t.Logf("Target's reserves %v; the grants reserve %v", want, held)
		if got < 100 {
			t.Errorf("ten windows after critical moved to five other instances, they keep %d of its reserve 100 for it; the grants still reserve %v", got, held)
		}
	})
}

// churn runs configd's rounds (Target, Policy with its reserves, Plan
// until a round writes nothing, as Publisher.Rounds does) for 120 rounds,
// four a window, over n instances that all flood batch, the holders
// writing the releases their newest grants ask (State.ToRelease, as a
// Follower does) after each round. Critical, when classes is set, is
// asked on two of them, its smoothed demand wiggling by ±7% around 400:
// the jitter TestJitteringDemandsKeepGrantsWithinTheHorizon assumes, and
// the same as each instance's total. It returns the publishes (not
// top-ups) written, and the etcd operations of configd's transactions
// and of the holders' releases.
func churn(t *testing.T, n int, classes bool) (pubs, ops int, why []string) {
	const win = time.Second
	cfg := schema.ProviderConfig{Version: 1, Name: "api", Limit: 1000, Window: schema.Duration(win),
		Algorithm: schema.AlgorithmFair, Coordination: schema.CoordinationLedger}
	if classes {
		cfg.Classes = []schema.Class{{Name: "critical", Reserve: schema.Reserve{Share: 6000}}, {Name: "batch"}}
	}
	rng := rand.New(rand.NewPCG(7, 7))
	live := make([]schema.InstanceRecord, n)
	for i := range live {
		live[i] = schema.InstanceRecord{ID: fmt.Sprintf("i%02d", i), Holder: fmt.Sprintf("h%02d", i)}
	}
	s := ledger.NewState()
	now := ledger.StartOf(1000, win)
	for r := range 120 {
		for i := range live {
			crit := int64(0)
			if i < 2 {
				crit = 372 + rng.Int64N(57) // 400 ± 7%
			}
			live[i].Demand = 1000 + crit
			if classes {
				live[i].ClassDemand = map[string]int64{"batch": 1000}
				if crit > 0 {
					live[i].ClassDemand["critical"] = crit
				}
			}
		}
		target, reserves, err := Target(cfg, live)
		if err != nil {
			t.Fatal(err)
		}
		p := Policy(cfg)
		p.Reserves = reserves
		for range 8 {
			c, err := ledger.Plan(s, p, target, now)
			if err != nil {
				t.Fatalf("round %d: %v", r, err)
			}
			if c.Empty() {
				break
			}
			ops += c.Size()
			for _, pub := range c.Pubs {
				if _, had := s.Pubs[pub.Seq]; !had && !pub.TopUp {
					pubs++
					why = append(why, fmt.Sprintf("round %d: reserves %v", r, reserves))
				}
			}
			s.Commit(c)
		}
		for _, rec := range live {
			for _, rel := range s.ToRelease(rec.Holder, now, 0) {
				s.Apply(rel)
				ops++
			}
		}
		if vs := ledger.Audit(s); len(vs) > 0 {
			t.Fatalf("round %d: %v", r, vs)
		}
		now += int64(Tick(win))
	}
	return pubs, ops, why
}

// TestJitteringClassDemandsDoNotRepublish: the slack (2% of the limit)
// keeps demands that jitter from making a publish every round: with ±7%
// jitter of every instance's demand a provider without classes writes
// one publish in 30 windows. So must one whose critical reserves 60% and
// is asked, jittering alike, on two instances: their parts of the
// reserve (300 each) and the shares raised to hold them stay put while
// the demands stay above them.
func TestJitteringClassDemandsDoNotRepublish(t *testing.T) {
	for _, n := range []int{4, 40} {
		plain, plainOps, _ := churn(t, n, false)
		withClasses, ops, why := churn(t, n, true)
		t.Logf("%d instances, 120 rounds (30 windows): %d publishes, %d operations without classes; %d publishes, %d operations with critical=60%% asked on two",
			n, plain, plainOps, withClasses, ops)
		if withClasses > plain+2 {
			for _, w := range why[:min(len(why), 4)] {
				t.Log(w)
			}
			t.Errorf("%d instances: class demands jittering ±7%% made %d publishes (%d operations) in 30 windows, against %d (%d) for the same jitter without classes",
				n, withClasses, ops, plain, plainOps)
		}
	}
}

// TestAReserveAboveItsDemandDoesNotRepublishOnEveryJitter: critical
// reserves 60% of 1,000 and is asked about 40 a window on each of five
// of ten instances (some 200 in all, under its reserve of 600), every
// instance flooding batch. Below its reserve a class keeps what it
// wants, so its parts follow the smoothed demands; a demand that moves by
// two permits on one instance (a move the member reports at once) must
// not be a new publish to all ten holders: the slack (2% of the limit)
// forgives it, as it forgives a jittering quota.
func TestAReserveAboveItsDemandDoesNotRepublishOnEveryJitter(t *testing.T) {
	for _, jitter := range []int64{0, 2} {
		f := newSlackFleet(t)
		f.cfg.Classes[0].Reserve.Share = 6000 // 60%
		f.ask(0, 5)
		for i := range 5 {
			f.live[i].ClassDemand["critical"] = 40
			f.live[i].Demand = 1040
		}
		f.rounds(8)
		pubs := 0
		seen := map[int64]bool{}
		for _, p := range f.s.Pubs {
			seen[p.Seq] = true
		}
		for r := range 40 { // ten windows
			// One instance's smoothed critical demand moves by jitter.
			f.live[r%5].ClassDemand["critical"] = 40 + jitter*int64(r%2)
			f.rounds(1)
			for _, p := range f.s.Pubs {
				if !seen[p.Seq] {
					seen[p.Seq] = true
					if !p.TopUp {
						pubs++
					}
				}
			}
		}
		t.Logf("jitter %d: %d new publishes in 40 rounds (10 windows)", jitter, pubs)
		if jitter > 0 && pubs > 2 {
			t.Errorf("critical's demand, far under its reserve, moving by %d permits on one of ten instances: %d publishes of all ten holders in 10 windows (%d with no jitter)", jitter, pubs, 0)
		}
	}
}
