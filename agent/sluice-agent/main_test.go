package main

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-go/sluice/agent"
	"github.com/sluice-go/sluice/limiter"
)

// TestProbe runs --probe against a real agent on a socket, and against a
// path where none serves.
func TestProbe(t *testing.T) {
	dir := t.TempDir()
	cfg := agent.DefaultConfig()
	cfg.Socket, cfg.GRPCSocket = filepath.Join(dir, "a.sock"), ""
	cfg.Local = []agent.LocalProvider{{Name: "p", Limits: []limiter.Limit{{Quota: 10, Window: time.Second}}}}
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ls, err := a.Listen() // the socket accepts from here on
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ls) }()
	defer func() { cancel(); <-done }()

	var stderr bytes.Buffer
	if code := run([]string{"--probe", "--socket", cfg.Socket}, &stderr); code != 0 {
		t.Errorf("probe of a serving agent: exit %d: %s", code, stderr.String())
	}
	stderr.Reset()
	if code := run([]string{"--probe", "--socket", filepath.Join(dir, "none.sock")}, &stderr); code != 1 || !bytes.Contains(stderr.Bytes(), []byte("probe:")) {
		t.Errorf("probe of no agent: exit %d: %q, want 1 and the reason", code, stderr.String())
	}
	stderr.Reset()
	if code := run([]string{"--probe", "--socket", ""}, &stderr); code != 1 {
		t.Errorf("probe with no socket: exit %d, want 1", code)
	}
}
