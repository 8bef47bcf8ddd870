package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-go/sluice/internal/schema"
)

// actorHeader carries who asked for a change (the CLI's --who); the API
// records it in history together with the caller's address.
const actorHeader = "X-Sluice-Actor"

// api serves the admin HTTP API over a store. Reads are open; writes need
// the bearer token when one is configured.
type api struct {
	store   *store
	token   []byte      // empty: writes are open
	hosts   *hostPolicy // the Host names it answers; nil: any
	log     *slog.Logger
	metrics *metrics
	ready   func(ctx context.Context) error // nil error: ready
	leader  func() bool
	// publishError says why this replica, leading, last failed to publish
	// a provider's shares ("": it did not); nil: never.
	publishError func(provider string) string
	// console, when set, is served at / and /console/ (console.go).
	console *console
}

// handler returns the API's routes:
//
//	GET    /v1/providers                  list
//	GET    /v1/providers/{name}           get (ETag: the revision)
//	PUT    /v1/providers/{name}           create or replace (If-Match: revision; If-None-Match: *)
//	DELETE /v1/providers/{name}           delete (If-Match: revision)
//	GET    /v1/providers/{name}/instances status: config, shares, instances, malformed records
//	GET    /v1/providers/{name}/history   history, oldest first
//	GET    /v1/providers/{name}/audit     a ledger provider's ledgers, audited
//	GET    /metrics, /healthz, /readyz
//	GET    /, /console/...                the web console (console.go), when a.console is set
//
// GET routes answer HEAD too; any other method on these paths is 405.
func (a *api) handler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/providers", a.handleList)
	mux.HandleFunc("GET /v1/providers/{name}", a.handleGet)
	mux.HandleFunc("PUT /v1/providers/{name}", a.authorized(a.handlePut))
	mux.HandleFunc("DELETE /v1/providers/{name}", a.authorized(a.handleDelete))
	mux.HandleFunc("GET /v1/providers/{name}/instances", a.handleStatus)
	mux.HandleFunc("GET /v1/providers/{name}/history", a.handleHistory)
	mux.HandleFunc("GET /v1/providers/{name}/audit", a.handleAudit)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", a.handleReady)
	if a.console != nil {
		a.console.register(mux)
	}
	// Whatever no route above matches: a path the API has, with a method
	// it does not serve, is 405 with Allow (RFC 9110 15.5.6); any other
	// path is 404. Both answer JSON, like every other error.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if allow := allowedMethods(mux, r); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeError(w, http.StatusMethodNotAllowed, fmt.Errorf("%w: %s %s; it allows %s",
				ErrMethodNotAllowed, clip(r.Method), clip(r.URL.Path), strings.Join(allow, ", ")))
			return
		}
		writeError(w, http.StatusNotFound, fmt.Errorf("no such endpoint: %s %s", clip(r.Method), clip(r.URL.Path)))
	})
	return a.instrument(mux)
}

// ErrMethodNotAllowed: a path the API serves, with a method it does not.
var ErrMethodNotAllowed = errors.New("configd: method not allowed")

// probeMethods are the methods allowedMethods tries, in the order an Allow
// header lists them.
var probeMethods = []string{
	http.MethodDelete, http.MethodGet, http.MethodHead, http.MethodOptions,
	http.MethodPatch, http.MethodPost, http.MethodPut,
}

