package ledger

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"slices"
	"strings"
	"time"
)

// ErrViolated is returned by Plan when the ledger it is given already
// breaks the invariant (a hand edit): it then adds no room.
var ErrViolated = errors.New("ledger: the ledger read breaks its invariant")

// MaxHorizon is the most windows Plan grants ahead, or keeps behind.
const MaxHorizon = 1 << 20

// MinOps is the fewest operations of one transaction Plan works with: a
// head, a publish and one grant.
const MinOps = 3

// Policy is what configd asks of the ledger of one limit.
type Policy struct {
	Limit   int64         // permits per window
	Window  time.Duration // the window's length
	Horizon int64         // windows granted past the current one: the fail-static budget
	Lead    int64         // extend once fewer windows than this remain granted ahead (0: Horizon/2)
	Keep    int64         // windows behind the current one kept before a publish may go (≥ 1)
	Bound   time.Duration // the most a holder's clock may be off: kept in the era (Era.Bound)
	Slack   int64         // a changed target within Slack of a holder's quota needs no new publish
	MaxOps  int           // the most operations of one transaction: etcd's --max-txn-ops (0: DefaultMaxOps)
	// Reserves is, per holder, the part of its quota each priority class
	// keeps (Grant.Reserve); where they add up to more than the holder's
	// quota, its grants keep them cut in proportion.
	Reserves map[string]map[string]int64
	// ClassReserves is each class's reserve in all: a class whose
	// holders' reserves add up to it is owed every permit of it.
	ClassReserves map[string]int64
}

// maxOps returns the policy's MaxOps, its default for 0.
func (p Policy) maxOps() int { return cmp.Or(p.MaxOps, DefaultMaxOps) }

// Change is one Plan's writes: one transaction, conditioned on the
// head's revision as read.
type Change struct {
	Head        Head      // the head to write: Seq is one more than read
	Pubs        []Pub     // publishes new or extended
	Grants      []Grant   // new grants
	DelPubs     []Pub     // publishes ended below the floor whose grants are gone or go here: delete
	DelGrants   []Grant   // grants of such publishes, or of a publish never to be written: delete
	DelReleases []Release // releases of grants that go here or are gone: delete
	Why         []string
}

// Empty reports whether c writes nothing. Why may still say why not.
func (c Change) Empty() bool { return c.Head.Seq == 0 }

// Size returns the number of operations c's transaction makes, the
// head's write included.
func (c Change) Size() int {
	return 1 + len(c.Pubs) + len(c.Grants) + len(c.DelPubs) + len(c.DelGrants) + len(c.DelReleases)
}

// Plan decides what configd writes so that the holders in target (quota
// per window each, adding up to at most p.Limit) hold their quotas from
// now on, within the room the ledger s leaves. now (ns, configd's clock)
// chooses the windows; whether room is free is decided by the records
// alone, so a wrong clock costs windows, never the invariant. Every
// change it returns leaves Audit empty.
func Plan(s *State, p Policy, target map[string]int64, now int64) (Change, error) {
	if err := validWindow(p.Window); err != nil {
		return Change{}, err
	}
	if p.Limit < 0 || p.Horizon < 1 || p.Horizon > MaxHorizon || p.Keep < 0 || p.Keep > MaxHorizon || p.Bound < 0 {
		return Change{}, fmt.Errorf("%w: policy with limit %d, horizon %d, keep %d: want a limit ≥ 0 and a horizon from 1 to %d windows", ErrInvalid, p.Limit, p.Horizon, p.Keep, MaxHorizon)
	}
	if p.MaxOps != 0 && (p.MaxOps < MinOps || p.MaxOps > MaxOps) {
		return Change{}, fmt.Errorf("%w: policy with at most %d operations a transaction: want 0 (%d) or from %d to %d", ErrInvalid, p.MaxOps, DefaultMaxOps, MinOps, MaxOps)
	}
	if k := WindowOf(now, p.Window); !inRange(k+p.Horizon, p.Window) || !inRange(k-p.Keep-1, p.Window) {
		return Change{}, fmt.Errorf("%w: time %d is out of the range of %v windows", ErrInvalid, now, p.Window)
	}
	if vs := Audit(s); len(vs) > 0 {
		return Change{}, fmt.Errorf("%w: %v", ErrViolated, vs[0])
	}
	pl := &planner{t: s.Clone(), p: p, k: WindowOf(now, p.Window), target: positive(target), left: p.maxOps() - 1}
	pl.era()
	pl.limit()
	pl.foldLimits()
	pl.publish()
	pl.topUp()
	pl.stageAhead()
	pl.collect()
	if vs := Audit(pl.t); len(vs) > 0 {
		return Change{}, fmt.Errorf("ledger: plan broke its own invariant: %v", vs[0]) // unreachable by construction
	}
	if n := pl.c.Size(); n > p.maxOps() {
		return Change{}, fmt.Errorf("ledger: plan made %d operations, over its %d", n, p.maxOps()) // unreachable by construction
	}
	if pl.c.Size() == 1 && sameHead(pl.t.Head, s.Head) {
		return pl.c, nil // a write of the head alone would change nothing
	}
	pl.c.Head = pl.t.Head
	pl.c.Head.Seq = s.Head.Seq + 1
	return pl.c, nil
}

