package ledger

import (
	"fmt"
	"testing"
)

// TestALimitThatKeepsProbingKeepsTheHoldersGranted: twenty holders granted
// 50 each of 1,000; then the limit moves every other round, between
// 1,100 and 1,300 (an adaptive controller probing a provider), by 40:
// each holder's quota moves by 2, a tenth of the slack, the sum by twice
// the slack. With transactions of 8 operations a publish to twenty
// holders is written ahead over three rounds, so none is written before
// the target moves again and the one written ahead starts over. The open
// publish holds the holders within their slack of every target (50 of 55
// to 65, with a slack of 22 to 26): it must go on being extended until a
// new one is written, or the holders run out of grants while the limit
// never falls below 1,100.
func TestALimitThatKeepsProbingKeepsTheHoldersGranted(t *testing.T) {
	const n = 20
	s := NewState()
	even := func(limit int64) map[string]int64 {
		m := map[string]int64{}
		for i := range n {
			m[fmt.Sprintf("h%02d", i)] = limit / n
		}
		return m
	}
	wave := []int64{1100, 1140, 1180, 1220, 1260, 1300, 1260, 1220, 1180, 1140}
	k0 := int64(1000)
	for r := range 4 * 20 { // 20 windows, four rounds a window
		limit := int64(1000) // two windows to write the first publish
		if r >= 8 {
			limit = wave[(r/2)%len(wave)]
		}
		p := Policy{Limit: limit, Window: w, Horizon: 4, Keep: 3, Slack: limit / 50, MaxOps: 8}
		k := k0 + int64(r/4)
		c, err := Plan(s, p, even(limit), StartOf(k, w)+int64(r%4)*int64(w)/4)
		if err != nil {
			t.Fatal(err)
		}
		apply(s, c)
		if vs := Audit(s); len(vs) > 0 {
			t.Fatalf("round %d: %v", r, vs)
		}
		e := s.Head.Eras[len(s.Head.Eras)-1]
		if got := s.Sum(e.Seq, k); k > k0 && got < 1000 {
			t.Fatalf("round %d, window %d: the holders hold %d, under the 1,000 they held before the limit rose to %d (%v)", r, k, got, limit, c.Why)
		}
	}
}

// TestAProbeAtScaleNeverEmptiesTheWindows: bench/scale's 1,000 holders
// under an adaptive limit, with etcd's default of 128 operations a
// transaction: a publish to them is written ahead over 8 rounds (two
// windows). The controller, halved to 50,000 of a ceiling of 100,000,
// probes back up every other round (configd adapts every 500 ms, plans
// every 250 ms with 1 s windows): +2%, +4%, … of the ceiling, so each
// target stands for two rounds. The holders must keep at least the
// 50,000 they held, and reach 100,000 once the controller rests there.
func TestAProbeAtScaleNeverEmptiesTheWindows(t *testing.T) {
	const n = 1000
	s := NewState()
	even := func(limit int64) map[string]int64 {
		m := map[string]int64{}
		for i := range n {
			m[fmt.Sprintf("h%04d", i)] = limit / n
		}
		return m
	}
	probe := []int64{50_000, 52_000, 56_000, 62_000, 70_000, 80_000, 92_000, 100_000}
	k0 := int64(1000)
	least := int64(-1)
	for r := range 4 * 16 { // 16 windows, four rounds a window
		limit := probe[0] // three windows at 50,000 to write it
		if r >= 12 {
			limit = probe[min((r-12)/2+1, len(probe)-1)]
		}
		p := Policy{Limit: limit, Window: w, Horizon: 4, Keep: 3, Slack: limit / 50}
		k := k0 + int64(r/4)
		c, err := Plan(s, p, even(limit), StartOf(k, w)+int64(r%4)*int64(w)/4)
		if err != nil {
			t.Fatal(err)
		}
		apply(s, c)
		e := s.Head.Eras[len(s.Head.Eras)-1]
		if got := s.Sum(e.Seq, k); k >= k0+2 && (least < 0 || got < least) {
			least = got
			if got < 50_000 {
				t.Errorf("round %d, window %d, limit %d: the holders hold %d, under the 50,000 they held", r, k, limit, got)
			}
		}
	}
	e := s.Head.Eras[len(s.Head.Eras)-1]
	if got := s.Sum(e.Seq, k0+15); got < 100_000-2_000 {
		t.Errorf("window %d, 5 windows after the limit rested at 100,000: the holders hold %d", k0+15, got)
	}
}
