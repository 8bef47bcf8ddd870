package ledger

import (
	"fmt"
	"testing"
)

// TestAGrantWrittenAheadForAnOldTargetIsNotAdopted: 60 holders hold 100
// each of 6,000; transactions of 8 operations, configd's 8 rounds a
// call, so a publish to them is written ahead over two calls. For one
// call h00's target spikes to 3,000 (the others 50), and that call's
// rounds write 56 grants ahead, h00's at 3,000; from the next call on
// every holder wants 100 again, and the open publish is the target. The
// grants written ahead for the spike must go then: a 61st holder who
// joins 25 windows later (98 each) must not find h00 at 3,000 in the
// publish that takes it in, which nobody could take back before it ends
// (a holder releases only down to its last publish).
func TestAGrantWrittenAheadForAnOldTargetIsNotAdopted(t *testing.T) {
	for name, joinAt := range map[string]int{
		"joiner 25 windows later": 140,
	} {
		t.Run(name, func(t *testing.T) {
			const n, limit, spike = 60, 6000, 40
			s := NewState()
			k0 := int64(1000)
			for c := range joinAt + 4*12 {
				m := map[string]int64{}
				for i := range n {
					m[fmt.Sprintf("h%02d", i)] = limit / n
				}
				if c >= joinAt {
					for i := range n + 1 {
						m[fmt.Sprintf("h%02d", i)] = limit / (n + 1)
					}
				}
				if c == spike {
					m["h00"] = 3000
					for i := 1; i < n; i++ {
						m[fmt.Sprintf("h%02d", i)] = (limit - 3000) / (n - 1)
					}
				}
				p := Policy{Limit: limit, Window: w, Horizon: 8, Keep: 3, Slack: limit / 50, MaxOps: 8}
				k, now := k0+int64(c/4), StartOf(k0+int64(c/4), w)+int64(c%4)*int64(w)/4
				configdCall(t, s, p, m, now, 8)
				if c < joinAt {
					continue
				}
				e, _ := s.Head.Current()
				al := s.Allowances(e.Seq, k)
				var useful int64
				for h, q := range al {
					useful += min(q, m[h])
				}
				if al["h00"] > m["h00"]+p.Slack || useful < limit*9/10 {
					t.Fatalf("call %d, window %d (the spike was at call %d): h00 holds %d, its target %d; %s holds %d of %d; %d of the limit %d goes to holders who want it",
						c, k, spike, al["h00"], m["h00"], "h59", al["h59"], m["h59"], useful, limit)
				}
			}
		})
	}
}