// sameHead reports whether heads a and b have the same eras and staged
// publish. Their counters of publish numbers may differ: a number no
// record uses need not be kept.
func sameHead(a, b Head) bool {
	return a.Staged == b.Staged && slices.EqualFunc(a.Eras, b.Eras, func(x, y Era) bool {
		return x.Seq == y.Seq && x.Window == y.Window && x.Start == y.Start && x.Floor == y.Floor && x.Bound == y.Bound && slices.Equal(x.Limits, y.Limits)
	})
}

type planner struct {
	t      *State
	p      Policy
	k      int64 // configd's current window
	target map[string]int64
	c      Change
	left   int     // operations the transaction still has room for
	ahead  []Grant // grants of a waiting publish to write ahead (stageAhead)
}

func positive(m map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(m))
	for h, q := range m {
		if q > 0 {
			out[h] = q
		}
	}
	return out
}

// cur returns the current era, which era() made.
func (pl *planner) cur() *Era { return &pl.t.Head.Eras[len(pl.t.Head.Eras)-1] }

// lo is the first window a grant may cover now.
func (pl *planner) lo() int64 { e := pl.cur(); return max(e.Start, e.Floor, pl.k) }

// era starts an era of the policy's window length when there is none or
// another length is current, and moves the current era's start earlier
// when releases ended the earlier eras' grants sooner.
func (pl *planner) era() {
	e, ok := pl.t.Head.Current()
	if !ok || e.Window != pl.p.Window {
		start := pl.earliestStart(pl.t.Head.Eras, pl.p.Window, StartOf(pl.k, pl.p.Window))
		seq := int64(1)
		if ok {
			seq = e.Seq + 1
		}
		pl.t.Head.Eras = append(pl.t.Head.Eras, Era{Seq: seq, Window: pl.p.Window, Start: start, Floor: pl.k,
			Limits: []Step{{From: start, Limit: pl.p.Limit}}, Bound: pl.p.Bound})
		// Grants written ahead count their first window in the old
		// length: never adopted by a publish of the new one.
		pl.t.Head.Staged = 0
		pl.c.Why = append(pl.c.Why, fmt.Sprintf("era %d: windows of %v from window %d", seq, pl.p.Window, start))
		return
	}
	if cur := pl.cur(); pl.p.Bound > cur.Bound {
		// Holders that read the old bound may still keep it: only raise.
		cur.Bound = pl.p.Bound
		pl.c.Why = append(pl.c.Why, fmt.Sprintf("era %d: clocks off by up to %v", cur.Seq, cur.Bound))
	}
	if len(pl.t.Head.Eras) < 2 {
		return
	}
	cur := pl.cur()
	before := pl.t.Head.Eras[:len(pl.t.Head.Eras)-1]
	if start := pl.earliestStart(before, cur.Window, StartOf(max(cur.Floor, pl.k), cur.Window)); start < cur.Start {
		pl.c.Why = append(pl.c.Why, fmt.Sprintf("era %d starts at window %d, not %d: the earlier era's grants end sooner", cur.Seq, start, cur.Start))
		if len(cur.Limits) > 0 && cur.Limits[0].From == cur.Start {
			// Nothing of this era is granted before its start: its
			// first limit may govern from the new one.
			cur.Limits = append([]Step{{From: start, Limit: cur.Limits[0].Limit}}, cur.Limits[1:]...)
		}
		cur.Start = start
	}
}

// earliestStart returns the first window of length w, at or after t0,
// that begins once every grant of the eras before has ended, on a
// boundary the last of them shares.
func (pl *planner) earliestStart(before []Era, w time.Duration, t0 int64) int64 {
	step := int64(w)
	for i, e := range before {
		if end, ok := pl.t.End(e.Seq); ok {
			t0 = max(t0, StartOf(end+1, e.Window))
		}
		// Publishes below an era's floor may be gone: what they granted
		// is no longer in the ledger to be counted.
		t0 = max(t0, StartOf(e.Floor, e.Window))
		if i == len(before)-1 {
			step = lcm(int64(e.Window), int64(w))
		}
	}
	return ceilDiv(t0, step) * step / int64(w)
}