// allowedMethods returns the methods mux has a route for at r's path,
// other than its catch-all "/" — none for a path the API does not have.
// It asks mux itself, so the answer cannot drift from the routes.
func allowedMethods(mux *http.ServeMux, r *http.Request) []string {
	var allow []string
	for _, m := range probeMethods {
		probe := &http.Request{Method: m, URL: r.URL, Host: r.Host}
		if _, pattern := mux.Handler(probe); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	return allow
}

// requestTimeout bounds each admin request's etcd work, so an unreachable
// etcd gives a prompt 503 rather than a hung request.
const requestTimeout = 10 * time.Second

// instrument bounds each request in time and counts requests by route
// pattern and status.
func (a *api) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
		if a.console != nil && isConsoleStream(r) {
			ctx, cancel = context.WithCancel(r.Context()) // lasts as long as the page
		}
		defer cancel()
		r = r.WithContext(ctx)
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		start := time.Now()
		if a.hosts != nil && !a.hosts.allows(r.Host) {
			writeError(rec, http.StatusMisdirectedRequest, misdirected(r.Host))
		} else {
			next.ServeHTTP(rec, r)
		}
		route := r.Pattern
		if route == "" || route == "/" {
			route = "other"
		}
		a.metrics.httpRequests.WithLabelValues(route, strconv.Itoa(rec.status)).Inc()
		if rec.status >= 400 && rec.status != http.StatusNotFound {
			a.log.Info("admin request refused", "method", clip(r.Method), "path", clip(r.URL.Path), "host", clip(r.Host),
				"status", rec.status, "remote", r.RemoteAddr, "duration", time.Since(start))
		}
	})
}

// maxLogged bounds each string a request chooses (method, path, Host) in
// a log line or an error answer: a path can be nearly a megabyte
// (http.DefaultMaxHeaderBytes), and refused requests cost an attacker
// nothing.
const maxLogged = 256

