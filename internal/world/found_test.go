package world

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// span is a duration as internal/sim's scenarios write it: "1.5s".
type span time.Duration

func (d *span) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = span(v)
	return err
}

// found is the part the world plays of a scenario the protocol search of
// the old protocol found (testdata/found).
type found struct {
	Seed         uint64 `json:"seed"`
	Limit        int64  `json:"limit"`
	Window       span   `json:"window"`
	Duration     span   `json:"duration"`
	ConfigdClock span   `json:"configd_clock"`
	Groups       []struct {
		Name   string `json:"name"`
		Count  int    `json:"count"`
		Demand int64  `json:"demand"`
		Join   span   `json:"join"`
	} `json:"groups"`
	Events []struct {
		At     span   `json:"at"`
		Kind   string `json:"kind"`
		Group  string `json:"group"`
		Count  int    `json:"count"`
		Demand int64  `json:"demand"`
		Limit  int64  `json:"limit"`
		Window span   `json:"window"`
		Down   span   `json:"down"`
		Offset span   `json:"offset"`
	} `json:"events"`
}

func (f found) config(seed uint64) Config {
	s := &Script{Duration: time.Duration(f.Duration)}
	for _, g := range f.Groups {
		s.Groups = append(s.Groups, Group{Name: g.Name, Count: g.Count, Demand: g.Demand, Join: time.Duration(g.Join)})
	}
	for _, e := range f.Events {
		s.Events = append(s.Events, Event{At: time.Duration(e.At), Kind: e.Kind, Group: e.Group, Count: e.Count,
			Demand: e.Demand, Limit: e.Limit, Window: time.Duration(e.Window), Down: time.Duration(e.Down), Offset: time.Duration(e.Offset)})
	}
	return Config{Seed: seed, Limit: f.Limit, Window: time.Duration(f.Window), ConfigdOff: time.Duration(f.ConfigdClock),
		Loss: 0.05, Refuse: 0.03, Script: s}
}

// TestFoundScenarios plays every history the protocol search found
// against the old protocol (testdata/found) on the ledger:
// the same fleet, demands, limits, windows, deletions, failovers, outages
// and configd clocks, each under a few seeds of message faults.
func TestFoundScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/found/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios under testdata/found: %v", err)
	}
	// make oracle sets WORLD_FOUND_LONG to a number of seeds each, and
	// liveness is waited for after every configd clock, up to 44 minutes
	// ahead.
	seeds, ahead := uint64(1), time.Minute
	if n, err := strconv.Atoi(os.Getenv("WORLD_FOUND_LONG")); err == nil && n > 0 {
		seeds, ahead = uint64(n), 0
	}
	var windows, writes, live, runs int
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".json")
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var f found
			if err := json.Unmarshal(b, &f); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			var admitted int64
			for i := range seeds {
				cfg := f.config(f.Seed + i)
				cfg.LiveAhead = ahead
				if testing.Verbose() && os.Getenv("WORLD_TRACE") != "" {
					cfg.Trace = func(s string) { t.Log(s) }
				}
				r := Run(cfg)
				windows, writes, runs = windows+r.Windows, writes+r.Writes, runs+1
				if r.Live {
					live++
				}
				if len(r.Violations) > 0 {
					t.Fatalf("%v\nreplay: go test -run '^TestFoundScenarios$/^%s$' -v ./internal/world", r, name)
				}
				admitted += r.Admitted
			}
			// A seed's faults may keep every instance down; the
			// scenario's own calls must play under some seed.
			if admitted == 0 {
				t.Errorf("%d seeds admitted nothing: the scenario did not play", seeds)
			}
		})
	}
	t.Logf("%d scenarios × %d seeds: %d windows checked, %d writes, none over; liveness checked in %d of %d", len(files), seeds, windows, writes, live, runs)
}

// TestScriptValidate: a script the world cannot play is refused before
// anything runs.
func TestScriptValidate(t *testing.T) {
	for _, e := range []Event{
		{Kind: "reboot"},
		{Kind: EventLimit, Limit: 0},
		{Kind: EventCreate, Limit: 10, Window: 7 * time.Second},
	} {
		r := Run(Config{Seed: 1, Script: &Script{Duration: time.Second, Events: []Event{e}}})
		if len(r.Violations) != 1 || r.Admitted != 0 {
			t.Errorf("%+v: %v, want one refusal and nothing admitted", e, r)
		}
	}
}