// limit sets the limit in force from the first window it may govern: a
// raise from lo, a lowering from the first window from which the grants
// fit under it.
func (pl *planner) limit() {
	e := pl.cur()
	lo := pl.lo()
	if pl.limitFrom(lo) {
		return
	}
	ks := append(pl.t.edges(e.Seq), lo)
	slices.Sort(ks)
	was := slices.Clone(e.Limits)
	for _, f := range slices.Compact(ks) {
		if f > lo && pl.trySteps(f) {
			if !slices.Equal(was, e.Limits) {
				pl.c.Why = append(pl.c.Why, fmt.Sprintf("limit %d from window %d, once the grants fit under it", pl.p.Limit, f))
			}
			return
		}
	}
}

// keptSteps is how many limit steps an era keeps before foldLimits
// drops those no grant needs: enough to read a retune's past in the head.
const keptSteps = 32

// foldLimits drops, once the current era has more than keptSteps limit
// steps, those that govern no window a grant covers or may yet cover,
// and merges steps of equal limits: a limit that moves every window must
// not grow the head without end.
func (pl *planner) foldLimits() {
	e := pl.cur()
	if len(e.Limits) <= keptSteps {
		return
	}
	cut := pl.lo()
	for g := range pl.t.Counted() {
		if a, b, ok := pl.t.Span(g); ok && a <= b && pl.t.Pubs[g.Pub].Era == e.Seq {
			cut = min(cut, a)
		}
	}
	var steps []Step
	for _, st := range e.Limits {
		switch {
		case st.From <= cut && len(steps) > 0 && steps[0].From <= cut:
			steps[0] = st // a later step in force at cut replaces an earlier one
		case len(steps) > 0 && steps[len(steps)-1].Limit == st.Limit:
		default:
			steps = append(steps, st)
		}
	}
	if len(steps) < len(e.Limits) {
		e.Limits = steps
	}
}

// limitFrom reports whether the limit is already p.Limit from lo on, or
// can be made so at lo.
func (pl *planner) limitFrom(lo int64) bool {
	e := pl.cur()
	same := e.Limit(lo) == pl.p.Limit
	for _, s := range e.Limits {
		same = same && (s.From <= lo || s.Limit == pl.p.Limit)
	}
	if same {
		return true
	}
	if pl.trySteps(lo) {
		pl.c.Why = append(pl.c.Why, fmt.Sprintf("limit %d from window %d", pl.p.Limit, lo))
		return true
	}
	return false
}

// trySteps sets the limit p.Limit from window f on if the grants fit.
func (pl *planner) trySteps(f int64) bool {
	e := pl.cur()
	old := e.Limits
	var steps []Step
	for _, s := range old {
		if s.From < f {
			steps = append(steps, s)
		}
	}
	e.Limits = append(steps, Step{From: f, Limit: pl.p.Limit})
	if len(auditEra(pl.t, *e)) > 0 {
		e.Limits = old
		return false
	}
	return true
}

// open returns the current era's last publish that is not a top-up: the
// one kept extended.
func (pl *planner) open() (Pub, bool) {
	var best Pub
	found := false
	for _, p := range pl.t.Pubs {
		if p.Era == pl.cur().Seq && !p.TopUp && (!found || p.Seq > best.Seq) {
			best, found = p, true
		}
	}
	return best, found
}

// holds returns the quota each holder has in publish seq.
func (pl *planner) holds(seq int64) map[string]int64 {
	m := map[string]int64{}
	for _, g := range pl.t.Grants {
		if g.Pub == seq {
			m[g.Holder] += g.Quota
		}
	}
	return m
}

// publish extends the open publish while its grants are the target, or
// starts a new one after it with the target's quotas: in this change when
// the publish and its grants fit in it, else by writing the grants ahead
// (stage) over as many changes as they take. While no new publish is
// written, the open one is extended before it ends, as far as its grants
// fit: a target that moves faster than a publish is staged must not leave
// the holders with nothing.
func (pl *planner) publish() {
	if len(pl.target) == 0 {
		return
	}
	open, ok := pl.open()
	if ok && pl.matches(pl.holds(open.Seq)) && pl.reservesNear(open.Seq) && pl.extend(open, pl.lead()) {
		// The open publish is the target: grants written ahead for
		// another one are not wanted, and go.
		pl.t.Head.Staged = 0
		return
	}
	np, missing, why, early := pl.next(open, ok)
	if why == "" && 1+len(missing) <= pl.left {
		pl.t.Head.Staged = 0
		pl.t.Pubs[np.Seq] = np
		pl.c.Pubs = append(pl.c.Pubs, np)
		pl.left--
		pl.grant(missing)
		pl.c.Why = append(pl.c.Why, fmt.Sprintf("publish %d: %d holders from window %d", np.Seq, len(pl.target), np.A))
		return
	}
	if ok {
		pl.extend(open, 2)
	}
	if why != "" {
		pl.c.Why = append(pl.c.Why, why)
	}
	switch {
	case early && !pl.urgent(open, len(missing)):
		pl.ahead = missing // after the top-ups: the windows before it come first
	case early:
		pl.stage(np.Seq, missing[:min(len(missing), pl.left)])
	case why == "" && pl.left > 0 && len(missing) > 0:
		pl.stage(np.Seq, missing[:min(len(missing), pl.left)])
	}
}

