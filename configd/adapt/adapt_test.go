package adapt

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestValidate(t *testing.T) {
	ok := DefaultConfig(1000, time.Second)
	if err := ok.Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want error
	}{
		{"ceiling 0", func(c *Config) { c.Ceiling = 0 }, ErrCeiling},
		{"floor 0", func(c *Config) { c.Floor = 0 }, ErrFloor},
		{"floor above ceiling", func(c *Config) { c.Floor = 1001 }, ErrFloor},
		{"window 0", func(c *Config) { c.Window = 0 }, ErrWindow},
		{"decrease 1", func(c *Config) { c.Decrease = 1 }, ErrDecrease},
		{"decrease NaN", func(c *Config) { c.Decrease = nan() }, ErrDecrease},
		{"probe 0", func(c *Config) { c.Probe = 0 }, ErrProbe},
		{"probe 2", func(c *Config) { c.Probe = 2 }, ErrProbe},
		{"settle -1s", func(c *Config) { c.Settle = -time.Second }, ErrSettle},
		{"settle 2h", func(c *Config) { c.Settle = 2 * time.Hour }, ErrSettle},
		{"max pause 2h", func(c *Config) { c.MaxPause = 2 * time.Hour }, ErrMaxPause},
		{"lead -1s", func(c *Config) { c.Lead = -time.Second }, ErrLead},
	} {
		c := ok
		tc.edit(&c)
		if err := c.Validate(); !errors.Is(err, tc.want) {
			t.Errorf("%s: Validate() = %v, want %v", tc.name, err, tc.want)
		}
	}
}

func nan() float64 { var z float64; return z / z }

func TestStep(t *testing.T) {
	c := DefaultConfig(1000, time.Second)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	for _, tc := range []struct {
		name      string
		s         State
		r         Round
		limit     int64
		pause     time.Time
		why       string // a part of the reason; "" wants none
		quietWant int
	}{
		{"a drop halves", State{Limit: 1000, Last: at(0)},
			Round{At: at(1), Pushbacks: 42}, 500, time.Time{}, "lowered 1000 → 500: 42 pushbacks in 1s", 0},
		{"a probe that meets the limit steps back", State{Limit: 620, Good: 580, Last: at(0)},
			Round{At: at(1), Pushbacks: 8}, 580, time.Time{}, "lowered 620 → 580", 0},
		{"a good level far below: at most Decrease", State{Limit: 1000, Good: 100, Last: at(0)},
			Round{At: at(1), Pushbacks: 8}, 500, time.Time{}, "lowered 1000 → 500", 0},
		{"pushback within Settle of a decrease is the old limit's", State{Limit: 500, Last: at(1), Lowered: at(1), Quiet: 3},
			Round{At: at(2), Pushbacks: 50}, 500, time.Time{}, "", 0},
		{"pushback after Settle lowers again", State{Limit: 500, Last: at(3), Lowered: at(1)},
			Round{At: at(4), Pushbacks: 50}, 250, time.Time{}, "lowered 500 → 250", 0},
		{"floor holds", State{Limit: 150, Last: at(0)},
			Round{At: at(1), Pushbacks: 10}, 100, time.Time{}, "lowered 150 → 100", 0},
		{"Retry-After pauses", State{Limit: 600, Last: at(0), Quiet: 2},
			Round{At: at(1), RetryUntil: at(4)}, 600, at(4), "paused until 00:00:04.000: Retry-After", 2},
		{"Retry-After bounded by MaxPause", State{Limit: 600, Last: at(0)},
			Round{At: at(1), RetryUntil: at(1e6)}, 600, at(61), "paused", 0},
		{"paused: no probe", State{Limit: 600, Last: at(0), PauseUntil: at(3)},
			Round{At: at(1)}, 600, at(3), "", 0},
		{"remaining raises to what was sent and left", State{Limit: 600, Last: at(0)},
			Round{At: at(1), Sent: 590, HasRemaining: true, Remaining: 310}, 900, time.Time{}, "raised 600 → 900: 310 left unused", 1},
		{"remaining without a sent count adds to the limit", State{Limit: 600, Last: at(0)},
			Round{At: at(1), HasRemaining: true, Remaining: 300}, 900, time.Time{}, "raised 600 → 900", 1},
		{"remaining of a fleet that sends little probes", State{Limit: 600, Last: at(0)},
			Round{At: at(1), Sent: 100, HasRemaining: true, Remaining: 300}, 620, time.Time{}, "probing", 1},
		{"absurd remaining stops at the ceiling", State{Limit: 600, Last: at(0)},
			Round{At: at(1), Sent: 600, HasRemaining: true, Remaining: 1 << 62}, 1000, time.Time{}, "raised 600 → 1000", 1},
		{"remaining 0 holds", State{Limit: 600, Last: at(0)},
			Round{At: at(1), Sent: 600, HasRemaining: true, Remaining: 0}, 600, time.Time{}, "", 0},
		{"remaining below a probe step holds", State{Limit: 600, Last: at(0)},
			Round{At: at(1), Sent: 600, HasRemaining: true, Remaining: 19}, 600, time.Time{}, "", 0},
		{"remaining from before the last change: await a fresh one", State{Limit: 900, Last: at(0), Changed: at(0)},
			Round{At: at(1), HasRemaining: true, Remaining: 300, RemainingAt: at(1)}, 900, time.Time{}, "", 0},
		{"no fresh remaining five windows after the change: probe", State{Limit: 900, Last: at(4), Changed: at(0)},
			Round{At: at(5), HasRemaining: true, Remaining: 300, RemainingAt: at(1)}, 920, time.Time{}, "probing", 1},
		{"remaining after the change took effect counts", State{Limit: 900, Last: at(2), Changed: at(0)},
			Round{At: at(3), HasRemaining: true, Remaining: 50, RemainingAt: at(2)}, 950, time.Time{}, "50 left unused", 1},
		{"first quiet round probes by Probe", State{Limit: 600, Last: at(0)},
			Round{At: at(1)}, 620, time.Time{}, "raised 600 → 620: probing, 1 quiet rounds", 1},
		{"third quiet round probes by 3·Probe", State{Limit: 600, Last: at(0), Quiet: 2},
			Round{At: at(1)}, 660, time.Time{}, "probing, 3 quiet rounds", 3},
		{"state above a lowered ceiling comes back", State{Limit: 5000, Last: at(0)},
			Round{At: at(1), Pushbacks: 1}, 500, time.Time{}, "lowered 5000 → 500", 0},
		{"negative counts are none", State{Limit: 1000, Last: at(0)},
			Round{At: at(1), Pushbacks: -5, Sent: -1}, 1000, time.Time{}, "", 1},
	} {
		got, why := c.Step(tc.s, tc.r)
		if got.Limit != tc.limit || !got.PauseUntil.Equal(tc.pause) || got.Quiet != tc.quietWant {
			t.Errorf("%s: got limit %d pause %v quiet %d, want %d %v %d", tc.name, got.Limit, got.PauseUntil, got.Quiet, tc.limit, tc.pause, tc.quietWant)
		}
		if (tc.why == "") != (why == "") || !strings.Contains(why, tc.why) {
			t.Errorf("%s: reason %q, want one containing %q", tc.name, why, tc.why)
		}
	}
}

