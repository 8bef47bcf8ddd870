package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestASmallLoweringKeepsGranting: a limit lowered by less than the
// slack leaves the target matching the open publish, whose grants no
// longer fit under it; a new publish takes over where it cannot extend.
func TestASmallLoweringKeepsGranting(t *testing.T) {
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 3, Slack: 2}
	tgt := map[string]int64{"a": 25, "b": 25, "c": 25, "d": 25}
	plan(t, s, p, tgt, 10)
	p.Limit = 96
	p.Slack = 96 / 50
	tgt = map[string]int64{"a": 24, "b": 24, "c": 24, "d": 24}
	for k := int64(10); k < 40; k++ {
		plan(t, s, p, tgt, k)
	}
	if got := s.Sum(1, 40); got < 90 {
		t.Errorf("30 windows after lowering the limit 100->96, window 40 holds %d of 96", got)
	}
}

// TestOutOfRangeWindowsAreRefused: a horizon or a publish end so far out
// that a window's start overflows would blind the checks of eras;
// Plan refuses such a horizon and the codec such a publish.
func TestOutOfRangeWindowsAreRefused(t *testing.T) {
	s := NewState()
	p := Policy{Limit: 100, Window: 2 * time.Second, Horizon: int64(4 * time.Second), Keep: 3}
	if _, err := Plan(s, p, map[string]int64{"a": 100}, StartOf(900_000_000, p.Window)); !errors.Is(err, ErrInvalid) {
		t.Errorf("Plan with a horizon of %d windows: %v, want ErrInvalid", p.Horizon, err)
	}
	b, _ := json.Marshal(Pub{Seq: 1, Era: 1, Window: 2 * time.Second, A: 900_000_000, B: 4_900_000_000})
	if err := Keys("L/").Decode(s, Keys("L/").Pub(1), b); !errors.Is(err, ErrInvalid) {
		t.Errorf("a publish ending at window 4,900,000,000 of 2s: %v, want ErrInvalid", err)
	}
}

// TestAuditSeesAnEndAtTheLastWindow: a hand-written grant running to the
// last window must not slip past Audit, nor let Plan grant beside it.
func TestAuditSeesAnEndAtTheLastWindow(t *testing.T) {
	s := NewState()
	s.Head = Head{Seq: 1, Eras: []Era{{Seq: 1, Window: w, Start: 0, Limits: []Step{{0, 100}}}}}
	s.Pubs[1] = Pub{Seq: 1, Era: 1, Window: w, A: 5, B: math.MaxInt64}
	s.Grants[GrantKey{1, "x"}] = Grant{Pub: 1, Holder: "x", Quota: 1000, From: 5}
	if vs := Audit(s); len(vs) == 0 {
		t.Errorf("a grant of 1000/window against a limit of 100 passes Audit (Sum(10)=%d, Profile=%v)", s.Sum(1, 10), s.Profile(1))
	}
	c, err := Plan(s, Policy{Limit: 100, Window: w, Horizon: 4, Keep: 3}, map[string]int64{"y": 100}, StartOf(10, w))
	if err == nil {
		apply(s, c)
		t.Errorf("Plan accepts it and grants more: %v; window 12 now holds %d", c.Why, s.Sum(1, 12))
	}
}

// TestAViewNeverPairsAGrantWithAnotherPublish: a member whose watch of
// publishes runs ahead of its watch of grants must never pair an old
// grant with a new publish of the same number: numbers are not reused,
// also once every publish has gone.
func TestAViewNeverPairsAGrantWithAnotherPublish(t *testing.T) {
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 3}
	seen := map[int64]Pub{}
	grants := map[GrantKey]Grant{}
	note := func() {
		for q, pb := range s.Pubs {
			if old, ok := seen[q]; ok && old != pb {
				t.Errorf("publish %d reused: was %+v, now %+v", q, old, pb)
			}
			seen[q] = pb
		}
		for key, g := range s.Grants {
			grants[key] = g
		}
	}
	plan(t, s, p, map[string]int64{"a": 50, "b": 50}, 10)
	note()
	p.Limit = 200
	plan(t, s, p, map[string]int64{"a": 100, "b": 100}, 11)
	note()
	p.Limit = 300
	plan(t, s, p, map[string]int64{"a": 150, "b": 150}, 12)
	note()
	for i := int64(1); i <= 6; i++ {
		p.Limit = 300 + 100*i
		plan(t, s, p, map[string]int64{"a": p.Limit / 2, "b": p.Limit / 2}, 12+i)
		note()
	}
	before := s.Clone() // a member's view: every record up to here
	t.Logf("head %d, pubs %v", s.Head.Seq, s.Pubs)
	for k := int64(40); k < 41; k++ { // nobody registered: empty target
		plan(t, s, p, nil, k)
	}
	t.Logf("after collection: head %d, pubs %v", s.Head.Seq, s.Pubs)
	c := plan(t, s, p, map[string]int64{"a": 10, "b": p.Limit - 10}, 41)
	t.Logf("%v", c.Why)
	note()
	// Member a's view: the pub watch delivered the publishes' deletion
	// and the new ones; the grant watch (a separate watcher, whose events
	// may come later) has not yet delivered grant/a/<seq>'s deletion.
	view := before.Clone()
	for q := range before.Pubs {
		delete(view.Pubs, q)
	}
	for q, pb := range s.Pubs {
		view.Pubs[q] = pb
	}
	now := StartOf(42, w)
	got := view.Allowance("a", s.Head.Eras[len(s.Head.Eras)-1].Seq, 42)
	want := s.Allowance("a", s.Head.Eras[len(s.Head.Eras)-1].Seq, 42)
	pieces, _ := view.Schedule("a", now)
	if got > want {
		t.Errorf("a's view lets it admit %d in window 42 (schedule %v); etcd grants it %d; window 42 sums to %d in etcd, limit %d", got, pieces, want, s.Sum(s.Head.Eras[len(s.Head.Eras)-1].Seq, 42), p.Limit)
	}
}