// urgent reports whether the grants still to write ahead of the publish
// after open take as many changes, and one more, as windows remain until
// open ends: from then on they come before the top-ups, which targets
// that move every round could keep busy for good. configd makes more
// than one change a window.
func (pl *planner) urgent(open Pub, missing int) bool {
	changes := int64((missing+pl.p.maxOps()-2)/(pl.p.maxOps()-1)) + 1
	return open.B-pl.k <= changes+1
}

// stageAhead writes ahead, with the operations the top-ups left, the
// grants of a publish that waits for the open one to come within the
// horizon, unless they are urgent (publish).
func (pl *planner) stageAhead() {
	if n := min(len(pl.ahead), pl.left); n > 0 {
		pl.stage(pl.ahead[0].Pub, pl.ahead[:n])
	}
}

// next returns the publish that takes over after open (ok: there is
// one) and its grants not yet written, or why it is not written yet;
// early reports that its grants may be written ahead meanwhile.
func (pl *planner) next(open Pub, ok bool) (np Pub, missing []Grant, why string, early bool) {
	a := pl.lo()
	if ok && open.B >= max(a, pl.k+pl.p.Horizon+1) {
		// A new publish starts after the open one ends, at most a window
		// past the horizon: else targets that keep moving would start
		// each one further out. The windows before it are topped up
		// meanwhile. A publish larger than a transaction is written
		// ahead meanwhile, so that it is whole when its turn comes.
		why = fmt.Sprintf("no publish: publish %d runs to window %d, past the horizon", open.Seq, open.B)
		if len(pl.target)+2 <= pl.p.maxOps() {
			return Pub{}, nil, why, false
		}
		early = true
	}
	if ok {
		a = max(a, open.B+1)
	}
	np = Pub{Seq: pl.staged(), Era: pl.cur().Seq, Window: pl.cur().Window, A: a, B: max(a, pl.k+pl.p.Horizon)}
	missing = pl.missing(np)
	if !pl.fits(np, missing) && np.Seq == pl.t.Head.Staged && !pl.exact(np.Seq) {
		// Grants written ahead for a target that has moved since: the
		// rest take what room they leave, so a target that moves every
		// round cannot keep a publish from being written. The next
		// publish brings the quotas back to the target.
		if less, ok := pl.shrink(np, missing); ok {
			missing = less
		} else {
			pl.t.Head.Staged = 0
			np.Seq = pl.nextSeq()
			missing = pl.missing(np)
		}
	}
	if !pl.fits(np, missing) {
		// A lowering ahead not yet in force: wait for it.
		return np, missing, "no publish: the target does not fit yet", false
	}
	return np, missing, why, early
}

// missing returns the grants of the target that publish np lacks.
func (pl *planner) missing(np Pub) []Grant {
	var gs []Grant
	for _, h := range slices.Sorted(maps.Keys(pl.target)) {
		if _, ok := pl.t.Grants[GrantKey{np.Seq, h}]; !ok {
			gs = append(gs, Grant{Pub: np.Seq, Holder: h, Quota: pl.target[h], From: np.A, Reserve: pl.reserve(h, pl.target[h])})
		}
	}
	return gs
}

// staged returns the number of the next publish: the one staged, when
// every grant written ahead for it is one of the target's holders; else
// a new one. A grant written ahead is never changed, so what a holder
// has read of it is what counts once its publish is written.
func (pl *planner) staged() int64 {
	seq := pl.t.Head.Staged
	if _, live := pl.t.Pubs[seq]; seq != 0 && (live || !pl.allWanted(seq)) {
		// Never to be written: its grants go as orphans.
		pl.t.Head.Staged, seq = 0, 0
	}
	if seq == 0 {
		seq = pl.nextSeq()
	}
	for !pl.allWanted(seq) {
		seq = pl.nextSeq() // grants no change of Plan wrote: not trusted
	}
	return seq
}

