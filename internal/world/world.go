// Package world is a deterministic simulation of sluice's coordination
// that runs the code that ships: configd's ledger decisions (its
// leader's round: round.Policy, round.Target over alloc.Split, and
// ledger.Plan), the members' (ledger.State.Schedule and ToRelease) and a
// real limiter.Limiter per member, over a model of etcd that loses
// answers, refuses writes, delays and batches each watcher's events,
// expires leases, and over processes that crash, restart with the same
// id, pause and wake with their old state, and are cut off from etcd
// while their fail-static budget runs; configd replicas pause, fail over
// and act as zombies beside a new leader, or all stop for a while, when
// the members stand in for configd (round.StandIn, as limiter/cluster
// does). The provider is deleted and created again: on the ledger, which
// keeps its ledger, or first on the shares, which configd accepts once
// the ledger's grants have ended (ledger.State.Ended) and which deletes
// the ledger whole; members follow the config and leave the ledger for
// the shares (not played: they admit nothing there), and a member whose
// session ended meanwhile follows the old ledger into the new one.
//
// One seed is one history: time is virtual, nothing runs concurrently,
// and every random choice comes from one generator, so a failing seed
// replays exactly (Run with the same Config). The oracles:
//
//   - the ledger invariant (ledger.Audit) after every write etcd applies;
//   - nothing admitted in a window wholly between a ledger's deletion
//     and the first era of the next one (a deleted provider's limit is
//     its ledger's until its grants end, which the deletion waits for);
//   - the guarantee: in every aligned window of true time, what all
//     members admitted is at most the most any revision of the ledger let
//     that window hold;
//   - in an adaptive history (Config.Adaptive), no window over the
//     ceiling (the effective limit is the limit the guarantee above
//     checks);
//   - liveness: once the faults end, within Config.Settle windows the
//     grants of the current window add up to the limit;
//   - with priority classes (Config.Critical), in every window of every
//     member's limiter, faults included: a member refused critical in a
//     window whose quota and reserve held from its start was admitted
//     there at least the reserve its grants keep for critical
//     (ledger.State.Reserves), cut to its quota; summed over the members,
//     the fleet admits critical the reserve its grants keep for the
//     members whose critical demand reached it (checkClassWindow);
//   - with priority classes, at the same time as liveness: the members
//     that want critical keep for it, of their grants, its reserve or
//     what they want of it (round.Target's split, the grants' reserves),
//     and in the next window they are admitted that much.
package world

import (
	"cmp"
	"container/heap"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/sluice-go/sluice/configd/round"
	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/internal/share"
)

