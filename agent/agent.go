package agent

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/cluster"
	"github.com/sluice-go/sluice/limiter/metrics"
)

// Agent holds this machine's share of each provider's limits and answers
// acquisitions for it. Its methods are safe for concurrent use; Serve puts
// them on the sockets, and Close leaves every provider.
type Agent struct {
	cfg   Config
	log   *slog.Logger
	cli   *clientv3.Client // nil without Endpoints
	token []byte           // nil without TokenFile
	reg   *prometheus.Registry
	copts []cluster.Option

	ctx    context.Context // ends at Close: joins under way stop
	cancel context.CancelFunc
	joins  sync.WaitGroup // the join goroutines

	mu        sync.RWMutex
	providers map[string]*provider
	closed    bool

	grants  grants
	callers callers
	// draining is set when Serve begins to shut down: a wait cut short
	// by it ends as ErrClosed, not as the caller's cancellation.
	draining atomic.Bool
	// grpcDrain is Serve's context that ends when it shuts down: the gRPC
	// interceptor ends a call's wait with it (HTTP requests derive from it).
	grpcDrain atomic.Pointer[context.Context]
}

// provider is one provider the agent holds: a limiter.Multi of its
// limits, kept at this machine's share by a cluster.Group, or local.
type provider struct {
	name  string
	ready chan struct{} // closed once multi or err is set
	multi *limiter.Multi
	group *cluster.Group // nil for a local provider
	dims  []string       // the distinct dimensions its limits count
	err   error
}

// Option configures an Agent.
type Option interface{ apply(*options) }

type options struct {
	log   *slog.Logger
	copts []cluster.Option
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

// WithLogger sets the logger (default: none).
func WithLogger(l *slog.Logger) Option { return optionFunc(func(o *options) { o.log = l }) }

// WithClusterOptions adds options to every provider's join (after the
// agent's own: Config.ID, Prefix, LeaseTTL, the logger).
func WithClusterOptions(opts ...cluster.Option) Option {
	return optionFunc(func(o *options) { o.copts = append(o.copts, opts...) })
}

// New validates cfg, connects to etcd (without waiting for it) and starts
// joining the configured providers and making the local ones. Close
// undoes it.
func New(cfg Config, opts ...Option) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := options{log: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		opt.apply(&o)
	}
	a := &Agent{cfg: cfg, log: o.log, reg: prometheus.NewRegistry(), providers: map[string]*provider{}}
	a.grants.init(cfg.MaxGrants, cfg.GrantTTL)
	a.callers.init(cfg.MaxCallers)
	if cfg.TokenFile != "" {
		tok, err := readToken(cfg.TokenFile)
		if err != nil {
			return nil, err
		}
		a.token = tok
	}
	if len(cfg.Endpoints) > 0 {
		cli, err := dial(cfg)
		if err != nil {
			return nil, err
		}
		a.cli = cli
	}
	a.copts = []cluster.Option{cluster.WithLogger(o.log)}
	if cfg.ID != "" {
		a.copts = append(a.copts, cluster.WithID(cfg.ID))
	}
	if cfg.Prefix != "" {
		a.copts = append(a.copts, cluster.WithPrefix(cfg.Prefix))
	}
	if cfg.LeaseTTL > 0 {
		a.copts = append(a.copts, cluster.WithLeaseTTL(cfg.LeaseTTL))
	}
	a.copts = append(a.copts, o.copts...)
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.reg.MustRegister(&callerCollector{a: a})
	for _, lp := range cfg.Local {
		if err := a.addLocal(lp); err != nil {
			a.Close()
			return nil, err
		}
	}
	a.mu.Lock()
	for _, name := range cfg.Providers {
		a.startJoinLocked(name)
	}
	a.mu.Unlock()
	return a, nil
}

// Registry is the agent's own Prometheus registry: its callers' counts and
// every provider's limiter and member metrics. Nothing is registered on
// the default registerer.
func (a *Agent) Registry() *prometheus.Registry { return a.reg }