// allWanted reports whether every grant of publish seq read is one of
// the target's holders.
func (pl *planner) allWanted(seq int64) bool {
	for key := range pl.t.Grants {
		if _, ok := pl.target[key.Holder]; key.Pub == seq && !ok {
			return false
		}
	}
	return true
}

// shrink returns missing with each quota cut by the same fraction, the
// least cut that fits publish np, and at least 1 each; ok is false when
// the grants written ahead leave no room for that.
func (pl *planner) shrink(np Pub, missing []Grant) ([]Grant, bool) {
	const whole = 1024
	cut := func(f int64) []Grant {
		gs := slices.Clone(missing)
		for i := range gs {
			gs[i].Quota = max(1, gs[i].Quota*f/whole)
			gs[i].Reserve = pl.reserve(gs[i].Holder, gs[i].Quota)
		}
		return gs
	}
	if !pl.fits(np, cut(0)) {
		return nil, false
	}
	lo, hi := int64(0), int64(whole) // fits(cut(lo)); find the largest f ≤ hi that fits
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if pl.fits(np, cut(mid)) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return cut(lo), true
}

// exact reports whether every grant of publish seq read has its holder's
// quota in the target.
func (pl *planner) exact(seq int64) bool {
	for key, g := range pl.t.Grants {
		if key.Pub == seq && g.Quota != pl.target[key.Holder] {
			return false
		}
	}
	return true
}

// fits reports whether the grants of publish np, those written ahead and
// missing, fit within the limits once np is written.
func (pl *planner) fits(np Pub, missing []Grant) bool {
	pl.t.Pubs[np.Seq] = np
	for _, g := range missing {
		pl.t.Grants[GrantKey{g.Pub, g.Holder}] = g
	}
	ok := len(auditEra(pl.t, *pl.cur())) == 0
	delete(pl.t.Pubs, np.Seq)
	for _, g := range missing {
		delete(pl.t.Grants, GrantKey{g.Pub, g.Holder})
	}
	return ok
}

// stage writes part of publish seq's grants ahead of it. They count for
// nothing until the publish is written, by the change that finds every
// other grant of it written too.
func (pl *planner) stage(seq int64, part []Grant) {
	pl.t.Head.Staged = seq
	pl.grant(part)
	pl.c.Why = append(pl.c.Why, fmt.Sprintf("publish %d: %d holders' grants written ahead of it", seq, len(part)))
}

// grant adds gs to the ledger and to the change.
func (pl *planner) grant(gs []Grant) {
	for _, g := range gs {
		pl.t.Grants[GrantKey{g.Pub, g.Holder}] = g
	}
	pl.c.Grants = append(pl.c.Grants, gs...)
	pl.left -= len(gs)
}

// matches reports whether quotas are the target's, within the slack.
func (pl *planner) matches(quotas map[string]int64) bool {
	if len(quotas) != len(pl.target) {
		return false
	}
	var want, held int64
	for h, q := range pl.target {
		have, ok := quotas[h]
		if !ok || !pl.near(have, q) {
			return false
		}
		want, held = want+q, held+have
	}
	// The slack forgives each holder's jitter, not a change of the whole:
	// a raise spread thin over many holders is still a raise.
	return held >= want-pl.p.Slack && held <= want+pl.p.Slack
}

// reserve returns what holder's grant of quota q reserves for each
// class: the policy's reserves, cut in proportion to fit within q.
func (pl *planner) reserve(holder string, q int64) map[string]int64 {
	want := pl.p.Reserves[holder]
	var sum int64
	for _, r := range want {
		sum += max(r, 0)
	}
	if sum == 0 {
		return nil
	}
	out := make(map[string]int64, len(want))
	for c, r := range want {
		if r = max(r, 0); sum > q {
			r = mulDiv(r, q, sum)
		}
		if r > 0 {
			out[c] = r
		}
	}
	return out
}

// owed reports whether the policy's reserves for class c add up to the
// class's whole reserve.
func (pl *planner) owed(c string) bool {
	r, ok := pl.p.ClassReserves[c]
	if !ok || r == 0 {
		return false
	}
	var sum int64
	for h, q := range pl.target {
		sum += pl.reserve(h, q)[c]
	}
	return sum >= r
}

// mulDiv returns a·b/c rounded down, for 0 ≤ a ≤ c and b ≥ 0, c > 0,
// without overflow: the result is at most b.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(q)
}

