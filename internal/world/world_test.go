package world

import (
	"cmp"
	"flag"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/ledger"
)

var (
	nFlag       = flag.Int("world.n", 200, "random histories TestHistories plays")
	seedFlag    = flag.Uint64("world.seed", 0, "first seed (0: drawn; printed either way)")
	memFlag     = flag.Int("world.members", 0, "members at the start (0: Config's default)")
	lossFlag    = flag.Float64("world.loss", 0.05, "chance that a write's answer is lost")
	refuseFlag  = flag.Float64("world.refuse", 0.03, "chance that a write is refused")
	skewFlag    = flag.Duration("world.skew", 0, "clock bound (0: Config's default)")
	horizonFlag = flag.Duration("world.horizon", 0, "granted ahead (0: Config's default)")
	offFlag     = flag.Duration("world.configdoff", 0, "every replica's clock this far off")
	lagFlag     = flag.Duration("world.lag", 0, "members' time to apply a change (0: 400ms in every fourth history)")
	repFlag     = flag.Int("world.replicas", 0, "configd replicas (0: Config's default)")
	faultsFlag  = flag.Duration("world.faults", 0, "how long faults are drawn (0: Config's default)")
	fixedFlag   = flag.Bool("world.fixed", false, "never change the window length")
	maxOpsFlag  = flag.Int("world.maxops", 0, "etcd's --max-txn-ops (0: 3 to 10 in every third history, else 128)")
	adaptFlag   = flag.Bool("world.adaptive", false, "every history adaptive (else every third)")
	critFlag    = flag.Int64("world.critical", 0, "critical's reserve in hundredths of a percent in every history not adaptive (0: 30% in every fifth)")
)

// drawn returns the Config TestHistories plays seed with, by its flags.
func drawn(seed uint64) Config {
	cfg := Config{Seed: seed, Loss: *lossFlag, Refuse: *refuseFlag, Members: *memFlag,
		SkewBound: *skewFlag, Horizon: *horizonFlag, ConfigdOff: *offFlag, ApplyLag: *lagFlag,
		Replicas: *repFlag, Faults: *faultsFlag, FixedWindow: *fixedFlag, MaxOps: *maxOpsFlag}
	if cfg.ApplyLag == 0 && seed%4 == 3 {
		cfg.ApplyLag = 400 * time.Millisecond
	}
	if cfg.MaxOps == 0 && seed%3 == 2 {
		// Publishes to more holders than a transaction holds.
		cfg.MaxOps = ledger.MinOps + int(seed/3%8)
	}
	cfg.Adaptive = *adaptFlag || seed%3 == 1
	if !cfg.Adaptive && (*critFlag > 0 || seed%5 == 4) {
		cfg.Critical = cmp.Or(*critFlag, 3000)
	}
	return cfg
}

// TestHistories plays random histories of the real ledger code under every
// fault the world draws; a failure prints its seed, and
// -world.n=1 -world.seed=SEED replays it exactly.
func TestHistories(t *testing.T) {
	n := *nFlag
	if (raceEnabled || testing.Short()) && !flagSet("world.n") {
		n = max(1, n/10)
	}
	first := *seedFlag
	if first == 0 {
		first = rand.Uint64() >> 1
	}
	t.Logf("seeds %d to %d (replay one: go test -run '^TestHistories$' ./internal/world -world.n=1 -world.seed=SEED -v)", first, first+uint64(n)-1)
	var windows, writes, classWindows int
	var worst float64
	var sum Result // the new faults' counts, summed
	for i := range n {
		seed := first + uint64(i)
		cfg := drawn(seed)
		if testing.Verbose() && n == 1 {
			cfg.Trace = func(s string) { t.Log(s) }
		}
		r := Run(cfg)
		windows += r.Windows
		writes += r.Writes
		classWindows += r.ClassWindows
		worst = max(worst, r.Worst)
		sum.add(r)
		if len(r.Violations) > 0 {
			t.Fatalf("%v\nreplay: go test -run '^TestHistories$' ./internal/world -world.n=1 -world.seed=%d -v", r, r.Seed)
		}
	}
	t.Logf("%d histories: %d windows checked, %d writes, none over; the fullest window at %.1f%% of its bound; %d members' windows that refused critical checked against their grants' reserve", n, windows, writes, 100*worst, classWindows)
	t.Logf("the provider deleted %d times, created again on the ledger %d times and on the shares %d; %d ledgers emptied, %d members followed across one; configd down %d times, %d writes of members standing in applied, %d refused for their size", sum.Deletes, sum.Creates, sum.Shares, sum.Emptied, sum.Across, sum.Outages, sum.StandIns, sum.StandInsTooLarge)
	t.Logf("%d top-ups of all a publish's holders; %d members left cleanly with their releases stored", sum.TopUpsOfAll, sum.Departed)
	if n >= 50 && sum.TopUpsOfAll == 0 {
		t.Errorf("%d histories wrote no top-up of all a publish's holders: the world does not reach them", n)
	}
	if n >= 50 && sum.Departed == 0 {
		t.Errorf("%d histories stored no clean leave's releases: the world does not reach them", n)
	}
}

