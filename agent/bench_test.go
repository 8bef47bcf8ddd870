package agent

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-go/sluice/agent/agentpb"
	"github.com/sluice-go/sluice/limiter"
)

func benchAgent(b *testing.B) *Agent {
	cfg := DefaultConfig()
	cfg.Socket, cfg.GRPCSocket = "unused.sock", ""
	cfg.Local = []LocalProvider{{Name: "bench", Limits: []limiter.Limit{{Quota: limiter.MaxQuota, Window: time.Hour}}}}
	a, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Close() })
	return a
}

// BenchmarkAcquire is the agent's own cost of an acquisition, without a
// transport.
func BenchmarkAcquire(b *testing.B) {
	a := benchAgent(b)
	req := Request{Provider: "bench", Caller: "b"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.Acquire(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHandler adds the HTTP/JSON decoding and encoding, without a
// socket.
func BenchmarkHandler(b *testing.B) {
	a := benchAgent(b)
	h := a.Handler()
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/v1/acquire", strings.NewReader(`{"provider":"bench","caller":"b"}`)))
		if w.Code != 200 {
			b.Fatal(w.Body.String())
		}
	}
}

// BenchmarkUnixHTTP is an acquisition over the HTTP Unix socket, from
// goroutines each with a kept connection exchanging plain HTTP/1.1, as
// the Python client does.
func BenchmarkUnixHTTP(b *testing.B) {
	cfg := DefaultConfig()
	dir := b.TempDir()
	cfg.Socket, cfg.GRPCSocket = dir+"/a.sock", ""
	cfg.Local = []LocalProvider{{Name: "bench", Limits: []limiter.Limit{{Quota: limiter.MaxQuota, Window: time.Hour}}}}
	a, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	ls, err := a.Listen()
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ls) }()
	defer func() { cancel(); <-done }()
	body := `{"provider":"bench","caller":"b"}`
	raw := []byte("POST /v1/acquire HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		c, err := net.Dial("unix", cfg.Socket)
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for pb.Next() {
			if _, err := c.Write(raw); err != nil {
				b.Error(err)
				return
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
}

// BenchmarkUnixGRPC is an acquisition over the gRPC Unix socket, one call
// at a time from grpc-go's client. cpu-ns/op is the process's CPU time
// per call, the client's and the agent's together: on a shared machine
// it moves less than the wall time does.
func BenchmarkUnixGRPC(b *testing.B) {
	cfg := DefaultConfig()
	dir := b.TempDir()
	cfg.Socket, cfg.GRPCSocket = "", dir+"/g.sock"
	cfg.Local = []LocalProvider{{Name: "bench", Limits: []limiter.Limit{{Quota: limiter.MaxQuota, Window: time.Hour}}}}
	a, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	ls, err := a.Listen()
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx, ls) }()
	defer func() { cancel(); <-done }()
	conn, err := grpc.NewClient("unix://"+cfg.GRPCSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	c := agentpb.NewAgentClient(conn)
	req := &agentpb.AcquireRequest{Provider: "bench", Caller: "b"}
	b.ReportAllocs()
	cpu := cpuTime()
	for b.Loop() {
		if _, err := c.Acquire(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
}

// cpuTime is the user and system time this process has spent.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
