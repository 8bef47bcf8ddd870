package sim

import (
	"os"
	"path/filepath"
	"testing"
)

// TestFoundScenarios replays every scenario the protocol search once found
// over the limit (testdata/found, written by the search with the seed that
// drew it). Each is a regression test for the fix it led to: none may put
// any aligned window over what the oracle allows.
func TestFoundScenarios(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "found", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scenarios in testdata/found")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			sc, err := ParseScenarioBytes(b)
			if err != nil {
				t.Fatal(err)
			}
			r, err := Run(sc)
			if err != nil {
				t.Fatal(err)
			}
			if r.Checked == 0 {
				t.Fatal("the oracle checked no window")
			}
			if r.Over != 0 {
				t.Fatalf("%d windows over, by up to %d: %v", r.Over, r.OverBy, r.Violations)
			}
		})
	}
}
