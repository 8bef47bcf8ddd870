package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

// FuzzBudgetHeader serves a request with an arbitrary X-Latency-Budget.
// No panic; the answer is 200, 400 (the downstream not called, no permit
// spent) or 503 with a Retry-After of whole seconds; the downstream is
// called at most once.
func FuzzBudgetHeader(f *testing.F) {
	for _, s := range []string{"150ms", "", "0", "-1s", "2562047h", "1ns", "9999999999h", "1e3ms", " 1s"} {
		f.Add(s)
	}
	lim, err := limiter.New(1<<20, time.Second)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { lim.Close() })
	f.Fuzz(func(t *testing.T, budget string) {
		down := &fakeDown{}
		h := &handler{lim: lim, down: down, budget: 10 * time.Millisecond, callTime: time.Millisecond}
		before := lim.Stats().Admitted
		rec := serve(h, budget)
		switch rec.Code {
		case http.StatusOK:
		case http.StatusBadRequest:
			if down.calls.Load() != 0 || lim.Stats().Admitted != before {
				t.Fatalf("budget %q: 400 after calling the downstream or taking a permit", budget)
			}
		case http.StatusServiceUnavailable:
			if rec.Header().Get("Retry-After") == "" {
				t.Fatalf("budget %q: 503 without Retry-After", budget)
			}
		default:
			t.Fatalf("budget %q: status %d %q", budget, rec.Code, rec.Body)
		}
		if n := down.calls.Load(); n > 1 {
			t.Fatalf("budget %q: %d downstream calls", budget, n)
		}
	})
}

// FuzzParseRetryAfter reads arbitrary Retry-After values from a provider:
// never a panic, always a wait from 0 to one hour.
func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"", "0", "5", "-1", "99999999999999999999", "Wed, 21 Oct 2015 07:28:00 GMT", "Sun, 06 Nov 2994 08:49:37 GMT", "1.5", " 5"} {
		f.Add(s, int64(1445412480))
	}
	f.Fuzz(func(t *testing.T, s string, nowUnix int64) {
		d := parseRetryAfter(s, time.Unix(nowUnix, 0))
		if d < 0 || d > time.Hour {
			t.Fatalf("parseRetryAfter(%q) = %v, want 0..1h", s, d)
		}
	})
}

// FuzzClassHeader serves a request with an arbitrary X-Sluice-Class to a
// limiter with classes. No panic; a class name is served (200), anything
// else is answered 400 with no downstream call and no permit taken.
func FuzzClassHeader(f *testing.F) {
	for _, s := range []string{"critical", "batch", "", "nonesuch", "Critical", "critical ", "\x00", "a-b_c9"} {
		f.Add(s)
	}
	lim, err := limiter.New(1<<39, time.Second, limiter.WithClasses(limiter.Class{Name: "critical", Reserve: 1}, limiter.Class{Name: "batch"}))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { lim.Close() })
	f.Fuzz(func(t *testing.T, class string) {
		down := &fakeDown{}
		h := &handler{lim: lim, down: down, budget: 10 * time.Millisecond, callTime: time.Millisecond}
		before := lim.Stats().Admitted
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header[ClassHeader] = []string{class} // as sent, not as Set would clean it
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		want := http.StatusOK
		if class != "" && !limiter.ValidClassName(class) {
			want = http.StatusBadRequest
		}
		if rec.Code != want {
			t.Fatalf("class %q: %d %q, want %d", class, rec.Code, rec.Body, want)
		}
		if want == http.StatusBadRequest && (down.calls.Load() != 0 || lim.Stats().Admitted != before) {
			t.Fatalf("class %q: 400 after calling the downstream or taking a permit", class)
		}
	})
}
