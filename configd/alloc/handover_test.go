package alloc

import (
	"maps"
	"math/rand/v2"
	"testing"

	"github.com/sluice-go/sluice/internal/share"
)

func TestHandoverGrowsOnlyFromWhatIsFree(t *testing.T) {
	tests := []struct {
		name               string
		total              int64
		target, bound      map[string]int64
		wantShares, wantGr map[string]int64
	}{
		{
			name:       "first publish: everything free",
			total:      100,
			target:     map[string]int64{"a": 50, "b": 50},
			bound:      map[string]int64{"a": 0, "b": 0},
			wantShares: map[string]int64{"a": 50, "b": 50},
			wantGr:     map[string]int64{"a": 50, "b": 50},
		},
		{
			name:       "a join: the old holder shrinks now, the newcomer waits",
			total:      100,
			target:     map[string]int64{"a": 50, "b": 50},
			bound:      map[string]int64{"a": 100, "b": 0},
			wantShares: map[string]int64{"a": 50, "b": 0},
			wantGr:     map[string]int64{"a": 100, "b": 0},
		},
		{
			name:       "after the shrink is acknowledged",
			total:      100,
			target:     map[string]int64{"a": 50, "b": 50},
			bound:      map[string]int64{"a": 50, "b": 0},
			wantShares: map[string]int64{"a": 50, "b": 50},
			wantGr:     map[string]int64{"a": 50, "b": 50},
		},
		{
			name:       "spare capacity grows at once",
			total:      100,
			target:     map[string]int64{"a": 30, "b": 70},
			bound:      map[string]int64{"a": 30, "b": 40},
			wantShares: map[string]int64{"a": 30, "b": 70},
			wantGr:     map[string]int64{"a": 30, "b": 70},
		},
		{
			name:       "partly free: growth in order of id",
			total:      100,
			target:     map[string]int64{"a": 10, "b": 45, "c": 45},
			bound:      map[string]int64{"a": 80, "b": 10, "c": 0},
			wantShares: map[string]int64{"a": 10, "b": 20, "c": 0},
			wantGr:     map[string]int64{"a": 80, "b": 20, "c": 0},
		},
		{
			name:       "total lowered: shrink everyone, grow no one",
			total:      50,
			target:     map[string]int64{"a": 25, "b": 25},
			bound:      map[string]int64{"a": 50, "b": 20},
			wantShares: map[string]int64{"a": 25, "b": 20},
			wantGr:     map[string]int64{"a": 50, "b": 20},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, g := Handover(tt.total, tt.target, tt.bound)
			if !maps.Equal(s, tt.wantShares) || !maps.Equal(g, tt.wantGr) {
				t.Errorf("handover = %v, granted %v; want %v, granted %v", s, g, tt.wantShares, tt.wantGr)
			}
		})
	}
}

// TestHandoverNeverOvershoots simulates instances that apply and
// acknowledge publishes at random and checks, after every publish, that no
// instance enforces more than its grant and the grants add up to at most the
// total — so no mix of old and new shares can exceed it — and that the target
// is reached in two publishes once everyone has acknowledged.
func TestHandoverNeverOvershoots(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const total = 1000
	for round := range 300 {
		n := 2 + rng.IntN(8)
		ids := make([]string, n)
		for i := range ids {
			ids[i] = string(rune('a' + i))
		}
		enforcing := map[string]int64{} // what each instance enforces now
		st := map[string]share.Standing{}
		publish := func(target map[string]int64) map[string]int64 {
			bound := map[string]int64{}
			for _, id := range ids {
				bound[id] = share.Bound(st[id])
			}
			shares, granted := Handover(total, target, bound)
			for _, id := range ids {
				st[id] = share.Standing{Share: shares[id], Grant: granted[id], Named: true, InEffect: true}
			}
			return shares
		}
		ack := func(id string, shares map[string]int64) {
			enforcing[id] = shares[id]
			s := st[id]
			s.Acked = true
			st[id] = s
		}
		for step := range 30 {
			target := map[string]int64{}
			left := int64(total)
			for i, id := range ids {
				v := rng.Int64N(left + 1)
				if i == len(ids)-1 {
					v = left
				}
				target[id] = v
				left -= v
			}
			shares := publish(target)
			for _, id := range ids {
				if rng.IntN(2) == 0 {
					ack(id, shares)
				}
			}
			var grants int64
			for _, id := range ids {
				grants += st[id].Grant
				if enforcing[id] > st[id].Grant {
					t.Fatalf("round %d step %d: %s enforces %d beyond its grant %d", round, step, id, enforcing[id], st[id].Grant)
				}
			}
			if grants > total {
				t.Fatalf("round %d step %d: grants add up to %d > total %d", round, step, grants, total)
			}
		}
		target := map[string]int64{}
		for i, id := range ids {
			target[id] = total / int64(n)
			if i == 0 {
				target[id] += total % int64(n)
			}
		}
		var shares map[string]int64
		for range 2 {
			shares = publish(target)
			for _, id := range ids {
				ack(id, shares)
			}
		}
		if !maps.Equal(shares, target) || Pending(shares, target) {
			t.Fatalf("round %d: after everyone acknowledged, shares %v, want %v", round, shares, target)
		}
	}
}
