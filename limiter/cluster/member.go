package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// ErrClosed is returned by calls on a Member after Close.
var ErrClosed = errors.New("cluster: member closed")

// Member is one instance's membership of a provider: it holds an etcd lease
// under the provider, keeps the limiter's quota equal to the share in force
// for it, and reports its demand, admissions and clock offset.
//
// One goroutine owns all of a Member's state; Close stops it, revokes the
// lease so the other instances learn at once that this one left, and
// closes the limiter.
type Member struct {
	cli      *clientv3.Client
	provider string
	id       string
	keys     schema.Keys
	cfg      options
	lim      *limiter.Limiter
	log      *slog.Logger

	cancel context.CancelFunc
	done   chan struct{}
	ready  chan struct{} // closed after the first successful load
	once   sync.Once

	mu     sync.Mutex
	status Status

	clk *clock // the Member's own, or its Group's
	// dimension is what its limiter counts, for a Member of a Group: a
	// config that counts something else is refused. "": not checked.
	dimension string
	// registered is the etcd revision at which this process first wrote
	// its record (0: not yet); owned by the run goroutine. A shares record
	// written before it gives this process nothing: what it names for this
	// id was a previous process's (a restart with the same id), which may
	// have spent it in the window under way while configd hands it on. A
	// later session of the same process (after etcd was out of reach)
	// keeps the first registration, the process knowing what it enforced,
	// unless its share lapsed meanwhile (following.startOver): then it is
	// a new one.
	registered int64
	// registeredAt is when, on the monotonic clock: the even split gives a
	// newcomer nothing beyond its grant for a hold after it (follow.Even).
	registeredAt time.Time
	// evenMarked says this instance's even-split confirmation is written.
	// enforced is the generation of the last share record this process
	// applied (0: none): the even split caps it at that record's share.
	enforced int64
	// enforcedShare is the share of that record (resolved), per window of
	// its own length: see apply.
	enforcedShare *schema.ShareRecord
	evenMarked    bool
	// classMu guards the classes the Member last gave its limiter
	// (applyClasses), if classesSet, and what they were made from: the
	// config's classes (classCfg) and the reserves of the ledger's newest
	// grant (grantRes), which the run goroutine and the ledger's Follower
	// each change.
	classMu    sync.Mutex
	classes    []limiter.Class
	classesSet bool
	classCfg   *schema.ProviderConfig
	grantRes   grantReserve
	noMarks    sync.Once // warned that the even-split confirmation may not be written
	// budget is a budget lane's state (options.budget), owned by the run
	// goroutine; nil for a Member of shares.
	budget *budget
	// toLedger says the provider's config names the ledger: the run
	// goroutine leaves the shares' session for followLedger. holder is
	// then the incarnation's holder name, which its record reports.
	toLedger bool
	holder   string
	// noStandIn says etcd denied this instance the ledger's grants: it
	// does not stand in for configd (standIn).
	noStandIn bool
	// budgetUnknown counts the permits of takes from the budget whose
	// outcome is unknown (etcd did not answer): taken for all if they
	// landed, spent by none.
	budgetUnknown atomic.Int64
}

// Status is a snapshot of what a Member knows and applies.
type Status struct {
	// Connected is true while the Member has a live lease and an
	// up-to-date view of the provider; false while etcd is unreachable,
	// when the Member keeps its last share (fail-static) until AdmitsUntil.
	Connected bool
	// AdmitsUntil is when the limiter stops admitting if the lease is not
	// renewed before: the provider's fail_static past the lease's end
	// under configd's shares; under the even split, the lease's end or, if
	// sooner, follow.CountsValid and the fail_static past the last count read
	// sent; zero on the fallback (never). Every renewal, and on the even
	// split every count read, moves it on.
	AdmitsUntil time.Time
	// Source says where the quota in force comes from: "fallback" (cold
	// start without etcd, or no provider config yet), "even" (total / live
	// instances, no configd alive), "shares" (published by configd),
	// "budget" (a limit of a window longer than shares go, taken from the
	// window's counter: see JoinProvider).
	Source string
	// Share is the quota applied, in permits per window; Window its window.
	Share  int64
	Window time.Duration
	// Total is the provider's limit. Instances is the live instances the
	// even split counts (Source "even"), 0 otherwise: a member following
	// configd's shares does not watch the others (configd status counts
	// them).
	Total     int64
	Instances int
	// Taken is, for a budget lane (Source "budget"), what all instances
	// have taken of the window's limit so far, as last read; Share is
	// then what this instance took of it.
	Taken int64
	// Generation is the shares generation applied (0 if none).
	Generation int64
	// Demand is the smoothed permits per window this instance asked for.
	Demand int64
	// ClockKnown and ClockUncertainty are the clock measurement's (see
	// WithClockMonitor); the offset applied is the limiter's ClockOffset.
	ClockKnown       bool
	ClockUncertainty time.Duration
	// Problems lists records found malformed in etcd, and foreign keys
	// in configd's election (see the package doc), as "key: why"
	// (ignored; the last good value is kept). A member reads no other
	// instance's record: configd lists the malformed ones.
	Problems []string
	// LastError is the last etcd error seen, empty when none.
	LastError string
}

