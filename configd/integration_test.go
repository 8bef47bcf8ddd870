package main

// Integration tests: `configd serve` (through run, in goroutines) and
// cluster.Members (goroutines of this process) against one real embedded
// etcd. They prove what neither side's own tests can: that the shares the
// leader publishes reach every member, that every member switches at the
// window boundary the shares name, and that a retune, a graceful leave and
// a leader change all reach running members without a restart.
//
// Every wait polls a condition against a deadline; nothing asserts on
// elapsed wall-clock time. The helpers here are prefixed "it" so this file
// shares no names with the package's other test files.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/harness"
	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter/cluster"
)

const (
	// itWindow is the provider's window in these tests: short, so that a
	// change takes effect quickly.
	itWindow = 100 * time.Millisecond
	// itMargin is serve's --propagation-margin: how far ahead of the
	// publish the new shares take effect. The default (200ms) is ample for
	// a watch round trip; the tests run under -race on a shared machine,
	// where a goroutine may not run for a while, so they give it 500ms.
	// A member that received shares after their boundary would make
	// itRecorder.check fail.
	itMargin = 500 * time.Millisecond
	// itTimeout bounds every wait.
	itTimeout = 20 * time.Second
)

var itKeys = schema.DefaultKeys()

// itWait polls cond every 5ms until it holds, failing the test after
// itTimeout with what and the last explanation cond gave.
func itWait(t *testing.T, what string, cond func() (ok bool, why string)) {
	t.Helper()
	deadline := time.Now().Add(itTimeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; last: %s", itTimeout, what, why)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}

// itReplica is one `configd serve` run through run() in a goroutine, with a
// context of its own.
type itReplica struct {
	id     string
	addr   string // the admin API's address, read from the log (it listens on port 0)
	log    *logbuf.Buffer
	cancel context.CancelFunc
	done   chan struct{}
	err    error // what run returned; valid after done is closed
}

var servingRE = regexp.MustCompile(`msg="configd serving" listen=(\S+)`)

// itServe starts `configd serve --etcd-endpoints … --listen 127.0.0.1:0`
// and waits until its admin API answers; extra flags are added to those.
// Cleanup stops it (if the test has not) and expects a clean return.
func itServe(t *testing.T, srv *etcdtest.Server, id string, extra ...string) *itReplica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &itReplica{id: id, log: &logbuf.Buffer{}, cancel: cancel, done: make(chan struct{})}
	args := []string{"serve",
		"--etcd-endpoints", strings.Join(srv.Endpoints(), ","),
		"--listen", "127.0.0.1:0",
		"--replica-id", id,
		"--session-ttl", "1s",
		"--propagation-margin", itMargin.String(),
		"--log-level", "debug",
	}
	args = append(args, extra...)
	go func() {
		defer close(r.done)
		r.err = run(ctx, args, io.Discard, r.log)
	}()
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("replica %s: serve returned %v", id, err)
		}
		if t.Failed() {
			t.Logf("replica %s log:\n%s", id, r.log.String())
		}
	})
	itWait(t, "replica "+id+" to serve", func() (bool, string) {
		select {
		case <-r.done:
			t.Fatalf("replica %s exited: %v\n%s", id, r.err, r.log.String())
		default:
		}
		if r.addr == "" {
			m := servingRE.FindStringSubmatch(r.log.String())
			if m == nil {
				return false, "no 'configd serving' line in its log yet"
			}
			r.addr = m[1]
		}
		resp, err := http.Get(r.url() + "/healthz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return r
}

func (r *itReplica) url() string { return "http://" + r.addr }

// stop cancels the replica's context (a graceful shutdown: drain, resign)
// and returns what run returned.
func (r *itReplica) stop() error {
	r.cancel()
	select {
	case <-r.done:
		return r.err
	case <-time.After(itTimeout):
		return fmt.Errorf("serve did not return within %v of its context's end", itTimeout)
	}
}

// leading asks the replica's /readyz whether it is the leader.
func (r *itReplica) leading() bool {
	resp, err := http.Get(r.url() + "/readyz")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var v struct{ Leader bool }
	return json.NewDecoder(resp.Body).Decode(&v) == nil && v.Leader
}

// itCLI runs a configd subcommand through run and returns its stdout.
func itCLI(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
	defer cancel()
	var out, errOut bytes.Buffer
	if err := run(ctx, args, &out, &errOut); err != nil {
		t.Fatalf("configd %s: %v\nstderr: %s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String()
}

func itClient(t *testing.T, srv *etcdtest.Server) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// itJoin joins one member of provider for each id, concurrently, each with
// an etcd client of its own, as separate instances would. Cleanup closes
// them.
func itJoin(t *testing.T, srv *etcdtest.Server, provider string, ids ...string) []*cluster.Member {
	t.Helper()
	members := make([]*cluster.Member, len(ids))
	errs := make([]error, len(ids))
	logs := make([]*logbuf.Buffer, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		cli := itClient(t, srv)
		logs[i] = &logbuf.Buffer{}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
			defer cancel()
			members[i], errs[i] = cluster.Join(ctx, cli, provider,
				cluster.WithID(id),
				cluster.WithLeaseTTL(time.Second),
				cluster.WithReportInterval(100*time.Millisecond),
				// The fallback window equals the provider's, so the first
				// share applies at its own boundary (a window change waits
				// for a boundary common to both windows).
				cluster.WithFallback(0, itWindow),
				cluster.WithLogger(slog.New(slog.NewTextHandler(logs[i], nil))))
		})
	}
	wg.Wait()
	for i := range members {
		if members[i] == nil {
			continue
		}
		t.Cleanup(func() {
			members[i].Close()
			if t.Failed() {
				t.Logf("member %s log:\n%s", ids[i], logs[i].String())
			}
		})
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("join %s: %v", ids[i], err)
		}
	}
	return members
}

// itShares reads the view of the provider's share records.
func itShares(t *testing.T, cli *clientv3.Client, provider string) (schema.Shares, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
	defer cancel()
	sh, _, ok, err := harness.ReadShares(ctx, cli, provider)
	if err != nil {
		t.Fatal(err)
	}
	return sh, ok
}

// itSettle waits until the shares published for provider satisfy cond
// and every member has applied them: it holds its own share record's
// generation with the share it gives, has acknowledged it in its instance
// record, and (once the record's boundary has passed) its limiter
// enforces that share. The newest record is read again on every poll, so a
// republish while waiting (an instance's demand moved, say) is followed.
// It returns the record the members settled on.
func itSettle(t *testing.T, cli *clientv3.Client, provider, what string, cond func(schema.Shares) bool, members ...*cluster.Member) schema.Shares {
	t.Helper()
	var sh schema.Shares
	itWait(t, what+", applied by every member", func() (bool, string) {
		var ok bool
		sh, ok = itShares(t, cli, provider)
		if !ok {
			return false, "no shares published, or a record that does not decode"
		}
		why := fmt.Sprintf("generation %d total %d from %d shares %v", sh.Generation, sh.Total, sh.EffectiveFrom, sh.Shares)
		if !cond(sh) {
			return false, why
		}
		for _, m := range members {
			want := sh.Shares[m.ID()]
			st := m.Status()
			ls := m.Limiter().Stats()
			why := fmt.Sprintf("%s; %s: status generation %d share %d source %s, limiter quota %d window start %d",
				why, m.ID(), st.Generation, st.Share, st.Source, ls.Quota, ls.WindowStart.UnixNano())
			if st.Generation != sh.GenerationOf(m.ID()) || st.Share != want || st.Source != "shares" ||
				ls.Quota != want || ls.WindowStart.UnixNano() < sh.EffectiveFromOf(m.ID()) {
				return false, why
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
		defer cancel()
		resp, err := cli.Get(ctx, itKeys.Instances(provider), clientv3.WithPrefix())
		if err != nil {
			return false, err.Error()
		}
		acked := map[string]int64{}
		for _, kv := range resp.Kvs {
			if rec, err := schema.DecodeInstanceRecord(kv.Value); err == nil {
				acked[rec.ID] = rec.AppliedGeneration
			}
		}
		for _, m := range members {
			if acked[m.ID()] != sh.GenerationOf(m.ID()) {
				return false, fmt.Sprintf("%s; applied generations acknowledged in etcd: %v", why, acked)
			}
		}
		return true, ""
	})
	return sh
}

// itLeases returns each instance key's lease, to show that members did not
// register again (a restart would).
func itLeases(t *testing.T, cli *clientv3.Client, provider string) map[string]clientv3.LeaseID {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), itTimeout)
	defer cancel()
	resp, err := cli.Get(ctx, itKeys.Instances(provider), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]clientv3.LeaseID{}
	for _, kv := range resp.Kvs {
		out[strings.TrimPrefix(string(kv.Key), itKeys.Instances(provider))] = clientv3.LeaseID(kv.Lease)
	}
	return out
}

func itSum(m map[string]int64) (s int64) {
	for _, v := range m {
		s += v
	}
	return s
}

// itRecorder records, while a test runs, every Shares record published
// (through an etcd watch) and what each member's limiter enforces in each
// window (by sampling its Stats every millisecond or so). check then
// compares the two window by window.
type itRecorder struct {
	provider string
	mu       sync.Mutex
	gens     []schema.Shares                     // every published record, in generation order
	quotas   map[int64]map[string]map[int64]bool // window start → member → quotas seen in it
	members  map[string]*cluster.Member          // sampled now
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// itRecord starts recording; cleanup (registered here, so it runs after the
// members' closes registered later) stops it.
func itRecord(t *testing.T, cli *clientv3.Client, provider string) *itRecorder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &itRecorder{provider: provider, quotas: map[int64]map[string]map[int64]bool{}, members: map[string]*cluster.Member{}, cancel: cancel}
	// The watch must be in place before anything is published.
	wctx, wcancel := context.WithTimeout(ctx, itTimeout)
	defer wcancel()
	resp, err := cli.Get(wctx, itKeys.Shares(provider), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Fatalf("shares already published for %s", provider)
	}
	wch := cli.Watch(ctx, itKeys.Shares(provider), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	r.wg.Go(func() {
		set := schema.NewShareSet(itKeys, provider)
		for wr := range wch {
			for _, ev := range wr.Events {
				set.Apply(string(ev.Kv.Key), ev.Kv.Value, ev.Type == clientv3.EventTypeDelete)
			}
			sh, ok := set.View()
			if !ok {
				continue
			}
			// One view per generation: a publish's deletions of held
			// records may come in a response of their own.
			r.mu.Lock()
			if n := len(r.gens); n > 0 && r.gens[n-1].Generation == sh.Generation {
				r.gens[n-1] = sh
			} else {
				r.gens = append(r.gens, sh)
			}
			r.mu.Unlock()
		}
	})
	r.wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			r.mu.Lock()
			for id, m := range r.members {
				st := m.Limiter().Stats()
				ws := st.WindowStart.UnixNano()
				if st.Window != itWindow {
					continue // still in the fallback window before the first config
				}
				byMember := r.quotas[ws]
				if byMember == nil {
					byMember = map[string]map[int64]bool{}
					r.quotas[ws] = byMember
				}
				if byMember[id] == nil {
					byMember[id] = map[int64]bool{}
				}
				byMember[id][st.Quota] = true
			}
			r.mu.Unlock()
		}
	})
	t.Cleanup(func() {
		r.stop()
		if t.Failed() {
			for _, sh := range r.generations() {
				t.Logf("published: generation %d from %d total %d instances %d shares %v config revision %d by %s at %s",
					sh.Generation, sh.EffectiveFrom, sh.Total, sh.Instances, sh.Shares, sh.ConfigRevision, sh.Leader, sh.Published.Format("15:04:05.000"))
			}
		}
	})
	return r
}

