package main

// The web console: `configd serve` serves it on its admin address, at
// /console/. Its files are embedded in the binary (console/), so nothing is
// fetched from anywhere else. It reads what the admin API reads: the list
// of providers, and for the provider on screen a live view pushed over
// server-sent events by a feed that one etcd watch drives, whatever the
// number of browsers. It changes nothing itself: a change is previewed
// here (old → new, as configd set prints it), then sent by the browser to
// the admin API's PUT, with the admin token the operator types and the
// revision the preview was read at as If-Match — the same validation, the
// same preconditions, the same history entry as any other client.

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/schema"
)

//go:embed console
var consoleFiles embed.FS

// Paths of the console.
const (
	consolePath       = "/console/"
	consoleEventsPath = "/console/events"
)

// Timing of the feeds. Variables, so that tests can shorten them.
var (
	// feedGap is the least time between two reads of a provider's status
	// by its feed; a read that took d waits at least 10·d before the next,
	// so that a provider with many instances costs etcd and configd a
	// tenth of their time at most, however often its records change.
	feedGap = 250 * time.Millisecond
	// feedRefresh rereads a provider that nothing changed: the election
	// and the holds move without a write under the provider.
	feedRefresh = 5 * time.Second
	// overviewRefresh rereads the list of providers.
	overviewRefresh = 5 * time.Second
	// feedLinger keeps a feed running after its last browser left, so that
	// one that comes back (a reload) finds the chart's history.
	feedLinger = 2 * time.Minute
	// overviewStatusMax bounds the providers whose generation the list
	// shows: each costs one status read per overviewRefresh.
	overviewStatusMax = 100
	// heartbeat is how often an idle event stream sends a comment, so that
	// proxies and the server's write deadline do not end it.
	heartbeat = 15 * time.Second
)

// console serves the web console.
type console struct {
	hub      *hub
	fail     func(w http.ResponseWriter, err error) // the admin API's error answers
	writable bool                                   // an admin token is set: the console offers changes, made with it
	replica  string
	leader   func() bool
	log      *slog.Logger
	files    fs.FS
}

// newConsole returns the console of the admin API a, reading through a's
// store; close its hub when done.
func newConsole(a *api, replica string) *console {
	files, _ := fs.Sub(consoleFiles, "console")
	return &console{hub: newHub(a.store, a.publishError, a.log), fail: a.fail, writable: len(a.token) > 0,
		replica: replica, leader: a.leader, log: a.log, files: files}
}

// register adds the console's routes to mux.
func (c *console) register(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, consolePath, http.StatusFound)
	})
	mux.HandleFunc("GET "+consolePath+"{$}", c.serveFile("index.html"))
	mux.HandleFunc("GET "+consolePath+"app.js", c.serveFile("app.js"))
	mux.HandleFunc("GET "+consolePath+"app.css", c.serveFile("app.css"))
	mux.HandleFunc("GET "+consoleEventsPath, c.handleEvents)
	mux.HandleFunc("GET "+consolePath+"preview/{name}", c.handlePreview)
}

// isConsoleStream reports whether r is for the console's event stream,
// which lasts as long as the browser's page: the admin API's per-request
// timeout does not apply to it.
func isConsoleStream(r *http.Request) bool {
	return r.URL.Path == consoleEventsPath
}

// securityHeaders are sent with every console file: nothing loads from
// elsewhere, nothing runs inline, no other site may frame the page (its
// change form) or read where it came from.
func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
}

func (c *console) serveFile(name string) http.HandlerFunc {
	ctype := map[string]string{".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
	return func(w http.ResponseWriter, r *http.Request) {
		b, err := fs.ReadFile(c.files, name)
		if err != nil {
			writeError(w, http.StatusNotFound, fmt.Errorf("no such file: %s", name))
			return
		}
		securityHeaders(w.Header())
		w.Header().Set("Content-Type", ctype[name[strings.LastIndexByte(name, '.'):]])
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			w.Write(b)
		}
	}
}

// overview is the list of providers as the console shows it, and what the
// console can do.
type overview struct {
	Providers []overviewRow `json:"providers"`
	Malformed []string      `json:"malformed,omitempty"`
	Error     string        `json:"error,omitempty"`
	// Writable says whether the console offers changes: only when configd
	// has an admin token, which the operator types to make them.
	Writable bool      `json:"writable"`
	Replica  string    `json:"replica"`
	Leader   bool      `json:"leader"` // this replica leads
	Read     time.Time `json:"read"`
}

