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

// TestPushbackReportedAtOnce: a pushback, and the end of the provider's
// window with its remaining, reach the instance record within a moment,
// not at the next report interval: configd's controller lowers the
// fleet's limit from it, and a report interval's wait put that decision
// a window later (bench/adaptive: 1000 → 600 converged in 4–6 s).
func TestPushbackReportedAtOnce(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	putConfig(t, cli, schema.ProviderConfig{Name: "api", Limit: 100, Window: schema.Duration(time.Second)})
	const every = 5 * time.Second
	a := join(t, cli, "api", "a", WithReportInterval(every))
	enforcing(t, a, 100)
	record := func() schema.InstanceRecord {
		resp, err := cli.Get(context.Background(), keys.Instance("api", "a"))
		if err != nil || len(resp.Kvs) != 1 {
			return schema.InstanceRecord{}
		}
		rec, _ := schema.DecodeInstanceRecord(resp.Kvs[0].Value)
		return rec
	}
	within := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(every / 5); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s not reported within %v (report interval %v)", what, every/5, every)
			}
		}
	}
	a.Limiter().Pushback(time.Millisecond)
	within("the pushback", func() bool { return record().Pushbacks == 1 })
	time.Sleep(every / 2) // news of a window's end waits half an interval after the last write
	a.Limiter().Observe(limiter.Signal{HasRemaining: true, Remaining: 17, Reset: time.Millisecond})
	time.Sleep(5 * time.Millisecond)
	a.Limiter().Observe(limiter.Signal{HasRemaining: true, Remaining: 40, Reset: time.Second}) // the next window's first answer
	within("the window's remaining", func() bool { rec := record(); return rec.Remaining == 17 && !rec.RemainingAt.IsZero() })
}
