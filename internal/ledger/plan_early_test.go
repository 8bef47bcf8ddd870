package ledger

import (
	"fmt"
	"testing"
)

// TestTopUpsComeBeforeAPublishWrittenEarly: 20 holders, transactions of
// 8 operations, and the open publish runs a window past the horizon when
// the limit doubles and so does every target. The windows before the
// next publish get the raise by top-ups alone; the next publish's grants,
// which may be written ahead already, must not take their operations
// while its turn is far: every holder has the raise within 4 rounds.
func TestTopUpsComeBeforeAPublishWrittenEarly(t *testing.T) {
	s := NewState()
	p := Policy{Limit: 1000, Window: w, Horizon: 8, Keep: 3, MaxOps: 8}
	target := map[string]int64{}
	for i := range 20 {
		target[fmt.Sprintf("h%02d", i)] = 50
	}
	k := int64(100)
	for range 10 {
		plan(t, s, p, target, k)
	}
	// Extended to k+H, then a second publish from k+H+1: the open
	// one runs past the horizon.
	k += 5
	plan(t, s, p, target, k)
	for h := range target {
		target[h] = 49
	}
	for range 10 {
		plan(t, s, p, target, k)
	}
	open, _ := (&planner{t: s, p: p}).open()
	t.Logf("open publish %d runs %d..%d at window %d (horizon %d)", open.Seq, open.A, open.B, k, p.Horizon)
	p.Limit = 2000
	for h := range target {
		target[h] = 100
	}
	for r := 1; r <= 10; r++ {
		c := plan(t, s, p, target, k)
		e, _ := s.Head.Current()
		short := 0
		for h := range target {
			if s.Allowance(h, e.Seq, k+1) < 100 {
				short++
			}
		}
		t.Logf("round %d: %d holders short in window %d; %v", r, short, k+1, c.Why)
		if short == 0 {
			if r > 4 {
				t.Errorf("every holder had its raise in the next window only after %d rounds", r)
			}
			return
		}
	}
	t.Errorf("after 10 rounds some holders still lack the raise")
}