// TestALateReleaseOfAPublishGoneCapsNothing: publish numbers come from
// the head's counter, so a release of a publish that went, landing late,
// names no publish of today; Plan deletes it.
func TestALateReleaseOfAPublishGoneCapsNothing(t *testing.T) {
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 3}
	plan(t, s, p, map[string]int64{"a": 50, "b": 50}, 10)
	for i := int64(1); i <= 6; i++ {
		p.Limit = 100 + 100*i
		plan(t, s, p, map[string]int64{"a": p.Limit / 2, "b": p.Limit / 2}, 10+i)
	}
	used := s.Head.Pubs
	plan(t, s, p, nil, 40) // everything goes
	plan(t, s, p, map[string]int64{"a": p.Limit / 2, "b": p.Limit / 2}, 41)
	for q := range s.Pubs {
		if q <= used {
			t.Fatalf("publish %d after the gap: numbers up to %d were used before", q, used)
		}
	}
	s.Apply(Release{Pub: used, Holder: "a", From: 12, Limit: 0}) // lost, lands now
	plan(t, s, p, map[string]int64{"a": p.Limit / 2, "b": p.Limit / 2}, 42)
	e, _ := s.Head.Current()
	if got := s.Allowance("a", e.Seq, 43); got != p.Limit/2 {
		t.Errorf("a holds %d in window 43, want its target %d", got, p.Limit/2)
	}
	if _, left := s.Releases[GrantKey{used, "a"}]; left {
		t.Errorf("the release of publish %d, gone, is still in the ledger", used)
	}
}

// TestAPublishLargerThanATransactionIsWrittenAhead: with five operations
// a transaction, a publish to ten holders writes their grants ahead of it
// over several changes; none counts before the publish is written, a
// changed target starts the grants over under a new number, the one
// abandoned never counts, and its grants go.
func TestAPublishLargerThanATransactionIsWrittenAhead(t *testing.T) {
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 2, MaxOps: 5}
	target := func(q int64) map[string]int64 {
		m := map[string]int64{}
		for i := range 10 {
			m[fmt.Sprintf("h%d", i)] = q
		}
		return m
	}
	for i := range 12 {
		q := int64(10)
		if i < 2 {
			q = 5 // the target moves after two changes
		}
		c := plan(t, s, p, target(q), 10)
		if c.Size() > p.MaxOps {
			t.Fatalf("change %d: %d operations: %v", i, c.Size(), c.Why)
		}
		if len(s.Pubs) == 0 && s.Sum(1, 10) != 0 {
			t.Fatalf("change %d: grants of no publish count %d", i, s.Sum(1, 10))
		}
	}
	if got := s.Sum(1, 10); got != 100 {
		t.Errorf("the ten holders hold %d in window 10, want 100", got)
	}
	for key := range s.Grants {
		if _, ok := s.Pubs[key.Pub]; !ok {
			t.Errorf("grant of %s in publish %d, never written, is still there", key.Holder, key.Pub)
		}
	}
	for _, n := range []int{MinOps - 1, MaxOps + 1} {
		if _, err := Plan(s, Policy{Limit: 100, Window: w, Horizon: 4, MaxOps: n}, target(10), StartOf(10, w)); !errors.Is(err, ErrInvalid) {
			t.Errorf("a policy of %d operations a transaction: %v, want ErrInvalid", n, err)
		}
	}
}