// Config is one history's parameters; Seed decides the rest.
type Config struct {
	Seed      uint64
	Members   int           // members at the start (default 4)
	Replicas  int           // configd replicas (default 2)
	Limit     int64         // permits per window at the start (default 100)
	Window    time.Duration // at the start (default 1s)
	Horizon   time.Duration // granted ahead: the fail-static budget (default 4s, at least 4 windows)
	Faults    time.Duration // how long faults are drawn (default 20s)
	Settle    time.Duration // after the faults and a lease, for liveness (default 2·Horizon + 4 of the longest windows)
	SkewBound time.Duration // members' and configd's clocks are this close to true time (default 20ms)
	// ConfigdOff, when set, puts every replica's clock this far off.
	ConfigdOff time.Duration
	// Loss and Refuse are the chances that a write's answer is lost (the
	// writer is told nothing; the write is applied at once, or up to two
	// windows later, after the writer's next writes) or that it is
	// refused.
	Loss, Refuse float64
	Trace        func(string) // every step, when set
	// Break, for tests of the oracles, breaks one rule of the protocol:
	// "unconditioned" (configd writes without the head's condition),
	// "unenforced" (members write releases without enforcing them),
	// "twice-ceiling" (configd plans an adaptive provider with twice its
	// ceiling), "own-part" (with Critical, each member keeps for
	// critical the part of its own quota that the reserve is of the
	// limit, not what its grants keep) or "drop-reserve" (with Critical,
	// members keep no reserve for critical in the second quarter of
	// Faults, and keep their grants' again after it).
	Break string
	// ApplyLag, when set, is how long a member takes between computing its
	// schedule and releases (ToRelease, Schedule) and applying them to its
	// limiter: a GC pause or a slow goroutine in a real process. Its ticks
	// keep admitting meanwhile under the schedule applied before.
	ApplyLag time.Duration
	// FixedWindow: the window length never changes.
	FixedWindow bool
	// MaxOps is etcd's limit on the operations of one transaction
	// (--max-txn-ops, default ledger.DefaultMaxOps); configd plans within
	// it and members write their releases in transactions within it.
	MaxOps int
	// Script, when set, plays its groups and changes in place of the
	// members, joins, leaves, limits and windows the seed would draw.
	Script *Script
	// LiveAhead, when set, is the most a scripted configd clock may have
	// run ahead for the liveness check to wait for it: the wait grows by
	// that much (see heal), and a longer one ends the history a settle
	// after the faults with only the safety oracles checked.
	LiveAhead time.Duration
	// Adaptive makes the limit adaptive: Limit is the ceiling, and the
	// members call a provider whose own limit moves while faults are
	// drawn, instead of an operator retuning the limit; configd's leader
	// runs the real controller (configd/adapt) on the members' reports of
	// the provider's pushback and writes the effective limit it decides.
	// The window length never changes (it is the provider's).
	Adaptive bool
	// Critical, when set, gives the provider two classes: critical,
	// reserving this many hundredths of a percent of the limit, then
	// batch. Every member wants batch, and half of them some critical
	// too, which they ask for after batch in every tick. Every window in
	// which a member is refused critical is checked against the reserve
	// its grants keep (checkClassWindow); the liveness check also checks
	// that the members that want critical keep, and are admitted, its
	// reserve or what they want of it.
	Critical int64
}

func (c *Config) defaults() {
	c.Members = cmp.Or(c.Members, 4)
	c.Replicas = cmp.Or(c.Replicas, 2)
	c.Limit = cmp.Or(c.Limit, 100)
	c.Window = cmp.Or(c.Window, time.Second)
	c.Horizon = cmp.Or(c.Horizon, 4*time.Second)
	c.Faults = cmp.Or(c.Faults, 20*time.Second)

	c.SkewBound = cmp.Or(c.SkewBound, 20*time.Millisecond)
	c.MaxOps = cmp.Or(c.MaxOps, ledger.DefaultMaxOps)
}

// Result is what a history showed.
type Result struct {
	Seed     uint64
	Writes   int     // transactions etcd applied
	Windows  int     // aligned windows checked
	Admitted int64   // permits admitted in all
	Worst    float64 // the fullest window against its bound
	Live     bool    // the liveness check ran (see Config.LiveAhead)
	// Refused is the calls an adaptive history's provider answered with a
	// pushback, and Moves how often configd moved the effective limit.
	Refused int64
	Moves   int
	// ClassWindows is how many windows of a member's limiter the class
	// check checked (Config.Critical): a call of critical refused in a
	// window whose quota and reserve held from its start.
	ClassWindows int
	// Deletes is how often the provider was deleted, Creates and Shares
	// how often it was created again on the ledger and on the shares,
	// Emptied how often its ledger was emptied (all but its head deleted,
	// as configd does when the provider moves to the shares),
	// LedgersDeleted how often its head was deleted, and Across how many
	// members followed a ledger from before either into what came after.
	// Outages is how often every configd replica
	// stopped, StandIns the writes members standing in for configd got
	// applied, and StandInsTooLarge those etcd refused for their size
	// (Config.MaxOps): a member plans with the ledger's default.
	Deletes, Creates, Shares, Emptied, LedgersDeleted, Across int
	Outages, StandIns, StandInsTooLarge                       int
	// TopUpsOfAll is how many top-ups of all a publish's holders
	// (ledger.Pub.Each) configd wrote, and Departed how many members
	// that left cleanly got their releases of every grant applied.
	TopUpsOfAll, Departed int
	Violations            []string // broken invariants; empty when the history passed
}

// epoch is where virtual time starts: a day boundary, so every window
// length aligns with it.
const epoch = int64(1_800_000_000/86400) * 86400 * int64(time.Second)

