package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
)

// ErrScenario means a scenario file is malformed or out of range; the
// message names the field.
var ErrScenario = errors.New("sim: invalid scenario")

// Duration is a time.Duration written in scenario files as a Go duration
// string ("1s", "250ms").
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// UnmarshalJSON accepts a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"1s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Delay is a message-delay distribution: uniform in [Min, Max], plus, with
// probability TailP, an exponentially distributed extra delay of mean
// TailMean (a slow watch or a slow etcd write).
type Delay struct {
	Min      Duration `json:"min"`
	Max      Duration `json:"max"`
	TailP    float64  `json:"tail_p,omitempty"`
	TailMean Duration `json:"tail_mean,omitempty"`
}

// Group is a set of identical instances. Their ids are Name-0000,
// Name-0001, …
type Group struct {
	Name   string `json:"name"`
	Count  int    `json:"count"`
	Demand int64  `json:"demand"` // offered permits per window, per instance
	// Skew is every member's residual clock error: its window k spans
	// [kW+Skew, (k+1)W+Skew) in true time. SkewSpread adds, per member, a
	// uniform error in [−SkewSpread, +SkewSpread].
	Skew       Duration `json:"skew,omitempty"`
	SkewSpread Duration `json:"skew_spread,omitempty"`
	// Join is when the group's instances start (0: at the start).
	Join Duration `json:"join,omitempty"`
	// ReportInterval is the members' report interval (0: the
	// scenario's): instances of one provider may be given different ones.
	ReportInterval Duration `json:"report_interval,omitempty"`
}

// Event kinds.
const (
	EventDemand  = "demand"  // set the demand of Count members of Group (all when 0) to Demand
	EventJoin    = "join"    // start Count new members of Group with Demand
	EventCrash   = "crash"   // crash Count live members of Group (all when 0); their leases expire after LeaseTTL
	EventRestart = "restart" // crash Count live members of Group (all when 0) and start them again, with the same ids, after Down
	EventLimit   = "limit"   // the operator sets the provider's limit to Limit, and its window to Window if given
	EventDelete  = "delete"  // the operator deletes the provider: its shares go, instances fall back
	EventCreate  = "create"  // the operator creates the provider again with Limit (and Window if given)
	// EventFailover: the leader dies; a standby leads after Down, resuming
	// from etcd.
	EventFailover = "failover"
	EventOutage   = "outage"        // every configd replica is down for Down: instances fall back to total/N
	EventClock    = "configd-clock" // the leader's clock is set Offset from true time (a step, or a new leader's clock)
)

// Event is something that happens at a point of the run.
type Event struct {
	At     Duration `json:"at"`
	Kind   string   `json:"kind"`
	Group  string   `json:"group,omitempty"`
	Count  int      `json:"count,omitempty"`
	Demand int64    `json:"demand,omitempty"`
	Limit  int64    `json:"limit,omitempty"`
	Window Duration `json:"window,omitempty"` // limit, create: the new window; 0 keeps it
	Down   Duration `json:"down,omitempty"`
	Offset Duration `json:"offset,omitempty"` // configd-clock: the leader's clock minus true time
}

// Walk moves every live instance's demand at random: every Every, demand
// is multiplied by exp(Sigma·N(0,1)) and clamped to [Min, Max].
type Walk struct {
	Every Duration `json:"every"`
	Sigma float64  `json:"sigma"`
	Min   int64    `json:"min"`
	Max   int64    `json:"max"`
}

// Admission modes: how an instance's admissions lie within its window.
const (
	AdmitSpread  = "spread"  // evenly across the window (pacing)
	AdmitBunched = "bunched" // all at the window's start (no pacing, offered load ≥ share)
)

