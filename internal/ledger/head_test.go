package ledger

import (
	"testing"
	"time"
)

// TestAHeadStaysReadableUnderALimitThatKeepsMoving: every change
// of the limit adds a step to the current era's Limits, and nothing ever
// drops the steps below the floor, so the head, one record, grows by
// about 34 bytes a change of the limit for as long as the era lasts (the
// window's length stays). An adaptive provider probes every other round
// of its controller (every 500 ms): with 1 s windows one step a window.
// Past MaxRecord (64 KiB) Encode still writes the head (it does not check
// the size) but Decode refuses it: every whole read of the ledger reports
// it as a bad record, configd's rounds (store.Publisher) fail with "do not
// decode" from then on, and the grants end a horizon later for good. Here
// the limit alternates between 1,000 and 1,100 every window for up to 8,000 windows.
func TestAHeadStaysReadableUnderALimitThatKeepsMoving(t *testing.T) {
	const keys = Keys("/l/")
	s := NewState()
	k0 := int64(1_765_000_000) // 1 s windows in 2025
	for i := range int64(8000) {
		limit := int64(1000)
		if i%2 == 1 {
			limit = 1100
		}
		p := Policy{Limit: limit, Window: w, Horizon: 10, Keep: 2, Slack: limit / 50}
		c, err := Plan(s, p, map[string]int64{"a": limit / 2, "b": limit / 2}, StartOf(k0+i, w))
		if err != nil {
			t.Fatalf("window %d: %v", i, err)
		}
		if c.Empty() {
			continue
		}
		ops, err := keys.Ops(c)
		if err != nil {
			t.Fatalf("window %d: %v", i, err)
		}
		// The head as a reader of etcd decodes it.
		got := NewState()
		if err := keys.Decode(got, ops[0].Key, ops[0].Value); err != nil {
			steps := len(c.Head.Eras[len(c.Head.Eras)-1].Limits)
			t.Fatalf("after %d windows (%v of a limit moving every window) the head configd writes is %d bytes, %d limit steps, and no reader decodes it: %v",
				i, time.Duration(i)*w, len(ops[0].Value), steps, err)
		}
		apply(s, c)
	}
}
