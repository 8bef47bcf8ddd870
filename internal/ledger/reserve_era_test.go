package ledger

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

// TestAReserveOfANewWindowLengthIsKeptInTheOldWindows: a provider of
// 2,000 per 2 s window, critical reserving 30% (600), one holder a. The
// operator halves the window and the limit (1,000 per 1 s: the same
// rate, critical's reserve 300); era 2's grant begins only once era 1's
// grants end. Until then a must keep era 1's reserve, 600 of each 2 s
// window, not era 2's 300, which is of a 1 s window.
func TestAReserveOfANewWindowLengthWaitsForItsEra(t *testing.T) {
	s := NewState()
	p := Policy{Limit: 2000, Window: 2 * time.Second, Horizon: 5, Keep: 3, Slack: 40,
		Reserves:      map[string]map[string]int64{"a": {"critical": 600}},
		ClassReserves: map[string]int64{"critical": 600}}
	target := map[string]int64{"a": 2000}
	plan := func(now int64) {
		c, err := Plan(s, p, target, now)
		if err != nil {
			t.Fatal(err)
		}
		s.Commit(c)
		if vs := Audit(s); len(vs) > 0 {
			t.Fatal(vs)
		}
	}
	t0 := StartOf(100, 2*time.Second)
	for i := range 6 {
		plan(t0 + int64(i)*int64(2*time.Second))
	}
	now := t0 + 6*int64(2*time.Second)
	p.Window, p.Limit, p.Horizon = time.Second, 1000, 10 // round.Horizon: 10 s of fail-static
	p.Reserves = map[string]map[string]int64{"a": {"critical": 300}}
	p.ClassReserves = map[string]int64{"critical": 300}
	target = map[string]int64{"a": 1000}
	critical := limiter.WithClass(context.Background(), "critical")
	batch := limiter.WithClass(context.Background(), "batch")
	var short, worst int64 = 0, 600
	var shortFor time.Duration
	for ; now < t0+30*int64(2*time.Second); now += int64(time.Second) {
		plan(now)
		// The era in force at now.
		var e Era
		for _, x := range s.Head.Eras {
			if StartOf(x.Start, x.Window) <= now {
				e = x
			}
		}
		if e.Window != 2*time.Second {
			break
		}
		k := WindowOf(now, e.Window)
		q := s.Allowance("a", e.Seq, k)
		res, _ := s.Reserves("a", now)
		if q == 0 || now != StartOf(k, e.Window) {
			continue
		}
		lim, err := limiter.New(q, time.Hour, limiter.WithClasses(LimiterClasses([]string{"critical", "batch"}, res)...))
		if err != nil {
			t.Fatal(err)
		}
		for lim.Acquire(batch, 0) == nil {
		}
		var got int64
		for lim.Acquire(critical, 0) == nil {
			got++
		}
		lim.Close()
		t.Logf("2 s window %d: a's quota %d, reserves %v: critical admitted %d", k, q, res, got)
		if got < 600-1 {
			short++
			shortFor += e.Window
			worst = min(worst, got)
		}
	}
	if short > 1 {
		t.Errorf("critical, flooding and reserved 30%% of the limit at both window lengths (600 per 2 s), is admitted as few as %d per 2 s window in %d windows (%v) after the window was halved", worst, short, shortFor)
	}
}
