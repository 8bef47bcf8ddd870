package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

// BudgetHeader carries a request's latency budget (a Go duration such as
// "150ms"); without it the server's default budget applies.
const BudgetHeader = "X-Latency-Budget"

// downstream is the rate-limited API the handler calls once per request.
type downstream interface {
	Call(ctx context.Context) error
}

// tooManyRequests is the downstream's 429 (or 503) with its Retry-After.
type tooManyRequests struct {
	status     int
	retryAfter time.Duration
}

func (e *tooManyRequests) Error() string {
	return fmt.Sprintf("downstream: %d %s, retry after %v", e.status, http.StatusText(e.status), e.retryAfter)
}

// handler serves one request by calling the downstream within the request's
// latency budget: it waits for a permit only as long as the budget allows
// (keeping callTime for the call itself), and otherwise fails fast with 503
// and a Retry-After saying when the next window opens.
type handler struct {
	lim      *limiter.Limiter
	down     downstream
	budget   time.Duration // when the request gives none
	callTime time.Duration // part of the budget kept for the downstream call

	ok, refused, backedOff, failed atomic.Int64
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	budget := h.budget
	if s := r.Header.Get(BudgetHeader); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			http.Error(w, BudgetHeader+": want a positive duration such as 150ms", http.StatusBadRequest)
			return
		}
		budget = d
	}
	// The request's deadline: the budget, or sooner if the client's
	// context already has one.
	ctx, cancel := context.WithTimeout(r.Context(), budget)
	defer cancel()
	deadline, _ := ctx.Deadline()

	// Wait for a permit only as long as the budget leaves room for the
	// call. Acquire says ErrTimeout at once, without sleeping, when the
	// earliest permit lies further away.
	wait := time.Until(deadline) - h.callTime
	if err := h.lim.Acquire(ctx, max(0, wait)); err != nil {
		if errors.Is(err, limiter.ErrTimeout) || errors.Is(err, limiter.ErrNoQuota) {
			h.refused.Add(1)
			h.unavailable(w, h.retryAfter(), "no permit within the latency budget")
			return
		}
		h.failed.Add(1)
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	err := h.down.Call(ctx)
	var tmr *tooManyRequests
	switch {
	case err == nil:
		h.ok.Add(1)
		io.WriteString(w, "ok\n")
	case errors.As(err, &tmr):
		// Our limit is set higher than the provider's: pause the limiter
		// for as long as the provider asks, so the instance stops
		// hammering it, and pass the wait on to our client.
		h.lim.Backoff(tmr.retryAfter)
		h.backedOff.Add(1)
		h.unavailable(w, max(tmr.retryAfter, h.retryAfter()), "the provider asked us to slow down")
	case ctx.Err() != nil:
		h.failed.Add(1)
		http.Error(w, "downstream: latency budget spent", http.StatusGatewayTimeout)
	default:
		h.failed.Add(1)
		http.Error(w, err.Error(), http.StatusBadGateway)
	}
}

// unavailable answers 503 with Retry-After d, in whole seconds rounded up
// (at least 1), as HTTP wants.
func (h *handler) unavailable(w http.ResponseWriter, d time.Duration, why string) {
	w.Header().Set("Retry-After", strconv.FormatInt(int64(max(time.Second, d+time.Second-1)/time.Second), 10))
	http.Error(w, why, http.StatusServiceUnavailable)
}

// retryAfter returns how long until the limiter can admit again: the start
// of the next window, or the end of a Backoff if that is later.
func (h *handler) retryAfter() time.Duration {
	st := h.lim.Stats()
	next := st.WindowStart.Add(st.Window)
	if st.BackoffUntil.After(next) {
		next = st.BackoffUntil
	}
	return next.Sub(h.lim.Now())
}

// httpDownstream calls a URL with POST; 429 and 503 become
// *tooManyRequests with the Retry-After they carry.
type httpDownstream struct {
	url    string
	client *http.Client
}

func (d *httpDownstream) Call(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, nil)
	if err != nil {
		return err
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	switch resp.StatusCode {
	case http.StatusOK, http.StatusNoContent:
		return nil
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return &tooManyRequests{status: resp.StatusCode, retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	}
	return fmt.Errorf("downstream: %s", resp.Status)
}

// parseRetryAfter reads Retry-After as seconds or an HTTP date; missing or
// malformed, it is one second.
func parseRetryAfter(s string, now time.Time) time.Duration {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n >= 0 {
		return time.Duration(min(n, 3600)) * time.Second
	}
	if t, err := http.ParseTime(s); err == nil {
		return max(0, min(t.Sub(now), time.Hour))
	}
	return time.Second
}