// Scenario is one simulated run. Zero fields take the defaults of
// DefaultScenario.
type Scenario struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Seed        uint64 `json:"seed"`

	Limit     int64    `json:"limit"`
	Window    Duration `json:"window"`
	Algorithm string   `json:"algorithm"` // "fair" or "even" (alloc.ByName)
	Duration  Duration `json:"duration"`
	Warmup    Duration `json:"warmup"` // windows before this are not measured

	ReportInterval Duration `json:"report_interval"` // instances' demand report period
	Margin         Duration `json:"margin"`          // configd's propagation margin
	// LeaderBatch is how long the leader gathers watch events before it
	// decides (0: 5 ms). configd decides at least every 20 ms, and a
	// decision over 100,000 instances takes it about 1.6 s
	// (BENCHMARKS.md, section 12): a large fleet's scenario sets it so.
	LeaderBatch Duration `json:"leader_batch,omitempty"`
	LeaseTTL    Duration `json:"lease_ttl"` // instance lease TTL
	// FailStatic is the provider's fail_static (0: the default, 10 s):
	// the even split's hold counts it.
	FailStatic Duration `json:"fail_static,omitempty"`

	Publish Delay   `json:"publish_delay"` // leader's publish → instance
	Ack     Delay   `json:"ack_delay"`     // instance record write → leader
	AckLoss float64 `json:"ack_loss"`      // probability that a record write is lost

	// PublishReorder is the probability that a publish reaches an
	// instance before the one published just before it (a watch that
	// reconnected and read again); the instance keeps the newer one.
	PublishReorder float64 `json:"publish_reorder,omitempty"`
	// ConfigdClock is the configd leader's clock minus true time at the
	// start (its boundaries and its judgement of when a publish is in
	// effect are on that clock); a configd-clock event changes it.
	ConfigdClock Duration `json:"configd_clock,omitempty"`

	Admissions string `json:"admissions"` // "spread" or "bunched"
	// ClockCut applies the limiter's clock-uncertainty cut
	// (skew.EnforcedShare) with each instance's |skew| as its uncertainty.
	ClockCut   bool     `json:"clock_cut,omitempty"`
	ClockBound Duration `json:"clock_bound,omitempty"` // 0: skew.DefaultBound

	Groups []Group `json:"groups"`
	Events []Event `json:"events,omitempty"`
	Walk   *Walk   `json:"walk,omitempty"`
}

// DefaultScenario returns the defaults: the real system's (1 s windows,
// 1 s reports, 200 ms margin, 10 s lease) with fast, LAN-like messages.
func DefaultScenario() Scenario {
	return Scenario{
		Seed:           1,
		Window:         Duration(time.Second),
		Algorithm:      "fair",
		Duration:       Duration(120 * time.Second),
		Warmup:         Duration(10 * time.Second),
		ReportInterval: Duration(time.Second),
		Margin:         Duration(200 * time.Millisecond),
		LeaseTTL:       Duration(10 * time.Second),
		Publish:        Delay{Min: Duration(2 * time.Millisecond), Max: Duration(20 * time.Millisecond)},
		Ack:            Delay{Min: Duration(2 * time.Millisecond), Max: Duration(20 * time.Millisecond)},
		Admissions:     AdmitSpread,
	}
}

// ParseScenario reads a JSON scenario, fills defaults and validates it.
// Unknown fields are an error.
func ParseScenario(r io.Reader) (Scenario, error) {
	sc := DefaultScenario()
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sc); err != nil {
		return Scenario{}, fmt.Errorf("%w: %v", ErrScenario, err)
	}
	if dec.More() {
		return Scenario{}, fmt.Errorf("%w: trailing data after the scenario object", ErrScenario)
	}
	return sc, sc.Validate()
}

// ParseScenarioBytes is ParseScenario over b.
func ParseScenarioBytes(b []byte) (Scenario, error) { return ParseScenario(bytes.NewReader(b)) }

