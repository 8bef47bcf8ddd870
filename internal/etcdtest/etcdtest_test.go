package etcdtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, IgnoreLeaks()...)
}

// TestStopRestart proves that data survives Stop+Restart on the same
// directory and ports, and that clients see the outage in between.
func TestStopRestart(t *testing.T) {
	start := time.Now()
	srv := Start(t)
	t.Logf("ready in %v", time.Since(start))
	cli := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := cli.Get(short, "k")
	cancelShort()
	if err == nil {
		t.Fatal("Get succeeded while the server was stopped")
	}
	srv.Restart()
	resp, err := cli.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("after restart: %v", resp.Kvs)
	}
	srv.Stop()
	srv.Stop() // idempotent
}

// TestClientCerts: with WithClientCerts the member speaks TLS only, and
// only to clients presenting a certificate signed by the test's CA; it
// keeps doing so after a restart.
func TestClientCerts(t *testing.T) {
	certs := NewCerts(t)
	srv := Start(t, WithClientCerts(certs))
	if ep := srv.Endpoints()[0]; !strings.HasPrefix(ep, "https://127.0.0.1:") {
		t.Fatalf("endpoint %s, want https://127.0.0.1:PORT", ep)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := srv.Client(t).Put(ctx, "k", "v"); err != nil {
		t.Fatalf("client with certificate: %v", err)
	}

	refused := func(name string, cfg clientv3.Config) {
		t.Helper()
		cli, err := clientv3.New(cfg)
		if err == nil {
			defer cli.Close()
			short, cancel := context.WithTimeout(ctx, time.Second)
			_, err = cli.Get(short, "k")
			cancel()
		}
		if err == nil {
			t.Errorf("%s: Get succeeded", name)
			return
		}
		t.Logf("%s: %v", name, err)
	}
	noCert := srv.Config(t)
	tlsInfo := certs.ClientTLSInfo()
	tlsInfo.CertFile, tlsInfo.KeyFile = "", ""
	var err error
	if noCert.TLS, err = tlsInfo.ClientConfig(); err != nil {
		t.Fatal(err)
	}
	refused("no client certificate", noCert)

	other := NewCerts(t) // another CA
	foreign := srv.Config(t)
	info := other.ClientTLSInfo()
	info.TrustedCAFile = certs.CAFile
	if foreign.TLS, err = info.ClientConfig(); err != nil {
		t.Fatal(err)
	}
	refused("certificate of another CA", foreign)

	plain := srv.Config(t)
	plain.TLS = nil
	plain.Endpoints = []string{strings.Replace(srv.Endpoints()[0], "https://", "http://", 1)}
	refused("plain http", plain)

	srv.Stop()
	srv.Restart()
	if _, err := srv.Client(t).Get(ctx, "k"); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

// TestAuth: with WithAuth every request needs credentials; AddUser's users
// reach their prefixes and nothing else.
func TestAuth(t *testing.T) {
	srv := Start(t, WithAuth("root-pw"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	root := srv.Client(t)
	if _, err := root.Put(ctx, "/other/k", "v"); err != nil {
		t.Fatalf("root: %v", err)
	}
	srv.AddUser(t, "app", "app-pw", "/app/")
	cfg := srv.Config(t)
	cfg.Username, cfg.Password = "app", "app-pw"
	app, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if _, err := app.Put(ctx, "/app/k", "v"); err != nil {
		t.Fatalf("app in its prefix: %v", err)
	}
	if _, err := app.Get(ctx, "/app/", clientv3.WithPrefix()); err != nil {
		t.Fatalf("app reads its prefix: %v", err)
	}
	if _, err := app.Put(ctx, "/other/k", "w"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("app outside its prefix: %v, want permission denied", err)
	}
	if _, err := app.Get(ctx, "/", clientv3.WithPrefix()); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("app reading everything: %v, want permission denied", err)
	}

	anon := srv.Config(t)
	anon.Username, anon.Password = "", ""
	cli, err := clientv3.New(anon)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Get(ctx, "/app/k"); !errors.Is(err, rpctypes.ErrUserEmpty) && !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("no credentials: %v, want refused", err)
	}
	bad := srv.Config(t)
	bad.Password = "wrong"
	if cli, err := clientv3.New(bad); err == nil {
		cli.Close()
		t.Errorf("wrong password: client created")
	} else if !errors.Is(err, rpctypes.ErrAuthFailed) {
		t.Errorf("wrong password: %v, want %v", err, rpctypes.ErrAuthFailed)
	}
}

// TestClusterKillLeader: a three-member cluster keeps serving when its
// leader is killed, and the killed member catches up after Restart.
func TestClusterKillLeader(t *testing.T) {
	awaitPeerConns(t)
	start := time.Now()
	c := StartCluster(t, 3)
	t.Logf("3 members ready in %v", time.Since(start))
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v1"); err != nil {
		t.Fatal(err)
	}
	leader := -1
	for i, ep := range c.Endpoints() {
		st, err := cli.Status(ctx, ep)
		if err != nil {
			t.Fatal(err)
		}
		if st.Header.MemberId == st.Leader {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no member says it is the leader")
	}
	killed := c.Members[leader]
	// A watch stream on the member to be killed: Kill must end it.
	watcher, err := clientv3.New(killed.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	<-watcher.Watch(wctx, "k", clientv3.WithCreatedNotify())
	if n := killed.Kill(); n < 1 {
		t.Errorf("killing %s ended %d RPCs in progress, want at least the watch", killed.Name(), n)
	}
	if n := killed.Kill(); n != 0 { // idempotent
		t.Errorf("killing %s again ended %d RPCs", killed.Name(), n)
	}
	// A proposal made before the others elect a new leader would wait out
	// etcd's request timeout: wait for the election.
	for elected := false; !elected; {
		for i, ep := range c.Endpoints() {
			if i == leader {
				continue
			}
			st, err := cli.Status(ctx, ep)
			if err != nil {
				t.Fatal(err)
			}
			elected = elected || (st.Leader != 0 && st.Leader == st.Header.MemberId)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := cli.Put(ctx, "k", "v2"); err != nil {
		t.Fatalf("put with the leader (%s) killed: %v", killed.Name(), err)
	}
	killed.Restart()
	one, err := clientv3.New(killed.Config(t)) // the restarted member alone
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	resp, err := one.Get(ctx, "k") // linearizable: it has caught up
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v2" {
		t.Fatalf("restarted member reads %v, want v2", resp.Kvs)
	}
}

// awaitPeerConns registers, first so that it runs last, a wait for the
// peer connections between a cluster's members to end: once every member
// has stopped they end within etcd's peer read timeout (5 s), later than
// goleak's own retries wait.
func awaitPeerConns(t *testing.T) {
	t.Cleanup(func() {
		deadline := time.Now().Add(10 * time.Second)
		for goleak.Find(IgnoreLeaks()...) != nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// TestClusterStopRestart: with every member stopped the cluster answers
// nothing; restarted together, the members form it again with its data.
func TestClusterStopRestart(t *testing.T) {
	awaitPeerConns(t)
	c := StartCluster(t, 3)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v1"); err != nil {
		t.Fatal(err)
	}
	c.Stop()
	dctx, dcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := cli.Get(dctx, "k")
	dcancel()
	if err == nil {
		t.Fatal("a read with every member stopped succeeded")
	}
	c.Restart()
	resp, err := cli.Get(ctx, "k")
	if err != nil {
		t.Fatalf("read after the restart: %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v1" {
		t.Fatalf("after the restart k is %v, want v1", resp.Kvs)
	}
	if _, err := cli.Put(ctx, "k", "v2"); err != nil {
		t.Fatalf("write after the restart: %v", err)
	}
}