// reservesNear reports whether the reserves of publish seq's grants are
// within the slack of the policy's, holder by holder and class by class
// in all: the slack forgives how a class's reserve is split among the
// holders that want the class, never a part on a holder that does not
// want it, nor a part missing of a class owed its whole reserve
// (Policy.ClassReserves): its grants must then add up to it exactly.
func (pl *planner) reservesNear(seq int64) bool {
	sum := map[string]int64{}
	near := func(have, want int64) bool {
		d := have - want
		return d <= pl.p.Slack && -d <= pl.p.Slack && (have > 0) == (want > 0)
	}
	for h, q := range pl.target {
		have, want := pl.t.Grants[GrantKey{seq, h}].Reserve, pl.reserve(h, q)
		for c := range maps.Keys(have) {
			sum[c] += have[c]
			if !near(have[c], want[c]) {
				return false
			}
		}
		for c := range maps.Keys(want) {
			sum[c] -= want[c]
			if !near(have[c], want[c]) {
				return false
			}
		}
	}
	for c, d := range sum {
		if d > pl.p.Slack || -d > pl.p.Slack || d != 0 && pl.owed(c) {
			return false
		}
	}
	return true
}

// near reports whether a quota have is within the slack of q: never
// more than q where q itself is within the slack of nothing.
func (pl *planner) near(have, q int64) bool {
	return have >= q-pl.p.Slack && have <= q+pl.p.Slack && (have <= q || q >= pl.p.Slack)
}

// lead is how few windows may remain granted ahead before the open
// publish is extended.
func (pl *planner) lead() int64 {
	if pl.p.Lead > 0 {
		return pl.p.Lead
	}
	return max(1, pl.p.Horizon/2)
}

// extend moves the open publish's end to the horizon when fewer than
// lead windows remain, as far as the grants fit and the change has room,
// and reports false when it had to and could not: a new publish must
// take over.
func (pl *planner) extend(open Pub, lead int64) bool {
	want, was := pl.k+pl.p.Horizon, open.B
	if was >= pl.k+lead || want <= was {
		return true
	}
	if pl.left < 1 {
		return false
	}
	fits := func(b int64) bool {
		open.B = b
		pl.t.Pubs[open.Seq] = open
		return len(auditEra(pl.t, *pl.cur())) == 0
	}
	// Whether it fits only gets worse as b grows: search the last b.
	lo, hi := was, want // fits(lo); find the largest b ≤ hi that fits
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	fits(lo)
	if lo == was {
		return false
	}
	pl.c.Pubs = append(pl.c.Pubs, open)
	pl.left--
	pl.c.Why = append(pl.c.Why, fmt.Sprintf("publish %d extended to window %d", open.Seq, lo))
	return true
}

// nextSeq takes the next publish number from the head's counter, so a
// number never names two publishes, even after the first one went.
func (pl *planner) nextSeq() int64 {
	n := pl.t.Head.Pubs
	for s := range pl.t.Pubs {
		n = max(n, s)
	}
	pl.t.Head.Pubs = n + 1
	return n + 1
}

// topUp grants, in the windows before the open publish begins, what the
// holders of the target lack of it, within the room left there: one
// top-up publish for each run of windows where room and lack are alike.
func (pl *planner) topUp() {
	open, ok := pl.open()
	lo := pl.lo()
	if !ok || open.A <= lo {
		return
	}
	e := pl.cur()
	ks := []int64{lo}
	for _, k := range pl.t.edges(e.Seq) {
		if k > lo && k < open.A {
			ks = append(ks, k)
		}
	}
	ks = append(ks, open.A)
	// Decide every piece from the ledger before this round's top-ups.
	gives := make([]map[string]int64, len(ks)-1)
	for i := range gives {
		gives[i] = pl.lack(ks[i])
	}
	for i := 0; i < len(gives); {
		j := i + 1
		for j < len(gives) && maps.Equal(gives[j], gives[i]) {
			j++
		}
		if len(gives[i]) > 0 {
			pl.topUpPiece(ks[i], ks[j]-1, gives[i])
		}
		i = j
	}
}

// lack returns what each holder of the target lacks of it in window k,
// divided max-min fairly within the room left there.
func (pl *planner) lack(k int64) map[string]int64 {
	e := pl.cur()
	need := map[string]int64{}
	have := pl.t.Allowances(e.Seq, k)
	for h, q := range pl.target {
		if n := q - have[h]; n > 0 {
			need[h] = n
		}
	}
	return fill(need, e.Limit(k)-pl.t.Sum(e.Seq, k))
}