func (r *itRecorder) stop() {
	r.cancel()
	r.wg.Wait()
}

// sample adds members to the sampled set, or with on false removes them.
func (r *itRecorder) sample(on bool, members ...*cluster.Member) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range members {
		if on {
			r.members[m.ID()] = m
		} else {
			delete(r.members, m.ID())
		}
	}
}

// waitSampled waits until the recorder has sampled every member in a
// window starting at or after from.
func (r *itRecorder) waitSampled(t *testing.T, from int64, members ...*cluster.Member) {
	t.Helper()
	itWait(t, "a sample of every member's limiter in the latest window", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, m := range members {
			seen := false
			for ws, byMember := range r.quotas {
				if _, ok := byMember[m.ID()]; ok && ws >= from {
					seen = true
				}
			}
			if !seen {
				return false, m.ID() + " not sampled yet"
			}
		}
		return true, ""
	})
}

// generations returns the records published so far.
func (r *itRecorder) generations() []schema.Shares {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.gens)
}

// check verifies, for every window sampled that starts at or after the
// first published record's boundary, that the quotas members enforced in
// it add up to at most the total of the record in force for it (the newest
// generation whose EffectiveFrom is not after the window's start).
//
// With exact set, it also verifies that every member enforced exactly that
// record's share for it (0 if the record does not name it) during the
// whole window: nobody switched early, late, or in the middle of a window.
// That holds also for a record superseded before its own boundary by one
// with a later boundary (joins in a burst publish such records): a member
// schedules every generation of a watch response, in order. But a member
// that follows the common record reads it again with its own record, and
// that read may already answer with the later one: it then keeps, until
// the later boundary, what was in force before the superseded record —
// less, never more, than it (CI saw b and c keep 0 through a generation
// that gave them 500 for one window, superseded 100 ms before it began).
//
// It returns, per generation, how many windows were checked exactly.
func (r *itRecorder) check(t *testing.T, exact bool) map[int64]int {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.gens) == 0 {
		t.Fatal("no shares were published")
	}
	for i := 1; i < len(r.gens); i++ {
		if r.gens[i].Generation <= r.gens[i-1].Generation || r.gens[i].EffectiveFrom < r.gens[i-1].EffectiveFrom {
			t.Errorf("generation %d (from %d) follows generation %d (from %d): generations and boundaries must grow",
				r.gens[i].Generation, r.gens[i].EffectiveFrom, r.gens[i-1].Generation, r.gens[i-1].EffectiveFrom)
		}
	}
	// inForce returns the record in force for the window starting at ws,
	// and whether a later record replaced it before its boundary.
	// It also returns the record in force before it (none: nil).
	inForce := func(ws int64) (sh schema.Shares, prev *schema.Shares, superseded, found bool) {
		i := -1
		for j, g := range r.gens {
			if g.EffectiveFrom <= ws {
				i = j
			}
		}
		if i < 0 {
			return sh, nil, false, false
		}
		sh = r.gens[i]
		for j := i - 1; j >= 0; j-- {
			if r.gens[j].EffectiveFrom < sh.EffectiveFrom {
				prev = &r.gens[j]
				break
			}
		}
		for _, g := range r.gens[i+1:] {
			if g.Published.UnixNano() < sh.EffectiveFrom && g.EffectiveFrom > sh.EffectiveFrom {
				superseded = true
			}
		}
		return sh, prev, superseded, true
	}
	exactly := map[int64]int{}
	checked, skipped := 0, 0
	for _, ws := range slices.Sorted(maps.Keys(r.quotas)) {
		sh, prev, superseded, ok := inForce(ws)
		if !ok {
			continue
		}
		checked++
		var total int64
		for id, qs := range r.quotas[ws] {
			total += slices.Max(slices.Collect(maps.Keys(qs)))
			if !exact {
				continue
			}
			var before int64 // what was in force before sh (0: nothing)
			if prev != nil {
				before = prev.Shares[id]
			}
			if superseded && len(qs) == 1 && qs[before] && before <= sh.Shares[id] {
				continue // read past the superseded record: kept the one before, which is less
			}
			if want := sh.Shares[id]; len(qs) != 1 || !qs[want] {
				t.Errorf("window %d: %s enforced quotas %v, want only %d (generation %d, in force from %d)",
					ws, id, slices.Sorted(maps.Keys(qs)), want, sh.Generation, sh.EffectiveFrom)
			}
		}
		if total > sh.Total {
			t.Errorf("window %d: members enforced %d in all, over the total %d (generation %d): %v",
				ws, total, sh.Total, sh.Generation, r.quotas[ws])
		}
		if exact && superseded {
			skipped++ // checked exactly too; counted apart for the log
		}
		if exact {
			exactly[sh.Generation]++
		}
	}
	if exact {
		t.Logf("%d generations published; %d windows checked; exactly, by generation: %v; %d of them under a generation superseded before its boundary",
			len(r.gens), checked, exactly, skipped)
	} else {
		t.Logf("%d generations published; %d windows checked (sum only)", len(r.gens), checked)
	}
	return exactly
}