// clip returns s cut to at most maxLogged bytes, on a UTF-8 boundary, and
// says how long it was: "aaa...[921614 bytes, cut]".
func clip(s string) string {
	if len(s) <= maxLogged {
		return s
	}
	n := maxLogged
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "...[" + strconv.Itoa(len(s)) + " bytes, cut]"
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection's writer (the
// console's event stream flushes and moves its deadlines).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// ErrMisdirected: a request whose Host names a server configd does not
// take itself to be (see hostPolicy).
var ErrMisdirected = errors.New("configd: request for another host")

func misdirected(host string) error {
	return fmt.Errorf("%w: Host %s; the admin API answers only requests for localhost, an IP address, "+
		"its --listen host or a name given with --allowed-host (a defence against DNS rebinding)", ErrMisdirected, strconv.Quote(clip(host)))
}

// hostPolicy is the admin API's defence against DNS rebinding: a web page
// on evil.example that points evil.example at 127.0.0.1 can make the
// browser send requests to configd as same-origin requests — reads and
// writes, with no CORS preflight to stop them — but they carry
// "Host: evil.example". So the API answers only requests whose Host is
//
//   - localhost, or an IP address: a browser sends an IP address only for
//     a page loaded from that address, and a page from elsewhere sending
//     to it is cross-origin, where the preflight of PUT and DELETE (and
//     the unreadable answers of GET) stop it; no DNS answer is involved;
//   - the host of --listen, when it is a name;
//   - a name given with --allowed-host (say, behind a proxy or a DNS name
//     of its own).
//
// Ports are not compared: rebinding changes the name, never makes it one
// of these. Names compare case-insensitively, a trailing dot ignored.
//
// Another Host gets 421 Misdirected Request: RFC 9110 15.5.20 has it for a
// request whose target "does not match an origin for which the server has
// been configured" — exactly this case — where 403 would say the resource
// exists but the client may not have it, and the same request to the
// right name succeeds.
//
// serve checks Host when no --admin-token-file is set (writes are then
// open to whoever reaches the API, a rebinding page included) and when
// --allowed-host is given. With a token and no --allowed-host it does not:
// the token guards writes, a browser has no token, and replicas reached
// by many names (load balancers, service names) need no list. Reads stay
// open by design either way.
type hostPolicy struct {
	names map[string]bool // lower case, no trailing dot
}

// newHostPolicy returns the policy for an API listening on listen
// (host:port) with the extra names allowed.
func newHostPolicy(listen string, allowed []string) *hostPolicy {
	p := &hostPolicy{names: map[string]bool{"localhost": true}}
	if host, _, err := net.SplitHostPort(listen); err == nil && host != "" {
		p.names[normalHost(host)] = true
	}
	for _, n := range allowed {
		p.names[normalHost(n)] = true
	}
	return p
}

// allows reports whether a request with this Host header may be answered.
func (p *hostPolicy) allows(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	if host == "" {
		return false
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	return p.names[normalHost(host)]
}

func normalHost(h string) string { return strings.ToLower(strings.TrimSuffix(h, ".")) }

// validHostName reports whether s can be an --allowed-host: a DNS name (or
// an IP address), without scheme, port, path or wildcard.
func validHostName(s string) bool {
	if _, err := netip.ParseAddr(s); err == nil {
		return true
	}
	name := strings.TrimSuffix(s, ".")
	if name == "" || len(name) > 253 {
		return false
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range []byte(label) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// authorized wraps a write handler with the bearer-token check: 401 with no
// token, 403 with a wrong one. The comparison is constant-time (over SHA-256
// digests, so the length does not leak either) and the token is never
// logged.
func (a *api) authorized(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if len(a.token) == 0 {
			next(w, r)
			return
		}
		// The scheme is case-insensitive (RFC 7235); the token is not.
		scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(got) == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="configd"`)
			writeError(w, http.StatusUnauthorized, ErrUnauthorized)
			return
		}
		gh, wh := sha256.Sum256([]byte(strings.TrimSpace(got))), sha256.Sum256(a.token)
		if subtle.ConstantTimeCompare(gh[:], wh[:]) != 1 {
			writeError(w, http.StatusForbidden, ErrForbidden)
			return
		}
		next(w, r)
	}
}

func (a *api) handleList(w http.ResponseWriter, r *http.Request) {
	v, err := a.store.list(r.Context())
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (a *api) handleGet(w http.ResponseWriter, r *http.Request) {
	v, err := a.store.get(r.Context(), r.PathValue("name"))
	if err != nil {
		a.fail(w, err)
		return
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(v.Revision, 10)))
	writeJSON(w, http.StatusOK, v)
}

func (a *api) handlePut(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := schema.ValidateName(name); err != nil {
		a.fail(w, err)
		return
	}
	pre, err := preconditions(r)
	if err != nil {
		a.fail(w, err)
		return
	}
	body, err := schema.ReadBody(http.MaxBytesReader(w, r.Body, schema.MaxRecordSize))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			err = &schema.ValidationError{Field: "body", Value: "more than " + strconv.Itoa(schema.MaxRecordSize) + " bytes", Err: schema.ErrTooLarge}
		}
		a.fail(w, err)
		return
	}
	cfg, err := schema.DecodeProviderConfigInput(body, name)
	if err != nil {
		a.fail(w, err)
		return
	}
	if pre, err = a.resolve(r.Context(), name, pre); err != nil {
		a.fail(w, err)
		return
	}
	ch, err := a.store.put(r.Context(), cfg, pre.ifRev, actor(r))
	if err != nil {
		a.fail(w, pre.explain(err))
		return
	}
	if ch.Changed {
		a.log.Info("provider config written", "provider", name, "revision", ch.Revision, "who", actor(r))
	}
	writeJSON(w, http.StatusOK, ch)
}

func (a *api) handleDelete(w http.ResponseWriter, r *http.Request) {
	pre, err := preconditions(r)
	if err != nil {
		a.fail(w, err)
		return
	}
	if pre, err = a.resolve(r.Context(), r.PathValue("name"), pre); err != nil {
		a.fail(w, err)
		return
	}
	ch, err := a.store.remove(r.Context(), r.PathValue("name"), pre.ifRev, actor(r))
	if err != nil {
		a.fail(w, pre.explain(err))
		return
	}
	a.log.Info("provider deleted", "provider", r.PathValue("name"), "revision", ch.Revision, "who", actor(r))
	writeJSON(w, http.StatusOK, ch)
}

func (a *api) handleStatus(w http.ResponseWriter, r *http.Request) {
	v, err := a.store.status(r.Context(), r.PathValue("name"))
	if err != nil {
		a.fail(w, err)
		return
	}
	if a.publishError != nil {
		v.PublishError = a.publishError(v.Provider)
	}
	writeJSON(w, http.StatusOK, v)
}

func (a *api) handleHistory(w http.ResponseWriter, r *http.Request) {
	v, err := a.store.history(r.Context(), r.PathValue("name"))
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (a *api) handleAudit(w http.ResponseWriter, r *http.Request) {
	v, err := a.store.audit(r.Context(), r.PathValue("name"))
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (a *api) handleReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := a.ready(ctx); err != nil {
		writeError(w, http.StatusServiceUnavailable, fmt.Errorf("not ready: %w", err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "leader": a.leader()})
}

// precondition is a write's If-Match and If-None-Match (RFC 9110 13.1) as
// the store's ifRev: anyRevision (neither), 0 (If-None-Match: *), a
// revision (If-Match: "R"), mustExist (If-Match: *) or neverMatches.
type precondition struct {
	ifRev int64
	// revs, when If-Match lists several revisions: the write needs the
	// current one to be among them (resolve turns that into an ifRev).
	revs []int64
	// why says, for neverMatches, why nothing can match.
	why string
}

// explain adds to a failed precondition why it could never hold.
func (p precondition) explain(err error) error {
	if p.why != "" && errors.Is(err, ErrPreconditionFailed) {
		return fmt.Errorf("%w: %s", err, p.why)
	}
	return err
}

// resolve returns p with its ifRev for provider name: when If-Match
// listed several revisions, the current one if it is among them. The store
// then writes only at that revision, so a change in between fails the
// write.
func (a *api) resolve(ctx context.Context, name string, p precondition) (precondition, error) {
	if len(p.revs) == 0 {
		return p, nil
	}
	if err := schema.ValidateName(name); err != nil {
		return p, err
	}
	cur, err := a.store.revision(ctx, name)
	if err != nil {
		return p, err
	}
	if cur == 0 || !slices.Contains(p.revs, cur) {
		return precondition{ifRev: neverMatches, why: "none of the revisions If-Match lists is the current one"}, nil
	}
	return precondition{ifRev: cur}, nil
}

// preconditions reads If-Match and If-None-Match (RFC 9110 13.1.1, 13.1.2)
// into a precondition. configd's ETags are strong, the config's revision
// in quotes ("42"), so an If-Match tag matches only when it is exactly
// such a revision: a weak tag never does (If-Match compares strongly), nor
// one that is not a revision configd gives (the server evaluates, RFC
// 9110 13.2.2; the answer is 412, not 400). Headers that are not "*" or a
// list of entity tags are 400. If-None-Match supports only "*" (create
// only).
func preconditions(r *http.Request) (precondition, error) {
	im, hasIM := headerList(r, "If-Match")
	inm, hasINM := headerList(r, "If-None-Match")
	if hasINM {
		if star, _, ok := parseEntityTags(inm); !ok || !star {
			return precondition{}, &schema.ValidationError{Field: "If-None-Match", Value: schema.QuoteValue(inm), Err: errors.New(`If-None-Match supports only "*" (create only)`)}
		}
	}
	if !hasIM {
		if hasINM {
			return precondition{ifRev: 0}, nil
		}
		return precondition{ifRev: anyRevision}, nil
	}
	star, tags, ok := parseEntityTags(im)
	if !ok {
		return precondition{}, &schema.ValidationError{Field: "If-Match", Value: schema.QuoteValue(im), Err: errors.New(`If-Match must be "*" or entity tags such as "42", the ETag from GET`)}
	}
	if hasINM {
		// If-Match holds only if the provider exists, If-None-Match: *
		// only if it does not.
		return precondition{ifRev: neverMatches, why: "If-Match and If-None-Match: * never hold together"}, nil
	}
	if star {
		return precondition{ifRev: mustExist}, nil
	}
	var revs []int64
	seen := make(map[int64]bool)
	weak := 0
	for _, t := range tags {
		if t.weak {
			weak++
			continue
		}
		if rev, ok := revisionTag(t.opaque); ok && !seen[rev] {
			seen[rev] = true
			revs = append(revs, rev)
		}
	}
	switch {
	case len(revs) == 1:
		return precondition{ifRev: revs[0]}, nil
	case len(revs) > 1:
		return precondition{ifRev: anyRevision, revs: revs}, nil
	case weak == len(tags):
		return precondition{ifRev: neverMatches, why: `a weak entity tag (W/"...") never matches If-Match, which compares strongly; send the ETag from GET as it is, such as "42"`}, nil
	}
	return precondition{ifRev: neverMatches, why: `If-Match names no revision; configd's ETags are revisions such as "42" (from GET), and weak tags (W/"...") never match`}, nil
}

// headerList returns the field lines of name joined into one list, and
// whether there was a non-empty one.
func headerList(r *http.Request, name string) (string, bool) {
	v := strings.Trim(strings.Join(r.Header.Values(name), ", "), " \t")
	return v, v != ""
}

// entityTag is one element of an If-Match or If-None-Match list.
type entityTag struct {
	weak   bool
	opaque string // between the quotes
}

// parseEntityTags parses a field value that is "*" or a comma-separated
// list of entity tags (RFC 9110 8.8.3: [W/] DQUOTE *etagc DQUOTE, empty
// list elements allowed). ok is false when it is neither.
func parseEntityTags(v string) (star bool, tags []entityTag, ok bool) {
	s := strings.Trim(v, " \t")
	if s == "*" {
		return true, nil, true
	}
	for {
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			return false, tags, len(tags) > 0
		}
		if s[0] == ',' {
			s = s[1:]
			continue
		}
		var t entityTag
		if rest, found := strings.CutPrefix(s, "W/"); found {
			t.weak, s = true, rest
		}
		if s == "" || s[0] != '"' {
			return false, nil, false
		}
		end := strings.IndexByte(s[1:], '"')
		if end < 0 {
			return false, nil, false
		}
		t.opaque = s[1 : 1+end]
		for i := 0; i < len(t.opaque); i++ {
			if c := t.opaque[i]; c < 0x21 || c == 0x7f { // etagc: %x21 / %x23-7E / obs-text
				return false, nil, false
			}
		}
		tags = append(tags, t)
		s = strings.TrimLeft(s[2+end:], " \t")
		if s != "" && s[0] != ',' {
			return false, nil, false
		}
	}
}

// revisionTag returns the revision an opaque tag stands for, if it is one
// configd could have sent: a positive decimal in canonical form (the
// strong comparison is byte for byte, so "042" is not "42").
func revisionTag(opaque string) (int64, bool) {
	rev, err := strconv.ParseInt(opaque, 10, 64)
	return rev, err == nil && rev > 0 && strconv.FormatInt(rev, 10) == opaque
}

// actor returns who to record for a write: the X-Sluice-Actor header (made
// printable, shortened) and the caller's address.
func actor(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	who := strings.Map(func(c rune) rune {
		if unicode.IsPrint(c) {
			return c
		}
		return -1
	}, r.Header.Get(actorHeader))
	who = truncate(who, 128)
	if who == "" {
		return "api@" + host
	}
	return who + " via api@" + host
}

// fail writes err with the status it maps to.
func (a *api) fail(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, schema.ErrTooLarge):
		status = http.StatusRequestEntityTooLarge
	case errors.Is(err, ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, ErrPreconditionFailed):
		status = http.StatusPreconditionFailed
	case errors.Is(err, ErrConflict), errors.Is(err, ErrRecordsLeft):
		status = http.StatusConflict
	case errors.Is(err, ErrMalformedStored):
		status = http.StatusInternalServerError
	case errors.Is(err, schema.ErrInvalid):
		status = http.StatusBadRequest
	case errors.Is(err, ErrEtcd), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		status = http.StatusServiceUnavailable
	}
	if status >= 500 {
		a.log.Error("admin request failed", "error", err)
	}
	writeError(w, status, err)
}

// errorBody is the JSON of every error answer.
type errorBody struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, errorBody{Error: err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client may be gone; nothing to do
}
