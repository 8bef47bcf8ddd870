package feedback

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

var now = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		h      map[string]string
		tokens bool
		want   limiter.Signal
	}{
		{"200 without headers", 200, nil, false, limiter.Signal{}},
		{"429 seconds", 429, map[string]string{"Retry-After": "3"}, false,
			limiter.Signal{Pushback: true, RetryAfter: 3 * time.Second}},
		{"503 HTTP date", 503, map[string]string{"Retry-After": now.Add(90 * time.Second).Format(http.TimeFormat)}, false,
			limiter.Signal{Pushback: true, RetryAfter: 90 * time.Second}},
		{"429 date in the past", 429, map[string]string{"Retry-After": now.Add(-time.Hour).Format(http.TimeFormat)}, false,
			limiter.Signal{Pushback: true}},
		{"429 malformed Retry-After", 429, map[string]string{"Retry-After": "soon"}, false,
			limiter.Signal{Pushback: true, RetryAfter: DefaultRetryAfter}},
		{"429 absurd Retry-After", 429, map[string]string{"Retry-After": "99999999999999999999"}, false,
			limiter.Signal{Pushback: true, RetryAfter: MaxWait}},
		{"RateLimit-Remaining", 200, map[string]string{"RateLimit-Remaining": "42", "RateLimit-Reset": "2"}, false,
			limiter.Signal{HasRemaining: true, Remaining: 42, Reset: 2 * time.Second}},
		{"RateLimit field", 200, map[string]string{"RateLimit": `limit=100, remaining=50, reset=5`}, false,
			limiter.Signal{HasRemaining: true, Remaining: 50, Reset: 5 * time.Second}},
		{"OpenAI requests", 200, map[string]string{"x-ratelimit-remaining-requests": "59", "x-ratelimit-reset-requests": "6m0s",
			"x-ratelimit-remaining-tokens": "1000", "x-ratelimit-reset-tokens": "20ms"}, false,
			limiter.Signal{HasRemaining: true, Remaining: 59, Reset: 6 * time.Minute}},
		{"OpenAI tokens", 200, map[string]string{"x-ratelimit-remaining-requests": "59", "x-ratelimit-reset-requests": "6m0s",
			"x-ratelimit-remaining-tokens": "1000", "x-ratelimit-reset-tokens": "20ms"}, true,
			limiter.Signal{HasRemaining: true, Remaining: 1000, Reset: 20 * time.Millisecond}},
		{"GitHub Unix reset", 200, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": strconv.FormatInt(now.Add(30*time.Second).Unix(), 10)}, false,
			limiter.Signal{HasRemaining: true, Remaining: 0, Reset: 30 * time.Second}},
		{"negative remaining ignored", 200, map[string]string{"RateLimit-Remaining": "-1"}, false, limiter.Signal{}},
		{"tokens reads no requests header", 200, map[string]string{"RateLimit-Remaining": "5"}, true, limiter.Signal{}},
	} {
		h := http.Header{}
		for k, v := range tc.h {
			h.Set(k, v)
		}
		parse := Parse
		if tc.tokens {
			parse = ParseTokens
		}
		if got := parse(tc.status, h, now); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// FuzzParse checks that no header value panics the parser or yields a
// wait outside [0, MaxWait] or a negative remaining.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"3", "Wed, 21 Oct 2015 07:28:00 GMT", "6m0s", "1e308", "NaN", "-1", "remaining=5;reset=2", "9223372036854775807", ""} {
		f.Add(429, s, s)
	}
	f.Fuzz(func(t *testing.T, status int, a, b string) {
		h := http.Header{}
		for _, k := range []string{"Retry-After", "RateLimit-Remaining", "x-ratelimit-remaining-requests", "x-ratelimit-remaining-tokens", "x-ratelimit-remaining"} {
			h.Set(k, a)
		}
		for _, k := range []string{"RateLimit", "RateLimit-Reset", "x-ratelimit-reset-requests", "x-ratelimit-reset-tokens", "x-ratelimit-reset"} {
			h.Set(k, b)
		}
		for _, s := range []limiter.Signal{Parse(status, h, now), ParseTokens(status, h, now)} {
			if s.RetryAfter < 0 || s.RetryAfter > MaxWait || s.Reset < 0 || s.Reset > MaxWait || s.Remaining < 0 {
				t.Fatalf("a=%q b=%q: %+v out of range", a, b, s)
			}
			if s.Pushback != (status == 429 || status == 503) {
				t.Fatalf("status %d: Pushback %v", status, s.Pushback)
			}
		}
	})
}
