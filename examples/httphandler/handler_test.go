package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/stub"
	"github.com/sluice-go/sluice/limiter"
)

// fakeDown counts calls and answers with err.
type fakeDown struct {
	calls atomic.Int64
	err   error
}

func (f *fakeDown) Call(_ context.Context, estimate int64) (int64, error) {
	f.calls.Add(1)
	return estimate, f.err
}

func serve(h http.Handler, budget string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	if budget != "" {
		req.Header.Set(BudgetHeader, budget)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// The handler waits for a permit only within the request's budget, and
// otherwise answers 503 with Retry-After at once. Time is synctest's
// virtual time, so "at once" and "waited 200ms" are exact, not measured.
func TestBudgetAndRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Start on a window boundary (windows are aligned to the clock).
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		lim, err := limiter.New(1, time.Second) // one call per second
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		down := &fakeDown{}
		h := &handler{lim: lim, down: down, budget: 300 * time.Millisecond, callTime: 20 * time.Millisecond}

		if rec := serve(h, ""); rec.Code != http.StatusOK {
			t.Fatalf("first request: %d %s", rec.Code, rec.Body)
		}

		// The next permit is 1s away, beyond the 300ms budget: 503 at
		// once, no wait, and Retry-After says when the next window opens.
		start := time.Now()
		rec := serve(h, "")
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" {
			t.Fatalf("over budget: %d, Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("a refusal waited %v; it must be decided at once", d)
		}
		if lim.Stats().TimedOut != 1 || down.calls.Load() != 1 {
			t.Fatalf("timed out %d, calls %d", lim.Stats().TimedOut, down.calls.Load())
		}

		// 800ms into the window the next one is 200ms away: within a
		// 300ms budget (280ms after keeping 20ms for the call), so the
		// handler waits for it and succeeds.
		time.Sleep(800*time.Millisecond - time.Since(start))
		start = time.Now()
		if rec := serve(h, ""); rec.Code != http.StatusOK {
			t.Fatalf("within budget: %d %s", rec.Code, rec.Body)
		}
		if d := time.Since(start); d != 200*time.Millisecond {
			t.Fatalf("waited %v, want 200ms (until the next window)", d)
		}

		// A request's own budget, shorter than the wait, is honoured.
		time.Sleep(850 * time.Millisecond) // 150ms before the next window
		if rec := serve(h, "100ms"); rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("100ms budget, next permit 150ms away: %d", rec.Code)
		}
		if rec := serve(h, "nonsense"); rec.Code != http.StatusBadRequest {
			t.Fatalf("bad budget header: %d", rec.Code)
		}
	})
}

// A downstream 429 with Retry-After pauses the limiter for that long: the
// handler answers 503 with the provider's Retry-After, and refuses at once
// until the pause ends.
func TestDownstream429FeedsBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		lim, err := limiter.New(100, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		down := &fakeDown{err: &tooManyRequests{status: http.StatusTooManyRequests, retryAfter: 3 * time.Second}}
		h := &handler{lim: lim, down: down, budget: 500 * time.Millisecond, callTime: 10 * time.Millisecond}

		rec := serve(h, "")
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "3" {
			t.Fatalf("on a 429: %d, Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
		}
		down.err = nil
		time.Sleep(time.Second)
		rec = serve(h, "")
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "2" || down.calls.Load() != 1 {
			t.Fatalf("during the backoff: %d, Retry-After %q, calls %d", rec.Code, rec.Header().Get("Retry-After"), down.calls.Load())
		}
		time.Sleep(2 * time.Second)
		if rec := serve(h, ""); rec.Code != http.StatusOK {
			t.Fatalf("after the backoff: %d", rec.Code)
		}
	})
}

