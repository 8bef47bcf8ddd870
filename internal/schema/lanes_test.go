package schema

import (
	"strings"
	"testing"
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