// Validate checks that sc can be run.
func (sc *Scenario) Validate() error {
	bad := func(field string, v any, why string) error {
		return fmt.Errorf("%w: %s = %v: %s", ErrScenario, field, v, why)
	}
	switch {
	case sc.Name == "":
		return bad("name", `""`, "required")
	case sc.Limit <= 0 || sc.Limit > 1e12:
		return bad("limit", sc.Limit, "must be in 1..1e12")
	case validWindow(sc.Window.D()) != "":
		return bad("window", sc.Window.D(), validWindow(sc.Window.D()))
	case sc.Algorithm != "fair" && sc.Algorithm != "even":
		return bad("algorithm", sc.Algorithm, `must be "fair" or "even"`)
	case sc.Duration < sc.Window || sc.Duration.D() > 24*time.Hour:
		return bad("duration", sc.Duration.D(), "must be at least one window and at most 24h")
	case sc.Warmup < 0 || sc.Warmup >= sc.Duration:
		return bad("warmup", sc.Warmup.D(), "must be in [0, duration)")
	case sc.FailStatic < 0 || sc.FailStatic.D() > schema.MaxFailStatic:
		return bad("fail_static", sc.FailStatic.D(), "must be from 0 to 1h")
	case sc.ReportInterval <= 0:
		return bad("report_interval", sc.ReportInterval.D(), "must be > 0")
	case sc.Margin < 0:
		return bad("margin", sc.Margin.D(), "must be ≥ 0")
	case sc.LeaderBatch < 0 || sc.LeaderBatch.D() > time.Minute:
		return bad("leader_batch", sc.LeaderBatch.D(), "must be from 0 to 1m")
	case sc.LeaseTTL <= 0:
		return bad("lease_ttl", sc.LeaseTTL.D(), "must be > 0")
	case sc.AckLoss < 0 || sc.AckLoss >= 1:
		return bad("ack_loss", sc.AckLoss, "must be in [0, 1)")
	case sc.PublishReorder < 0 || sc.PublishReorder > 1:
		return bad("publish_reorder", sc.PublishReorder, "must be in [0, 1]")
	case abs(sc.ConfigdClock.D()) > 24*time.Hour:
		return bad("configd_clock", sc.ConfigdClock.D(), "must be within ±24h")
	case sc.Admissions != AdmitSpread && sc.Admissions != AdmitBunched:
		return bad("admissions", sc.Admissions, `must be "spread" or "bunched"`)
	case len(sc.Groups) == 0:
		return bad("groups", "[]", "at least one group")
	}
	for _, d := range []struct {
		name string
		d    Delay
	}{{"publish_delay", sc.Publish}, {"ack_delay", sc.Ack}} {
		if d.d.Min < 0 || d.d.Max < d.d.Min || d.d.TailP < 0 || d.d.TailP > 1 || d.d.TailMean < 0 {
			return bad(d.name, d.d, "need 0 ≤ min ≤ max, tail_p in [0,1], tail_mean ≥ 0")
		}
	}
	names := map[string]bool{}
	total := 0
	shortest := sc.Window.D()
	for _, e := range sc.Events {
		if e.Window > 0 {
			shortest = min(shortest, e.Window.D())
		}
	}
	for i, g := range sc.Groups {
		f := fmt.Sprintf("groups[%d]", i)
		switch {
		case g.Name == "" || names[g.Name]:
			return bad(f+".name", g.Name, "required and unique")
		case g.Count < 0 || g.Demand < 0 || g.Join < 0 || g.ReportInterval < 0:
			return bad(f, g, "count, demand, join and report_interval must be ≥ 0")
		case abs(g.Skew.D())+g.SkewSpread.D() >= shortest/2 || g.SkewSpread < 0:
			return bad(f+".skew", g.Skew.D(), "|skew| + skew_spread must be < half the shortest window")
		}
		names[g.Name] = true
		total += g.Count
	}
	for i, e := range sc.Events {
		f := fmt.Sprintf("events[%d]", i)
		if e.At < 0 || e.At > sc.Duration {
			return bad(f+".at", e.At.D(), "must be within the run")
		}
		switch e.Kind {
		case EventDemand, EventJoin, EventCrash, EventRestart:
			if !names[e.Group] {
				return bad(f+".group", e.Group, "no such group")
			}
			if e.Count < 0 || e.Demand < 0 {
				return bad(f, e, "count and demand must be ≥ 0")
			}
			if e.Kind == EventRestart && e.Down <= 0 {
				return bad(f+".down", e.Down.D(), "must be > 0")
			}
			if e.Kind == EventJoin {
				total += e.Count
			}
		case EventLimit, EventCreate:
			if e.Limit <= 0 || e.Limit > 1e12 {
				return bad(f+".limit", e.Limit, "must be in 1..1e12")
			}
			if e.Window != 0 && validWindow(e.Window.D()) != "" {
				return bad(f+".window", e.Window.D(), validWindow(e.Window.D()))
			}
		case EventDelete:
		case EventFailover, EventOutage:
			if e.Down <= 0 {
				return bad(f+".down", e.Down.D(), "must be > 0")
			}
		case EventClock:
			if abs(e.Offset.D()) > 24*time.Hour {
				return bad(f+".offset", e.Offset.D(), "must be within ±24h")
			}
		default:
			return bad(f+".kind", e.Kind, "unknown")
		}
	}
	if total > 100_000 {
		return bad("groups", total, "at most 100000 instances")
	}
	if w := sc.Walk; w != nil && (w.Every <= 0 || w.Sigma < 0 || w.Min < 0 || w.Max < w.Min) {
		return bad("walk", *w, "need every > 0, sigma ≥ 0, 0 ≤ min ≤ max")
	}
	return nil
}

// validWindow says what is wrong with window length w ("": nothing): the
// limiter's rules, 10 ms to 1 h, dividing a day.
func validWindow(w time.Duration) string {
	if w < 10*time.Millisecond || w > time.Hour || (24*time.Hour)%w != 0 {
		return "must be 10ms to 1h and divide 24h"
	}
	return ""
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