// Close leaves every provider (revoking the leases, so the others' shares
// grow) and releases every waiter with ErrClosed. It is idempotent.
func (a *Agent) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	a.mu.Unlock()
	a.cancel()
	a.joins.Wait() // after it, no provider changes
	var errs []error
	for _, p := range a.providers {
		switch {
		case p.group != nil:
			errs = append(errs, p.group.Close())
		case p.multi != nil:
			errs = append(errs, p.multi.Close())
		}
	}
	if a.cli != nil {
		errs = append(errs, a.cli.Close())
	}
	return errors.Join(errs...)
}

func readToken(file string) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("agent: token: %w", err)
	}
	tok := strings.TrimRight(string(b), "\r\n")
	if len(tok) < 16 {
		return nil, fmt.Errorf("%w: the token in %s is shorter than 16 characters", ErrConfig, file)
	}
	return []byte(tok), nil
}

// authorized reports whether header, an Authorization value, carries the
// token; the comparison takes the same time wherever they differ.
func (a *Agent) authorized(header string) bool {
	tok, ok := strings.CutPrefix(header, "Bearer ")
	return ok && a.token != nil && subtle.ConstantTimeCompare([]byte(tok), a.token) == 1
}

func dial(cfg Config) (*clientv3.Client, error) {
	var pw string
	if cfg.PasswordFile != "" {
		b, err := os.ReadFile(cfg.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("agent: etcd password: %w", err)
		}
		pw = strings.TrimRight(string(b), "\r\n")
	}
	ecfg := clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: cluster.DialOptions(), Username: cfg.Username, Password: pw}
	if cfg.CAFile != "" || cfg.CertFile != "" {
		info := transport.TLSInfo{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, TrustedCAFile: cfg.CAFile}
		tc, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("agent: etcd TLS: %w", err)
		}
		ecfg.TLS = tc
	}
	cli, err := clientv3.New(ecfg)
	if err != nil {
		return nil, fmt.Errorf("agent: etcd: %w", err)
	}
	return cli, nil
}

// addLocal makes a local provider, ready at once.
func (a *Agent) addLocal(lp LocalProvider) error {
	m, err := limiter.NewMulti(lp.Limits)
	if err != nil {
		return fmt.Errorf("agent: local provider %s: %w", lp.Name, err)
	}
	p := &provider{name: lp.Name, ready: make(chan struct{}), multi: m, dims: dims(m)}
	close(p.ready)
	a.providers[lp.Name] = p
	for i := range lp.Limits {
		name := lp.Name
		if i > 0 {
			name = schema.LaneName(lp.Name, i)
		}
		if err := metrics.Register(a.reg, m.Limiter(i), prometheus.Labels{"provider": name, "instance": "local"}); err != nil {
			return err
		}
	}
	return nil
}

