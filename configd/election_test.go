package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// Keys under the election prefix that no configd replica holds — foreign
// keys — must never block leadership silently (issue 16, finding 4).

// grant returns a new lease of ttl seconds, never kept alive: it outlives
// the test when ttl is long enough.
func grant(t testing.TB, cli *clientv3.Client, ttl int64) clientv3.LeaseID {
	t.Helper()
	l, err := cli.Grant(ctxT(t), ttl)
	if err != nil {
		t.Fatal(err)
	}
	return l.ID
}

func putKV(t testing.TB, cli *clientv3.Client, key, value string, opts ...clientv3.OpOption) {
	t.Helper()
	if _, err := cli.Put(ctxT(t), key, value, opts...); err != nil {
		t.Fatal(err)
	}
}

func keyExists(t testing.TB, cli *clientv3.Client, key string) bool {
	t.Helper()
	resp, err := cli.Get(ctxT(t), key, clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count > 0
}

// foreignKinds writes one foreign key of every kind under the election
// prefix and returns each key with the error its check must match. The
// instance record on the member's lease stays as it is.
func foreignKinds(t testing.TB, cli *clientv3.Client) map[string]error {
	t.Helper()
	out := map[string]error{}
	// Leaseless: it never goes by itself.
	k := keys.Election() + "/0000000000000001"
	putKV(t, cli, k, "configd-x")
	out[k] = schema.ErrElectionNoLease
	// On a lease, but not under the name the election gives that lease.
	k = keys.Election() + "/leader"
	putKV(t, cli, k, "configd-x", clientv3.WithLease(grant(t, cli, 60)))
	out[k] = schema.ErrElectionKeyName
	// Named after its lease, but the lease is an instance's: it lives as
	// long as the instance does.
	inst := grant(t, cli, 60)
	putKV(t, cli, keys.Instance("pay", "i-1"), `{"version":1,"id":"i-1"}`, clientv3.WithLease(inst))
	k = keys.ElectionKey(int64(inst))
	putKV(t, cli, k, "configd-x", clientv3.WithLease(inst))
	out[k] = errLeaseShared
	// Named after its lease, but a lease no replica's session has: two
	// hours, never kept alive, still blocks for two hours.
	long := grant(t, cli, 7200)
	k = keys.ElectionKey(int64(long))
	putKV(t, cli, k, "configd-x", clientv3.WithLease(long))
	out[k] = errLeaseTooLong
	// Named after its lease, but its value is no replica ID.
	odd := grant(t, cli, 60)
	k = keys.ElectionKey(int64(odd))
	putKV(t, cli, k, "not a replica", clientv3.WithLease(odd))
	out[k] = schema.ErrInvalidReplicaID
	return out
}

// TestForeignElectionKeysAreRemoved: with a foreign key of every kind
// older than any replica's, a replica still leads: each key is logged
// once with why, counted, and removed; the instance record sharing a
// lease with one of them stays. A foreign key written while the replica
// leads goes too.
func TestForeignElectionKeysAreRemoved(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	foreign := foreignKinds(t, cli)
	r := startReplica(t, srv, "r1")
	waitFor(t, 15*time.Second, "r1 to lead despite the foreign keys", r.leading)
	for k := range foreign {
		if keyExists(t, cli, k) {
			t.Errorf("foreign key %s still there", k)
		}
	}
	if !keyExists(t, cli, keys.Instance("pay", "i-1")) {
		t.Error("the instance record on the lease of a foreign key was removed")
	}
	logs := r.log.String()
	for k, why := range foreign {
		var found []string
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, `msg="foreign key in the configd election"`) && strings.Contains(line, "key="+k+" ") {
				found = append(found, line)
			}
		}
		if len(found) != 1 {
			t.Errorf("%s: %d log lines, want 1:\n%s", k, len(found), strings.Join(found, "\n"))
			continue
		}
		if want := whyText(why); !strings.Contains(found[0], want) {
			t.Errorf("%s: log line does not say %q:\n%s", k, want, found[0])
		}
	}
	waitFor(t, 5*time.Second, "the metrics to count the removals", func() bool {
		return r.metricValue(t, "configd_election_foreign_keys_removed_total") == itoa(int64(len(foreign))) &&
			r.metricValue(t, "configd_election_foreign_keys") == "0"
	})

	k := keys.Election() + "/late"
	putKV(t, cli, k, "r1")
	waitFor(t, 10*time.Second, "a foreign key written while r1 leads to go", func() bool { return !keyExists(t, cli, k) })
	if !r.leading() {
		t.Error("r1 stopped leading")
	}
	if !strings.Contains(r.log.String(), "key="+k+" ") {
		t.Errorf("the late foreign key was not logged:\n%s", r.log.String())
	}
}

