package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/limiter"
)

// BudgetHeader carries a request's latency budget (a Go duration such as
// "150ms"); without it the server's default budget applies.
const BudgetHeader = "X-Latency-Budget"

// TokensHeader carries a request's estimated cost in tokens (an upper
// bound, such as the max_tokens of a model API call), and the
// downstream's TokensUsedHeader the tokens the call really used. They
// matter only with a tokens limit (-tokens-limit).
const (
	TokensHeader     = "X-Tokens"
	TokensUsedHeader = "X-Tokens-Used"
)

// ClassHeader names a request's priority class ("critical", "batch"):
// its permit is of that class (limiter.WithClass), so that a flood of a
// lower class cannot take what the limiter keeps for a higher one. A
// request without it, or naming a class the limiter does not list, is of
// the limiter's default class; one that is no class name at all is
// answered 400. With a tokens limit (a Multi), each limit keeps the
// reserves of its own classes: a joined provider's are its first
// limit's.
const ClassHeader = "X-Sluice-Class"

// tokens is the dimension of the tokens limit.
const tokens = "tokens"

// downstream is the rate-limited API the handler calls once per request.
// Call sends the call's estimated tokens and returns those it used.
type downstream interface {
	Call(ctx context.Context, estimate int64) (used int64, err error)
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
//
// With one limit (lim) a call takes one permit. With a requests and a
// tokens limit (multi) it takes one request and its estimated tokens, all
// or nothing, and settles the tokens the downstream says it used: what
// was charged too much goes back to the window for later requests.
type handler struct {
	lim      *limiter.Limiter // one limit; nil when multi is set
	multi    *limiter.Multi   // several limits: requests and tokens, or several of requests
	tokens   int64            // estimated tokens of a request that does not send TokensHeader
	down     downstream
	budget   time.Duration // when the request gives none
	callTime time.Duration // part of the budget kept for the downstream call

	ok, refused, backedOff, failed atomic.Int64
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	budget, estimate, class, err := h.request(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// The request's deadline: the budget, or sooner if the client's
	// context already has one.
	ctx := r.Context()
	if class != "" {
		ctx = limiter.WithClass(ctx, class)
	}
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	deadline, _ := ctx.Deadline()

	// Wait for a permit only as long as the budget leaves room for the
	// call. Acquire says ErrTimeout at once, without sleeping, when the
	// earliest permit lies further away.
	wait := max(0, time.Until(deadline)-h.callTime)
	grant, err := h.acquire(ctx, wait, estimate)
	if err != nil {
		if errors.Is(err, limiter.ErrTimeout) || errors.Is(err, limiter.ErrNoQuota) {
			h.refused.Add(1)
			h.unavailable(w, h.retryAfter(estimate), "no permit within the latency budget")
			return
		}
		h.failed.Add(1)
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	used, err := h.down.Call(ctx, estimate)
	if h.countsTokens() {
		// A call refused or failed used no tokens: all go back. One the
		// provider answered used what it says; more than the estimate is
		// counted in Stats.Overdrawn (estimate an upper bound).
		grant.Settle(limiter.Cost(tokens, max(used, 0)))
	}
	var tmr *tooManyRequests
	switch {
	case err == nil:
		h.ok.Add(1)
		io.WriteString(w, "ok\n")
	case errors.As(err, &tmr):
		// Our limit is set higher than the provider's: pause the limiter
		// for as long as the provider asks, so the instance stops
		// hammering it, and pass the wait on to our client.
		h.backoff(tmr.retryAfter)
		h.backedOff.Add(1)
		h.unavailable(w, max(tmr.retryAfter, h.retryAfter(estimate)), "the provider asked us to slow down")
	case ctx.Err() != nil:
		h.failed.Add(1)
		http.Error(w, "downstream: latency budget spent", http.StatusGatewayTimeout)
	default:
		h.failed.Add(1)
		http.Error(w, err.Error(), http.StatusBadGateway)
	}
}

// request reads a request's latency budget, estimated tokens and
// priority class ("" for none).
func (h *handler) request(r *http.Request) (budget time.Duration, estimate int64, class string, err error) {
	budget, estimate = h.budget, h.tokens
	if s := r.Header.Get(BudgetHeader); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return 0, 0, "", errors.New(BudgetHeader + ": want a positive duration such as 150ms")
		}
		budget = d
	}
	if s := r.Header.Get(TokensHeader); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return 0, 0, "", errors.New(TokensHeader + ": want a whole number of tokens, 0 or more")
		}
		estimate = n
	}
	if class = r.Header.Get(ClassHeader); class != "" && !limiter.ValidClassName(class) {
		// A typo in a name is served as the default class, as the
		// limiter serves any name it does not list; a value that cannot
		// be a name is a client's bug, said at once.
		return 0, 0, "", errors.New(ClassHeader + ": want a class name: 1 to 32 lower-case letters, digits, '_' or '-', starting with a letter")
	}
	return budget, estimate, class, nil
}