func dims(m *limiter.Multi) []string {
	var out []string
	for _, l := range m.Limits() {
		if !contains(out, l.Dimension) {
			out = append(out, l.Dimension)
		}
	}
	return out
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// allowedLocked reports whether name may be joined on first use.
func (a *Agent) allowed(name string) bool {
	for _, pat := range a.cfg.Allow {
		if ok, _ := path.Match(pat, name); ok {
			return true
		}
	}
	return false
}

// startJoinLocked adds provider name and joins it in a goroutine owned by
// the agent (a.joins), under a.ctx: a request that gives up waiting does
// not abandon the join for the next one. a.mu must be held.
func (a *Agent) startJoinLocked(name string) *provider {
	p := &provider{name: name, ready: make(chan struct{})}
	a.providers[name] = p
	a.joins.Add(1)
	go func() {
		defer a.joins.Done()
		g, err := cluster.JoinProvider(a.ctx, a.cli, name, a.copts...)
		if err == nil {
			err = a.register(g)
			if err != nil {
				g.Close()
			}
		}
		if err != nil {
			a.log.Warn("joining a provider failed", "provider", name, "err", err)
			p.err = err
			a.mu.Lock()
			if a.providers[name] == p {
				delete(a.providers, name) // the next request tries again
			}
			a.mu.Unlock()
		} else {
			p.group, p.multi, p.dims = g, g.Multi(), dims(g.Multi())
			// Not p.multi.Limits(): those are the placeholders the limits
			// were made with (0/1s); the shares come in force later, each
			// logged as "share applied", and /v1/status shows them.
			a.log.Info("joined a provider", "provider", name, "dimensions", strings.Join(p.dims, ","))
		}
		close(p.ready)
	}()
	return p
}

func (a *Agent) register(g *cluster.Group) error {
	for _, m := range g.Members() {
		labels := prometheus.Labels{"provider": m.Provider(), "instance": m.ID()}
		if err := metrics.Register(a.reg, m.Limiter(), labels); err != nil {
			return err
		}
		if err := a.reg.Register(cluster.NewCollector(m, labels)); err != nil {
			return err
		}
	}
	return nil
}

// provider returns the provider called name, joining it if it is allowed
// and new, and waiting, within ctx, until it is ready.
func (a *Agent) provider(ctx context.Context, name string) (*provider, error) {
	a.mu.RLock()
	p, closed := a.providers[name], a.closed
	a.mu.RUnlock()
	if closed {
		return nil, ErrClosed
	}
	if p == nil {
		if err := schema.ValidateUserName(name); err != nil {
			return nil, fmt.Errorf("%w: provider: %v", ErrBadRequest, err)
		}
		if a.cli == nil || !a.allowed(name) {
			return nil, fmt.Errorf("%w: %q is not among the agent's providers and matches none of its allowed patterns", ErrProviderNotAllowed, name)
		}
		a.mu.Lock()
		switch p = a.providers[name]; {
		case a.closed:
			a.mu.Unlock()
			return nil, ErrClosed
		case p != nil:
		case len(a.providers) >= a.cfg.MaxProviders:
			a.mu.Unlock()
			return nil, fmt.Errorf("%w: it holds %d already", ErrTooManyProviders, a.cfg.MaxProviders)
		default:
			p = a.startJoinLocked(name)
		}
		a.mu.Unlock()
	}
	select {
	case <-p.ready:
	default:
		select {
		case <-p.ready:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: joining %s: %w", limiter.ErrCanceled, name, ctx.Err())
		}
	}
	if p.err != nil {
		return nil, fmt.Errorf("%w: joining %s: %w", ErrClosed, name, p.err)
	}
	return p, nil
}

// Request is an acquisition.
type Request struct {
	Provider string
	// Caller names the program asking, for status and metrics ("": unnamed).
	Caller string
	// Cost is what the call takes per dimension: 1 request unless it names
	// requests (limiter.Multi's rule).
	Cost []limiter.Amount
	// MaxWait is the longest the caller waits (Acquire, Reserve).
	MaxWait time.Duration
	// Class names the call's priority class ("": none), which Acquire,
	// TryAcquire and Reserve serve as limiter.Multi does a call that
	// names it with limiter.WithClass: a provider's classes are those of
	// its config (cluster.JoinProvider), each limit keeping its classes'
	// reserves. A class the provider does not list is its default class,
	// as in the library.
	Class string
}

// Granted is an acquisition's outcome: the grant's or reservation's id,
// what it took per dimension, and (Reserve) how long until it is valid.
type Granted struct {
	ID    string
	Cost  map[string]int64
	Delay time.Duration
}

// Acquire waits up to req.MaxWait for every limit of the provider to have
// room for the cost, as limiter.Multi.Acquire: ErrTimeout at once when the
// earliest instant lies further away; if ctx ends while it waits, the
// permits go back. The grant is kept for Settle and Cancel.
func (a *Agent) Acquire(ctx context.Context, req Request) (Granted, error) {
	p, t, err := a.begin(ctx, req)
	if err != nil {
		t.count(opAcquire, err)
		return Granted{}, err
	}
	if req.Class != "" {
		ctx = limiter.WithClass(ctx, req.Class)
	}
	g, err := p.multi.Acquire(ctx, req.MaxWait, req.Cost...)
	if err != nil {
		err = a.drained(err)
		t.count(opAcquire, err)
		return Granted{}, err
	}
	t.count(opAcquire, nil)
	return a.grants.add(p, t, costOf(p, req.Cost), g, nil, 0), nil
}

// TryAcquire takes the cost if every limit has room now, and never waits;
// a refusal wraps limiter.ErrTimeout (no room within a wait of 0).
func (a *Agent) TryAcquire(ctx context.Context, req Request) (Granted, error) {
	p, t, err := a.begin(ctx, req)
	if err != nil {
		t.count(opTryAcquire, err)
		return Granted{}, err
	}
	g, ok := p.multi.TryAcquireContext(classContext(req.Class), req.Cost...)
	if !ok {
		err := fmt.Errorf("%w: no room now in every limit of %s", limiter.ErrTimeout, p.name)
		t.count(opTryAcquire, err)
		return Granted{}, err
	}
	t.count(opTryAcquire, nil)
	return a.grants.add(p, t, costOf(p, req.Cost), g, nil, 0), nil
}

// Reserve takes the cost at the earliest instant within req.MaxWait at
// which every limit has room, and returns at once with how long until
// then, as limiter.Multi.Reserve. The reservation is kept for Cancel and
// Settle; one neither cancelled nor settled is spent, as in the library.
func (a *Agent) Reserve(ctx context.Context, req Request) (Granted, error) {
	p, t, err := a.begin(ctx, req)
	if err != nil {
		t.count(opReserve, err)
		return Granted{}, err
	}
	// The reservation outlives the request: only its class is the
	// caller's, not its context's deadline or cancellation.
	r, err := p.multi.ReserveContext(classContext(req.Class), req.MaxWait, req.Cost...)
	if err != nil {
		t.count(opReserve, err)
		return Granted{}, err
	}
	t.count(opReserve, nil)
	d := r.Delay()
	return a.grants.add(p, t, costOf(p, req.Cost), limiter.Grant{}, r, d), nil
}

// classContext is a context that names class, if any, for the calls
// that do not wait (limiter.Multi.TryAcquireContext, ReserveContext).
func classContext(class string) context.Context {
	if class == "" {
		return context.Background()
	}
	return limiter.WithClass(context.Background(), class)
}

// begin checks req and finds its provider and caller tally.
func (a *Agent) begin(ctx context.Context, req Request) (*provider, *tally, error) {
	if err := a.check(req); err != nil {
		return nil, a.callers.unknown(), err
	}
	p, err := a.provider(ctx, req.Provider)
	if err != nil {
		return nil, a.callers.unknown(), err
	}
	t := a.callers.get(p.name, req.Caller)
	if err := p.check(req.Cost); err != nil {
		return nil, t, err
	}
	return p, t, nil
}

// check rejects a cost that names a dimension none of p's limits counts,
// or takes nothing, as limiter.Multi would: TryAcquire's refusal says
// only that there was no room.
func (p *provider) check(cost []limiter.Amount) error {
	any := false
	for _, c := range cost {
		if !contains(p.dims, c.Dimension) {
			return fmt.Errorf("%w: dimension %q is none of %s's limits' (%s)", limiter.ErrInvalid, c.Dimension, p.name, strings.Join(p.dims, ", "))
		}
		any = any || c.N > 0
	}
	if !any && !named(cost, limiter.Requests) && contains(p.dims, limiter.Requests) {
		any = true // 1 request by default
	}
	if !any {
		return fmt.Errorf("%w: the cost takes nothing from any limit of %s", limiter.ErrInvalid, p.name)
	}
	return nil
}

func named(cost []limiter.Amount, dim string) bool {
	for _, c := range cost {
		if c.Dimension == dim {
			return true
		}
	}
	return false
}

// costOf is what cost takes per dimension of p: 1 request unless it
// names requests.
func costOf(p *provider, cost []limiter.Amount) map[string]int64 {
	out := make(map[string]int64, len(p.dims))
	for _, d := range p.dims {
		out[d] = 0
	}
	if contains(p.dims, limiter.Requests) {
		out[limiter.Requests] = 1
	}
	for _, c := range cost {
		out[c.Dimension] = c.N
	}
	return out
}

// check rejects what no provider could accept, before any provider is
// joined for it.
func (a *Agent) check(req Request) error {
	if req.MaxWait < 0 || req.MaxWait > a.cfg.MaxWait {
		return fmt.Errorf("%w: max wait %v: want 0 to %v", ErrBadRequest, req.MaxWait, a.cfg.MaxWait)
	}
	if err := checkCaller(req.Caller); err != nil {
		return err
	}
	return checkCost(req.Cost)
}

// checkClass refuses a class that is no class name; "" names none.
func checkClass(c string) error {
	if c != "" && !limiter.ValidClassName(c) {
		return fmt.Errorf("%w: class %.40q: 1 to 32 lower-case letters, digits, '_' or '-', starting with a letter", ErrBadRequest, c)
	}
	return nil
}

func checkCaller(c string) error {
	if len(c) > 64 {
		return fmt.Errorf("%w: caller: at most 64 characters, got %d", ErrBadRequest, len(c))
	}
	for i := 0; i < len(c); i++ {
		b := c[i]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || strings.IndexByte("._:@/-", b) >= 0) {
			return fmt.Errorf("%w: caller %q: letters, digits and ._:@/- only", ErrBadRequest, c)
		}
	}
	return nil
}