// TestIntegrationSharesRetuneLeave runs one `configd serve` and four
// members, and proves: (a) the shares configd publishes reach every member
// and add up to at most the limit; (b) a retune with `configd set NAME
// --limit N` reaches every member without a restart (same leases) and every
// member applies it at the one window boundary the shares name; (c) a
// graceful Close of one member changes every other member's share. All
// along, every member enforces, in every window, exactly the share of the
// generation in force for that window.
func TestIntegrationSharesRetuneLeave(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := itClient(t, srv)
	rec := itRecord(t, cli, "api")
	r := itServe(t, srv, "solo")
	itWait(t, "the only replica to lead", func() (bool, string) { return r.leading(), "not leading" })
	server := "--server=" + r.url()

	itCLI(t, "set", "api", "--coordination", "shares", "--limit", "1000", "--window", itWindow.String(), server)
	members := itJoin(t, srv, "api", "a", "b", "c", "d")
	rec.sample(true, members...)

	// (a) Published shares reach every member and add up to at most the limit.
	sh := itSettle(t, cli, "api", "all of the limit handed out to four instances", func(sh schema.Shares) bool { return sh.Instances == 4 && itSum(sh.Shares) == sh.Total }, members...)
	if sh.Total != 1000 || itSum(sh.Shares) > sh.Total || len(sh.Shares) != 4 || sh.Leader != "solo" {
		t.Fatalf("published %+v, want 4 shares adding up to at most 1000, by solo", sh)
	}
	for _, m := range members {
		if sh.Shares[m.ID()] != 250 {
			t.Errorf("%s's published share %d, want 250 (even split)", m.ID(), sh.Shares[m.ID()])
		}
	}
	leases := itLeases(t, cli, "api")

	// (b) A retune reaches every member, at one boundary, without restart.
	out := itCLI(t, "set", "api", "--limit", "600", server)
	if !strings.Contains(out, "1000") || !strings.Contains(out, "600") {
		t.Errorf("set printed %q, want the change 1000 → 600", out)
	}
	before := sh.Generation
	sh = itSettle(t, cli, "api", "shares for the new limit", func(sh schema.Shares) bool { return sh.Total == 600 && itSum(sh.Shares) == 600 }, members...)
	if sh.Generation <= before || itSum(sh.Shares) > 600 || sh.EffectiveFrom%int64(itWindow) != 0 {
		t.Fatalf("after the retune: %+v", sh)
	}
	retuned := sh.Generation
	for _, m := range members {
		if st := m.Status(); st.Total != 600 || st.Source != "shares" || !st.Connected {
			t.Errorf("%s status after the retune: %+v", m.ID(), st)
		}
	}
	if got := itLeases(t, cli, "api"); !maps.Equal(got, leases) {
		t.Errorf("leases changed across the retune (a member registered again): %v → %v", leases, got)
	}

	// (c) A graceful leave changes every other share.
	leaver, stay := members[3], members[:3]
	rec.sample(false, leaver)
	if err := leaver.Close(); err != nil {
		t.Fatal(err)
	}
	// Close revoked the lease before returning: the key is gone already,
	// not after the TTL.
	if _, ok := itLeases(t, cli, "api")[leaver.ID()]; ok {
		t.Errorf("%s's instance key survived its Close", leaver.ID())
	}
	old := sh
	sh = itSettle(t, cli, "api", "shares without the leaver", func(sh schema.Shares) bool { return sh.Instances == 3 && itSum(sh.Shares) == 600 }, stay...)
	if _, ok := sh.Shares[leaver.ID()]; ok || itSum(sh.Shares) > 600 {
		t.Fatalf("after the leave: %+v", sh)
	}
	for _, m := range stay {
		if sh.Shares[m.ID()] == old.Shares[m.ID()] {
			t.Errorf("%s's share stayed %d after a member left", m.ID(), sh.Shares[m.ID()])
		}
	}

	// Every member enforced the retune's and the leave's shares exactly
	// from their boundaries on, window by window.
	rec.waitSampled(t, sh.EffectiveFrom, stay...)
	exactly := rec.check(t, true)
	for _, g := range []int64{retuned, sh.Generation} {
		if exactly[g] == 0 {
			t.Errorf("no window of generation %d was checked exactly", g)
		}
	}
}

