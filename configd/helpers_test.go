package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/harness"
	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestMain checks that no test leaves a goroutine behind. etcdtest.IgnoreLeaks
// lists the only exceptions: process-wide loops of embed etcd's and gRPC's
// that are started once and never stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, etcdtest.IgnoreLeaks()...)
}

var keys = schema.DefaultKeys()

// waitFor polls cond every 10 ms until it is true, failing the test after
// timeout. It is how tests wait on state in etcd: no sleeps as
// synchronisation.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond) // polling interval, not synchronisation
	}
}

func freeAddr(t testing.TB) string {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		// Addresses are handed out before anything binds them: the same
		// free port twice (the kernel may give it again once released)
		// would make two servers of one test collide.
		if !handedOut.addrs[addr] {
			handedOut.addrs[addr] = true
			return addr
		}
	}
}

// handedOut is every address freeAddr returned in this process.
var handedOut = struct {
	sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// replica is one `configd serve` running in a goroutine through run.
type replica struct {
	id     string
	addr   string
	log    *logbuf.Buffer
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// startReplica runs `configd serve` against srv with the given extra flags
// and waits until its API answers.
func startReplica(t *testing.T, srv *etcdtest.Server, id string, extra ...string) *replica {
	t.Helper()
	r := &replica{id: id, addr: freeAddr(t), log: &logbuf.Buffer{}, done: make(chan error, 1)}
	args := append([]string{"serve", "--listen", r.addr, "--replica-id", id, "--session-ttl", "2s", "--log-level", "debug"}, extra...)
	if srv != nil {
		args = append(args, "--etcd-endpoints", strings.Join(srv.Endpoints(), ","))
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- run(ctx, args, io.Discard, r.log) }()
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("replica %s: serve returned %v", id, err)
		}
		if t.Failed() {
			t.Logf("replica %s log:\n%s", id, r.log.String())
		}
	})
	waitFor(t, 20*time.Second, "replica "+id+" to serve", func() bool {
		select {
		case err := <-r.done:
			r.done <- err
			t.Fatalf("replica %s exited: %v\n%s", id, err, r.log.String())
		default:
		}
		resp, err := http.Get(r.url() + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return r
}

func (r *replica) url() string { return "http://" + r.addr }

// stop cancels the replica's ctx (a graceful shutdown) and returns what
// run returned.
func (r *replica) stop() error {
	r.once.Do(func() {
		r.cancel()
		select {
		case r.err = <-r.done:
		case <-time.After(30 * time.Second):
			r.err = errors.New("serve did not return within 30s of cancel")
		}
	})
	return r.err
}

// leading asks the replica's /readyz whether it leads.
func (r *replica) leading() bool {
	resp, err := http.Get(r.url() + "/readyz")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var v struct{ Leader bool }
	return json.NewDecoder(resp.Body).Decode(&v) == nil && v.Leader
}

// cliRun runs a CLI subcommand through run and returns its stdout and
// error.
func cliRun(t testing.TB, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(ctxT(t), args, &out, &errOut)
	return out.String(), err
}

// cliOK runs a CLI subcommand that must succeed.
func cliOK(t testing.TB, args ...string) string {
	t.Helper()
	out, err := cliRun(t, args...)
	if err != nil {
		t.Fatalf("configd %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// addInstance registers a simulated instance of provider: an instance
// record (demand 10) on a lease of its own (60 s, so it does not expire
// during a test; revoke it to make the instance leave). The instance
// acknowledges every shares generation published from now on (see sim);
// instancesOf(t, cli, provider).silence(id) opts it out.
func addInstance(t testing.TB, cli *clientv3.Client, provider, id string) clientv3.LeaseID {
	t.Helper()
	return addInstanceDemand(t, cli, provider, id, 10)
}

// addInstanceDemand is addInstance with the demand the record reports.
func addInstanceDemand(t testing.TB, cli *clientv3.Client, provider, id string, demand int64) clientv3.LeaseID {
	t.Helper()
	lease, err := cli.Grant(ctxT(t), 60)
	if err != nil {
		t.Fatal(err)
	}
	putDemand(t, cli, provider, id, lease.ID, demand)
	return lease.ID
}

// putDemand rewrites an instance's record on its lease with a new demand,
// as an instance does every report interval. The record keeps the
// generation the instance acknowledged.
func putDemand(t testing.TB, cli *clientv3.Client, provider, id string, lease clientv3.LeaseID, demand int64) {
	t.Helper()
	instancesOf(t, cli, provider).put(id, lease, demand)
}

// readShares returns the view of the provider's share records, or false
// when there are none.
func readShares(t testing.TB, cli *clientv3.Client, provider string) (schema.Shares, bool) {
	t.Helper()
	sh, _, ok, err := harness.ReadShares(ctxT(t), cli, provider)
	if err != nil {
		t.Fatal(err)
	}
	return sh, ok
}

// waitShares waits until the provider's shares satisfy cond.
func waitShares(t testing.TB, cli *clientv3.Client, provider, what string, cond func(schema.Shares) bool) schema.Shares {
	t.Helper()
	var last schema.Shares
	waitFor(t, 15*time.Second, what, func() bool {
		sh, ok := readShares(t, cli, provider)
		last = sh
		return ok && cond(sh)
	})
	return last
}

// configKeyExists reports whether provider has a config key.
func configKeyExists(t testing.TB, cli *clientv3.Client, provider string) bool {
	t.Helper()
	resp, err := cli.Get(ctxT(t), keys.Config(provider), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count > 0
}

func writeFile(t testing.TB, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func withPrefix() clientv3.OpOption { return clientv3.WithPrefix() }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
