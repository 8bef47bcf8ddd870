package cluster

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/internal/schema"
)

// putLeader puts a configd leader's key as concurrency.Election leaves
// it: named after its lease, on it, with the replica's ID.
func putLeader(t *testing.T, cli *clientv3.Client, lease clientv3.LeaseID) {
	t.Helper()
	put(t, cli, keys.ElectionKey(int64(lease)), "configd-test", clientv3.WithLease(lease))
}

// hasProblem reports whether m lists key among its problems, saying why.
func hasProblem(m *Member, key, why string) bool {
	return slices.ContainsFunc(m.Status().Problems, func(p string) bool {
		return strings.HasPrefix(p, key+": ") && strings.Contains(p, why)
	})
}

// TestForeignElectionKeyIsNoConfigd: a key under configd's election
// prefix that no configd replica can hold — leaseless, not named after its
// lease, on a lease granted for longer than any replica's session, or
// holding no replica ID — does not make members take configd for alive:
// with no configd running they stay on the even split, instead of waiting
// with nothing (or stale shares) for a publish that never comes. Each is
// listed in Status.Problems and logged once. A key as a replica's does
// make configd alive.
func TestForeignElectionKeyIsNoConfigd(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := context.Background()
	putConfig(t, cli, schema.ProviderConfig{Name: "api", Limit: 90, Window: schema.Duration(100 * time.Millisecond)})
	// Present when the members load the provider.
	leaseless := keys.Election() + "/0000000000000001"
	put(t, cli, leaseless, "configd-x")
	var logs logbuf.Buffer
	a := join(t, cli, "api", "a", WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	b := join(t, cli, "api", "b")
	for _, m := range []*Member{a, b} {
		enforcing(t, m, 45)
		if st := m.Status(); st.Source != "even" || !hasProblem(m, leaseless, "no lease") {
			t.Errorf("%s with a leaseless election key: %+v", m.ID(), st)
		}
	}

	// Written while they run.
	grant := func(ttl int64) clientv3.LeaseID {
		l, err := cli.Grant(ctx, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return l.ID
	}
	long := grant(7200)
	odd := grant(60)
	foreign := []struct{ key, value, why string }{
		{keys.Election() + "/leader", "configd-x", "not named after its lease"},
		{keys.ElectionKey(int64(long)), "configd-x", "granted for longer"},
		{keys.ElectionKey(int64(odd)), "not a replica", "replica id must be"},
	}
	put(t, cli, foreign[0].key, foreign[0].value, clientv3.WithLease(grant(60)))
	put(t, cli, foreign[1].key, foreign[1].value, clientv3.WithLease(long))
	put(t, cli, foreign[2].key, foreign[2].value, clientv3.WithLease(odd))
	for _, f := range foreign {
		for _, m := range []*Member{a, b} {
			waitFor(t, m.ID()+" to list "+f.key, func() bool { return hasProblem(m, f.key, f.why) })
		}
	}
	for _, m := range []*Member{a, b} {
		if st := m.Status(); st.Source != "even" || st.Share != 45 {
			t.Errorf("%s with foreign election keys: %+v", m.ID(), st)
		}
	}
	for _, k := range append([]string{leaseless}, foreign[0].key, foreign[1].key, foreign[2].key) {
		if n := strings.Count(logs.String(), "key="+k+" "); n != 1 {
			t.Errorf("%s logged %d times, want once:\n%s", k, n, logs.String())
		}
	}

	// A replica's key: configd is alive, and nothing is published yet.
	replica := grant(5)
	putLeader(t, cli, replica)
	for _, m := range []*Member{a, b} {
		enforcing(t, m, 0)
		if st := m.Status(); st.Source != "shares" {
			t.Errorf("%s with a replica's key: %+v", m.ID(), st)
		}
	}
	if _, err := cli.Revoke(ctx, replica); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*Member{a, b} {
		enforcing(t, m, 45)
	}
	// Removed (as configd does): no longer a problem.
	if _, err := cli.Delete(ctx, leaseless); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a to forget the removed key", func() bool { return !hasProblem(a, leaseless, "") })
}
