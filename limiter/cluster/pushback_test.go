package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// TestPushbackReported checks that the provider's pushback and remaining,
// told to the member's limiter, reach the instance record, where configd's
// adaptive controller reads them.
func TestPushbackReported(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	putConfig(t, cli, schema.ProviderConfig{Name: "api", Limit: 100, Window: schema.Duration(time.Second)})
	a := join(t, cli, "api", "a")
	enforcing(t, a, 100)
	for range 3 {
		a.Limiter().Pushback(2 * time.Second)
	}
	a.Limiter().Observe(limiter.Signal{HasRemaining: true, Remaining: 17, Reset: time.Millisecond})
	waitFor(t, "the provider's window to end", func() bool { return !a.Limiter().Stats().ProviderWindowEnd.IsZero() })
	var rec schema.InstanceRecord
	waitFor(t, "the pushbacks reported", func() bool {
		resp, err := cli.Get(context.Background(), keys.Instance("api", "a"))
		if err != nil || len(resp.Kvs) != 1 {
			return false
		}
		rec, err = schema.DecodeInstanceRecord(resp.Kvs[0].Value)
		return err == nil && rec.Pushbacks == 3 && !rec.RemainingAt.IsZero()
	})
	if rec.Remaining != 17 || rec.RetryUntil.IsZero() {
		t.Errorf("record %+v: want remaining 17 and a retry-until", rec)
	}
}
