package etcdtest

import (
	"context"
	"testing"
	"time"

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