// topUpPiece writes the top-ups of give over windows a..b: one record
// for what every holder of the publish in force there is given alike
// (alike), and a grant each for the rest, to as many holders as the
// change has room for: the next round tops up the others from what is
// left. What one record leaves a holder short, when less than its part
// of the slack, is not worth a record of its own: such rests come of
// dividing the room evenly, one each for some holders, and waits for the
// next publish.
func (pl *planner) topUpPiece(a, b int64, give map[string]int64) {
	e := pl.cur()
	if of, each, ok := pl.alike(a, b, give); ok && pl.left >= 1 {
		tp := Pub{Seq: pl.nextSeq(), Era: e.Seq, Window: e.Window, A: a, B: b, TopUp: true, Each: each, Of: of.Seq}
		pl.t.Pubs[tp.Seq] = tp
		pl.c.Pubs = append(pl.c.Pubs, tp)
		pl.left--
		give = maps.Clone(give)
		least := max(1, pl.p.Slack/int64(max(1, len(pl.target))))
		for h := range pl.holds(of.Seq) {
			if give[h] -= each; give[h] < least {
				delete(give, h)
			}
		}
		pl.c.Why = append(pl.c.Why, fmt.Sprintf("publish %d: publish %d's holders topped up by %d each in windows %d..%d", tp.Seq, of.Seq, each, a, b))
	}
	if pl.left < 2 || len(give) == 0 {
		return
	}
	tp := Pub{Seq: pl.nextSeq(), Era: e.Seq, Window: e.Window, A: a, B: b, TopUp: true}
	pl.t.Pubs[tp.Seq] = tp
	pl.c.Pubs = append(pl.c.Pubs, tp)
	pl.left--
	hs := slices.Sorted(maps.Keys(give))
	hs = hs[:min(len(hs), pl.left)]
	gs := make([]Grant, 0, len(hs))
	for _, h := range hs {
		gs = append(gs, Grant{Pub: tp.Seq, Holder: h, Quota: give[h], From: a})
	}
	pl.grant(gs)
	pl.c.Why = append(pl.c.Why, fmt.Sprintf("publish %d: %d holders topped up in windows %d..%d", tp.Seq, len(gs), a, b))
}

// alike returns the publish in force through windows a..b, the last
// that is not a top-up, and what give gives each of its holders at
// least, when that is more than 0 and it has more than one holder: a
// top-up of all its holders alike is then one record (Pub.Each). It ends
// no later than that publish, so it is collected with it or before.
func (pl *planner) alike(a, b int64, give map[string]int64) (of Pub, each int64, ok bool) {
	for _, p := range pl.t.Pubs {
		if p.Era == pl.cur().Seq && !p.TopUp && p.A <= a && b <= p.B && (!ok || p.Seq > of.Seq) {
			of, ok = p, true
		}
	}
	if !ok {
		return Pub{}, 0, false
	}
	hs := pl.holds(of.Seq)
	if len(hs) < 2 {
		return Pub{}, 0, false
	}
	each = math.MaxInt64
	for h := range hs {
		each = min(each, give[h])
	}
	return of, each, each > 0
}

// fill divides room among needs max-min fairly, in holder order for the
// remainder: nobody gets more than it needs, and the room is used up
// before anyone who needs more gets less than an equal part.
func fill(need map[string]int64, room int64) map[string]int64 {
	give := map[string]int64{}
	hs := slices.Sorted(maps.Keys(need))
	for room > 0 && len(hs) > 0 {
		part := max(1, room/int64(len(hs)))
		var left []string
		for _, h := range hs {
			d := min(part, need[h]-give[h], room)
			give[h] += d
			room -= d
			if give[h] < need[h] {
				left = append(left, h)
			}
		}
		hs = left
	}
	for h, d := range give {
		if d == 0 {
			delete(give, h)
		}
	}
	return give
}

// collect deletes, as far as the change has room, the releases and
// grants of publishes gone or never to be written, and the publishes
// ended below the floor, which it raises to Keep windows behind the
// current one. What does not fit waits for a later change: the floor
// already says that nothing is granted below it, so a record of a window
// below it may go at any time, or later, without changing any room.
func (pl *planner) collect() {
	rels, grants := pl.orphans()
	pl.dropReleases(rels)
	pl.dropGrants(grants)
	e := pl.cur()
	floor := max(e.Floor, pl.k-max(pl.p.Keep, 1))
	floorAt := StartOf(floor, e.Window)
	var gone []Pub
	for _, p := range pl.t.Pubs {
		if StartOf(p.B+1, p.Window) <= floorAt && (p.Era != e.Seq || p.B < floor) {
			gone = append(gone, p)
		}
	}
	if len(gone) == 0 {
		return
	}
	if floor > e.Floor {
		e.Floor = floor
		pl.c.Why = append(pl.c.Why, fmt.Sprintf("floor at window %d", floor))
	}
	slices.SortFunc(gone, func(a, b Pub) int { return cmp.Compare(a.Seq, b.Seq) })
	for _, p := range gone {
		if !pl.dropPub(p) {
			break
		}
	}
	pl.dropEras()
}

