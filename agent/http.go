package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-go/sluice/limiter"
)

// The HTTP/JSON API. Every answer is JSON with a Content-Length; a refusal
// is {"error": REASON, "message": "..."} with the status of its reason
// (outcomes), and changed nothing. One exception: a request that does not
// arrive whole within Config.HeaderTimeout is BAD_REQUEST with 408, so
// that the client knows the agent closed the connection for its slowness.
//
//	POST /v1/acquire      {"provider", "caller", "cost": {"tokens": 700}, "max_wait_ms": 200, "class": "critical"} → {"grant", "cost"}
//	POST /v1/try_acquire  the same, never waiting
//	POST /v1/reserve      the same → {"reservation", "delay_ms", "cost"}
//	POST /v1/cancel       {"id", "caller"} → {}
//	POST /v1/settle       {"id", "caller", "cost": {"tokens": 512}} → {}
//	GET  /v1/status       Status
//	GET  /metrics         Prometheus, the agent's own registry
//	GET  /healthz         {"ok": true}

// MaxBody is the largest request body read; a larger one is refused with
// 413 and TOO_LARGE.
const MaxBody = 64 << 10

// AcquireJSON is the body of acquire, try_acquire and reserve.
type AcquireJSON struct {
	Provider  string           `json:"provider"`
	Caller    string           `json:"caller,omitempty"`
	Cost      map[string]int64 `json:"cost,omitempty"`
	MaxWaitMS float64          `json:"max_wait_ms,omitempty"`
	Class     string           `json:"class,omitempty"`
}

// IDJSON is the body of cancel and settle.
type IDJSON struct {
	ID     string           `json:"id"`
	Caller string           `json:"caller,omitempty"`
	Cost   map[string]int64 `json:"cost,omitempty"`
}

type grantedJSON struct {
	Grant       string           `json:"grant,omitempty"`
	Reservation string           `json:"reservation,omitempty"`
	DelayMS     *float64         `json:"delay_ms,omitempty"`
	Cost        map[string]int64 `json:"cost"`
}

type errorJSON struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// DecodeAcquire reads an acquisition from body: one JSON object, no
// unknown fields, nothing after it, a wait in milliseconds from 0 to
// maxWait, costs 0 to limiter.MaxQuota in at most limiter.MaxLimits valid
// dimensions, a class that is a class name (limiter.ValidClassName) or
// none. Any error wraps ErrBadRequest.
func DecodeAcquire(body []byte, maxWait time.Duration) (Request, error) {
	var in AcquireJSON
	if err := decodeStrict(body, &in); err != nil {
		return Request{}, err
	}
	if in.Provider == "" {
		return Request{}, fmt.Errorf("%w: provider is required", ErrBadRequest)
	}
	w, err := waitOf(in.MaxWaitMS, maxWait)
	if err != nil {
		return Request{}, err
	}
	cost, err := amounts(in.Cost)
	if err != nil {
		return Request{}, err
	}
	req := Request{Provider: in.Provider, Caller: in.Caller, Cost: cost, MaxWait: w, Class: in.Class}
	if err := checkCaller(req.Caller); err != nil {
		return Request{}, err
	}
	if err := checkClass(req.Class); err != nil {
		return Request{}, err
	}
	return req, nil
}

// DecodeID reads a cancel or settle body. Any error wraps ErrBadRequest.
func DecodeID(body []byte) (IDJSON, []limiter.Amount, error) {
	var in IDJSON
	if err := decodeStrict(body, &in); err != nil {
		return IDJSON{}, nil, err
	}
	if in.ID == "" || len(in.ID) > 64 {
		return IDJSON{}, nil, fmt.Errorf("%w: id is required, at most 64 characters", ErrBadRequest)
	}
	if err := checkCaller(in.Caller); err != nil {
		return IDJSON{}, nil, err
	}
	cost, err := amounts(in.Cost)
	if err != nil {
		return IDJSON{}, nil, err
	}
	return in, cost, nil
}

func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: data after the JSON object", ErrBadRequest)
	}
	return nil
}

func waitOf(ms float64, maxWait time.Duration) (time.Duration, error) {
	if math.IsNaN(ms) || ms < 0 || ms > float64(maxWait/time.Millisecond) {
		return 0, fmt.Errorf("%w: max_wait_ms %v: want 0 to %d", ErrBadRequest, ms, maxWait/time.Millisecond)
	}
	return time.Duration(ms * float64(time.Millisecond)), nil
}

// amounts turns a cost object into limiter amounts, in a fixed order so
// that a request's outcome does not depend on map iteration.
func amounts(cost map[string]int64) ([]limiter.Amount, error) {
	if len(cost) > limiter.MaxLimits {
		return nil, fmt.Errorf("%w: cost names %d dimensions, at most %d", ErrBadRequest, len(cost), limiter.MaxLimits)
	}
	out := make([]limiter.Amount, 0, len(cost))
	for d, n := range cost {
		out = append(out, limiter.Amount{Dimension: d, N: n})
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].Dimension < out[j-1].Dimension; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	if err := checkCost(out); err != nil {
		return nil, err
	}
	return out, nil
}

