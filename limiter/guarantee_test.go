package limiter

import (
	"testing"
	"testing/synctest"
	"time"
)

// Regression tests for the holes in the core that an independent review
// found by hand (issue 12, "holes in the limiter core", numbered as
// there) and that the core oracle (oracle_test.go) finds at random. Each
// failed before its fix.

// Hole 1: permits a window admitted beyond a lowered quota were forgotten
// when the limits changed again, so the window re-opened.
func TestHoleQuotaDropAndRaiseKeepsTheExcess(t *testing.T) {
	for _, name := range []string{"raise", "cancel"} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := mustNew(t, 10, time.Second)
				time.Sleep(100 * time.Millisecond) // mid-window
				got := drain(l)
				for range 3 {
					if name == "cancel" {
						// An unrelated reservation in the current window,
						// made before the drop and cancelled after it.
						if err := l.SetQuota(10, time.Time{}); err != nil {
							t.Fatal(err)
						}
						r, err := l.Reserve(1, 0)
						if err == nil {
							got++ // valid at once: in the window's count until cancelled
						}
						if err := l.SetQuota(2, time.Time{}); err != nil {
							t.Fatal(err)
						}
						if r != nil {
							r.Cancel()
							got--
						}
						got += drain(l)
						continue
					}
					if err := l.SetQuota(2, time.Time{}); err != nil {
						t.Fatal(err)
					}
					if err := l.SetQuota(10, time.Time{}); err != nil {
						t.Fatal(err)
					}
					got += drain(l)
				}
				if got > 10 {
					t.Errorf("one window of quota ≤ 10 admitted %d", got)
				}
			})
		})
	}
}