// World is one running history.
type World struct {
	cfg    Config
	rng    *rand.Rand
	now    int64
	q      queue
	seq    int64
	etcd   *etcd
	keys   ledger.Keys
	limit  int64
	window time.Duration
	reps   []*replica
	mems   []*member
	nextID int
	// faultsEnd is when faults stop being drawn.
	faultsEnd int64
	admitted  map[time.Duration]map[int64]int64
	// critical is what critical was admitted by window of the length in
	// force, each member's on its own clock (Config.Critical).
	critical  map[int64]int64
	eras      map[int64][]ledger.Era // every version of each era any head held
	toppedAll map[int64]bool         // the top-ups of all holders seen (Result.TopUpsOfAll)
	res       Result
	stopAt    int64         // when the liveness check ran: the history ends
	ledger    *ledger.State // etcd's ledger records, decoded as they change
	longest   time.Duration
	settle    time.Duration   // the liveness check's wait after the faults
	calm      bool            // the faults ended: no lost, refused or slow messages, no pauses
	lengths   []time.Duration // the window lengths admissions are counted in
	ahead     time.Duration   // the most a script set a replica's clock ahead
	prov      *provider       // Config.Adaptive: the provider the members call
	coord     string          // what the provider's config names (deletion.go); "": deleted
	gen       int             // how many times the ledger was deleted whole or emptied
	heads     int             // how many times its head was deleted: eraKey's ledgers
	gaps      []gap           // the spans of true time with no grant in the ledger
	down      bool            // every configd replica is stopped (outage)
}

// Run plays the history of cfg and returns what it showed.
func Run(cfg Config) Result {
	cfg.defaults()
	w := &World{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		now: epoch, etcd: newEtcd(cfg.MaxOps), keys: "L/", limit: cfg.Limit, window: cfg.Window,
		admitted: map[time.Duration]map[int64]int64{}, eras: map[int64][]ledger.Era{}, toppedAll: map[int64]bool{},
		critical: map[int64]int64{}}
	w.res.Seed = cfg.Seed
	w.ledger = ledger.NewState()
	w.etcd.applied = func(key string, value []byte) {
		if !strings.HasPrefix(key, string(w.keys)) {
			return
		}
		if err := w.keys.Decode(w.ledger, key, value); err != nil {
			w.fail("etcd holds a record the ledger cannot read: %v", err)
		}
		if key == w.keys.Head() && value == nil {
			w.ledgerDeleted()
		}
	}
	w.faultsEnd = epoch + int64(cfg.Faults)
	if cfg.Adaptive {
		w.cfg.FixedWindow = true
		w.prov = newProvider(w)
	}
	for i := range cfg.Replicas {
		w.reps = append(w.reps, newReplica(w, i))
	}
	w.reps[0].leader = true
	w.elect()
	w.coord = coordLedger
	w.putConfig()
	w.lengths = append(w.lengths, windows...)
	w.lengths = append(w.lengths, cfg.Window)
	if s := cfg.Script; s != nil {
		if err := s.Validate(); err != nil {
			w.fail("%v", err)
			return w.res
		}
		w.faultsEnd = epoch + int64(s.Duration)
		for _, e := range s.Events {
			w.lengths = append(w.lengths, e.Window)
		}
		w.play(s)
		w.at(w.now+int64(cfg.Window)/2, w.fault)
	} else {
		for range cfg.Members {
			w.join()
		}
		w.at(w.now+int64(cfg.Window)/2, w.fault)
	}
	slices.Sort(w.lengths)
	w.lengths = slices.DeleteFunc(slices.Compact(w.lengths), func(d time.Duration) bool { return d <= 0 })
	w.at(w.faultsEnd, w.heal)
	// A violation ends the history: replaying its seed shows the rest.
	for w.q.Len() > 0 && w.stopAt == 0 && len(w.res.Violations) == 0 {
		e := heap.Pop(&w.q).(*item)
		w.now = e.at
		w.etcd.expire(w.now)
		w.afterWrite()
		e.fn()
	}
	w.checkWindows()
	if n := len(w.etcd.refused); n > 0 {
		w.fail("etcd refused %d transactions of more than %d operations, the first: %s", n, cfg.MaxOps, w.etcd.refused[0])
	}
	return w.res
}

// at runs fn at true time t.
func (w *World) at(t int64, fn func()) {
	w.seq++
	heap.Push(&w.q, &item{at: max(t, w.now), seq: w.seq, fn: fn})
}