// overTCP reports whether r came over TCP, where the token is needed.
func overTCP(r *http.Request) bool {
	addr, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	_, tcp := addr.(*net.TCPAddr)
	return tcp
}

// Handler returns the HTTP/JSON API. A request that came over TCP needs
// the token (Config.TokenFile); one over the Unix socket is let in by the
// socket's permissions.
func (a *Agent) Handler() http.Handler {
	metrics := promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if overTCP(r) && !a.authorized(r.Header.Get("Authorization")) {
			writeError(w, ReasonUnauthenticated, "a request over TCP needs 'Authorization: Bearer TOKEN'")
			return
		}
		switch r.URL.Path {
		case "/v1/acquire", "/v1/try_acquire", "/v1/reserve", "/v1/cancel", "/v1/settle":
			if r.Method != http.MethodPost {
				w.Header().Set("Allow", "POST")
				writeError(w, ReasonMethodNotAllowed, r.URL.Path+" takes POST")
				return
			}
			a.serveOp(w, r)
		case "/v1/status", "/metrics", "/healthz":
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				w.Header().Set("Allow", "GET")
				writeError(w, ReasonMethodNotAllowed, r.URL.Path+" takes GET")
				return
			}
			switch r.URL.Path {
			case "/v1/status":
				writeJSON(w, http.StatusOK, a.Status())
			case "/metrics":
				metrics.ServeHTTP(w, r)
			default:
				writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
			}
		default:
			writeError(w, ReasonNotFound, "no such path: "+r.URL.Path)
		}
	})
}

func (a *Agent) serveOp(w http.ResponseWriter, r *http.Request) {
	// The body must arrive within HeaderTimeout, as on the lean loop: the
	// server's ReadHeaderTimeout covers only the head, and its
	// ReadTimeout would also end the wait that follows (net/http's read
	// for the peer's close would time out and cancel the request).
	// A body declared larger than MaxBody is refused before it is read:
	// waiting for it would only end in TOO_LARGE, or in a timeout when
	// the caller never sends it.
	if r.ContentLength > MaxBody {
		writeError(w, ReasonTooLarge, fmt.Sprintf("a body of at most %d bytes; Content-Length says %d", MaxBody, r.ContentLength))
		return
	}
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(a.cfg.HeaderTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	rc.SetReadDeadline(time.Time{})
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			writeError(w, ReasonTooLarge, fmt.Sprintf("a body of at most %d bytes", MaxBody))
			return
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			writeJSON(w, http.StatusRequestTimeout, errorJSON{Error: ReasonBadRequest, Message: fmt.Sprintf(
				"%v: the body did not arrive whole within %v", ErrBadRequest, a.cfg.HeaderTimeout)})
			return
		}
		writeError(w, ReasonBadRequest, "reading the body: "+err.Error())
		return
	}
	ctx := r.Context()
	switch r.URL.Path {
	case "/v1/cancel", "/v1/settle":
		if err := a.serveID(ctx, r.URL.Path, body); err != nil {
			writeError(w, Reason(err), err.Error())
			return
		}
		writeJSON(w, http.StatusOK, struct{}{})
		return
	}
	req, err := DecodeAcquire(body, a.cfg.MaxWait)
	if err != nil {
		writeError(w, Reason(err), err.Error())
		return
	}
	var g Granted
	switch r.URL.Path {
	case "/v1/acquire":
		g, err = a.Acquire(ctx, req)
	case "/v1/try_acquire":
		g, err = a.TryAcquire(ctx, req)
	default:
		g, err = a.Reserve(ctx, req)
	}
	if err != nil {
		writeError(w, Reason(err), err.Error())
		return
	}
	out := grantedJSON{Grant: g.ID, Cost: g.Cost}
	if r.URL.Path == "/v1/reserve" {
		d := float64(g.Delay) / float64(time.Millisecond)
		out.Grant, out.Reservation, out.DelayMS = "", g.ID, &d
	}
	// A caller gone by now would never learn of its grant: give it back.
	// The answer is flushed here, not after return, so that a write to a
	// closed socket is seen.
	if ctx.Err() != nil || writeJSON(w, http.StatusOK, out) != nil || http.NewResponseController(w).Flush() != nil {
		a.Cancel(ctx, g.ID, req.Caller)
	}
}

// serveID decodes and runs a cancel or a settle of a reservation.
func (a *Agent) serveID(ctx context.Context, path string, body []byte) error {
	in, cost, err := DecodeID(body)
	switch {
	case err != nil:
		return err
	case path == "/v1/settle":
		return a.Settle(ctx, in.ID, in.Caller, cost)
	case len(in.Cost) > 0:
		return fmt.Errorf("%w: cancel takes no cost", ErrBadRequest)
	}
	return a.Cancel(ctx, in.ID, in.Caller)
}

func writeError(w http.ResponseWriter, reason, msg string) {
	writeJSON(w, outcomes[reason].http, errorJSON{Error: reason, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		b, status = []byte(`{"error":"INTERNAL","message":"encoding the answer failed"}`), http.StatusInternalServerError
	}
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, err = w.Write(b)
	return err
}
