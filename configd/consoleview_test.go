package main

// The console's figures without a browser: clock offsets in units an
// operator reads at a glance, and a chart that says which bars are counts
// and which are estimates.

import (
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
