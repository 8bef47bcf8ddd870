package main

// The console's figures without a browser: clock offsets in units an
// operator reads at a glance, and a chart that says which bars are counts
// and which are estimates.

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
)

func TestConsoleClockReadable(t *testing.T) {
	for _, tc := range []struct {
		offset, uncertainty time.Duration
		want                string
	}{
		{203699 * time.Nanosecond, 5222128 * time.Nanosecond, "+0.2 ms ± 5.2 ms"},
		{-400 * time.Millisecond, 5 * time.Millisecond, "−400 ms ± 5.0 ms"},
		{12 * time.Microsecond, 9960 * time.Microsecond, "0.0 ms ± 10 ms"},
		{2 * time.Second, 1500 * time.Millisecond, "+2.0 s ± 1.5 s"},
		{-999700 * time.Microsecond, 0, "−1.0 s ± 0.0 ms"},
	} {
		rec := &schema.InstanceRecord{Version: schema.Version, ID: "a", ClockKnown: true,
			ClockOffset: schema.Duration(tc.offset), ClockUncertainty: schema.Duration(tc.uncertainty)}
		row := instanceRowOf(newConsoleState(), statusView{Provider: "p"}, instanceView{ID: "a", Record: rec})
		if row.Clock != tc.want {
			t.Errorf("offset %v ± %v: the console shows %q, want %q", tc.offset, tc.uncertainty, row.Clock, tc.want)
		}
	}
}

// TestConsoleChartSaysEstimates: two records of an instance give exactly
// what it admitted between them, not when. A window that holds both is a
// count; one that records straddle is an estimate with the bounds the
// records allow, so a bar drawn from spreading admissions evenly never
// passes for a count.
func TestConsoleChartSaysEstimates(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC)
	sec := func(f float64) time.Time { return t0.Add(time.Duration(f * float64(time.Second))) }
	cfg := &schema.ProviderConfig{Version: schema.Version, Name: "p", Limit: 100, Window: schema.Duration(time.Second)}
	st := newConsoleState()
	read := func(now time.Time, admitted int64) statusView {
		rec := &schema.InstanceRecord{Version: schema.Version, ID: "a", Started: sec(0.5), Updated: now, Admitted: admitted}
		v := statusView{Provider: "p", Config: cfg, Instances: []instanceView{{ID: "a", Record: rec}}}
		st.observe(v, now)
		return v
	}
	read(sec(0.5), 0)
	read(sec(3), 250) // 250 over 2.5 s: the windows from 1 s and 2 s straddled
	read(sec(4), 330) // 80 in the window from 3 s, whole
	v := read(sec(5), 330)

	pts := map[time.Time]chartPoint{}
	for _, p := range chart(st, v, nil, sec(5)).Points {
		pts[p.Start] = p
	}
	f := func(p *float64) float64 {
		if p == nil {
			return -1
		}
		return *p
	}
	for _, tc := range []struct {
		start                 time.Time
		estimated             bool
		admitted, least, most float64
	}{
		{sec(1), true, 100, 0, 250},
		{sec(2), true, 100, 0, 250},
		{sec(3), false, 80, -1, -1},
		{sec(4), false, 0, -1, -1},
	} {
		p, ok := pts[tc.start]
		if !ok || p.Admitted == nil {
			t.Fatalf("no admitted figure for the window from %v: %+v", tc.start.Sub(t0), p)
		}
		if p.Estimated != tc.estimated || f(p.Admitted) != tc.admitted || f(p.Least) != tc.least || f(p.Most) != tc.most {
			t.Errorf("window from %v: estimated %v, admitted %v, least %v, most %v; want %v, %v, %v, %v",
				tc.start.Sub(t0), p.Estimated, f(p.Admitted), f(p.Least), f(p.Most), tc.estimated, tc.admitted, tc.least, tc.most)
		}
	}
	// An estimate lies within the bounds it gives.
	for _, p := range pts {
		if p.Admitted != nil && p.Estimated && (f(p.Least) > *p.Admitted || *p.Admitted > f(p.Most)) {
			t.Errorf("window from %v: estimate %v outside the bounds %v..%v", p.Start.Sub(t0), *p.Admitted, f(p.Least), f(p.Most))
		}
	}
}

