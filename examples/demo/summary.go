package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluice-go/sluice/internal/stub"
)

// summary prints what the provider saw, the utilization of the limit, how
// fast the grants followed each event, and what became of the children.
func (d *demo) summary() {
	d.out.endView()
	o := d.out
	start := o.startTime()
	if d.stub == nil {
		return
	}
	o.linef("summary")
	// The windows of the scenario: from the first whole one after it
	// started to the last whole one before everything stopped.
	var ws []stub.Window
	for _, w := range d.stub.Windows() {
		if !start.IsZero() && !w.Start.Before(start) {
			ws = append(ws, w)
		}
	}
	if len(ws) > 0 {
		ws = ws[:len(ws)-1] // the last one was cut short by the stop
	}
	if start.IsZero() || len(ws) == 0 {
		o.linef("  the scenario did not start: nothing to sum up")
	} else {
		d.summarizeWindows(ws)
	}

	d.mu.Lock()
	events := d.events
	d.mu.Unlock()
	o.linef("  events, and how fast the grants followed (from the event to the condition, sampled every %v):", sampleEvery)
	for i, e := range events {
		res := "did not follow before the end"
		switch {
		case e.done:
			res = fmt.Sprintf("followed in %.1fs", e.followed.Seconds())
		case e.closedBy != nil:
			res = "not before the next event"
		}
		o.linef("    %d. %-10s at %5.1fs  %-28s %s", i+1, e.name, e.at.Sub(start).Seconds(), res, e.followWhat)
	}
	o.linef("  events done: %d of 5", len(events))

	d.mu.Lock()
	var pids []string
	left := 0
	for _, p := range d.started {
		pids = append(pids, fmt.Sprint(p.Pid()))
		if !p.Exited() {
			left++
		}
	}
	d.mu.Unlock()
	o.linef("  child processes: %d started, %d still running; pids %s", len(pids), left, strings.Join(pids, " "))
}

// summarizeWindows prints the busiest window, the windows over the limit
// (and whether each is within the documented bound), and utilization.
func (d *demo) summarizeWindows(ws []stub.Window) {
	o := d.out
	d.mu.Lock()
	var changes []time.Time
	for _, e := range d.events {
		if e.membership {
			changes = append(changes, e.at)
		}
	}
	d.mu.Unlock()
	// A window where membership changed: one holding a membership event, or
	// the one after it (the change reaches the others within a window
	// plus propagation).
	changed := func(w stub.Window) bool {
		for _, t := range changes {
			if !t.Before(w.Start.Add(-window)) && t.Before(w.Start.Add(window)) {
				return true
			}
		}
		return false
	}
	var calls, allowed int64
	busiest := ws[0]
	var over []stub.Window
	within := true
	prev := ws[0].Start.Add(-window)
	lastLimit := ws[0].Limit
	for _, w := range ws {
		// Windows with no call at all are not in the list: count their
		// limit as unused.
		for t := prev.Add(window); t.Before(w.Start); t = t.Add(window) {
			allowed += lastLimit
		}
		prev, lastLimit = w.Start, w.Limit
		calls += w.Calls
		allowed += w.Limit
		if w.Calls > busiest.Calls {
			busiest = w
		}
		if w.Over() {
			over = append(over, w)
		}
	}
	o.linef("  provider stub: %d aligned windows of %v; the most calls in one window: %d, limit %d (window %s)",
		len(ws), window, busiest.Calls, busiest.Limit, busiest.Start.Format("15:04:05"))
	if len(over) == 0 {
		o.linef("  windows over the limit: 0 — the provider never saw more than its limit")
	}
	for _, w := range over {
		// cluster's documented degraded mode (the even split while no
		// configd is alive) may exceed the limit by one share, for one
		// window, when membership changes. The largest share published is
		// the bound used here.
		bound := w.Limit + d.maxShare
		ok := changed(w) && w.Calls <= bound
		within = within && ok
		o.linef("  window %s over the limit: %d calls, limit %d; membership changed: %t; within the degraded-mode bound (limit + one share = %d): %t",
			w.Start.Format("15:04:05"), w.Calls, w.Limit, changed(w), bound, ok)
	}
	if len(over) > 0 {
		if within {
			o.linef("  windows over the limit: %d, each within the documented degraded-mode bound", len(over))
		} else {
			o.linef("  windows over the limit: %d, NOT all within the documented degraded-mode bound", len(over))
		}
	}
	o.linef("  utilization of the limit: %.1f%% (%d calls of %d allowed over those windows; the offered load was above the limit throughout)",
		100*float64(calls)/float64(max(allowed, 1)), calls, allowed)
}