func checkCost(cost []limiter.Amount) error {
	if len(cost) > limiter.MaxLimits {
		return fmt.Errorf("%w: cost names %d dimensions, at most %d", ErrBadRequest, len(cost), limiter.MaxLimits)
	}
	for i, c := range cost {
		if named(cost[:i], c.Dimension) {
			return fmt.Errorf("%w: cost names %s twice", ErrBadRequest, c.Dimension)
		}
		if err := limiter.ValidateDimension(c.Dimension); err != nil {
			return fmt.Errorf("%w: cost: %w", ErrBadRequest, err)
		}
		if c.N < 0 || c.N > limiter.MaxQuota {
			return fmt.Errorf("%w: cost %s: want 0 to %d, got %d", ErrBadRequest, c.Dimension, int64(limiter.MaxQuota), c.N)
		}
	}
	return nil
}

// drained turns a wait cut short by Serve's shutdown into ErrClosed.
func (a *Agent) drained(err error) error {
	if a.draining.Load() && errors.Is(err, limiter.ErrCanceled) {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}

// Cancel gives back what a reservation or a grant took, to the window it
// was taken from while that is open, and forgets it.
func (a *Agent) Cancel(ctx context.Context, id, caller string) error {
	e, err := a.grants.lock(id)
	if err != nil {
		a.callers.unknown().count(opCancel, err)
		return err
	}
	defer e.mu.Unlock()
	if e.res != nil {
		e.res.Cancel()
	} else {
		zero := make([]limiter.Amount, len(e.p.dims))
		for i, d := range e.p.dims {
			zero[i] = limiter.Amount{Dimension: d}
		}
		if err := e.g.Settle(zero...); err != nil {
			e.t.count(opCancel, err)
			return err
		}
	}
	a.grants.forgetLocked(e)
	e.t.count(opCancel, nil)
	return nil
}

// Settle reports what the call a grant (or a reservation, once valid)
// paid for actually cost, as limiter.Grant.Settle: what was charged too
// much goes back. A refused settle changes nothing; the grant can be
// settled again.
func (a *Agent) Settle(ctx context.Context, id, caller string, cost []limiter.Amount) error {
	if err := checkCost(cost); err != nil {
		a.callers.unknown().count(opSettle, err)
		return err
	}
	e, err := a.grants.lock(id)
	if err != nil {
		a.callers.unknown().count(opSettle, err)
		return err
	}
	defer e.mu.Unlock()
	if e.res != nil {
		if d := e.res.Delay(); d > 0 {
			err := fmt.Errorf("%w: valid in %v", ErrNotYetValid, d)
			e.t.count(opSettle, err)
			return err
		}
		g, err := e.res.Wait(ctx) // valid: returns at once
		if err != nil {
			e.t.count(opSettle, err)
			return err
		}
		e.g, e.res = g, nil
	}
	if err := e.g.Settle(cost...); err != nil {
		e.t.count(opSettle, err)
		return err
	}
	a.grants.forgetLocked(e)
	e.t.count(opSettle, nil)
	return nil
}

// grants keeps the grants and reservations handed out, by id, for Settle
// and Cancel: at most max of them, each for ttl (a reservation, ttl past
// the instant it is valid). One forgotten keeps what it was charged.
type grants struct {
	max    int
	ttl    time.Duration
	prefix string // this agent's: an id of another run is unknown
	seq    atomic.Uint64

	mu    sync.Mutex
	byID  map[uint64]*entry
	queue []*entry // in order of expiry but for reservations: see add
	head  int
}

type entry struct {
	id      uint64
	secret  uint64 // random: an id cannot be guessed from another
	expires time.Time

	mu  sync.Mutex // held while settled or cancelled
	p   *provider
	t   *tally
	g   limiter.Grant
	res *limiter.MultiReservation
}

func (s *grants) init(max int, ttl time.Duration) {
	var b [4]byte
	rand.Read(b[:])
	s.max, s.ttl, s.prefix = max, ttl, "g"+hex.EncodeToString(b[:])+"-"
	s.byID = map[uint64]*entry{}
}

func (s *grants) add(p *provider, t *tally, cost map[string]int64, g limiter.Grant, r *limiter.MultiReservation, delay time.Duration) Granted {
	id := s.seq.Add(1)
	now := time.Now()
	var b [8]byte
	rand.Read(b[:])
	e := &entry{id: id, secret: binary.LittleEndian.Uint64(b[:]), expires: now.Add(s.ttl + max(delay, 0)), p: p, t: t, g: g, res: r}
	s.mu.Lock()
	// Entries leave from the head when they expire or when there are too
	// many; a reservation's later expiry can keep an earlier-expiring
	// entry behind it a while, which only delays its forgetting.
	for s.head < len(s.queue) && (len(s.byID) >= s.max || now.After(s.queue[s.head].expires)) {
		old := s.queue[s.head]
		s.queue[s.head] = nil
		s.head++
		if s.byID[old.id] == old {
			delete(s.byID, old.id)
		}
	}
	if s.head > len(s.queue)/2 && s.head > 1024 {
		s.queue = append(s.queue[:0], s.queue[s.head:]...)
		s.head = 0
	}
	s.byID[id] = e
	s.queue = append(s.queue, e)
	s.mu.Unlock()
	return Granted{ID: s.prefix + strconv.FormatUint(id, 36) + "." + strconv.FormatUint(e.secret, 36), Cost: cost, Delay: delay}
}

// lock returns the entry of id, locked, or ErrUnknownGrant.
func (s *grants) lock(id string) (*entry, error) {
	n, ok := strings.CutPrefix(id, s.prefix)
	n, sec, ok2 := strings.Cut(n, ".")
	var seq, secret uint64
	var err, err2 error
	if ok && ok2 {
		seq, err = strconv.ParseUint(n, 36, 64)
		secret, err2 = strconv.ParseUint(sec, 36, 64)
	}
	if !ok || !ok2 || err != nil || err2 != nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownGrant, id)
	}
	s.mu.Lock()
	e := s.byID[seq]
	s.mu.Unlock()
	if e == nil || subtle.ConstantTimeEq(int32(e.secret>>32), int32(secret>>32))&subtle.ConstantTimeEq(int32(e.secret), int32(secret)) != 1 {
		return nil, fmt.Errorf("%w: %q", ErrUnknownGrant, id)
	}
	e.mu.Lock()
	s.mu.Lock()
	gone := s.byID[seq] != e // settled or cancelled while we waited
	s.mu.Unlock()
	if gone {
		e.mu.Unlock()
		return nil, fmt.Errorf("%w: %q", ErrUnknownGrant, id)
	}
	return e, nil
}

func (s *grants) forgetLocked(e *entry) {
	s.mu.Lock()
	if s.byID[e.id] == e {
		delete(s.byID, e.id)
	}
	s.mu.Unlock()
}

func (s *grants) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}
