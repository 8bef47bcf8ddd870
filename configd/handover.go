package main

import (
	"time"

	"github.com/sluice-go/sluice/configd/alloc"
	"github.com/sluice-go/sluice/internal/schema"
)

// bounds returns, for each live instance, the most it may be enforcing now
// under the published record cur (see alloc.Bound and the handover protocol
// in package alloc). A record from before grants counts its shares as the
// grants.
func bounds(cur *schema.Shares, live map[string]schema.InstanceRecord, now time.Time) map[string]int64 {
	b := make(map[string]int64, len(live))
	if cur == nil {
		return b
	}
	inEffect := !now.Before(cur.EffectiveTime())
	for id, rec := range live {
		share, named := cur.Shares[id]
		grant, granted := cur.Granted[id]
		if cur.Granted == nil {
			grant = share
		}
		b[id] = alloc.Bound(alloc.Standing{
			Share:    share,
			Grant:    grant,
			Named:    named || granted,
			Acked:    rec.AppliedGeneration >= cur.Generation,
			InEffect: inEffect,
		})
	}
	return b
}
