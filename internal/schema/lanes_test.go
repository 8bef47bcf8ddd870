package schema

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestNumberLanes: what an operator gives is numbered against the config
// before, so that a lane keeps its number and its dimension.
func TestNumberLanes(t *testing.T) {
	old := ProviderConfig{Name: "p", Limit: 10, Window: Duration(1e9), Lanes: []Lane{
		{Lane: 1, Dimension: "tokens", Limit: 100, Window: Duration(60e9)},
		{Lane: 2, Limit: 1000, Window: Duration(3600e9), Retired: true},
	}}
	in := old
	in.Lanes = []Lane{
		{Limit: 2000, Window: Duration(1800e9)},                   // the retired requests lane, another window
		{Dimension: "tokens", Limit: 300, Window: Duration(60e9)}, // tokens, changed
		{Dimension: "images", Limit: 5, Window: Duration(1e9)},    // new
	}
	got, err := in.NumberLanes(&old)
	if err != nil {
		t.Fatal(err)
	}
	want := []Lane{
		{Lane: 1, Dimension: "tokens", Limit: 300, Window: Duration(60e9)},
		{Lane: 2, Limit: 2000, Window: Duration(1800e9)},
		{Lane: 3, Dimension: "images", Limit: 5, Window: Duration(1e9)},
	}
	if len(got.Lanes) != len(want) {
		t.Fatalf("lanes %+v, want %+v", got.Lanes, want)
	}
	for i := range want {
		if got.Lanes[i] != want[i] {
			t.Errorf("lane %d: %+v, want %+v", i, got.Lanes[i], want[i])
		}
	}
	in.Lanes = []Lane{{Lane: 1, Dimension: "images", Limit: 5, Window: Duration(1e9)}}
	if _, err := in.NumberLanes(&old); err == nil || !strings.Contains(err.Error(), "lane 1 counts tokens") {
		t.Errorf("a lane numbered with another dimension: %v", err)
	}
}

// TestNumberLanesKeepsAnUnchangedLimitsLane: a limit given again as it was
// keeps its lane, also when another of its dimension, in another window,
// is listed before it. Found by review: adding tokens 200/1s before the
// tokens 1000/10s in force gave lane 1, which every running instance
// enforced as 1000/10s, to 200/1s, and 1000/10s a new lane no running
// instance enforced: 2,000 tokens in a 10 s window of 1,000.
func TestNumberLanesKeepsAnUnchangedLimitsLane(t *testing.T) {
	old := ProviderConfig{Name: "api", Limit: 100, Window: Duration(time.Second),
		Lanes: []Lane{{Lane: 1, Dimension: "tokens", Limit: 1000, Window: Duration(10 * time.Second)}}}
	put := old
	put.Lanes = []Lane{
		{Dimension: "tokens", Limit: 200, Window: Duration(time.Second)},
		{Dimension: "tokens", Limit: 1000, Window: Duration(10 * time.Second)},
	}
	got, err := put.NumberLanes(&old)
	if err != nil {
		t.Fatal(err)
	}
	want := []Lane{
		{Lane: 1, Dimension: "tokens", Limit: 1000, Window: Duration(10 * time.Second)},
		{Lane: 2, Dimension: "tokens", Limit: 200, Window: Duration(time.Second)},
	}
	if !slices.Equal(got.Lanes, want) {
		t.Errorf("lanes %+v, want %+v", got.Lanes, want)
	}
}
