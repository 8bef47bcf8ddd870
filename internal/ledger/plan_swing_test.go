package ledger

import (
	"fmt"
	"testing"
)

// swing is a fleet whose holder h00 wants lo and hi in turn, one call of
// configd to the next, by more than the slack: the publish written ahead
// over several rounds finds its first grant off target by the next call.
type swing struct {
	n       int   // holders
	limit   int64 // before the change
	after   int64 // the limit from call change on
	lo, hi  int64 // what h00 wants, in turn, from call change on
	joiner  bool  // h<n> joins at call change
	maxOps  int
	rounds  int // Plan calls in one call of configd, back to back
	change  int // the call the swing begins
	settled int // the call from which every window must be granted
}

// target returns the limit and what each holder wants at call c.
func (sw swing) target(c int) (int64, map[string]int64) {
	m := map[string]int64{}
	if c < sw.change {
		for i := range sw.n {
			m[fmt.Sprintf("h%02d", i)] = sw.limit / int64(sw.n)
		}
		return sw.limit, m
	}
	q0, rest := sw.lo, sw.n-1
	if c%2 == 0 {
		q0 = sw.hi
	}
	if sw.joiner {
		rest++
	}
	m["h00"] = q0
	for i := 1; i <= rest; i++ {
		m[fmt.Sprintf("h%02d", i)] = (sw.after - q0) / int64(rest)
	}
	return sw.after, m
}

// play runs four calls a window for forty windows, and fails when a
// window from the settled call on holds less than 9/10 of its limit, or
// the joiner nothing.
func (sw swing) play(t *testing.T) {
	t.Helper()
	s := NewState()
	k0 := int64(1000)
	for c := range 4 * 40 {
		limit, m := sw.target(c)
		p := Policy{Limit: limit, Window: w, Horizon: 4, Keep: 3, Slack: limit / 50, MaxOps: sw.maxOps}
		k, now := k0+int64(c/4), StartOf(k0+int64(c/4), w)+int64(c%4)*int64(w)/4
		why := configdCall(t, s, p, m, now, sw.rounds)
		if c < sw.settled {
			continue
		}
		e, _ := s.Head.Current()
		if sum, l := s.Sum(e.Seq, k), e.Limit(k); sum < l*9/10 {
			t.Fatalf("call %d, window %d: the holders hold %d of %d; this call: %v", c, k, sum, l, why)
		}
		if joiner := fmt.Sprintf("h%02d", sw.n); sw.joiner && s.Allowance(joiner, e.Seq, k) == 0 {
			t.Fatalf("call %d, window %d: %s, which joined at call %d, holds nothing; this call: %v", c, k, joiner, sw.change, why)
		}
	}
}

// TestAHolderWhoseTargetSwingsDoesNotStallThePublishes: a publish written
// ahead is finished with the quotas it was begun with, whatever the
// targets do meanwhile; the holders it reaches last take what room the
// others leave. A publish that started over whenever one grant written
// ahead left its holder's slack was never written: a joiner was never
// granted, and a lowered limit emptied every window once the open
// publish could not be extended past it.
func TestAHolderWhoseTargetSwingsDoesNotStallThePublishes(t *testing.T) {
	for name, sw := range map[string]swing{
		"a joiner": {n: 20, limit: 1000, after: 1000, lo: 50, hi: 150, joiner: true,
			maxOps: 8, rounds: 1, change: 8, settled: 4 * 12},
		"a lowering": {n: 20, limit: 1000, after: 800, lo: 40, hi: 140,
			maxOps: 8, rounds: 1, change: 8, settled: 4 * 12},
		// configd's rounds: up to 8 back to back per call; a publish to
		// 60 holders takes 9 (1,000 holders at etcd's default 128 alike).
		"a lowering in configd's rounds": {n: 60, limit: 6000, after: 4800, lo: 80, hi: 400,
			maxOps: 8, rounds: 8, change: 16, settled: 4 * 12},
	} {
		t.Run(name, sw.play)
	}
}

// configdCall runs up to rounds Plans back to back at now, as one call of
// configd does (ledgerRounds), each applied and audited, until one has
// nothing to write, and returns why each wrote what it did.
func configdCall(t *testing.T, s *State, p Policy, target map[string]int64, now int64, rounds int) (why []string) {
	t.Helper()
	for range rounds {
		ch, err := Plan(s, p, target, now)
		if err != nil {
			t.Fatal(err)
		}
		if ch.Empty() {
			break
		}
		apply(s, ch)
		if vs := Audit(s); len(vs) > 0 {
			t.Fatalf("after %v: %v", ch.Why, vs)
		}
		why = append(why, ch.Why...)
	}
	return why
}