// TestReplay: one seed gives one history, adaptive or not.
func TestReplay(t *testing.T) {
	for _, adaptive := range []bool{false, true} {
		cfg := Config{Seed: 42, Loss: 0.05, Refuse: 0.03, Adaptive: adaptive}
		a, b := Run(cfg), Run(cfg)
		if a.String() != b.String() || a.Admitted != b.Admitted || a.Writes != b.Writes || a.Refused != b.Refused {
			t.Fatalf("seed 42 (adaptive %v) played twice:\n%v\n%v", adaptive, a, b)
		}
		if a.Admitted == 0 || a.Writes == 0 {
			t.Fatalf("seed 42 (adaptive %v) admitted %d in %d writes: the world did nothing", adaptive, a.Admitted, a.Writes)
		}
	}
}

// TestAdaptiveFollowsTheProvider: in adaptive histories the provider
// pushes back and configd's controller moves the effective limit, down
// and back up, while no window goes over the ceiling or over an effective
// limit in force.
func TestAdaptiveFollowsTheProvider(t *testing.T) {
	var refused int64
	var moves int
	for seed := uint64(3100); seed < 3120; seed++ {
		r := Run(Config{Seed: seed, Loss: 0.05, Refuse: 0.03, Adaptive: true})
		if len(r.Violations) > 0 {
			t.Fatalf("%v", r)
		}
		refused += r.Refused
		moves += r.Moves
	}
	if refused == 0 || moves < 40 {
		t.Fatalf("20 adaptive histories: %d calls pushed back, %d moves of the effective limit: the controller did not follow the provider", refused, moves)
	}
	t.Logf("20 adaptive histories: %d calls pushed back, %d moves of the effective limit", refused, moves)
}

