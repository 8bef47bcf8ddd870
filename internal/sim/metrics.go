package sim

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sluice-go/sluice/configd/alloc"
)

// metrics collects, per true aligned window, what was admitted and
// offered, and the shares in force against the ideal allocation.
type metrics struct {
	admitted  []int64   // permits admitted in aligned window k
	offered   []float64 // permits offered in aligned window k
	limit     []int64   // the limit at the start of window k
	shortfall []float64 // Σ max(0, ideal−share) / limit at the start of window k
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
	n := int(e.end / e.w)
	m.admitted = make([]int64, n)
	m.offered = make([]float64, n)
	m.limit = make([]int64, n)
	m.shortfall = make([]float64, n)
	m.damped = map[string]int{}
}

func (m *metrics) window(e *engine, t int64) int {
	k := t / e.w
	if t < 0 || k >= int64(len(m.admitted)) {
		return -1
	}
	return int(k)
}

// admit counts n permits admitted at true time t.
func (m *metrics) admit(e *engine, t, n int64) {
	if k := m.window(e, t); k >= 0 {
		m.admitted[k] += n
	}
}

// admitSpread counts n permits admitted evenly from true time a at rate r
// permits per ns: permit j at a + (j+½)/r.
func (m *metrics) admitSpread(e *engine, a int64, r float64, n int64) {
	done := int64(0)
	for done < n {
		t := a + int64((float64(done)+0.5)/r)
		b := (floorDiv(t, e.w) + 1) * e.w // end of t's aligned window
		// Permits before b: j < (b−a)·r − ½.
		upto := int64(math.Ceil(float64(b-a)*r - 0.5))
		upto = min(max(upto, done+1), n)
		m.admit(e, t, upto-done)
		done = upto
	}
}

// addOffered spreads o permits per window over [a, c) into aligned windows.
func (m *metrics) addOffered(e *engine, a, c, o int64) {
	for a < c {
		b := min((floorDiv(a, e.w)+1)*e.w, c)
		if k := m.window(e, a); k >= 0 {
			m.offered[k] += float64(o) * float64(b-a) / float64(e.w)
		}
		a = b
	}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// sample records, at the start of aligned window k, the limit and how far
// the shares in force are from the ideal allocation of the true demands.
func (m *metrics) sample(e *engine, k int64) {
	m.limit[k] = e.limit
	var ins []alloc.Instance
	var cur []int64
	for _, in := range e.inst {
		if in.alive {
			ins = append(ins, alloc.Instance{ID: in.id, Demand: float64(in.offered)})
			cur = append(cur, in.cur)
		}
	}
	m.live = max(m.live, len(ins))
	ideal, err := e.algo(e.limit, alloc.DefaultFloor(e.limit, len(ins)), ins)
	if err != nil {
		panic(fmt.Sprintf("sim: ideal allocation failed: %v", err))
	}
	var short int64
	for i := range ins {
		short += max(0, ideal[i]-cur[i])
	}
	m.shortfall[k] = float64(short) / float64(e.limit)
}

// shift records an event, for the re-convergence figure.
func (m *metrics) shift(e *engine, ev Event) {
	what := ev.Kind
	switch ev.Kind {
	case EventDemand:
		what = fmt.Sprintf("%s→%d", ev.Group, ev.Demand)
	case EventJoin:
		what = fmt.Sprintf("+%d %s", ev.Count, ev.Group)
	case EventCrash:
		what = fmt.Sprintf("crash %s", ev.Group)
		if ev.Count > 0 {
			what = fmt.Sprintf("crash %d %s", ev.Count, ev.Group)
		}
	case EventLimit:
		what = fmt.Sprintf("limit %d", ev.Limit)
	case EventFailover, EventOutage:
		what = fmt.Sprintf("%s %s", ev.Kind, ev.Down.D())
	}
	if n := len(m.shifts); n > 0 && m.shifts[n-1].at == e.now {
		m.shifts[n-1].what = append(m.shifts[n-1].what, what)
		return
	}
	m.shifts = append(m.shifts, shift{at: e.now, what: []string{what}})
}

// Converged is the utilization, or the share shortfall, a window needs to
// count as converged.
const (
	ConvergedUtilization = 0.97
	ConvergedShortfall   = 0.01
)

func (m *metrics) util(k int) float64 {
	den := min(float64(m.limit[k]), m.offered[k])
	if den <= 0 {
		return 1
	}
	return float64(m.admitted[k]) / den
}

func (m *metrics) report(e *engine) Report {
	r := Report{
		Name:        e.sc.Name,
		Description: e.sc.Description,
		Instances:   m.live,
		Limit:       e.sc.Limit,
		Window:      e.sc.Window.D(),
		Publishes:   m.publishes,
		Writes:      m.writes,
		LostWrites:  m.lost,
		Refused:     m.refused,
		Damped:      m.damped,
		MinUtil:     math.Inf(1),
	}
	first := int((int64(e.sc.Warmup) + e.w - 1) / e.w)
	var sum float64
	for k := first; k < len(m.admitted); k++ {
		r.Windows++
		if a := m.admitted[k]; a > r.MaxAdmitted || (a == r.MaxAdmitted && r.MaxLimit == 0) {
			r.MaxAdmitted, r.MaxLimit, r.MaxAt = a, m.limit[k], time.Duration(int64(k)*e.w)
		}
		if m.admitted[k] > m.limit[k] {
			r.Over++
			r.OverBy = max(r.OverBy, m.admitted[k]-m.limit[k])
		}
		u := m.util(k)
		sum += u
		r.MinUtil = min(r.MinUtil, u)
	}
	if r.Windows > 0 {
		r.Utilization = sum / float64(r.Windows)
	}
	for i, s := range m.shifts {
		ks := int((s.at + e.w - 1) / e.w)
		kn := len(m.admitted)
		if i+1 < len(m.shifts) {
			kn = min(kn, int((m.shifts[i+1].at+e.w-1)/e.w))
		}
		sh := Shift{At: time.Duration(s.at), What: strings.Join(s.what, ", ")}
		k0 := kn
		for k := kn - 1; k >= ks; k-- {
			if m.util(k) < ConvergedUtilization && m.shortfall[k] > ConvergedShortfall {
				break
			}
			k0 = k
		}
		if k0 < kn {
			sh.Converged = true
			sh.After = time.Duration(int64(k0)*e.w - s.at)
		} else {
			sh.After = time.Duration(int64(kn)*e.w - s.at)
		}
		r.Shifts = append(r.Shifts, sh)
	}
	slices.SortFunc(r.Shifts, func(a, b Shift) int { return int(a.At - b.At) })
	return r
}