func (w *World) tracef(format string, a ...any) {
	if w.cfg.Trace != nil {
		w.cfg.Trace(fmt.Sprintf("%.3fs ", float64(w.now-epoch)/1e9) + fmt.Sprintf(format, a...))
	}
}

func (w *World) fail(format string, a ...any) {
	msg := fmt.Sprintf("%.3fs ", float64(w.now-epoch)/1e9) + fmt.Sprintf(format, a...)
	w.tracef("VIOLATION %s", msg)
	if len(w.res.Violations) < 20 {
		w.res.Violations = append(w.res.Violations, msg)
	}
}

// write is a transaction a process sends: etcd applies it (or not) and
// the answer reaches the writer (or not). done gets the outcome: ok, and
// known false when the answer was lost.
func (w *World) write(cmps []cond, ops []op, done func(ok, known bool)) {
	delay := w.latency()
	w.at(w.now+delay/2, func() {
		if !w.calm && w.rng.Float64() < w.cfg.Refuse {
			w.at(w.now+delay/2, func() { done(false, true) })
			return
		}
		if !w.calm && w.rng.Float64() < w.cfg.Loss/2 {
			// Lost, and applied later: possibly after the writer's next
			// write.
			w.at(w.now+w.rng.Int64N(2*int64(w.window)), func() {
				w.etcd.txn(cmps, ops)
				w.afterWrite()
			})
			w.at(w.now+delay/2, func() { done(false, false) })
			return
		}
		ok, _ := w.etcd.txn(cmps, ops)
		w.afterWrite()
		if !w.calm && w.rng.Float64() < w.cfg.Loss/2 {
			w.at(w.now+delay/2, func() { done(false, false) })
			return
		}
		w.at(w.now+delay/2, func() { done(ok, true) })
	})
}

// latency draws a network round trip: mostly milliseconds, sometimes a
// good part of a window, rarely more.
func (w *World) latency() int64 {
	switch r := w.rng.Float64(); {
	case r < 0.8 || w.calm:
		return int64(time.Millisecond) + w.rng.Int64N(int64(10*time.Millisecond))
	case r < 0.97:
		return w.rng.Int64N(int64(w.window) / 2)
	default:
		return w.rng.Int64N(3 * int64(w.window))
	}
}

// afterWrite checks the ledger invariant once per revision and hands
// every watcher's new events to its delivery.
func (w *World) afterWrite() {
	if int(w.etcd.rev) != w.res.Writes {
		w.res.Writes = int(w.etcd.rev)
		st, _ := w.read()
		for _, v := range ledger.Audit(st) {
			w.fail("ledger invariant at revision %d: %v", w.etcd.rev, v)
		}
		for seq, p := range st.Pubs {
			if p.Each > 0 && !w.toppedAll[seq] {
				w.toppedAll[seq] = true
				w.res.TopUpsOfAll++
			}
		}
		w.closeGaps(st)
		for _, e := range st.Head.Eras {
			key := eraKey(w.heads, e.Seq)
			vs := w.eras[key]
			if len(vs) == 0 || !slices.EqualFunc(vs[len(vs)-1].Limits, e.Limits, func(a, b ledger.Step) bool { return a == b }) || vs[len(vs)-1].Start != e.Start {
				w.eras[key] = append(vs, e)
			}
		}
	}
	for _, m := range w.mems {
		m.schedule()
	}
}

// read returns the ledger in etcd now, and the head's mod revision. The
// state is shared: callers must not change it.
func (w *World) read() (*ledger.State, int64) {
	return w.ledger, w.etcd.kvs[w.keys.Head()].mod
}

// windows are the lengths the world draws.
var windows = []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}

// count records n permits admitted at true time t.
func (w *World) count(t, n int64) {
	w.res.Admitted += n
	for _, win := range w.lengths {
		m := w.admitted[win]
		if m == nil {
			m = map[int64]int64{}
			w.admitted[win] = m
		}
		m[ledger.WindowOf(t, win)] += n
	}
}