// TestGrantsWrittenAheadDoNotCrossAnEra: grants written ahead under 1s
// windows count their first window in 1s windows; once the window is 2s,
// a publish of 2s windows must not adopt them.
func TestGrantsWrittenAheadDoNotCrossAnEra(t *testing.T) {
	s := NewState()
	target := map[string]int64{}
	for i := range 10 {
		target[fmt.Sprintf("h%d", i)] = 10
	}
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 2, MaxOps: 5}
	if c := plan(t, s, p, target, 10); len(c.Grants) == 0 || len(c.Pubs) != 0 {
		t.Fatalf("the first change wrote no grants ahead: %v", c.Why)
	}
	p.Window = 2 * w
	for i := range 12 {
		plan(t, s, p, target, 5+int64(i)/4)
	}
	for key, g := range s.Grants {
		if pb, ok := s.Pubs[key.Pub]; ok && (g.From < pb.A || g.From > pb.B) {
			t.Errorf("grant of %s from window %d in publish %d of windows %d..%d", g.Holder, g.From, pb.Seq, pb.A, pb.B)
		}
	}
	if e, _ := s.Head.Current(); s.Sum(e.Seq, 8) != 100 {
		t.Errorf("the ten holders hold %d in window 8, want 100", s.Sum(e.Seq, 8))
	}
}

// TestTargetsThatKeepMovingStayWithinTheHorizon: ten holders whose
// targets move past the slack four times a window. A new publish starts
// after the open one ends, so one started while the open one had not
// begun ran a window further each round: the grants must stay within
// the horizon and one window, and the holders keep being granted.
func TestTargetsThatKeepMovingStayWithinTheHorizon(t *testing.T) {
	s := NewState()
	p := Policy{Limit: 1000, Window: w, Horizon: 6, Keep: 3, Slack: 20}
	rng := rand.New(rand.NewPCG(33, 7))
	k0 := int64(100)
	pubs, grants, seen := 0, 0, map[int64]bool{}
	for r := range 160 { // 40 windows
		tgt := map[string]int64{}
		for i := range 10 {
			tgt[fmt.Sprintf("h%d", i)] = 40 + rng.Int64N(60)
		}
		k := k0 + int64(r/4)
		c, err := Plan(s, p, tgt, StartOf(k, w)+int64(r%4)*int64(w)/4)
		if err != nil {
			t.Fatal(err)
		}
		apply(s, c)
		for _, pb := range c.Pubs {
			if !pb.TopUp && !seen[pb.Seq] {
				pubs++
			}
			seen[pb.Seq] = true
		}
		grants += len(c.Grants)
		for _, pb := range s.Pubs {
			if pb.B > k+p.Horizon+1 {
				t.Fatalf("round %d, window %d: publish %d runs to window %d, %d windows ahead; the horizon is %d", r, k, pb.Seq, pb.B, pb.B-k, p.Horizon)
			}
		}
		if vs := Audit(s); len(vs) > 0 {
			t.Fatalf("round %d: %v", r, vs)
		}
	}
	k := k0 + 40
	if got := s.Sum(s.Head.Eras[len(s.Head.Eras)-1].Seq, k); got < 400 {
		t.Errorf("window %d holds %d of 1000 after 40 windows of moving targets of 400 to 1000", k, got)
	}
	t.Logf("160 rounds: %d publishes, %d grants written", pubs, grants)
}

// TestAPlanThatChangesNothingWritesNothing: a round that finds no
// publish to start and no room to top up would only bump the head; it
// writes nothing, and still says why.
func TestAPlanThatChangesNothingWritesNothing(t *testing.T) {
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 3}
	plan(t, s, p, map[string]int64{"a": 50}, 10)
	plan(t, s, p, map[string]int64{"a": 40}, 10) // the next publish, from window 15
	c, err := Plan(s, p, map[string]int64{"a": 30}, StartOf(10, w))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Empty() || c.Size() != 1 {
		t.Errorf("a round with nothing to change writes the head: %d operations, why %v", c.Size(), c.Why)
	}
	if len(c.Why) == 0 {
		t.Errorf("an empty round does not say why it wrote nothing")
	}
}

// TestAnEraKeepsTheLargestClockBound: the era records the most a holder's
// clock may be off (Policy.Bound), raised by a larger one and never
// lowered: holders that read the old bound may still keep it.
func TestAnEraKeepsTheLargestClockBound(t *testing.T) {
	s := NewState()
	p := Policy{Limit: 100, Window: w, Horizon: 4, Keep: 2, Bound: time.Second}
	plan(t, s, p, map[string]int64{"a": 60, "b": 40}, 10)
	for _, b := range []time.Duration{3 * time.Second, time.Second} {
		p.Bound = b
		plan(t, s, p, map[string]int64{"a": 60, "b": 40}, 10)
		if e, _ := s.Head.Current(); e.Bound != 3*time.Second {
			t.Errorf("after a policy of bound %v: the era keeps %v, want 3s", b, e.Bound)
		}
	}
}