// TestConsoleSaysTheLedger: a ledger provider's panel says its fullest
// upcoming window against its limit, as status does, and whether the
// ledger is over anywhere.
func TestConsoleSaysTheLedger(t *testing.T) {
	now := time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC)
	cfg := &schema.ProviderConfig{Version: schema.Version, Name: "p", Limit: 100, Window: schema.Duration(time.Second), Coordination: schema.CoordinationLedger}
	within := &ledgerView{Provider: "p", Era: 1, Window: schema.Duration(time.Second), Fullest: 7, Start: now, Sum: 90, Limit: 100}
	over := &ledgerView{Provider: "p", Era: 1, Window: schema.Duration(time.Second), Fullest: 7, Start: now, Sum: 90, Limit: 100,
		Violations: []violationView{{Era: 1, Window: 3, Sum: 120, Limit: 100, Reason: "grants add up to 120, over the limit of 100"}}}
	for _, tc := range []struct {
		ledger *ledgerView
		want   string
		over   bool
	}{
		{nil, "", false},
		{within, "fullest upcoming window 90 of 100 (ok): window 7 from 2026-12-06T05:00:00Z, era 1", false},
		{over, "fullest upcoming window 90 of 100 (OVER): window 7 from 2026-12-06T05:00:00Z, era 1; over first in window 3 of era 1: see configd audit", true},
	} {
		p := buildPanel(newConsoleState(), statusView{Provider: "p", Config: cfg, Ledger: tc.ledger}, nil, now)
		if p.Ledger != tc.want || p.LedgerOver != tc.over {
			t.Errorf("the panel says %q (over %v), want %q (over %v)", p.Ledger, p.LedgerOver, tc.want, tc.over)
		}
	}
}

// TestConsoleShowsClasses: the panel's config lists a provider's classes
// as --class takes them, highest first, and nothing for a provider
// without.
func TestConsoleShowsClasses(t *testing.T) {
	now := time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC)
	cfg := schema.ProviderConfig{Name: "p", Limit: 1000}.WithDefaults()
	if p := buildPanel(newConsoleState(), statusView{Provider: "p", Config: &cfg}, nil, now); p.Config.Classes != "" {
		t.Errorf("no classes: the panel says %q", p.Config.Classes)
	}
	cfg.Classes = []schema.Class{{Name: "critical", Reserve: schema.Reserve{Share: 6000}}, {Name: "default"}, {Name: "batch", Reserve: schema.Reserve{Count: 5}}}
	p := buildPanel(newConsoleState(), statusView{Provider: "p", Config: &cfg}, nil, now)
	if want := "critical=60%,default,batch=5"; p.Config.Classes != want {
		t.Errorf("the panel says %q, want %q", p.Config.Classes, want)
	}
}