// dropPub deletes p's grants, each with its releases, then p, as far as
// the change has room; it reports whether p went.
func (pl *planner) dropPub(p Pub) bool {
	var gs []Grant
	for _, g := range pl.t.sortedGrants() {
		if g.Pub == p.Seq {
			gs = append(gs, g)
		}
	}
	for _, g := range gs {
		rels := pl.releasesOf(GrantKey{g.Pub, g.Holder})
		if 1+len(rels) > pl.left {
			return false
		}
		// A grant goes with its releases: a release left without its
		// grant caps nothing, a grant left without its release would
		// count again what it released.
		pl.dropGrants([]Grant{g})
		pl.dropReleases(rels)
	}
	if pl.left < 1 {
		return false
	}
	delete(pl.t.Pubs, p.Seq)
	pl.c.DelPubs = append(pl.c.DelPubs, p)
	pl.left--
	pl.c.Why = append(pl.c.Why, fmt.Sprintf("publish %d ended below the floor goes", p.Seq))
	return true
}

// dropEras forgets the eras before the current one with no publish left.
func (pl *planner) dropEras() {
	var eras []Era
	for i, era := range pl.t.Head.Eras {
		if i == len(pl.t.Head.Eras)-1 || pl.hasPubs(era.Seq) {
			eras = append(eras, era)
		}
	}
	pl.t.Head.Eras = eras
}

// releasesOf returns the releases of the grant key, in order.
func (pl *planner) releasesOf(key GrantKey) []Release {
	var out []Release
	for _, st := range pl.t.Releases[key].Steps {
		out = append(out, Release{Pub: key.Pub, Holder: key.Holder, From: st.From, Limit: st.Limit})
	}
	slices.SortFunc(out, func(a, b Release) int { return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.Limit, b.Limit)) })
	return out
}

// dropReleases deletes as many of rels, in order, as the change has
// room for.
func (pl *planner) dropReleases(rels []Release) {
	rels = rels[:min(len(rels), pl.left)]
	for _, r := range rels {
		key := GrantKey{r.Pub, r.Holder}
		rs := pl.t.Releases[key]
		rs.Steps = slices.DeleteFunc(slices.Clone(rs.Steps), func(st Step) bool { return st == Step{From: r.From, Limit: r.Limit} })
		if len(rs.Steps) == 0 {
			delete(pl.t.Releases, key)
		} else {
			pl.t.Releases[key] = rs
		}
	}
	pl.c.DelReleases = append(pl.c.DelReleases, rels...)
	pl.left -= len(rels)
	if len(rels) > 0 {
		pl.c.Why = append(pl.c.Why, fmt.Sprintf("%d releases go", len(rels)))
	}
}

// dropGrants deletes as many of gs, in order, as the change has room for.
func (pl *planner) dropGrants(gs []Grant) {
	gs = gs[:min(len(gs), pl.left)]
	for _, g := range gs {
		delete(pl.t.Grants, GrantKey{g.Pub, g.Holder})
	}
	pl.c.DelGrants = append(pl.c.DelGrants, gs...)
	pl.left -= len(gs)
	if len(gs) > 0 {
		pl.c.Why = append(pl.c.Why, fmt.Sprintf("%d grants go", len(gs)))
	}
}

// orphans returns the releases of publishes gone, written after their
// publish went or answered late, and the grants of publishes never to be
// written: numbers used, not written, and not staged.
func (pl *planner) orphans() ([]Release, []Grant) {
	var rels []Release
	var grants []Grant
	gone := func(seq int64) bool {
		_, ok := pl.t.Pubs[seq]
		return !ok && seq <= pl.t.Head.Pubs && seq != pl.t.Head.Staged
	}
	for key := range pl.t.Releases {
		if gone(key.Pub) {
			rels = append(rels, pl.releasesOf(key)...)
		}
	}
	for _, g := range pl.t.sortedGrants() {
		if gone(g.Pub) {
			grants = append(grants, g)
		}
	}
	slices.SortFunc(rels, func(a, b Release) int {
		return cmp.Or(cmp.Compare(a.Pub, b.Pub), strings.Compare(a.Holder, b.Holder), cmp.Compare(a.From, b.From), cmp.Compare(a.Limit, b.Limit))
	})
	return rels, grants
}

func (pl *planner) hasPubs(era int64) bool {
	for _, p := range pl.t.Pubs {
		if p.Era == era {
			return true
		}
	}
	return false
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func lcm(a, b int64) int64 { return a / gcd(a, b) * b }

// ceilDiv is ⌈a/b⌉ for b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a > 0) == (b > 0) {
		q++
	}
	return q
}