// Join registers this instance under provider and returns a running Member.
// It waits for the first view of the provider until ctx ends or the cold
// start timeout passes (WithColdStartTimeout); if etcd cannot be reached by
// then, the Member starts on its fallback quota (WithFallback; 0 by
// default, so nothing is admitted: fail-closed) and keeps trying in the
// background. Join returns an error only for invalid arguments or when ctx
// ends first.
func Join(ctx context.Context, cli *clientv3.Client, provider string, opts ...Option) (*Member, error) {
	o, keys, err := joinOptions(cli, []string{provider}, opts)
	if err != nil {
		return nil, err
	}
	lim, err := limiter.New(o.fallbackQuota, o.fallbackWindow, o.limiterOpts...)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	o.enforced = []schema.Lane{} // a provider's further limits are JoinProvider's: list them as not enforced
	return startMember(ctx, cli, provider, keys, o, lim, &clock{to: lim}, "")
}

// joinOptions checks Join's arguments and returns the options, with the
// instance id chosen, and the keys.
func joinOptions(cli *clientv3.Client, providers []string, opts []Option) (options, schema.Keys, error) {
	if cli == nil {
		return options{}, schema.Keys{}, fmt.Errorf("cluster: Join needs an etcd client, got nil")
	}
	for _, p := range providers {
		if err := schema.ValidateName(p); err != nil {
			return options{}, schema.Keys{}, fmt.Errorf("cluster: %w", err)
		}
	}
	o := defaultOptions()
	for _, opt := range opts {
		if opt != nil {
			opt.apply(&o)
		}
	}
	if err := o.validate(); err != nil {
		return options{}, schema.Keys{}, err
	}
	keys, err := schema.NewKeys(o.prefix)
	if err != nil {
		return options{}, schema.Keys{}, fmt.Errorf("cluster: %w", err)
	}
	if o.id == "" {
		o.id = defaultID()
	}
	if err := schema.ValidateInstanceID(o.id); err != nil {
		return options{}, schema.Keys{}, fmt.Errorf("cluster: %w", err)
	}
	return o, keys, nil
}

// startMember starts a Member that keeps lim at its share of provider,
// with clk the clock lim reads and dimension what it counts ("": any).
func startMember(ctx context.Context, cli *clientv3.Client, provider string, keys schema.Keys, o options, lim *limiter.Limiter, clk *clock, dimension string) (*Member, error) {
	id := o.id
	runCtx, cancel := context.WithCancel(context.Background())
	m := &Member{
		cli:       cli,
		provider:  provider,
		id:        id,
		keys:      keys,
		cfg:       o,
		lim:       lim,
		clk:       clk,
		dimension: dimension,
		log:       o.logger.With("provider", provider, "instance", id),
		cancel:    cancel,
		done:      make(chan struct{}),
		ready:     make(chan struct{}),
		status:    Status{Source: "fallback", Share: o.fallbackQuota, Window: o.fallbackWindow},
	}
	go m.run(runCtx)

	wait := time.NewTimer(o.coldStart)
	defer wait.Stop()
	select {
	case <-m.ready:
	case <-wait.C:
		m.log.Warn("etcd not reachable at start; running on the fallback quota", "quota", o.fallbackQuota)
	case <-ctx.Done():
		m.Close()
		return nil, ctx.Err()
	}
	return m, nil
}

// Limiter returns the limiter this Member keeps at its share. Acquire
// permits from it — for a Member of a Group, from the Group's Multi, of
// which it is one limit — and do not set its quota yourself.
func (m *Member) Limiter() *limiter.Limiter { return m.lim }

// ID returns the instance id this Member registered under.
func (m *Member) ID() string { return m.id }

// Provider returns the provider this Member joined.
func (m *Member) Provider() string { return m.provider }

// Status returns a snapshot of what the Member knows and applies.
func (m *Member) Status() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.status
	st.Problems = append([]string(nil), st.Problems...)
	return st
}

// Close leaves the provider: it stops the Member's goroutine, revokes its
// lease (so the others' shares grow a window later, not a fail_static
// later) and closes its limiter; a
// budget's Member then gives back to the window's counter what it took
// and did not spend. Close is idempotent.
func (m *Member) Close() error {
	m.once.Do(func() {
		m.cancel()
		<-m.done
		m.lim.Close()
		m.giveBack()
	})
	return nil
}

var idUnsafe = regexp.MustCompile(`[^A-Za-z0-9._:-]+`)

// defaultID is host-pid-random, so that restarts never reuse an id whose
// lease may still be alive.
func defaultID() string {
	host, _ := os.Hostname()
	host = strings.Trim(idUnsafe.ReplaceAllString(host, "-"), "-._:")
	if host == "" {
		host = "instance"
	}
	var b [3]byte
	rand.Read(b[:])
	id := fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	if len(id) > 128 {
		id = id[len(id)-128:]
		id = strings.TrimLeft(id, "-._:")
	}
	return id
}

func (m *Member) setStatus(f func(*Status)) {
	m.mu.Lock()
	f(&m.status)
	m.mu.Unlock()
}