// TestConfigdClockFarOff: configd's clock minutes off costs windows, never
// the invariant.
func TestConfigdClockFarOff(t *testing.T) {
	for _, off := range []time.Duration{-3 * time.Minute, 3 * time.Minute} {
		r := Run(Config{Seed: 7, ConfigdOff: off})
		if r.Writes < 10 {
			t.Errorf("configd %v off: %d writes: configd did not act", off, r.Writes)
		}
		for _, v := range r.Violations {
			if len(v) > 0 && !contains(v, "liveness") {
				t.Errorf("configd %v off: %s", off, v)
			}
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func flagSet(name string) (set bool) {
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// TestOraclesCatchABrokenProtocol: the oracles find a history over the
// limit when one rule is broken, within a few random seeds.
func TestOraclesCatchABrokenProtocol(t *testing.T) {
	for _, rule := range []string{"unconditioned", "unenforced", "twice-ceiling", "own-part", "drop-reserve"} {
		t.Run(rule, func(t *testing.T) {
			for seed := uint64(1); seed <= 200; seed++ {
				// "twice-ceiling": configd plans an adaptive provider with
				// twice its ceiling.
				cfg := Config{Seed: seed, Loss: 0.05, Refuse: 0.03, Break: rule, Adaptive: rule == "twice-ceiling"}
				if rule == "own-part" || rule == "drop-reserve" {
					cfg.Critical = 3000
				}
				r := Run(cfg)
				for _, v := range r.Violations {
					if !contains(v, "liveness") {
						t.Logf("found after %d seeds: %s", seed, v)
						return
					}
				}
			}
			t.Errorf("200 seeds with the rule %q broken found no violation", rule)
		})
	}
}

// TestLostWritesLandLate: with a fifth of the answers lost, and half of
// those writes applied up to two windows later, after the writer's next
// write, no window goes over and the ledger never breaks.
func TestLostWritesLandLate(t *testing.T) {
	for seed := uint64(12001); seed < 12041; seed++ {
		if r := Run(Config{Seed: seed, Loss: 0.2, Refuse: 0.03}); len(r.Violations) > 0 {
			t.Fatalf("%v", r)
		}
	}
}

// TestSlowMembers: members that take 600 ms to apply a change release
// only what they enforced before its window began.
func TestSlowMembers(t *testing.T) {
	for seed := uint64(7100); seed < 7140; seed++ {
		if r := Run(Config{Seed: seed, Loss: 0.05, Refuse: 0.03, ApplyLag: 600 * time.Millisecond}); len(r.Violations) > 0 {
			t.Fatalf("%v", r)
		}
	}
}

// TestSlowMemberAppliesOneChangeAtATime: a member that takes 400 ms to
// apply a change computes the next only once the last is committed, as
// store.Follower does. Computed before, it enforced a view without the
// release just stored: 20 admitted where the ledger counted 17, 103 in a
// window of 100.
func TestSlowMemberAppliesOneChangeAtATime(t *testing.T) {
	cfg := drawn(5195409195541766455)
	if cfg.ApplyLag == 0 {
		t.Fatalf("the history plays no slow members")
	}
	r := Run(cfg)
	if len(r.Violations) > 0 {
		t.Fatalf("%v", r)
	}
	if r.Admitted < 1000 {
		t.Fatalf("%d admitted: the history did not play", r.Admitted)
	}
}

// TestAnEmptiedLedgerGrantsAfterItsLastGrant: the provider moves to the
// shares once its grants have ended, and comes back on the ledger with
// windows of 2 s. The ledger keeps its head, emptied, so the new era
// starts after the old grants' end. With the head's floors left where
// they were, the new era began in a window the old grants had used: 58
// admitted of 42.
func TestAnEmptiedLedgerGrantsAfterItsLastGrant(t *testing.T) {
	cfg := drawn(43245)
	cfg.Horizon = time.Second
	r := Run(cfg)
	if len(r.Violations) > 0 {
		t.Fatalf("%v", r)
	}
	if r.Emptied == 0 || r.Creates == 0 {
		t.Fatalf("emptied %d times, created again %d: the history did not move the provider", r.Emptied, r.Creates)
	}
}

// TestNoInstanceLeftWantsNoGrants: when every instance has crashed for
// good by the time the faults end, there is nobody to hand the limit to,
// and the liveness check asks for nothing.
func TestNoInstanceLeftWantsNoGrants(t *testing.T) {
	s := &Script{Duration: 4 * time.Second,
		Groups: []Group{{Name: "a", Count: 1, Demand: 500}},
		Events: []Event{{At: 2 * time.Second, Kind: EventCrash, Group: "a"}}}
	r := Run(Config{Seed: 3, Limit: 600, Window: 250 * time.Millisecond, Script: s})
	if len(r.Violations) > 0 {
		t.Fatalf("%v", r)
	}
	if r.Admitted == 0 {
		t.Fatalf("the instances admitted nothing before they crashed: the history did not play")
	}
	if r.Live {
		t.Errorf("the liveness check ran with no instance to grant to")
	}
}

// TestDeletionsAndStandInsOccur: the random histories delete the
// provider and create it again, on the ledger and through the shares
// (emptying the ledger), with members that follow a ledger across; and they stop configd, with members standing in.
func TestDeletionsAndStandInsOccur(t *testing.T) {
	var sum Result
	for seed := uint64(1); seed <= 60; seed++ {
		r := Run(Config{Seed: seed, Loss: 0.05, Refuse: 0.03})
		if len(r.Violations) > 0 {
			t.Fatalf("%v", r)
		}
		sum.add(r)
	}
	t.Logf("60 histories: %d deletions, %d created on the ledger, %d on the shares, %d ledgers emptied, %d members across one, %d outages of configd, %d stand-in writes", sum.Deletes, sum.Creates, sum.Shares, sum.Emptied, sum.Across, sum.Outages, sum.StandIns)
	for what, n := range map[string]int{"deletion": sum.Deletes, "creation on the ledger": sum.Creates, "creation on the shares": sum.Shares,
		"ledger emptied": sum.Emptied, "member across an emptied ledger": sum.Across, "outage of configd": sum.Outages, "stand-in write": sum.StandIns} {
		if n == 0 {
			t.Errorf("60 histories drew no %s", what)
		}
	}
}
