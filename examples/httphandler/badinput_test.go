package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

// TestBadBudgetHeader: every malformed X-Latency-Budget is answered 400
// with a message naming the header and what is allowed, without calling
// the downstream or spending a permit.
func TestBadBudgetHeader(t *testing.T) {
	lim, err := limiter.New(1000, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	down := &fakeDown{}
	h := &handler{lim: lim, down: down, budget: 300 * time.Millisecond, callTime: 20 * time.Millisecond}
	for _, budget := range []string{
		"0", "0s", "-1s", "-0.5ms", "150", "1e3ms", " 150ms", "150ms ", "150 ms", "150MS", "NaNs", "Infs", "∞",
		"9999999999h", "2562048h", "1h1", ".s", "ms", "\x00", strings.Repeat("9", 4096) + "ms", "150ms,150ms",
	} {
		rec := serve(h, budget)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), BudgetHeader) ||
			!strings.Contains(rec.Body.String(), "positive duration such as 150ms") {
			t.Errorf("budget %.40q: %d %q, want 400 naming the header and the rule", budget, rec.Code, rec.Body)
		}
	}
	if n := down.calls.Load(); n != 0 {
		t.Errorf("the downstream was called %d times for bad budgets", n)
	}
	if st := lim.Stats(); st.Admitted != 0 {
		t.Errorf("bad budgets spent %d permits", st.Admitted)
	}
	// Odd but valid: the largest duration, a nanosecond.
	for _, budget := range []string{"2562047h", "1ns", "1h0m0.000000001s"} {
		if rec := serve(h, budget); rec.Code != http.StatusOK && rec.Code != http.StatusServiceUnavailable {
			t.Errorf("budget %q: %d %q", budget, rec.Code, rec.Body)
		}
	}
}

// TestBadTokensHeader: a malformed X-Tokens is answered 400 naming the
// header and the rule, with no downstream call and nothing taken from
// either limit; an estimate beyond the tokens limit is refused (503), not
// a panic or a wait.
func TestBadTokensHeader(t *testing.T) {
	m, err := limiter.NewMulti([]limiter.Limit{
		{Quota: 1000, Window: time.Second},
		{Dimension: tokens, Quota: 10_000, Window: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	down := &fakeDown{}
	h := &handler{multi: m, tokens: 10, down: down, budget: 300 * time.Millisecond, callTime: 20 * time.Millisecond}
	for _, v := range []string{"-1", "1.5", "ten", " 5", "5 ", "0x10", "99999999999999999999", "\x00"} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set(TokensHeader, v)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), TokensHeader) ||
			!strings.Contains(rec.Body.String(), "whole number of tokens") {
			t.Errorf("X-Tokens %q: %d %q, want 400 naming the header and the rule", v, rec.Code, rec.Body)
		}
	}
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set(TokensHeader, "10001")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Errorf("an estimate beyond the tokens limit: %d %q, want 503 with Retry-After", rec.Code, rec.Body)
	}
	if n := down.calls.Load(); n != 0 {
		t.Errorf("the downstream was called %d times", n)
	}
	for i, st := range m.Stats() {
		if st.Admitted != 0 {
			t.Errorf("limit %d admitted %d", i, st.Admitted)
		}
	}
}

// TestBadFlagCombinations: a tokens limit is local (-tokens-limit) or a
// provider's (-tokens-provider, with etcd); each refuses the other's mode.
// -transit sets the guard band, which a clock monitor sets otherwise.
func TestBadFlagCombinations(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-tokens-limit", "100", "-etcd-endpoints", "http://127.0.0.1:2379"}, "-tokens-limit is a local limit"},
		{[]string{"-tokens-provider", "llm-tokens"}, "-tokens-provider needs -etcd-endpoints"},
		{[]string{"-tokens-fallback", "500", "-etcd-endpoints", "http://127.0.0.1:2379"}, "-tokens-fallback is the fallback of -tokens-provider's share"},
		{[]string{"-tokens-fallback", "-1", "-tokens-provider", "llm-tokens", "-etcd-endpoints", "http://127.0.0.1:2379"}, "-tokens-fallback -1: must be ≥ 0"},
		{[]string{"-transit", "-1ms"}, "-transit -1ms: must be ≥ 0"},
		{[]string{"-transit", "5ms", "-etcd-endpoints", "http://127.0.0.1:2379", "-ntp-servers", "127.0.0.1:123"}, "not given with -ntp-servers"},
		{[]string{"-class", "Critical"}, "class name must be 1 to 32 lower-case letters"},
		{[]string{"-class", "critical=101%"}, "reserve"},
		{[]string{"-class", "critical=60%", "-etcd-endpoints", "http://127.0.0.1:2379"}, "-class is the local requests limiter's"},
		{[]string{"-class", "critical=60%", "-tokens-limit", "100"}, "-class is the local requests limiter's"},
	} {
		_, err := parseFlags(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%q) = %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
	if _, err := parseFlags([]string{"-tokens-provider", "llm-tokens", "-etcd-endpoints", "http://127.0.0.1:2379"}, io.Discard); err != nil {
		t.Errorf("-tokens-provider with -etcd-endpoints: %v", err)
	}
	c, err := parseFlags([]string{"-class", "critical=60%", "-class", "default", "-class", "batch=5"}, io.Discard)
	want := []limiter.Class{{Name: "critical", Reserve: 6000, Of: 10000}, {Name: "default"}, {Name: "batch", Reserve: 5}}
	if err != nil || !slices.Equal(c.join.Classes, want) {
		t.Errorf("-class critical=60%% -class default -class batch=5: %+v, %v, want %+v", c.join.Classes, err, want)
	}
}

// TestBadClassHeader: an X-Sluice-Class that is no class name is
// answered 400 naming the header and the rule, with no downstream call
// and no permit taken.
func TestBadClassHeader(t *testing.T) {
	lim, err := limiter.New(1000, time.Second, limiter.WithClasses(limiter.Class{Name: "critical", Reserve: 10}, limiter.Class{Name: "batch"}))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	down := &fakeDown{}
	h := &handler{lim: lim, down: down, budget: 300 * time.Millisecond, callTime: 20 * time.Millisecond}
	for _, class := range []string{"Critical", "critical ", " critical", "1st", "-x", "crit ical", "critical,batch", "\x00", "é", strings.Repeat("a", 33)} {
		rec := serveClass(h, class)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), ClassHeader) || !strings.Contains(rec.Body.String(), "lower-case letters") {
			t.Errorf("class %.40q: %d %q, want 400 naming the header and the rule", class, rec.Code, rec.Body)
		}
	}
	if n, st := down.calls.Load(), lim.Stats(); n != 0 || st.Admitted != 0 {
		t.Errorf("bad classes made %d downstream calls and took %d permits", n, st.Admitted)
	}
	// Valid names, listed or not, are served.
	for _, class := range []string{"critical", "batch", "nonesuch", strings.Repeat("a", 32)} {
		if rec := serveClass(h, class); rec.Code != http.StatusOK {
			t.Errorf("class %q: %d %q", class, rec.Code, rec.Body)
		}
	}
}