// overviewRow is one provider in the list.
type overviewRow struct {
	Name       string `json:"name"`
	Limit      int64  `json:"limit"`
	Window     string `json:"window"`
	Mode       string `json:"mode"`
	Algorithm  string `json:"algorithm"`
	Revision   int64  `json:"revision"`
	Generation int64  `json:"generation"`            // of its last shares record; 0: none
	MoreLimits string `json:"more_limits,omitempty"` // its further limits, as --limit takes them; empty: none
}

// handleEvents streams the overview and, with ?provider=NAME, that
// provider's panel, as server-sent events ("overview" and "provider"), each
// the whole state: a browser that reconnects needs nothing else.
func (c *console) handleEvents(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("provider")
	if name != "" {
		if err := schema.ValidateName(name); err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
	}
	sub, err := c.hub.subscribe(name)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	defer c.hub.unsubscribe(sub)
	rc := http.NewResponseController(w)
	// The server's read and write timeouts are for requests, not for a
	// stream that lasts as long as the page: the write deadline is moved
	// on with every event instead.
	rc.SetReadDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	send := func(event string, data []byte) bool {
		rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		var err error
		if event == "" {
			_, err = fmt.Fprint(w, ": still here\n\n")
		} else {
			_, err = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, data)
		}
		return err == nil && rc.Flush() == nil
	}
	if !send("", nil) {
		return
	}
	beat := time.NewTicker(heartbeat)
	defer beat.Stop()
	var sentOverview, sentPanel uint64
	for {
		ov, ovSeq, panel, panelSeq := c.hub.latest(sub)
		if ovSeq != sentOverview && ov != nil {
			if !send("overview", c.decorate(ov)) {
				return
			}
			sentOverview = ovSeq
		}
		if panelSeq != sentPanel && panel != nil {
			if !send("provider", panel) {
				return
			}
			sentPanel = panelSeq
		}
		select {
		case <-r.Context().Done():
			return
		case <-c.hub.done:
			return
		case <-sub.notify:
		case <-beat.C:
			if !send("", nil) {
				return
			}
		}
	}
}

// decorate adds to the shared overview what this replica knows of itself.
func (c *console) decorate(ov *overview) []byte {
	v := *ov
	v.Writable, v.Replica, v.Leader = c.writable, c.replica, c.leader()
	b, _ := json.Marshal(v)
	return b
}

// previewView answers a preview: the change configd set would make.
type previewView struct {
	Provider string                `json:"provider"`
	Change   string                `json:"change"`  // "limit 400 → 600", as configd set prints it
	Changed  bool                  `json:"changed"` // false: nothing would change
	Old      schema.ProviderConfig `json:"old"`
	New      schema.ProviderConfig `json:"new"` // the body to PUT
	Revision int64                 `json:"revision"`
	ETag     string                `json:"etag"` // the If-Match to send it with
}

// handlePreview answers GET /console/preview/NAME?limit=N&window=D&mode=M
// with the change that would make, parsed and checked exactly as configd
// set parses and checks its flags. It writes nothing.
func (c *console) handlePreview(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	q := r.URL.Query()
	var e edit
	for key, dst := range map[string]*optString{"limit": &e.limit, "window": &e.window, "mode": &e.mode} {
		if q.Has(key) {
			dst.Set(q.Get(key))
		}
	}
	for key := range q {
		if key != "limit" && key != "window" && key != "mode" {
			writeError(w, http.StatusBadRequest, &schema.ValidationError{Field: clip(key), Err: errors.New("the console changes only limit, window and mode")})
			return
		}
	}
	cur, err := c.hub.st.get(r.Context(), name)
	if err != nil {
		c.fail(w, err)
		return
	}
	next, err := e.apply(cur.Config)
	if err != nil {
		c.fail(w, err)
		return
	}
	ch := describeChange(&cur.Config, &next)
	writeJSON(w, http.StatusOK, previewView{Provider: name, Change: ch, Changed: !cur.Config.Equal(next), Old: cur.Config, New: next,
		Revision: cur.Revision, ETag: fmt.Sprintf("%q", fmt.Sprint(cur.Revision))})
}

// hub runs the feeds: one for the overview and one per provider on
// screen, each shared by every browser that shows it. A feed starts with
// its first subscriber and stops feedLinger after its last left; close
// stops them all.
type hub struct {
	st           *store
	publishError func(provider string) string
	log          *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed by close: every stream ends
	wg     sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	overview *feed
	feeds    map[string]*feed
	reads    int // status reads by all feeds, for tests
}

func newHub(st *store, publishError func(string) string, log *slog.Logger) *hub {
	ctx, cancel := context.WithCancel(context.Background())
	return &hub{st: st, publishError: publishError, log: log, ctx: ctx, cancel: cancel, done: make(chan struct{}), feeds: map[string]*feed{}}
}