// TestRemainingOfFirstWindowInForce: a limit lowered 257 ms into a window
// with a lead of 300 ms is in force from the next boundary, so the
// remaining of the window after it is the provider's word on the new
// limit; two windows after the round would wait a window more for the
// same word (bench/adaptive: 1000 → 600 converged in 5–6 s).
func TestRemainingOfFirstWindowInForce(t *testing.T) {
	c := DefaultConfig(1000, time.Second)
	c.Lead = 300 * time.Millisecond
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	lowered := State{Limit: 500, Last: ms(1257), Changed: ms(1257), Lowered: ms(1257)}
	for _, tc := range []struct {
		name        string
		s           State
		remainingAt time.Time
		limit       int64
	}{
		{"the first window in force counts", lowered, ms(3000), 600},
		{"its end said a little early counts", lowered, ms(2950), 600},
		{"the window the change came in does not", lowered, ms(2000), 500},
		{"a change too late for the next boundary: that window does not",
			State{Limit: 500, Last: ms(1757), Changed: ms(1757), Lowered: ms(1757)}, ms(3000), 500},
		{"nor for the one after", State{Limit: 500, Last: ms(1757), Changed: ms(1757), Lowered: ms(1757)}, ms(4000), 600},
	} {
		got, _ := c.Step(tc.s, Round{At: tc.remainingAt.Add(300 * time.Millisecond), Sent: 500, HasRemaining: true, Remaining: 100, RemainingAt: tc.remainingAt})
		if got.Limit != tc.limit {
			t.Errorf("%s: limit %d, want %d", tc.name, got.Limit, tc.limit)
		}
	}
}

