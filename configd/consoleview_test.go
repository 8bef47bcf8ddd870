package main

// The console's figures without a browser: clock offsets in units an
// operator reads at a glance.

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
