package world

import (
	"fmt"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

// Script is a history written out: groups of members and the changes
// that happen to them, played in place of the faults the seed draws. The
// seed still draws the messages' faults (lost, refused and slow answers,
// late watches), the members' restarts of their own, the pauses and the
// clocks, so a script with several seeds is several histories.
type Script struct {
	Duration time.Duration // the changes happen within it; then the faults end
	Groups   []Group
	Events   []Event
}

// Group is Count members that want Demand permits per window each, from
// Join on.
type Group struct {
	Name   string
	Count  int
	Demand int64
	Join   time.Duration
}

// Event kinds.
const (
	EventDemand   = "demand"        // Count members of Group (all when 0) want Demand
	EventJoin     = "join"          // Count new members of Group want Demand
	EventCrash    = "crash"         // Count members of Group (all when 0) crash for good
	EventRestart  = "restart"       // Count members of Group (all when 0) crash, and start again after Down
	EventLimit    = "limit"         // the limit becomes Limit, and the window Window if given
	EventDelete   = "delete"        // the provider's config is deleted: configd stops writing its ledger
	EventCreate   = "create"        // the provider comes back on the ledger with Limit (and Window if given)
	EventFailover = "failover"      // the leader stops; another replica leads after Down
	EventOutage   = "outage"        // every replica stops for Down
	EventClock    = "configd-clock" // the leader's clock is Offset from true time
)

// Event is one change of a Script, At after the start.
type Event struct {
	At     time.Duration
	Kind   string
	Group  string
	Count  int
	Demand int64
	Limit  int64
	Window time.Duration
	Down   time.Duration
	Offset time.Duration
}

// Validate reports the first event the world cannot play.
func (s *Script) Validate() error {
	for i, e := range s.Events {
		switch e.Kind {
		case EventDemand, EventJoin, EventCrash, EventRestart, EventDelete, EventFailover, EventOutage, EventClock:
		case EventLimit, EventCreate:
			if e.Limit < 1 {
				return fmt.Errorf("world: event %d (%s at %v) sets a limit of %d, want at least 1", i, e.Kind, e.At, e.Limit)
			}
			if e.Window != 0 {
				if err := limiter.ValidateWindow(e.Window); err != nil {
					return fmt.Errorf("world: event %d (%s at %v): %w", i, e.Kind, e.At, err)
				}
			}
		default:
			return fmt.Errorf("world: event %d at %v is of kind %q, which the world does not play", i, e.At, e.Kind)
		}
	}
	return nil
}

// play schedules the script's groups and events.
func (w *World) play(s *Script) {
	for _, g := range s.Groups {
		w.at(epoch+int64(g.Join), func() {
			for range g.Count {
				w.joinGroup(g.Name, g.Demand)
			}
		})
	}
	for _, e := range s.Events {
		w.at(epoch+int64(e.At), func() { w.event(e) })
	}
}

// joinGroup starts a new member of group wanting demand.
func (w *World) joinGroup(group string, demand int64) {
	m := w.join()
	m.group, m.demand = group, demand
}

func (w *World) event(e Event) {
	w.tracef("script: %+v", e)
	switch e.Kind {
	case EventDemand:
		for _, m := range w.pick(e.Group, e.Count) {
			m.demand = e.Demand
		}
	case EventJoin:
		for range max(1, e.Count) {
			w.joinGroup(e.Group, e.Demand)
		}
	case EventCrash:
		for _, m := range w.pick(e.Group, e.Count) {
			m.stop()
			m.name += "-gone" // never restarts
		}
	case EventRestart:
		for _, m := range w.pick(e.Group, e.Count) {
			m.stop()
			w.at(w.now+int64(e.Down), func() {
				if m.crashed {
					m.start()
				}
			})
		}
	case EventLimit:
		w.limit = e.Limit
		if e.Window > 0 {
			w.window = e.Window
			w.longest = max(w.longest, w.window)
		}
	case EventCreate:
		if w.coord == "" {
			w.createLedger(e.Limit, e.Window)
			break
		}
		// Created over a provider that was not deleted: a change of
		// its config.
		w.limit = e.Limit
		if e.Window > 0 {
			w.window = e.Window
			w.longest = max(w.longest, w.window)
		}
	case EventDelete:
		if w.coord != "" {
			w.deleteProvider()
		}
	case EventFailover:
		w.failover(e.Down)
	case EventOutage:
		for _, rp := range w.reps {
			rp.paused = max(rp.paused, w.now+int64(e.Down))
		}
	case EventClock:
		if rp := w.leaderOf(); rp != nil {
			rp.off = int64(e.Offset)
			w.ahead = max(w.ahead, e.Offset)
		}
	}
}

// failover stops the leader; the next replica leads after down.
func (w *World) failover(down time.Duration) {
	old := w.leaderOf()
	if old == nil || len(w.reps) < 2 {
		return
	}
	old.leader = false
	old.paused = w.now + int64(down)
	next := w.reps[(old.id+1)%len(w.reps)]
	w.at(w.now+int64(down), func() {
		if w.leaderOf() == nil {
			next.leader = true
		}
	})
}

// pick returns count live members of group in the order they joined, all
// when count is 0.
func (w *World) pick(group string, count int) []*member {
	var out []*member
	for _, m := range w.live() {
		if m.group == group && (count == 0 || len(out) < count) {
			out = append(out, m)
		}
	}
	return out
}
