package agent

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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
