package sim

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sluice-go/sluice/configd/alloc"
	"github.com/sluice-go/sluice/internal/share"
)

// The oracle, and the figures of a run.
//
// Every grant is counted into buckets of true time one unit long, the
// greatest common divisor of every window length the run uses, so that
// the count of any aligned window of any of those lengths is a sum of
// buckets. What each instance enforces is recorded over time as the
// configs (regimes) its quota comes from. A window of length w may hold at
// most, over the regimes any instance enforced at any time during it, the
// largest of that regime's limit counted into windows of w (share.In): the
// new limit once every instance enforces it, the old one while some still
// may — until every instance has applied a change, the old limit bounds
// the sum — and the count of a longer window's limit into a shorter one
// while windows of both lengths are in force.

// regime is one config of the run: a limit per window.
type regime struct {
	limit  int64
	window time.Duration
}

// span is a stretch of true time over which an instance may be enforcing
// quotas of the regimes listed (none: nothing).
type span struct {
	from, to int64 // to is math.MaxInt64 while open
	regimes  []int
}

type metrics struct {
	unit     int64   // bucket length, ns
	admitted []int64 // permits granted in each bucket of true time
	spans    map[*instance][]span

	// Per aligned window k of the scenario's length, for utilization and
	// re-convergence.
	offered   []float64 // permits offered
	limit     []int64   // the limit at its start, at the same rate in this length
	shortfall []float64 // Σ max(0, ideal−share) / limit at its start
	live      int       // most live instances at a window start
	shifts    []shift

	publishes, writes, lost, refused, failovers int
	damped                                      map[string]int
}

type shift struct {
	at   int64
	what []string
}

