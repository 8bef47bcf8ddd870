package faults

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
)

// memberDown is how long the killed etcd member stays down, counted from
// the kill.
const memberDown = 8 * time.Second

// newClusterRig is newRig on a three-member etcd cluster: configd and the
// instances are given every member's endpoint.
func newClusterRig(t *testing.T, provider string) (*rig, *etcdtest.Cluster) {
	t.Helper()
	cl := etcdtest.StartCluster(t, 3)
	return rigOn(t, provider, cl.Config(t)), cl
}

// etcdLeader asks every member but skip (an index; -1 for none) for its
// status and returns the index of the one that says it leads, or -1 when
// none does (no leader, or one not asked).
func etcdLeader(cli *clientv3.Client, cl *etcdtest.Cluster, skip int) (int, error) {
	for i, ep := range cl.Endpoints() {
		if i == skip {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := cli.Status(ctx, ep)
		cancel()
		if err != nil {
			return -1, fmt.Errorf("%s: %w", cl.Members[i].Name(), err)
		}
		if st.Leader != 0 && st.Leader == st.Header.MemberId {
			return i, nil
		}
	}
	return -1, nil
}

// caughtUp reports whether member s answers a linearizable read by itself:
// it is back in the cluster and has caught up with the leader's commits.
func caughtUp(t *testing.T, s *etcdtest.Server) bool {
	t.Helper()
	cli, err := clientv3.New(s.Config(t))
	if err != nil {
		return false
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = cli.Get(ctx, "/")
	return err == nil
}

// TestEtcdLeaderKilled: etcd is a cluster of three members (embedded in the
// test process); configd and three instances are given all three endpoints.
// Under load, the raft leader is killed (no leadership transfer) and
// restarted on its data dir 8 s later. The two others keep a quorum: an
// instance that keeps its lease must keep its share, one whose session
// ended must register again; configd's generations must never conflict, no
// aligned window may go over the limit, and the killed member must catch
// up.
func TestEtcdLeaderKilled(t *testing.T) {
	r, cl := newClusterRig(t, "fault-etcd-member")
	c := startConfigd(t, r.endpoint, "cd-a")
	c.cli(t, "set", r.provider, "--coordination", "shares", "--limit", fmt.Sprint(limit), "--algorithm", "even")
	insts := r.startInstances(t, 3)
	before := r.settleEven(t, insts...)
	if _, _, err := c.errs.wait(0, 10*time.Second, func(s string) bool { return strings.Contains(s, `msg="became leader"`) }); err != nil {
		t.Fatal(err)
	}
	old, err := leases(r)
	if err != nil {
		t.Fatal(err)
	}
	from := startLoad(insts...)
	waitUntil(time.Unix(0, (from+2)*int64(window)))

	leader, err := etcdLeader(r.cli, cl, -1)
	if err != nil || leader < 0 {
		t.Fatalf("no etcd leader found before the fault (%v)", err)
	}
	victim := cl.Members[leader]
	errsFrom := make([]int, len(insts))
	for i, in := range insts {
		errsFrom[i] = in.errs.len()
	}
	cdErrsFrom := c.errs.len()
	// Kill returns once the member's listeners are closed (about a second);
	// the others' election is watched meanwhile.
	down := time.Now()
	type killResult struct {
		ended int
		took  time.Duration
	}
	killDone := make(chan killResult, 1)
	go func() {
		n := victim.Kill()
		killDone <- killResult{n, time.Since(down)}
	}()
	var elected time.Time
	newLeader := -1
	for deadline := time.Now().Add(30 * time.Second); ; {
		newLeader, err = etcdLeader(r.cli, cl, leader)
		if err == nil && newLeader >= 0 {
			elected = time.Now()
			break
		}
		if time.Now().After(deadline) {
			<-killDone
			t.Fatalf("no new etcd leader within 30s of the kill (%v)", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	kr := <-killDone
	t.Logf("injected: etcd member %s (%s), the raft leader, killed at %s for %v — method: in the test process, its raft node and peer transport stopped at once without a leadership transfer (EtcdServer.HardStop), and the client RPCs it was serving ended at once with Unavailable, as when a dead process's connections reset (%d in progress: the watch and lease keep-alive streams that configd, the instances and the test had opened on this member); then its listeners closed (Kill took %v); members %s stay up",
		victim.Name(), victim.Endpoints()[0], down.UTC().Format("15:04:05.000"), memberDown, kr.ended, kr.took.Round(time.Millisecond), others(cl, leader))
	t.Logf("etcd: %s elected leader %v after the kill", cl.Members[newLeader].Name(), elected.Sub(down).Round(time.Millisecond))

	// While the member is down: every instance that kept its lease keeps
	// its share (one whose session ended registers again, and gets its
	// share back through a handover).
	waitUntil(down.Add(memberDown - 2*time.Second))
	mid, err := leases(r)
	if err != nil {
		t.Fatalf("reading the instances' leases with one member of three down: %v", err)
	}
	for _, in := range insts {
		st := in.stats(t)
		kept := mid[in.id] == old[in.id]
		t.Logf("while %s is down: %s share %s (%s, gen %s), lease kept %v", victim.Name(), in.id, st["share"], st["source"], st["gen"], kept)
		if kept && st["share"] != fmt.Sprint(before.Shares[in.id]) {
			t.Errorf("%s: share %s while one etcd member of three was down and its lease held, want %d", in.id, st["share"], before.Shares[in.id])
		}
	}
	waitUntil(down.Add(memberDown))
	restart := time.Now()
	victim.Restart()
	up := time.Now()
	t.Logf("injected: %s restarted on its data dir after %v down (Restart took %v)", victim.Name(), restart.Sub(down).Round(time.Millisecond), up.Sub(restart).Round(time.Millisecond))
	var caught time.Time
	for deadline := time.Now().Add(30 * time.Second); ; {
		if caughtUp(t, victim) {
			caught = time.Now()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not catch up within 30s of its restart", victim.Name())
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Every instance is registered (its lease kept, or a new one).
	var cur map[string]int64
	for deadline := time.Now().Add(30 * time.Second); ; {
		cur, err = leases(r)
		if err == nil && len(cur) == len(insts) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("instances not all registered within 30s of the restart: leases %v, err %v", cur, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	after := r.settleEven(t, insts...)
	settled := time.Now()
	waitUntil(settled.Add(2 * window))
	to := stopLoad(insts...)
	logPhases(t, insts...)

	evs := r.published(t)
	checkApplied(t, evs, insts...)
	t.Logf("invariant: generations strictly increase, each published once: %d shares records (gen %d to %d); configd leader changes %d; %d shares records published during the fault",
		len(evs), evs[0].sh.Generation, evs[len(evs)-1].sh.Generation, c.leaderChanges(), publishedBetween(evs, down, caught))
	tl := checkWindows(t, r, "whole run, member kill included", from, to)
	for k := windowIndex(down) - 1; k <= windowIndex(caught)+1; k++ {
		t.Logf("around the kill: %s", tl.row(k))
	}
	kept := 0
	for _, in := range insts {
		errs := in.errs.snapshot()[errsFrom[in.index-1]:]
		how := "kept its lease (stayed connected)"
		if cur[in.id] != old[in.id] {
			how = "registered again with a new lease (recovered)"
		} else {
			kept++
		}
		t.Logf("invariant: instances stay connected or recover: %s %s; from the kill on it logged %d warnings or errors and %d fail-static lines",
			in.id, how, warnings(errs), countMatching(errs, "fail-static"))
	}
	t.Logf("configd logged %d warnings or errors from the kill to the end", warnings(c.errs.snapshot()[cdErrsFrom:]))
	t.Logf("recovery: new etcd leader %v after the kill; %s caught up %v after its restart; %d of %d instances kept their lease; even split (gen %d, before the kill gen %d) in force and applied by all %v after the restart",
		elected.Sub(down).Round(time.Millisecond), victim.Name(), caught.Sub(up).Round(time.Millisecond), kept, len(insts),
		after.Generation, before.Generation, settled.Sub(up).Round(time.Millisecond))
}

// others names the members other than index i.
func others(cl *etcdtest.Cluster, i int) string {
	var names []string
	for j, s := range cl.Members {
		if j != i {
			names = append(names, s.Name())
		}
	}
	return strings.Join(names, " and ")
}

// publishedBetween counts the shares records seen in [from, to].
func publishedBetween(evs []sharesEvent, from, to time.Time) int {
	n := 0
	for _, ev := range evs {
		if !ev.seen.Before(from) && !ev.seen.After(to) {
			n++
		}
	}
	return n
}

// warnings counts the slog lines at WARN or ERROR.
func warnings(lines []string) int {
	return countMatching(lines, "level=WARN") + countMatching(lines, "level=ERROR")
}

// countMatching counts the lines containing s.
func countMatching(lines []string, s string) int {
	n := 0
	for _, l := range lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}