// TestNextRound: rounds every 500 ms with a lead of 300 ms fall at .150
// and .650 of each second, so that one decides 350 ms before each
// boundary, in time for it; a ticker's phase was chance, and a round just
// after .7 left its limit a window later (bench/adaptive: the drop's
// halving decided at 25.257 was in force at 26.000, one at 10.783 was read
// as in force only at 12.000).
func TestNextRound(t *testing.T) {
	c := DefaultConfig(1000, time.Second)
	c.Lead = 300 * time.Millisecond
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	for _, tc := range []struct{ at, want time.Time }{
		{ms(0), ms(150)},
		{ms(149), ms(150)},
		{ms(150), ms(650)},
		{ms(651), ms(1150)},
		{ms(999), ms(1150)},
	} {
		got := c.NextRound(tc.at, 500*time.Millisecond)
		if !got.Equal(tc.want) {
			t.Errorf("NextRound(%v) = %v, want %v", tc.at.Sub(t0), got.Sub(t0), tc.want.Sub(t0))
		}
	}
	if got, want := c.inForce(ms(650)), ms(1000); !got.Equal(want) {
		t.Errorf("a round at 650ms is in force at %v, want the next boundary, %v", got.Sub(t0), want.Sub(t0))
	}
}

func TestRoundsToCeiling(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want int
	}{
		{DefaultConfig(1000, time.Second), 9},           // 20·k(k+1)/2 ≥ 900
		{Config{Ceiling: 10, Floor: 1, Probe: 0.01}, 9}, // steps of at least 1
		{Config{Ceiling: 100, Floor: 1, Probe: 1}, 1},
		{Config{Ceiling: 5, Floor: 5, Probe: 0.5}, 0},
	} {
		if got := tc.c.RoundsToCeiling(); got != tc.want {
			t.Errorf("%+v: RoundsToCeiling() = %d, want %d", tc.c, got, tc.want)
		}
	}
}

// TestRandomHistories drives the controller with random pushback histories
// and checks two properties of every one: the limit stays in [Floor,
// Ceiling] after every round, and once pushback stops it reaches the
// ceiling within the pause plus RoundsToCeiling rounds.
func TestRandomHistories(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	for h := range 2000 {
		ceiling := 1 + rng.Int64N(100000)
		c := DefaultConfig(ceiling, time.Second)
		c.Floor = 1 + rng.Int64N(ceiling)
		c.Decrease = 0.05 + 0.9*rng.Float64()
		c.Probe = 0.001 + 0.2*rng.Float64()
		c.Settle = time.Duration(rng.Int64N(int64(5 * time.Second)))
		c.MaxPause = time.Duration(rng.Int64N(int64(10 * time.Second)))
		if err := c.Validate(); err != nil {
			t.Fatalf("history %d: %v", h, err)
		}
		s, at := c.Start(), t0
		for range rng.IntN(50) {
			at = at.Add(time.Duration(rng.Int64N(int64(3 * time.Second))))
			r := Round{At: at}
			if rng.IntN(2) == 0 {
				r.Pushbacks = rng.Int64N(2 * ceiling)
				r.Sent = rng.Int64N(3 * ceiling)
			}
			if rng.IntN(4) == 0 {
				r.RetryUntil = at.Add(time.Duration(rng.Int64N(int64(time.Hour))))
			}
			if rng.IntN(4) == 0 {
				r.HasRemaining, r.Remaining = true, rng.Int64N(2*ceiling)-ceiling/4
				r.RemainingAt = at.Add(-time.Duration(rng.Int64N(int64(5 * time.Second))))
			}
			s, _ = c.Step(s, r)
			if s.Limit < c.Floor || s.Limit > c.Ceiling {
				t.Fatalf("seed %d history %d: limit %d out of [%d, %d]", seed, h, s.Limit, c.Floor, c.Ceiling)
			}
		}
		// Pushback stops: rounds one window apart, without headers.
		bound := int(c.MaxPause/c.Window) + 1 + c.RoundsToCeiling()
		n := 0
		for s.Limit < c.Ceiling {
			if n++; n > bound {
				t.Fatalf("seed %d history %d: limit %d short of ceiling %d after %d quiet rounds (bound %d)", seed, h, s.Limit, c.Ceiling, n-1, bound)
			}
			at = at.Add(c.Window)
			s, _ = c.Step(s, Round{At: at})
			if s.Limit < c.Floor || s.Limit > c.Ceiling {
				t.Fatalf("seed %d history %d: limit %d out of [%d, %d]", seed, h, s.Limit, c.Floor, c.Ceiling)
			}
		}
	}
}