func (m *metrics) init(e *engine) {
	m.unit = int64(e.sc.Window)
	for _, ev := range e.sc.Events {
		if ev.Window > 0 {
			m.unit = gcd(m.unit, int64(ev.Window))
		}
	}
	m.admitted = make([]int64, e.end/m.unit+1)
	m.spans = map[*instance][]span{}
	n := int(e.end / int64(e.sc.Window))
	m.offered = make([]float64, n)
	m.limit = make([]int64, n)
	m.shortfall = make([]float64, n)
	m.damped = map[string]int{}
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// admit counts n permits granted at true time t.
func (m *metrics) admit(e *engine, t, n int64) {
	if t >= 0 && t/m.unit < int64(len(m.admitted)) {
		m.admitted[t/m.unit] += n
	}
}

// startEnforcing records that a process starts, or stops (regimes nil),
// now: it enforces exactly the regimes given, whatever the process before
// had in store.
func (m *metrics) startEnforcing(e *engine, in *instance, regimes []int) {
	m.enforce(e.now, e.now, in, regimes)
}

// enforceFrom records that in, told now, enforces only the regimes given
// from true time from on, and until then whatever its limiter still had in
// store as well: a change made before an earlier one took effect is never
// counted as undoing it.
func (m *metrics) enforceFrom(e *engine, in *instance, from int64, regimes []int) {
	m.enforce(e.now, max(from, e.now+1), in, regimes)
}

// enforce: from now until from, what the instance had in store plus
// regimes; from from on, regimes only.
func (m *metrics) enforce(now, from int64, in *instance, regimes []int) {
	spans := m.spans[in]
	var carry []int
	keep := spans[:0]
	for _, sp := range spans {
		if sp.to <= now {
			keep = append(keep, sp)
			continue
		}
		carry = union(carry, sp.regimes)
		if sp.from < now {
			sp.to = now
			keep = append(keep, sp)
		}
	}
	if from > now {
		keep = append(keep, span{now, from, union(carry, regimes)})
	}
	m.spans[in] = append(keep, span{from, math.MaxInt64, slices.Clone(regimes)})
}

func union(a, b []int) []int {
	out := slices.Clone(a)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// addOffered counts o permits per window offered over the last d ns, up
// to now, into the windows of the scenario's length they fall in.
func (m *metrics) addOffered(e *engine, o int64, d float64) {
	w := int64(e.sc.Window)
	for a, c := e.now-int64(d), e.now; a < c; {
		b := min((floorDiv(a, w)+1)*w, c)
		if k := a / w; a >= 0 && k < int64(len(m.offered)) {
			m.offered[k] += float64(o) * float64(b-a) / float64(w)
		}
		a = b
	}
}

// sample records, at the start of aligned window k of the scenario's
// length, the limit and how far the shares in force are from the ideal
// allocation of the true demands.
func (m *metrics) sample(e *engine, k int64) {
	c := e.cfg
	if c == nil {
		return
	}
	m.limit[k] = int64(float64(c.limit) * float64(e.sc.Window) / float64(c.window))
	var ins []alloc.Instance
	var cur []int64
	for _, in := range e.inst {
		if in.alive {
			ins = append(ins, alloc.Instance{ID: in.id, Demand: float64(in.offered)})
			cur = append(cur, in.ap.Quota)
		}
	}
	m.live = max(m.live, len(ins))
	if c.window != e.sc.Window.D() {
		return // shares of another length: no comparison
	}
	ideal, err := e.algo(c.limit, alloc.DefaultFloor(c.limit, len(ins)), ins)
	if err != nil {
		panic(fmt.Sprintf("sim: ideal allocation failed: %v", err))
	}
	var short int64
	for i := range ins {
		short += max(0, ideal[i]-cur[i])
	}
	m.shortfall[k] = float64(short) / float64(c.limit)
}

// shift records an event, for the re-convergence figure.
func (m *metrics) shift(e *engine, ev Event) {
	what := ev.Kind
	switch ev.Kind {
	case EventDemand:
		what = fmt.Sprintf("%s→%d", ev.Group, ev.Demand)
	case EventJoin:
		what = fmt.Sprintf("+%d %s", ev.Count, ev.Group)
	case EventCrash, EventRestart:
		what = fmt.Sprintf("%s %s", ev.Kind, ev.Group)
		if ev.Count > 0 {
			what = fmt.Sprintf("%s %d %s", ev.Kind, ev.Count, ev.Group)
		}
	case EventLimit, EventCreate:
		what = fmt.Sprintf("%s %d", ev.Kind, ev.Limit)
		if ev.Window > 0 {
			what += "/" + ev.Window.D().String()
		}
	case EventFailover, EventOutage:
		what = fmt.Sprintf("%s %s", ev.Kind, ev.Down.D())
	case EventClock:
		what = fmt.Sprintf("configd clock %+v", ev.Offset.D())
	}
	if n := len(m.shifts); n > 0 && m.shifts[n-1].at == e.now {
		m.shifts[n-1].what = append(m.shifts[n-1].what, what)
		return
	}
	m.shifts = append(m.shifts, shift{at: e.now, what: []string{what}})
}

// violation is an aligned window that held more than the oracle allows.
type violation struct {
	start          int64
	window         time.Duration
	admitted, most int64
}

// check runs the oracle over every aligned window of every length the run
// used, while some instance may have been enforcing a limit of that length
// (the guarantee is about the provider's windows: a length no instance
// enforces any more is no limit of the provider's); it returns the windows over what they may hold, the number of
// windows checked, and the fullest window (by share of what it may hold).
func (m *metrics) check(e *engine) (over []violation, checked, atBound int, fullest violation) {
	active := m.activity()
	lengths := []time.Duration{e.sc.Window.D()}
	for _, r := range e.limits {
		if !slices.Contains(lengths, r.window) {
			lengths = append(lengths, r.window)
		}
	}
	ratio := func(v violation) float64 {
		if v.most == 0 {
			return math.Inf(1)
		}
		return float64(v.admitted) / float64(v.most)
	}
	for _, w := range lengths {
		per := int64(w) / m.unit
		for b := int64(0); b+per <= e.end/m.unit; b += per {
			var sum int64
			for _, n := range m.admitted[b : b+per] {
				sum += n
			}
			start, end := b*m.unit, (b+per)*m.unit
			most, inUse := int64(0), false
			for k, ivs := range active {
				if overlaps(ivs, start, end) {
					r := e.limits[k]
					most = max(most, share.In(r.limit, r.window, w))
					inUse = inUse || r.window == w
				}
			}
			if !inUse {
				continue // no instance enforced windows of this length then
			}
			checked++
			v := violation{start: start, window: w, admitted: sum, most: most}
			if sum > most {
				over = append(over, v)
			}
			if sum == most && sum > 0 {
				atBound++
			}
			if sum > 0 && (fullest.admitted == 0 || ratio(v) > ratio(fullest)) {
				fullest = v
			}
		}
	}
	return over, checked, atBound, fullest
}

// activity returns, per regime, the stretches of true time during which
// some instance may have been enforcing it, sorted.
func (m *metrics) activity() map[int][][2]int64 {
	out := map[int][][2]int64{}
	for _, spans := range m.spans {
		for _, sp := range spans {
			for _, k := range sp.regimes {
				out[k] = append(out[k], [2]int64{sp.from, sp.to})
			}
		}
	}
	for _, ivs := range out {
		slices.SortFunc(ivs, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	}
	return out
}

// overlaps reports whether any of ivs (sorted by start) meets [a, b).
func overlaps(ivs [][2]int64, a, b int64) bool {
	for _, iv := range ivs {
		if iv[0] >= b {
			return false
		}
		if iv[1] > a {
			return true
		}
	}
	return false
}

// report sums the run up.
func (m *metrics) report(e *engine) Report {
	sc := e.sc
	w := int64(sc.Window)
	r := Report{
		Name:        sc.Name,
		Description: sc.Description,
		Instances:   m.live,
		Limit:       sc.Limit,
		Window:      sc.Window.D(),
		Publishes:   m.publishes,
		Damped:      m.damped,
		Refused:     m.refused,
		Writes:      m.writes,
		LostWrites:  m.lost,
		MinUtil:     math.Inf(1),
	}
	over, checked, atBound, fullest := m.check(e)
	r.Checked, r.AtBound, r.Over = checked, atBound, len(over)
	for _, v := range over {
		r.OverBy = max(r.OverBy, v.admitted-v.most)
		if len(r.Violations) < 5 {
			r.Violations = append(r.Violations, fmt.Sprintf("window [%v, +%v) admitted %d, may hold %d",
				time.Duration(v.start), v.window, v.admitted, v.most))
		}
	}
	r.FullestAdmitted, r.FullestMost, r.FullestAt, r.FullestWindow = fullest.admitted, fullest.most, time.Duration(fullest.start), fullest.window
	first := int((int64(sc.Warmup) + w - 1) / w)
	var utilSum float64
	for k := first; k < len(m.offered); k++ {
		r.Windows++
		if a := m.windowAdmitted(e, k); a > r.MaxAdmitted || (a == r.MaxAdmitted && r.MaxLimit == 0) {
			r.MaxAdmitted, r.MaxLimit, r.MaxAt = a, m.limit[k], time.Duration(int64(k)*w)
		}
		u := m.util(e, k)
		utilSum += u
		r.MinUtil = min(r.MinUtil, u)
	}
	if r.Windows > 0 {
		r.Utilization = utilSum / float64(r.Windows)
	}
	for i, s := range m.shifts {
		ks := int((s.at + w - 1) / w)
		kn := len(m.offered)
		if i+1 < len(m.shifts) {
			kn = min(kn, int((m.shifts[i+1].at+w-1)/w))
		}
		sh := Shift{At: time.Duration(s.at), What: joinWhat(s.what)}
		k0 := kn
		for k := kn - 1; k >= ks; k-- {
			if m.util(e, k) < ConvergedUtilization && m.shortfall[k] > ConvergedShortfall {
				break
			}
			k0 = k
		}
		if k0 < kn {
			sh.Converged = true
			sh.After = time.Duration(int64(k0)*w - s.at)
		} else {
			sh.After = time.Duration(int64(kn)*w - s.at)
		}
		r.Shifts = append(r.Shifts, sh)
	}
	slices.SortFunc(r.Shifts, func(a, b Shift) int { return cmp.Compare(a.At, b.At) })
	return r
}

// Converged is the utilization, or the share shortfall, a window needs to
// count as converged.
const (
	ConvergedUtilization = 0.97
	ConvergedShortfall   = 0.01
)

// util is the utilization of aligned window k of the scenario's length:
// admitted / min(limit, offered).
func (m *metrics) util(e *engine, k int) float64 {
	den := min(float64(m.limit[k]), m.offered[k])
	if den <= 0 {
		return 1
	}
	return float64(m.windowAdmitted(e, k)) / den
}

// windowAdmitted is what aligned window k of the scenario's length admitted.
func (m *metrics) windowAdmitted(e *engine, k int) int64 {
	w := int64(e.sc.Window)
	var adm int64
	for b := int64(k) * w / m.unit; b < int64(k+1)*w/m.unit; b++ {
		adm += m.admitted[b]
	}
	return adm
}

func joinWhat(what []string) string {
	s := ""
	for i, w := range what {
		if i > 0 {
			s += ", "
		}
		s += w
	}
	return s
}