// TestIntegrationLeaderFailover runs two `configd serve` replicas and four
// members, and proves (d): when the leader's context ends (a graceful
// shutdown) the other replica takes over, and a retune made afterwards
// still reaches every member, published by the new leader with a higher
// generation. The members enforce at most the limit in every window all
// along, also while no leader publishes (they fall back to the even split).
func TestIntegrationLeaderFailover(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := itClient(t, srv)
	rec := itRecord(t, cli, "api")
	replicas := map[string]*itReplica{"r1": itServe(t, srv, "r1"), "r2": itServe(t, srv, "r2")}
	itWait(t, "exactly one leader", func() (bool, string) {
		n := 0
		for _, r := range replicas {
			if r.leading() {
				n++
			}
		}
		return n == 1, fmt.Sprintf("%d leaders", n)
	})

	itCLI(t, "set", "api", "--coordination", "shares", "--limit", "1000", "--window", itWindow.String(), "--server="+replicas["r1"].url())
	members := itJoin(t, srv, "api", "a", "b", "c", "d")
	rec.sample(true, members...)
	sh := itSettle(t, cli, "api", "all of the limit handed out to four instances", func(sh schema.Shares) bool { return sh.Instances == 4 && itSum(sh.Shares) == sh.Total }, members...)

	leader := replicas[sh.Leader]
	if leader == nil || !leader.leading() {
		t.Fatalf("shares published by %q, which does not lead now", sh.Leader)
	}
	var other *itReplica
	for id, r := range replicas {
		if id != sh.Leader {
			other = r
		}
	}
	if err := leader.stop(); err != nil {
		t.Fatalf("leader %s: serve returned %v", leader.id, err)
	}
	itWait(t, other.id+" to take over", func() (bool, string) { return other.leading(), "not leading" })

	// A retune up: every share grows, which the new leader may only do
	// from the grants it finds in etcd.
	out := itCLI(t, "set", "api", "--limit", "1200", "--server="+other.url())
	if !strings.Contains(out, "1200") {
		t.Errorf("set printed %q", out)
	}
	before := sh.Generation
	sh = itSettle(t, cli, "api", "shares for the retune after the failover", func(sh schema.Shares) bool { return sh.Total == 1200 && itSum(sh.Shares) == 1200 }, members...)
	if sh.Leader != other.id || sh.Generation <= before || sh.Instances != 4 {
		t.Fatalf("after the failover and retune: %+v, want 4 shares by %s above generation %d", sh, other.id, before)
	}
	for _, m := range members {
		if sh.Shares[m.ID()] != 300 {
			t.Errorf("%s's share after the retune %d, want 300", m.ID(), sh.Shares[m.ID()])
		}
	}

	rec.waitSampled(t, sh.EffectiveFrom, members...)
	rec.check(t, false)
}
