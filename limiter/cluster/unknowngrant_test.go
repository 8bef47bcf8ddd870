package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestUnknownGrantIsNotAnEvenCap: after a takeover with the common record
// missing, configd (takeover, grantUnknown/holdUnknown) writes the
// followers a common record of share 0 granted the whole limit. An
// instance that reads it with configd gone again (the leader's deletion
// seen before the record, or a session's load after it) never enforced
// it, so the even split caps it at the record's grant: the whole limit.
// Rule 1 of follow.Even assumes the grants in the records add up to the
// limit; these add up to N times it. b and c each take limit/n = 30 while
// a, cut off, still enforces 60 under its fail-static: 120 of 90.
func TestUnknownGrantIsNotAnEvenCap(t *testing.T) {
	const w = 100 * time.Millisecond
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	putConfig(t, cli, schema.ProviderConfig{Name: "api", Limit: 90, Window: schema.Duration(w), FailStatic: schema.Duration(3 * time.Second)})
	ctx := context.Background()
	leader := liveLeader(t, cli)
	px, pcli := cutOffable(t, srv)
	a := join(t, pcli, "api", "a")
	b := join(t, cli, "api", "b")
	c := join(t, cli, "api", "c")
	from := time.Now().Add(2 * w).Truncate(w).UnixNano()
	put(t, cli, keys.Share("api", "a"), mustEncode(t, schema.ShareRecord{Version: 1, Provider: "api", Instance: "a", Generation: 7,
		EffectiveFrom: from, Window: schema.Duration(w), Total: 90, Share: 60, Granted: 60}))
	put(t, cli, keys.CommonShare("api"), mustEncode(t, schema.ShareRecord{Version: 1, Provider: "api", Instance: schema.CommonInstance,
		Generation: 7, EffectiveFrom: from, Window: schema.Duration(w), Total: 90, Share: 15, Granted: 15}))
	for _, id := range []string{"b", "c"} {
		put(t, cli, keys.Share("api", id), mustEncode(t, schema.ShareRecord{Version: 1, Provider: "api", Instance: id, Generation: 7, Common: true}))
	}
	enforcing(t, a, 60)
	enforcing(t, b, 15)
	enforcing(t, c, 15)

	px.Cut()
	horizon := a.Status().AdmitsUntil // a enforces 60 in every window until then
	// The common record goes (a hand edit); r1 goes; r2 takes over, cannot
	// resolve b's and c's records, and writes the common record of
	// nothing granted the whole limit (configd/shares.go unknownGrant);
	// then r2 goes too. b and c see configd gone before r2's record.
	if _, err := cli.Delete(ctx, keys.CommonShare("api")); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, leader); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b on the even split", func() bool { return b.Status().Source == "even" })
	waitFor(t, "c on the even split", func() bool { return c.Status().Source == "even" })
	put(t, cli, keys.CommonShare("api"), mustEncode(t, schema.ShareRecord{Version: 1, Provider: "api", Instance: schema.CommonInstance,
		Generation: 8, EffectiveFrom: time.Now().Add(2 * w).Truncate(w).UnixNano(), Window: schema.Duration(w), Total: 90, Share: 0, Granted: 90}))
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) && time.Now().Before(horizon) {
		bq, cq := b.Limiter().Stats().Quota, c.Limiter().Stats().Quota
		if 60+bq+cq > 90 {
			t.Fatalf("b enforces %d and c %d while a, cut off, enforces 60 until %s: %d of 90", bq, cq, horizon.Format("15:04:05.000"), 60+bq+cq)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("b %+v c %+v", b.Status(), c.Status())
}