// feed is the latest state of one view and the subscribers to tell.
type feed struct {
	name   string // the provider; "": the overview
	subs   map[*subscriber]bool
	data   []byte        // the latest state, JSON
	ov     *overview     // the overview's latest state
	seq    uint64        // grows with every new state
	idle   time.Time     // when its last subscriber left; zero while it has some
	wake   chan struct{} // a subscriber came or went
	poke   chan struct{} // read again now
	cancel context.CancelFunc
}

// subscriber is one event stream.
type subscriber struct {
	provider string
	notify   chan struct{} // a new state is there (buffered: states coalesce)
}

var errConsoleClosed = errors.New("configd: the console is shutting down")

// subscribe registers an event stream for the overview and, unless name is
// empty, that provider, starting their feeds as needed.
func (h *hub) subscribe(name string) (*subscriber, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errConsoleClosed
	}
	sub := &subscriber{provider: name, notify: make(chan struct{}, 1)}
	if h.overview == nil {
		h.overview = h.start("")
	}
	h.overview.add(sub)
	if name != "" {
		f := h.feeds[name]
		if f == nil {
			f = h.start(name)
			h.feeds[name] = f
		}
		f.add(sub)
	}
	return sub, nil
}

func (f *feed) add(sub *subscriber) {
	f.subs[sub] = true
	if !f.idle.IsZero() {
		f.idle = time.Time{}
		select {
		case f.wake <- struct{}{}:
		default:
		}
	}
	if f.seq > 0 {
		sub.tell()
	}
}

func (s *subscriber) tell() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// unsubscribe ends a stream; a feed left without subscribers stops after
// feedLinger.
func (h *hub) unsubscribe(sub *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, f := range h.subscribed(sub) {
		delete(f.subs, sub)
		if len(f.subs) == 0 {
			f.idle = time.Now()
			select {
			case f.wake <- struct{}{}:
			default:
			}
		}
	}
}

// subscribed returns the feeds sub is subscribed to. h.mu is held.
func (h *hub) subscribed(sub *subscriber) []*feed {
	var out []*feed
	if h.overview != nil && h.overview.subs[sub] {
		out = append(out, h.overview)
	}
	if f := h.feeds[sub.provider]; f != nil && f.subs[sub] {
		out = append(out, f)
	}
	return out
}

// latest returns the newest states sub sees.
func (h *hub) latest(sub *subscriber) (ov *overview, ovSeq uint64, panel []byte, panelSeq uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.overview != nil {
		ov, ovSeq = h.overview.ov, h.overview.seq
	}
	if f := h.feeds[sub.provider]; sub.provider != "" && f != nil {
		panel, panelSeq = f.data, f.seq
	}
	return ov, ovSeq, panel, panelSeq
}

// publish stores a feed's new state and tells its subscribers.
func (h *hub) publish(f *feed, data []byte, ov *overview) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f.data, f.ov = data, ov
	f.seq++
	for sub := range f.subs {
		sub.tell()
	}
}

// start starts a feed's goroutine. h.mu is held.
func (h *hub) start(name string) *feed {
	ctx, cancel := context.WithCancel(h.ctx)
	f := &feed{name: name, subs: map[*subscriber]bool{}, wake: make(chan struct{}, 1), poke: make(chan struct{}, 1), cancel: cancel}
	h.wg.Go(func() {
		defer cancel()
		if name == "" {
			h.runOverview(ctx, f)
		} else {
			h.runProvider(ctx, f)
		}
	})
	return f
}

// lingered reports whether f has had no subscriber for feedLinger, and
// forgets it if so: its goroutine then returns.
func (h *hub) lingered(f *feed) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(f.subs) > 0 || f.idle.IsZero() || time.Since(f.idle) < feedLinger {
		return false
	}
	if f.name == "" {
		h.overview = nil
	} else {
		delete(h.feeds, f.name)
	}
	return true
}

// close ends every stream and stops every feed, waiting for them.
func (h *hub) close() {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		close(h.done)
	}
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
}

// lingerTimer returns a channel that fires when f may have lingered long
// enough, or nil while it has subscribers.
func (h *hub) lingerTimer(f *feed) (<-chan time.Time, func()) {
	h.mu.Lock()
	idle := f.idle
	h.mu.Unlock()
	if idle.IsZero() {
		return nil, func() {}
	}
	t := time.NewTimer(time.Until(idle.Add(feedLinger)))
	return t.C, func() { t.Stop() }
}

// runOverview reads the list of providers every overviewRefresh, and
// when a provider's feed saw its config change.
func (h *hub) runOverview(ctx context.Context, f *feed) {
	for {
		ov := h.readOverview(ctx)
		h.publish(f, nil, &ov)
		if !h.wait(ctx, f, overviewRefresh, nil) {
			return
		}
	}
}

