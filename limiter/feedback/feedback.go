// Package feedback reads what a provider's HTTP answer says about its
// limit — 429 or 503, Retry-After, and the usual rate-limit headers — as a
// limiter.Signal, for Limiter.Observe:
//
//	resp, err := client.Do(req)
//	if err == nil {
//		lim.Observe(feedback.Parse(resp.StatusCode, resp.Header, time.Now()))
//	}
//
// Headers read: Retry-After (seconds or an HTTP date); RateLimit-Remaining
// and RateLimit-Reset (seconds), or the combined RateLimit field
// (remaining=…, reset=…); x-ratelimit-remaining-requests and
// x-ratelimit-reset-requests (a duration such as "1s" or "6m0s", as
// OpenAI sends); x-ratelimit-remaining and x-ratelimit-reset (seconds, or
// a Unix time as GitHub sends). ParseTokens reads the -tokens forms
// instead, for a limit that counts tokens. A header that does not parse is
// ignored: a provider's malformed header never stops a call's accounting.
package feedback

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

// MaxWait bounds every wait read from a header (Retry-After, a reset): an
// absurd value cannot pause an instance for longer.
const MaxWait = time.Hour

// DefaultRetryAfter is the pause a 429 or 503 without a readable
// Retry-After gets.
const DefaultRetryAfter = time.Second

// Parse returns what an answer with status and header said of a limit that
// counts requests, at now.
func Parse(status int, h http.Header, now time.Time) limiter.Signal {
	return parse(status, h, now, "requests")
}

// ParseTokens returns what an answer said of a limit that counts tokens:
// the same pushback, with x-ratelimit-remaining-tokens and
// x-ratelimit-reset-tokens for the remaining.
func ParseTokens(status int, h http.Header, now time.Time) limiter.Signal {
	return parse(status, h, now, "tokens")
}

func parse(status int, h http.Header, now time.Time, dim string) limiter.Signal {
	var s limiter.Signal
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		s.Pushback = true
		s.RetryAfter = DefaultRetryAfter
		if d, ok := RetryAfter(h.Get("Retry-After"), now); ok {
			s.RetryAfter = d
		}
	}
	remaining, reset := "x-ratelimit-remaining-"+dim, "x-ratelimit-reset-"+dim
	if n, ok := count(h.Get(remaining)); ok {
		s.Remaining, s.HasRemaining = n, true
		s.Reset, _ = duration(h.Get(reset))
		return s
	}
	if dim != "requests" {
		return s
	}
	if n, ok := count(h.Get("RateLimit-Remaining")); ok {
		s.Remaining, s.HasRemaining = n, true
		s.Reset, _ = seconds(h.Get("RateLimit-Reset"), now)
		return s
	}
	if v := h.Get("RateLimit"); v != "" {
		if n, ok := count(param(v, "remaining", "r")); ok {
			s.Remaining, s.HasRemaining = n, true
			s.Reset, _ = seconds(param(v, "reset", "t"), now)
			return s
		}
	}
	if n, ok := count(h.Get("x-ratelimit-remaining")); ok {
		s.Remaining, s.HasRemaining = n, true
		s.Reset, _ = seconds(h.Get("x-ratelimit-reset"), now)
	}
	return s
}

// RetryAfter reads a Retry-After value: whole seconds, or an HTTP date
// (a date in the past is 0). It is at most MaxWait.
func RetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if d, ok := seconds(v, time.Time{}); ok {
		return d, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return min(max(t.Sub(now), 0), MaxWait), true
}

// count reads a non-negative integer.
func count(v string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// seconds reads a delay in whole (or fractional) seconds; when now is not
// zero, a value beyond a billion seconds is a Unix time instead, as
// GitHub's x-ratelimit-reset is.
func seconds(v string, now time.Time) (time.Duration, bool) {
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	if f >= 1e9 && !now.IsZero() {
		return min(max(time.Unix(int64(min(f, 1e15)), 0).Sub(now), 0), MaxWait), true
	}
	return time.Duration(min(f, MaxWait.Seconds()) * float64(time.Second)), true
}

// duration reads a Go-style duration ("1s", "6m0s", "20ms"), or seconds.
func duration(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return min(d, MaxWait), true
	}
	return seconds(v, time.Time{})
}

// param returns the value of the first of names among a structured
// field's parameters ("limit=100, remaining=50, reset=5", or the ;-
// separated form), or "".
func param(v string, names ...string) string {
	for _, part := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ';' }) {
		k, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		for _, n := range names {
			if strings.EqualFold(strings.TrimSpace(k), n) {
				return strings.Trim(strings.TrimSpace(val), `"`)
			}
		}
	}
	return ""
}