// TestConsoleClassesAgainstReserves: each class's admissions per window
// are summed over the instances from their running totals by class, with
// the chart's rule (a count where records fall on the window's edges, an
// estimate with its bounds where they straddle them), against the class's
// reserve of the limit in force then. A class new to an instance counts
// from 0.
func TestConsoleClassesAgainstReserves(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC)
	sec := func(f float64) time.Time { return t0.Add(time.Duration(f * float64(time.Second))) }
	cfg := &schema.ProviderConfig{Version: schema.Version, Name: "p", Limit: 100, Window: schema.Duration(time.Second),
		Classes: []schema.Class{{Name: "critical", Reserve: schema.Reserve{Share: 6000}}, {Name: "batch"}}}
	st := newConsoleState()
	type tot struct{ all, critical, batch int64 }
	read := func(now time.Time, a, b tot) statusView {
		rec := func(id string, x tot) instanceView {
			r := &schema.InstanceRecord{Version: schema.Version, ID: id, Started: sec(0.5), Updated: now, Admitted: x.all,
				ClassAdmitted: map[string]int64{"critical": x.critical, "batch": x.batch}}
			if id == "b" && x.critical == 0 {
				delete(r.ClassAdmitted, "critical") // b had no critical yet
			}
			return instanceView{ID: id, Record: r}
		}
		v := statusView{Provider: "p", Config: cfg, Instances: []instanceView{rec("a", a), rec("b", b)}}
		st.observe(v, now)
		return v
	}
	read(sec(0.5), tot{}, tot{})
	read(sec(1), tot{10, 10, 0}, tot{0, 0, 0})
	read(sec(2), tot{70, 50, 20}, tot{30, 0, 30})      // window 1: critical 40, batch 50
	read(sec(3), tot{140, 110, 30}, tot{80, 20, 60})   // window 2: critical 80, batch 40
	read(sec(4.5), tot{240, 150, 90}, tot{80, 20, 60}) // windows 3 and 4 straddled by a
	v := read(sec(5), tot{240, 150, 90}, tot{80, 20, 60})

	p := buildPanel(st, v, nil, sec(5))
	if len(p.Classes) != 2 || p.Classes[0].Name != "critical" || p.Classes[1].Name != "batch" {
		t.Fatalf("classes %+v, want critical and batch in the config's order", p.Classes)
	}
	if p.Classes[0].Reserve != 60 || p.Classes[1].Reserve != 0 {
		t.Errorf("reserves %v and %v, want 60 and 0", p.Classes[0].Reserve, p.Classes[1].Reserve)
	}
	f := func(p *float64) float64 {
		if p == nil {
			return -1
		}
		return *p
	}
	for _, tc := range []struct {
		class                 int
		start                 time.Time
		reserve               float64
		estimated             bool
		admitted, least, most float64
	}{
		{0, sec(1), 60, false, 40, -1, -1},
		{1, sec(1), 0, false, 50, -1, -1},
		{0, sec(2), 60, false, 80, -1, -1},
		{1, sec(2), 0, false, 40, -1, -1},
		{0, sec(3), 60, true, 40 / 1.5, 0, 40},
		{1, sec(3), 0, true, 60 / 1.5, 0, 60},
		{0, sec(4), 60, true, 20 / 1.5, 0, 40},
	} {
		row := p.Classes[tc.class]
		i := slices.IndexFunc(row.Points, func(pt classPoint) bool { return pt.Start.Equal(tc.start) })
		if i < 0 || row.Points[i].Admitted == nil {
			t.Fatalf("%s: no admitted figure for the window from %v: %+v", row.Name, tc.start.Sub(t0), row.Points)
		}
		pt := row.Points[i]
		if f(pt.Reserve) != tc.reserve || pt.Estimated != tc.estimated || math.Abs(f(pt.Admitted)-tc.admitted) > 1e-9 || f(pt.Least) != tc.least || f(pt.Most) != tc.most {
			t.Errorf("%s, window from %v: reserve %v, estimated %v, admitted %v, least %v, most %v; want %v, %v, %v, %v, %v",
				row.Name, tc.start.Sub(t0), f(pt.Reserve), pt.Estimated, f(pt.Admitted), f(pt.Least), f(pt.Most),
				tc.reserve, tc.estimated, tc.admitted, tc.least, tc.most)
		}
	}

	// The classes' counts add up to the chart's where every admission is
	// of a class.
	for _, pt := range chart(st, v, nil, sec(5)).Points {
		if pt.Admitted == nil || pt.Start.Before(sec(1)) {
			continue
		}
		var sum float64
		for _, row := range p.Classes {
			for _, cp := range row.Points {
				if cp.Start.Equal(pt.Start) {
					sum += f(cp.Admitted)
				}
			}
		}
		if math.Abs(sum-*pt.Admitted) > 1e-9 {
			t.Errorf("window from %v: the classes add up to %v, the chart says %v", pt.Start.Sub(t0), sum, *pt.Admitted)
		}
	}

	// Without classes, the panel lists none.
	plain := *cfg
	plain.Classes = nil
	if p := buildPanel(st, statusView{Provider: "p", Config: &plain}, nil, sec(5)); len(p.Classes) != 0 {
		t.Errorf("no classes: the panel lists %+v", p.Classes)
	}
}
