package sim

import (
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/follow"
	"github.com/sluice-go/sluice/internal/share"
)

// moves is contention: b's demand rises while a keeps using all it has, so
// a must shrink while it still admits its old share; publishes often arrive
// after their EffectiveFrom, admissions are bunched. The case a handover
// must get right.
func moves(t *testing.T) Scenario {
	t.Helper()
	sc, err := ParseScenario(strings.NewReader(`{
		"name": "moves", "seed": 42, "limit": 1000, "duration": "60s",
		"admissions": "bunched",
		"publish_delay": {"min": "1ms", "max": "2500ms"},
		"groups": [
			{"name": "a", "count": 1, "demand": 900},
			{"name": "b", "count": 1, "demand": 50},
			{"name": "rest", "count": 4, "demand": 10}
		],
		"events": [
			{"at": "15s", "kind": "demand", "group": "b", "demand": 900},
			{"at": "25s", "kind": "demand", "group": "b", "demand": 50},
			{"at": "35s", "kind": "demand", "group": "b", "demand": 900},
			{"at": "45s", "kind": "demand", "group": "b", "demand": 50}
		]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func TestDeterministic(t *testing.T) {
	sc := moves(t)
	r1, err := Run(sc)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := Run(sc)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r1, r2) {
		t.Fatalf("two runs of one scenario differ:\n%+v\n%+v", r1, r2)
	}
	sc.Seed++
	r3, _ := Run(sc)
	if reflect.DeepEqual(r1, r3) {
		t.Errorf("another seed gave the very same report; is the seed used?")
	}
}

// TestHandoverInvariant: the real handover keeps every aligned window
// within the limit; one that grows shares before the shrinks are
// acknowledged (it publishes the target at once) is caught as overshoot.
func TestHandoverInvariant(t *testing.T) {
	greedy := func(total int64, target, bound map[string]int64) (map[string]int64, map[string]int64) {
		return maps.Clone(target), maps.Clone(target) // grows before anyone shrank
	}
	forget := func(s share.Standing) int64 { // forgets unacknowledged grants
		if !s.Named {
			return 0
		}
		return s.Share
	}
	var greedyOver, forgetOver int
	for seed := uint64(1); seed <= 5; seed++ {
		sc := moves(t)
		sc.Seed = seed
		r, err := Run(sc)
		if err != nil {
			t.Fatal(err)
		}
		if r.Over != 0 {
			t.Fatalf("seed %d, real handover: %d windows over the limit (most %d of %d)", seed, r.Over, r.MaxAdmitted, r.MaxLimit)
		}
		if r, err = (&Sim{Scenario: sc, Handover: greedy}).Run(); err != nil {
			t.Fatal(err)
		}
		greedyOver += r.Over
		if r, err = (&Sim{Scenario: sc, Bound: forget}).Run(); err != nil {
			t.Fatal(err)
		}
		forgetOver += r.Over
	}
	if greedyOver == 0 {
		t.Errorf("a handover that grows at once was not detected as overshoot")
	}
	if forgetOver == 0 {
		t.Errorf("a bound that ignores grants was not detected as overshoot")
	}
	t.Logf("windows over the limit in 5 seeds: greedy handover %d, forgetful bound %d", greedyOver, forgetOver)
}

// TestSourceSwitch: coming back from the even fallback (every configd
// down, then back), the real switch rule (follow.Schedule: the smaller
// quota at once, the new one from a boundary the margin ahead) keeps every
// window within the limit; switching at once to a share whose boundary has
// passed lets the instances still on the even split and those back on
// shares admit together, and is caught as overshoot.
func TestSourceSwitch(t *testing.T) {
	sc, err := ParseScenario(strings.NewReader(`{
		"name": "switch", "seed": 8, "limit": 1000, "duration": "90s", "admissions": "bunched",
		"publish_delay": {"min": "2ms", "max": "400ms"},
		"groups": [
			{"name": "a", "count": 1, "demand": 900},
			{"name": "rest", "count": 9, "demand": 10}
		],
		"events": [
			{"at": "30500ms", "kind": "outage", "down": "30s"},
			{"at": "35s", "kind": "demand", "group": "rest", "demand": 100}
		]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	abrupt := func(prev, next follow.Applied, _ follow.InForce, at, now int64, margin time.Duration) follow.Step {
		if at == 0 {
			at = follow.NextBoundary(now+int64(margin), int64(next.Window))
		}
		return follow.Step{From: at} // no cut, no wait for the others
	}
	var abruptOver int
	for seed := uint64(1); seed <= 5; seed++ {
		sc.Seed = seed
		r, err := Run(sc)
		if err != nil {
			t.Fatal(err)
		}
		if r.Over != 0 {
			t.Fatalf("seed %d, real switch rule: %d windows over the limit (most %d of %d)", seed, r.Over, r.MaxAdmitted, r.MaxLimit)
		}
		if r, err = (&Sim{Scenario: sc, Schedule: abrupt}).Run(); err != nil {
			t.Fatal(err)
		}
		abruptOver += r.Over
	}
	if abruptOver == 0 {
		t.Errorf("switching sources at once was not detected as overshoot")
	}
	t.Logf("windows over the limit in 5 seeds with an abrupt switch: %d", abruptOver)
}

// TestHandChecked: two instances under "even" split 100 as 50/50 whatever
// their demand. a offers 80 and admits 50; b offers 10 and admits 10: every
// window admits 60 of min(100, 90), utilization 2/3. b joins at 2s (0
// before the first publish that names it) and the warm-up hides that.
func TestHandChecked(t *testing.T) {
	sc, err := ParseScenario(strings.NewReader(`{
		"name": "hand", "limit": 100, "algorithm": "even", "duration": "20s", "warmup": "5s",
		"publish_delay": {"min": "10ms", "max": "10ms"}, "ack_delay": {"min": "10ms", "max": "10ms"},
		"groups": [
			{"name": "a", "count": 1, "demand": 80},
			{"name": "b", "count": 1, "demand": 10, "join": "2s"}
		]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(sc)
	if err != nil {
		t.Fatal(err)
	}
	if r.Windows != 15 || r.MaxAdmitted != 60 || r.Over != 0 || r.Instances != 2 {
		t.Fatalf("got windows %d, max %d, over %d, instances %d; want 15, 60, 0, 2", r.Windows, r.MaxAdmitted, r.Over, r.Instances)
	}
	if d, m := r.Utilization-60.0/90, r.MinUtil-60.0/90; d > 1e-9 || d < -1e-9 || m > 1e-9 || m < -1e-9 {
		t.Fatalf("utilization %v (min %v), want 2/3", r.Utilization, r.MinUtil)
	}
	// One publish when a joins alone (100/0 is all of it), one when b's
	// record lands (a shrinks to 50, b waits at 0), one once a's shrink is
	// acknowledged and in effect (b grows to 50).
	if r.Publishes != 3 {
		t.Errorf("publishes %d, want 3", r.Publishes)
	}
}

// TestSkewCounting: one instance holding the whole limit, its clock 250ms
// late: each aligned window gets the last quarter of one local window and
// the first three quarters of the next — 25 + 75 when spread, 100 from one
// local window when bunched — so always exactly the limit.
func TestSkewCounting(t *testing.T) {
	for _, mode := range []string{AdmitSpread, AdmitBunched} {
		sc, err := ParseScenario(strings.NewReader(`{
			"name": "skew", "limit": 100, "duration": "10s", "warmup": "3s", "admissions": "` + mode + `",
			"groups": [{"name": "a", "count": 1, "demand": 500, "skew": "250ms"}]
		}`))
		if err != nil {
			t.Fatal(err)
		}
		r, err := Run(sc)
		if err != nil {
			t.Fatal(err)
		}
		if r.MaxAdmitted != 100 || r.MinUtil != 1 || r.Over != 0 {
			t.Errorf("%s: max %d, min utilization %v, over %d; want 100, 1, 0", mode, r.MaxAdmitted, r.MinUtil, r.Over)
		}
	}
}

func TestParseScenarioErrors(t *testing.T) {
	for _, in := range []string{
		`{"name": "x", "limit": 10, "groups": [{"name": "a", "count": 1}], "bogus": 1}`,
		`{"name": "x", "limit": 0, "groups": [{"name": "a", "count": 1}]}`,
		`{"name": "x", "limit": 10, "groups": [{"name": "a", "count": 1, "skew": "600ms"}]}`,
		`{"name": "x", "limit": 10, "groups": [{"name": "a", "count": 1}], "events": [{"at": "1s", "kind": "demand", "group": "zz"}]}`,
		`{"name": "x", "limit": 10, "window": "1 s", "groups": [{"name": "a", "count": 1}]}`,
	} {
		if _, err := ParseScenario(strings.NewReader(in)); !errors.Is(err, ErrScenario) {
			t.Errorf("%s: err %v, want ErrScenario", in, err)
		}
	}
}
