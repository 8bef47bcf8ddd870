package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// embeddedClient returns a client of the embedded etcd at url, as user
// with the password configd generated under dataDir ("" user: none).
func embeddedClient(t *testing.T, url, dataDir, user string) *clientv3.Client {
	t.Helper()
	// The dial authenticates (a bcrypt check on the server), which under
	// the race detector on a loaded machine passed 5 s in a CI run.
	cfg := clientv3.Config{Endpoints: []string{url}, DialTimeout: 30 * time.Second, Logger: zap.NewNop()}
	if user != "" {
		pw, err := readPassword(dataDir, user)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Username, cfg.Password = user, pw
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestEmbeddedEtcdIsClosed (issue 16, findings 1 and 2): the embedded etcd,
// the default on one machine, served unauthenticated reads and writes on
// its client URL, and its JSON gateway took a forged shares record from
// any local user (or a web page, through DNS rebinding). Now nobody without
// credentials reads or writes; the instances' credentials reach only what
// instances write (their records), the reader's only reads; the gateway is
// off; the credentials are files only configd's OS user can read; and an
// instance with its credentials joins and is granted the limit by the
// ledger, the default coordination.
func TestEmbeddedEtcdIsClosed(t *testing.T) {
	dir := t.TempDir()
	clientURL, peerURL := "http://"+freeAddr(t), "http://"+freeAddr(t)
	r := startReplica(t, nil, "solo", "--data-dir", dir, "--embedded-client-url", clientURL, "--embedded-peer-url", peerURL)
	cliOK(t, "set", "pay", "--limit", "40", "--window", "100ms", "--server", r.url())
	ctx := ctxT(t)

	// No credentials: nothing.
	anon := embeddedClient(t, clientURL, dir, "")
	if _, err := anon.Put(ctx, keys.Share("pay", "x"), "{}"); !errors.Is(err, rpctypes.ErrUserEmpty) {
		t.Errorf("unauthenticated write: %v, want %v", err, rpctypes.ErrUserEmpty)
	}
	if _, err := anon.Get(ctx, keys.Prefix(), clientv3.WithPrefix()); !errors.Is(err, rpctypes.ErrUserEmpty) {
		t.Errorf("unauthenticated read: %v, want %v", err, rpctypes.ErrUserEmpty)
	}
	// The gateway is off: the JSON API is not served.
	resp, err := http.Post(clientURL+"/v3/kv/put", "text/plain", strings.NewReader(`{"key":"eA==","value":"eQ=="}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("POST /v3/kv/put: %s, want 404 (no gateway)", resp.Status)
	}

	// The credentials: readable by configd's OS user only.
	for _, user := range []string{rootUser, instanceUser, readerUser} {
		fi, err := os.Stat(credentialsFile(dir, user))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("credentials of %s: %v, mode %v; want 0600", user, err, fi.Mode())
		}
	}
	if fi, err := os.Stat(dir + "/" + credentialsDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("credentials directory: %v; want mode 0700", err)
	}

	// An instance: joins with its credentials and is granted the whole
	// limit by the ledger; may write nothing but its provider's instance
	// records, even marks and ledger releases.
	inst := embeddedClient(t, clientURL, dir, instanceUser)
	// A lease of 5 s: on this embedded etcd, with authentication and
	// under the race detector, keepalives of a 2 s lease were late on a
	// loaded machine, and the instance kept registering again.
	m, err := cluster.Join(ctx, inst, "pay", cluster.WithID("a"), cluster.WithLeaseTTL(5*time.Second),
		cluster.WithReportInterval(100*time.Millisecond), cluster.WithFallback(0, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	waitFor(t, 60*time.Second, "the instance to get the whole limit", func() bool {
		st := m.Status()
		return st.Source == schema.SourceLedger && st.Share == 40
	})
	denied := map[string]string{
		"config":                        keys.Config("pay"),
		"shares":                        keys.Share("pay", "x"),
		"another provider's even marks": keys.EvenMark("other", "x"),
		"history":                       keys.HistoryEntry("pay", 1),
		"election":                      keys.Election() + "/forged",
		"another provider's instances":  keys.Instance("other", "x"),
		"a ledger's head":               string(ledger.Keys(keys.Ledger("pay")).Head()),
		"a ledger's grant":              ledger.Keys(keys.Ledger("pay")).Grant("x.1", 1),
	}
	for what, key := range denied {
		if _, err := inst.Put(ctx, key, "{}"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("instance writing %s (%s): %v, want %v", what, key, err, rpctypes.ErrPermissionDenied)
		}
	}
	if _, err := inst.Put(ctx, keys.EvenMark("pay", "x"), "{}"); err != nil {
		t.Errorf("instance writing an even-split mark of its provider: %v", err)
	}
	if _, err := inst.Put(ctx, ledger.Keys(keys.Ledger("pay")).AllReleases()+"x.1/1", "{}"); err != nil {
		t.Errorf("instance writing a release of its provider's ledger: %v", err)
	}
	if _, err := inst.Get(ctx, keys.Ledger("pay"), clientv3.WithPrefix()); err != nil {
		t.Errorf("instance reading its provider's ledger: %v", err)
	}
	if _, err := inst.Delete(ctx, keys.Instance("pay", "a")); err != nil {
		t.Errorf("instance deleting an instance record of its provider: %v", err)
	}

	// The reader: everything, read only.
	reader := embeddedClient(t, clientURL, dir, readerUser)
	if resp, err := reader.Get(ctx, keys.Prefix(), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count == 0 {
		t.Errorf("reader reading the prefix: %v", err)
	}
	if _, err := reader.Put(ctx, keys.Instance("pay", "b"), "{}"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("reader writing: %v, want %v", err, rpctypes.ErrPermissionDenied)
	}

	// A provider created later: its instances may write their records.
	cliOK(t, "set", "later", "--limit", "10", "--server", r.url())
	if _, err := inst.Put(ctx, keys.Instance("later", "x"), "{}"); err != nil {
		t.Errorf("instance writing a record of a provider created after the start: %v", err)
	}
}

// TestEmbeddedEtcdServesTLS: with an https client URL (what serving beyond
// loopback requires) the embedded etcd speaks TLS there, configd reaches it
// through a plain loopback listener of its own, and an instance joins over
// TLS with its credentials and is granted the limit by the ledger. (Tests bind to loopback; that a non-loopback
// URL needs TLS is TestConfigValidate's.)
func TestEmbeddedEtcdServesTLS(t *testing.T) {
	certs := etcdtest.NewCerts(t)
	dir := t.TempDir()
	clientURL, peerURL := "https://"+freeAddr(t), "http://"+freeAddr(t)
	r := startReplica(t, nil, "solo", "--data-dir", dir, "--embedded-client-url", clientURL, "--embedded-peer-url", peerURL,
		"--embedded-cert-file", certs.ServerCertFile, "--embedded-key-file", certs.ServerKeyFile)
	cliOK(t, "set", "pay", "--limit", "30", "--window", "100ms", "--server", r.url())
	tlsCfg, err := certs.ClientTLSInfo().ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	pw, err := readPassword(dir, instanceUser)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{clientURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		TLS: tlsCfg, Username: instanceUser, Password: pw})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	m, err := cluster.Join(ctxT(t), cli, "pay", cluster.WithID("a"), cluster.WithLeaseTTL(2*time.Second),
		cluster.WithReportInterval(100*time.Millisecond), cluster.WithFallback(0, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	waitFor(t, 10*time.Second, "the instance to get the whole limit over TLS", func() bool {
		st := m.Status()
		return st.Source == schema.SourceLedger && st.Share == 30
	})
	// Plain HTTP on the https URL gets nowhere.
	plain := embeddedClient(t, strings.Replace(clientURL, "https://", "http://", 1), dir, "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := plain.Get(ctx, keys.Prefix()); err == nil {
		t.Error("a plain connection to the https client URL was served")
	}
}