func (h *hub) readOverview(ctx context.Context) overview {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	ov := overview{Providers: []overviewRow{}, Read: time.Now().UTC()}
	l, err := h.st.list(ctx)
	if err != nil {
		ov.Error = err.Error()
		return ov
	}
	for _, p := range l.Providers {
		c := p.Config
		row := overviewRow{Name: c.Name, Limit: c.Limit, Window: c.Window.String(), Mode: string(c.Mode),
			Algorithm: string(c.Algorithm), Revision: p.Revision}
		if more := moreLimits(c); more != "none" {
			row.MoreLimits = more
		}
		// The generation comes from status, the one read of a provider's
		// state that configd status makes too: the console knows nothing
		// of how shares are laid out in etcd.
		if len(l.Providers) <= overviewStatusMax {
			if v, err := h.st.status(ctx, c.Name); err == nil && v.Shares != nil {
				row.Generation = v.Shares.Generation
			}
		}
		ov.Providers = append(ov.Providers, row)
	}
	for _, m := range l.Malformed {
		ov.Malformed = append(ov.Malformed, fmt.Sprintf("%s (revision %d): %s", m.Key, m.Revision, m.Error))
	}
	return ov
}

// poke makes the overview read the list again now.
func (h *hub) poke() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.overview != nil {
		select {
		case h.overview.poke <- struct{}{}:
		default:
		}
	}
}

// wait waits until f has something to read again: a change under its
// provider (w, the watch; nil for the overview), a poke, or refresh. It
// returns false when f is to stop: ctx ended, or it lingered without a
// subscriber.
func (h *hub) wait(ctx context.Context, f *feed, refresh time.Duration, w *watcher) bool {
	t := time.NewTimer(refresh)
	defer t.Stop()
	var events clientv3.WatchChan
	if w != nil {
		events = w.ch
	}
	for {
		linger, stop := h.lingerTimer(f)
		select {
		case <-ctx.Done():
			stop()
			return false
		case wr, ok := <-events:
			stop()
			if !ok || wr.Err() != nil {
				// Cancelled (compacted, no leader, etcd gone): watch again
				// from now; the read that follows catches up.
				w.restart(ctx)
				return true
			}
			if wr.Created {
				continue
			}
			return true
		case <-t.C:
			stop()
			return true
		case <-f.poke:
			stop()
			return true
		case <-f.wake:
			stop() // a subscriber came or went: the linger timer changes
		case <-linger:
			stop()
			if h.lingered(f) {
				return false
			}
		}
	}
}

// watcher is a feed's etcd watch on its provider's keys: it only says
// that something changed; the feed then reads the provider's status.
type watcher struct {
	h    *hub
	name string
	ch   clientv3.WatchChan
}

func (w *watcher) restart(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	w.ch = w.h.st.cli.Watch(clientv3.WithRequireLeader(ctx), w.h.st.keys.Provider(w.name), clientv3.WithPrefix(), clientv3.WithCreatedNotify())
}

// runProvider keeps one provider's panel: it reads the provider's status
// when its keys change (one etcd watch, whatever the number of browsers),
// at most every feedGap (and ten times as long as a read takes), and
// every feedRefresh regardless.
func (h *hub) runProvider(ctx context.Context, f *feed) {
	st := newConsoleState()
	var hist []schema.HistoryEntry
	histRev := int64(-1)
	w := &watcher{h: h, name: f.name}
	w.restart(ctx)
	for {
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		v, err := h.st.status(rctx, f.name)
		if err == nil && v.ConfigRevision != histRev {
			// A change of config comes with its history entry, in one
			// transaction: read the history only then.
			var herr error
			if hist, herr = h.st.history(rctx, f.name); herr == nil {
				if histRev >= 0 {
					h.poke()
				}
				histRev = v.ConfigRevision
			}
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		h.mu.Lock()
		h.reads++
		h.mu.Unlock()
		now := time.Now()
		p := providerPanel{Provider: f.name, Read: now.UTC(), Instances: []instanceRow{}, Held: []heldRow{}, History: []historyRow{}}
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			p.Found, p.Error = true, err.Error()
		default:
			if h.publishError != nil {
				v.PublishError = h.publishError(f.name)
			}
			st.observe(v, now)
			p = buildPanel(st, v, hist, now)
		}
		data, _ := json.Marshal(p)
		h.publish(f, data, nil)
		gap := max(feedGap, 10*time.Since(start))
		if !h.wait(ctx, f, feedRefresh, w) {
			return
		}
		if wait := time.Until(start.Add(gap)); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			if ctx.Err() != nil {
				return
			}
		}
	}
}
