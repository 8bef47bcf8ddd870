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