// The real HTTP path: our limiter allows more than the provider stub, so
// the stub answers 429 and the handler turns that into a backoff.
func TestHTTPDownstreamAgainstStub(t *testing.T) {
	st := stub.New(2, time.Hour)
	ts := httptest.NewServer(st)
	defer ts.Close()
	lim, err := limiter.New(100, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	h := &handler{lim: lim, down: &httpDownstream{url: ts.URL, client: ts.Client()}, budget: 5 * time.Second, callTime: time.Second}
	srv := httptest.NewServer(h)
	defer srv.Close()
	var codes []int
	var retry string
	for range 4 {
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode == http.StatusServiceUnavailable {
			retry = resp.Header.Get("Retry-After")
		}
	}
	if want := []int{200, 200, 503, 503}; !slices.Equal(codes, want) {
		t.Fatalf("codes %v, want %v", codes, want)
	}
	// The stub asks to come back at the next hour; the limiter is paused
	// until then, so the 4th request never reached the stub.
	if retry == "" || strings.HasPrefix(retry, "0") || st.Total() != 3 || h.backedOff.Load() != 1 || h.refused.Load() != 1 {
		t.Fatalf("Retry-After %q, stub calls %d, backoffs %d, refused %d", retry, st.Total(), h.backedOff.Load(), h.refused.Load())
	}
	if parseRetryAfter("Wed, 21 Oct 2015 07:28:00 GMT", time.Date(2015, 10, 21, 7, 27, 0, 0, time.UTC)) != time.Minute {
		t.Fatal("Retry-After as an HTTP date")
	}
}

// stubDown calls a provider stub in process (no network, so that synctest's
// fake time runs it).
type stubDown struct{ st *stub.Stub }

func (d stubDown) Call(ctx context.Context, estimate int64) (int64, error) {
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/", nil)
	req.Header.Set(TokensHeader, strconv.FormatInt(estimate, 10))
	rec := httptest.NewRecorder()
	d.st.ServeHTTP(rec, req)
	switch rec.Code {
	case http.StatusOK:
		return strconv.ParseInt(rec.Header().Get(TokensUsedHeader), 10, 64)
	case http.StatusTooManyRequests:
		return 0, &tooManyRequests{status: rec.Code, retryAfter: parseRetryAfter(rec.Header().Get("Retry-After"), time.Now())}
	}
	return 0, fmt.Errorf("stub: %d %s", rec.Code, rec.Body)
}

// Two limits, requests and tokens, against a provider stub with the same
// limits whose calls use a random 25–75% of their estimate: clients send
// more than both limits allow for 20 windows. No window at the stub goes
// over in either dimension, the tokens are the binding limit, and the
// windows admit more calls than the estimates alone would let in, which
// only the tokens given back by settling allow.
func TestTwoLimitsSettleAgainstStub(t *testing.T) {
	const requests, tokenLimit, estimate, clients, windows = 100, 2_000, 100, 40, 20
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		rng := rand.New(rand.NewPCG(1, 2))
		var rngMu sync.Mutex
		st := stub.New(requests, time.Second)
		tok := stub.New(tokenLimit, time.Second)
		st.Tokens(tok, func(e int64) int64 {
			rngMu.Lock()
			defer rngMu.Unlock()
			return e/4 + rng.Int64N(e/2+1)
		})
		m, err := limiter.NewMulti([]limiter.Limit{
			{Quota: requests, Window: time.Second},
			{Dimension: tokens, Quota: tokenLimit, Window: time.Second},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		h := &handler{multi: m, tokens: estimate, down: stubDown{st}, budget: 300 * time.Millisecond, callTime: 10 * time.Millisecond}
		end := time.Now().Add(windows * time.Second)
		var wg sync.WaitGroup
		for range clients {
			wg.Go(func() {
				for time.Now().Before(end) {
					if rec := serve(h, ""); rec.Code != http.StatusOK && rec.Code != http.StatusServiceUnavailable {
						t.Errorf("status %d %s", rec.Code, rec.Body)
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			})
		}
		wg.Wait()
		time.Sleep(time.Second) // the last window closes
		calls, toks := st.Windows(), tok.Windows()
		if len(calls) < windows || len(toks) < windows {
			t.Fatalf("%d windows of calls and %d of tokens, want %d", len(calls), len(toks), windows)
		}
		var sum int64
		for i, w := range calls {
			if w.Over() {
				t.Errorf("calls window %d: %d calls, limit %d", i, w.Calls, w.Limit)
			}
			sum += w.Calls
		}
		for i, w := range toks {
			if w.Over() {
				t.Errorf("tokens window %d: %d tokens, limit %d", i, w.Calls, w.Limit)
			}
		}
		// Without settling, a window admits tokenLimit/estimate = 20 calls.
		if perWindow := float64(sum) / float64(len(calls)); perWindow <= tokenLimit/estimate*1.5 {
			t.Errorf("%.1f calls per window: settling gave nothing back (the estimates alone allow %d)", perWindow, tokenLimit/estimate)
		}
		stats := m.Stats()
		if stats[1].Settled >= 0 || stats[1].Overdrawn != 0 || h.backedOff.Load() != 0 {
			t.Errorf("tokens settled %d (want < 0), overdrawn %d, provider backoffs %d (want 0)", stats[1].Settled, stats[1].Overdrawn, h.backedOff.Load())
		}
		t.Logf("%d calls in %d windows; %d tokens admitted (as used), %d given back; ok %d, refused %d",
			sum, len(calls), stats[1].Admitted, -stats[1].Settled, h.ok.Load(), h.refused.Load())
	})
}

func serveClass(h http.Handler, class string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	if class != "" {
		req.Header.Set(ClassHeader, class)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestClassHeaderKeepsTheReserve: batch requests take what the window
// has beyond critical's reserve and are refused after; critical ones,
// named by X-Sluice-Class, still get the reserve. A request naming no
// class, or one the limiter does not list, is of the default class
// (batch, the last), and gets no part of the reserve.
func TestClassHeaderKeepsTheReserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		lim, err := limiter.New(10, time.Second, limiter.WithClasses(
			limiter.Class{Name: "critical", Reserve: 4}, limiter.Class{Name: "batch"}))
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		down := &fakeDown{}
		h := &handler{lim: lim, down: down, budget: 50 * time.Millisecond, callTime: 20 * time.Millisecond}
		codes := func(class string, n int) map[int]int {
			out := map[int]int{}
			for range n {
				out[serveClass(h, class).Code]++
			}
			return out
		}
		if got := codes("batch", 10); got[http.StatusOK] != 6 || got[http.StatusServiceUnavailable] != 4 {
			t.Fatalf("10 batch requests: %v, want 6 ok and 4 refused (4 kept for critical)", got)
		}
		for _, class := range []string{"", "nonesuch", "default"} {
			if got := codes(class, 1); got[http.StatusServiceUnavailable] != 1 {
				t.Fatalf("a request of class %q after batch's part: %v, want refused as batch", class, got)
			}
		}
		if got := codes("critical", 5); got[http.StatusOK] != 4 || got[http.StatusServiceUnavailable] != 1 {
			t.Fatalf("5 critical requests: %v, want 4 ok (the reserve) and 1 refused", got)
		}
		st := lim.Stats()
		if st.Classes[0].Admitted != 4 || st.Classes[1].Admitted != 6 || down.calls.Load() != 10 {
			t.Fatalf("classes %+v, %d downstream calls", st.Classes, down.calls.Load())
		}
	})
}