// whyText is the part of a check's error the log and status must show.
func whyText(err error) string {
	s, _, _ := strings.Cut(strings.TrimPrefix(err.Error(), "configd: "), ":")
	return s
}

// TestLiveReplicaKeysAreNotRemoved: a key exactly as a replica's (a slow
// one that has not led yet, or a stuck leader whose session lives) is
// never removed: the replica waits behind it, says which key it waits for
// in status, and leads once the key's lease ends.
func TestLiveReplicaKeysAreNotRemoved(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	slow := grant(t, cli, 60)
	slowKey := keys.ElectionKey(int64(slow))
	putKV(t, cli, slowKey, "slow-replica", clientv3.WithLease(slow))
	r1 := startReplica(t, srv, "r1")
	r2 := startReplica(t, srv, "r2")
	// The replicas sweep the prefix when they start and look at each key
	// written later: once they have removed this one, they have seen the
	// slow replica's and their own.
	junk := keys.Election() + "/junk"
	putKV(t, cli, junk, "r9")
	waitFor(t, 10*time.Second, "the foreign key to go", func() bool { return !keyExists(t, cli, junk) })
	if !keyExists(t, cli, slowKey) {
		t.Fatal("the slow replica's key was removed")
	}
	if r1.leading() || r2.leading() {
		t.Fatal("a replica leads while an older live replica's key is there")
	}
	for _, r := range []*replica{r1, r2} {
		if strings.Contains(r.log.String(), "key="+slowKey) {
			t.Errorf("%s logged the slow replica's key as foreign:\n%s", r.id, r.log.String())
		}
	}

	cliOK(t, "set", "pay", "--limit", "10", "--server", r1.url())
	out := cliOK(t, "status", "pay", "--server", r1.url())
	if !strings.Contains(out, "election:  slow-replica leads") || strings.Contains(out, "FOREIGN") {
		t.Errorf("status does not show the slow replica leading:\n%s", out)
	}
	for _, id := range []string{"r1", "r2"} {
		if !strings.Contains(out, "election:  "+id+" waits") {
			t.Errorf("status does not show %s waiting:\n%s", id, out)
		}
	}

	if _, err := cli.Revoke(ctxT(t), slow); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "one of r1, r2 to lead once the slow replica is gone", func() bool { return r1.leading() != r2.leading() })
}

// TestStatusShowsForeignElectionKeys: configd status (direct, with no
// replica running, so nothing removes them) lists every key of the
// election, oldest first, with why a foreign one is no replica's, and
// says when the oldest blocks the election; --json carries the same.
func TestStatusShowsForeignElectionKeys(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ep := []string{"--etcd-endpoints", srv.Endpoints()[0]}
	cliOK(t, append([]string{"set", "pay", "--limit", "10"}, ep...)...)
	out := cliOK(t, append([]string{"status", "pay"}, ep...)...)
	if !strings.Contains(out, "election:  no configd replica campaigns") {
		t.Errorf("status with no election key:\n%s", out)
	}

	foreign := foreignKinds(t, cli)
	ok := grant(t, cli, 60)
	putKV(t, cli, keys.ElectionKey(int64(ok)), "configd-1", clientv3.WithLease(ok))
	out = cliOK(t, append([]string{"status", "pay"}, ep...)...)
	blocker := keys.Election() + "/0000000000000001" // the first one written
	if !strings.Contains(out, "election:  FOREIGN "+blocker+" blocks the election:") {
		t.Errorf("status does not say the oldest foreign key blocks the election:\n%s", out)
	}
	for k, why := range foreign {
		if !strings.Contains(out, "FOREIGN "+k+" ") || !strings.Contains(out, whyText(why)) {
			t.Errorf("status does not list %s with %q:\n%s", k, whyText(why), out)
		}
	}
	if !strings.Contains(out, "election:  configd-1 waits") {
		t.Errorf("status does not list the replica's key:\n%s", out)
	}

	var v struct {
		Election []struct {
			Key            string `json:"key"`
			Replica        string `json:"replica"`
			Lease          string `json:"lease"`
			CreateRevision int64  `json:"create_revision"`
			Foreign        string `json:"foreign"`
		} `json:"election"`
	}
	js := cliOK(t, append([]string{"status", "pay", "--json"}, ep...)...)
	if err := json.Unmarshal([]byte(js), &v); err != nil {
		t.Fatalf("status --json: %v\n%s", err, js)
	}
	if len(v.Election) != len(foreign)+1 {
		t.Fatalf("status --json lists %d election keys, want %d:\n%s", len(v.Election), len(foreign)+1, js)
	}
	for i, e := range v.Election {
		if i > 0 && e.CreateRevision <= v.Election[i-1].CreateRevision {
			t.Errorf("election keys not oldest first:\n%s", js)
		}
		why, isForeign := foreign[e.Key]
		switch {
		case isForeign && !strings.Contains(e.Foreign, whyText(why)):
			t.Errorf("%s: foreign = %q, want %q", e.Key, e.Foreign, whyText(why))
		case !isForeign && (e.Foreign != "" || e.Replica != "configd-1" || e.Lease != fmt.Sprintf("%x", ok)):
			t.Errorf("the replica's key: %+v", e)
		}
	}
}