// acquire waits up to wait for one call's permits: one request, and
// estimate tokens when there is a tokens limit. The Grant is the zero one
// with one limit.
func (h *handler) acquire(ctx context.Context, wait time.Duration, estimate int64) (limiter.Grant, error) {
	switch {
	case h.multi == nil:
		return limiter.Grant{}, h.lim.Acquire(ctx, wait)
	case h.countsTokens():
		return h.multi.Acquire(ctx, wait, limiter.Cost(tokens, estimate))
	}
	return h.multi.Acquire(ctx, wait) // limits of requests only, such as 100/1s and 50000/1h
}

// countsTokens reports whether one of the limits counts tokens.
func (h *handler) countsTokens() bool {
	return h.multi != nil && slices.ContainsFunc(h.multi.Limits(), func(l limiter.Limit) bool { return l.Dimension == tokens })
}

// backoff pauses the limiter for d after the downstream pushed back, and
// counts the pushback for the instance's report: with an adaptive
// provider, configd lowers the whole fleet's limit from these counts.
func (h *handler) backoff(d time.Duration) {
	if h.multi != nil {
		h.multi.Pushback(d)
		return
	}
	h.lim.Pushback(d)
}

// unavailable answers 503 with Retry-After d, in whole seconds rounded up
// (at least 1), as HTTP wants.
func (h *handler) unavailable(w http.ResponseWriter, d time.Duration, why string) {
	w.Header().Set("Retry-After", strconv.FormatInt(int64(max(time.Second, d+time.Second-1)/time.Second), 10))
	http.Error(w, why, http.StatusServiceUnavailable)
}

// retryAfter returns how long until a call of estimate tokens may be
// admitted again: the start of the next window of each limit without room
// for it (of the requests limit if every one has room), or the end of a
// Backoff if that is later.
func (h *handler) retryAfter(estimate int64) time.Duration {
	var sts []limiter.Stats
	var dims []string
	var now func() time.Time
	if h.multi != nil {
		sts, now = h.multi.Stats(), h.multi.Now
		for _, lm := range h.multi.Limits() {
			dims = append(dims, lm.Dimension)
		}
	} else {
		sts, dims, now = []limiter.Stats{h.lim.Stats()}, []string{limiter.Requests}, h.lim.Now
	}
	next := sts[0].WindowStart.Add(sts[0].Window)
	for i, st := range sts {
		need := int64(1) // a request
		if dims[i] == tokens {
			need = estimate
		}
		if end := st.WindowStart.Add(st.Window); st.Remaining < need && end.After(next) {
			next = end
		}
		if st.BackoffUntil.After(next) {
			next = st.BackoffUntil
		}
	}
	return next.Sub(now())
}

// httpDownstream calls a URL with POST; 429 and 503 become
// *tooManyRequests with the Retry-After they carry.
type httpDownstream struct {
	url    string
	client *http.Client
}

func (d *httpDownstream) Call(ctx context.Context, estimate int64) (used int64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set(TokensHeader, strconv.FormatInt(estimate, 10))
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	switch resp.StatusCode {
	case http.StatusOK, http.StatusNoContent:
		// A provider that does not say charges the estimate.
		if n, err := strconv.ParseInt(resp.Header.Get(TokensUsedHeader), 10, 64); err == nil && n >= 0 {
			return n, nil
		}
		return estimate, nil
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return 0, &tooManyRequests{status: resp.StatusCode, retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	}
	return 0, fmt.Errorf("downstream: %s", resp.Status)
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