// checkWindows compares each aligned window of each era with the most
// any revision of the ledger let it hold.
func (w *World) checkWindows() {
	seqs := make([]int64, 0, len(w.eras))
	for s := range w.eras {
		seqs = append(seqs, s)
	}
	slices.Sort(seqs)
	for i, s := range seqs {
		vs := w.eras[s]
		win := vs[0].Window
		start := vs[0].Start
		for _, v := range vs {
			start = min(start, v.Start)
		}
		until := int64(1<<62 - 1)
		for _, later := range seqs[i+1:] {
			for _, v := range w.eras[later] {
				until = min(until, ledger.StartOf(v.Start, v.Window))
			}
		}
		for k, n := range w.admitted[win] {
			if k < start || ledger.StartOf(k+1, win) > until {
				continue
			}
			var bound int64
			for _, v := range vs {
				bound = max(bound, v.Limit(k))
			}
			w.res.Windows++
			if bound > 0 {
				w.res.Worst = max(w.res.Worst, float64(n)/float64(bound))
			}
			if n > bound {
				w.fail("%s: window %d of %v (at %.3fs) admitted %d, over its bound %d", eraName(s), k, win, float64(ledger.StartOf(k, win)-epoch)/1e9, n, bound)
			}
		}
	}
	w.checkOutside(seqs)
	w.checkGaps()
	w.checkAny()
	if w.prov != nil {
		w.checkEffective()
		w.res.Refused, w.res.Moves = w.prov.refused, len(w.prov.changes)-1
	}
}

// checkAny compares every aligned window of every length with the most
// any era of any revision could let it hold, counted into that length
// (share.In): coarser than checkWindows, it also covers windows between
// eras and an era's windows past a later era's start.
func (w *World) checkAny() {
	for _, win := range w.lengths {
		var bound int64
		for _, vs := range w.eras {
			for _, v := range vs {
				for _, st := range v.Limits {
					bound = max(bound, share.In(st.Limit, v.Window, win))
				}
			}
		}
		for k, n := range w.admitted[win] {
			if n > bound {
				w.fail("window %d of %v (at %.3fs) admitted %d, over the most any era let it hold, %d", k, win, float64(ledger.StartOf(k, win)-epoch)/1e9, n, bound)
			}
		}
	}
}

// checkOutside fails any permit admitted in no era's span.
func (w *World) checkOutside(seqs []int64) {
	if len(seqs) == 0 {
		if w.res.Admitted > 0 {
			w.fail("%d permits admitted with no ledger", w.res.Admitted)
		}
		return
	}
	first := w.eras[seqs[0]][0]
	start := ledger.StartOf(first.Start, first.Window)
	for _, v := range w.eras[seqs[0]] {
		start = min(start, ledger.StartOf(v.Start, v.Window))
	}
	for k, n := range w.admitted[w.cfg.Window] {
		if ledger.StartOf(k+1, w.cfg.Window) <= start && n > 0 {
			w.fail("window %d admitted %d before the ledger's first era", k, n)
		}
	}
}

// config is the provider's config as configd reads it, with the limit
// given: the fair algorithm, and the horizon as its fail_static.
func (w *World) config(limit int64) schema.ProviderConfig {
	return schema.ProviderConfig{
		Name: "world", Limit: limit, Window: schema.Duration(w.window), Algorithm: schema.AlgorithmFair,
		FailStatic: schema.Duration(w.cfg.Horizon), Coordination: schema.CoordinationLedger,
		Classes: w.classes(),
	}
}

// horizon is the horizon configd grants, in windows of the length in
// force (round.Horizon).
func (w *World) horizon() int64 { return round.Horizon(w.config(w.limit)) }

// String names a result for a test's log.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %d writes, %d windows, %d admitted, worst window at %.1f%% of its bound", r.Seed, r.Writes, r.Windows, r.Admitted, 100*r.Worst)
	if r.Moves > 0 || r.Refused > 0 {
		fmt.Fprintf(&b, "; %d calls pushed back, %d moves of the effective limit", r.Refused, r.Moves)
	}
	for _, v := range r.Violations {
		b.WriteString("\n  " + v)
	}
	return b.String()
}

type item struct {
	at, seq int64
	fn      func()
}

type queue []*item

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	return q[i].at < q[j].at || (q[i].at == q[j].at && q[i].seq < q[j].seq)
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(*item)) }
func (q *queue) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}