// TestCheckElectionKeyLease: the checks of a key's lease, on what etcd
// answers — including a lease etcd no longer knows, which a key cannot
// normally outlive.
func TestCheckElectionKeyLease(t *testing.T) {
	k := keys.ElectionKey(0x694d7a)
	other := keys.Instance("pay", "i-1")
	for _, c := range []struct {
		name string
		resp clientv3.LeaseTimeToLiveResponse
		want error
	}{
		{"a replica's", clientv3.LeaseTimeToLiveResponse{ID: 0x694d7a, TTL: 7, GrantedTTL: 10, Keys: [][]byte{[]byte(k)}}, nil},
		{"the longest session", clientv3.LeaseTimeToLiveResponse{ID: 0x694d7a, TTL: 3600, GrantedTTL: 3600, Keys: [][]byte{[]byte(k)}}, nil},
		// After an etcd leader change the remaining TTL may exceed the
		// granted one; only the granted one says whose lease it is.
		{"extended by etcd", clientv3.LeaseTimeToLiveResponse{ID: 0x694d7a, TTL: 12, GrantedTTL: 10, Keys: [][]byte{[]byte(k)}}, nil},
		{"gone", clientv3.LeaseTimeToLiveResponse{ID: 0x694d7a, TTL: -1}, errLeaseGone},
		{"too long", clientv3.LeaseTimeToLiveResponse{ID: 0x694d7a, TTL: 3601, GrantedTTL: 3601, Keys: [][]byte{[]byte(k)}}, errLeaseTooLong},
		{"shared", clientv3.LeaseTimeToLiveResponse{ID: 0x694d7a, TTL: 7, GrantedTTL: 10, Keys: [][]byte{[]byte(k), []byte(other)}}, errLeaseShared},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := leaseProblem(keys, &c.resp); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
				t.Errorf("leaseProblem = %v, want %v", err, c.want)
			}
		})
	}
}

// TestCheckElectionKeyPermissionDenied: under etcd auth, a lease holding
// a key configd may not read cannot be a replica's session (whose only
// key is its election key, inside configd's prefix).
func TestCheckElectionKeyPermissionDenied(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.WithAuth("root-pw-a1b2c3d4e5"))
	srv.AddUser(t, "configd", "configd-pw-f6g7h8i9j0", "/sluice/")
	root := srv.Client(t)
	cfg := srv.Config(t)
	cfg.Username, cfg.Password = "configd", "configd-pw-f6g7h8i9j0"
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	lease := grant(t, root, 60)
	putKV(t, root, "/elsewhere/x", "y", clientv3.WithLease(lease))
	k := keys.ElectionKey(int64(lease))
	putKV(t, root, k, "configd-x", clientv3.WithLease(lease))
	resp, err := cli.Get(ctxT(t), k)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get %s: %v", k, err)
	}
	why, err := checkElectionKey(ctxT(t), cli, keys, resp.Kvs[0])
	if err != nil || !errors.Is(why, errLeaseShared) {
		t.Errorf("checkElectionKey = %v, %v; want errLeaseShared", why, err)
	}
	// A replica's key, as its user sees it: fine.
	own := grant(t, cli, 10)
	k = keys.ElectionKey(int64(own))
	putKV(t, cli, k, "configd-1", clientv3.WithLease(own))
	if resp, err = cli.Get(ctxT(t), k); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get %s: %v", k, err)
	}
	if why, err := checkElectionKey(ctxT(t), cli, keys, resp.Kvs[0]); why != nil || err != nil {
		t.Errorf("a replica's key: checkElectionKey = %v, %v", why, err)
	}
}
