package sim

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is what one run measured. Windows are true aligned windows after
// the warm-up.
type Report struct {
	Name        string
	Description string
	Instances   int // most instances alive at once
	Limit       int64
	Window      time.Duration

	Windows int // aligned windows of the scenario's length measured (after the warm-up)

	// The oracle checks every aligned window of every length the run
	// used, from the start: a window may hold at most the largest limit,
	// counted into its length (share.In), of the configs any instance may
	// have been enforcing during it — the new limit once every instance
	// enforces it, the old one while some still may.
	Checked    int      // windows the oracle checked
	AtBound    int      // of which held exactly what they may hold
	Over       int      // windows that held more than that
	OverBy     int64    // the largest excess
	Violations []string // the first few windows over, described
	// The fullest window the oracle saw, by share of what it may hold:
	// its count, what it may hold, its start and length.
	FullestAdmitted, FullestMost int64
	FullestAt, FullestWindow     time.Duration

	// The most admitted in one measured window (of the scenario's length,
	// after the warm-up), the limit then and its start.
	MaxAdmitted int64
	MaxLimit    int64
	MaxAt       time.Duration

	// Utilization is admitted / min(limit, offered), averaged over the
	// windows; MinUtil is the lowest.
	Utilization float64
	MinUtil     float64

	Shifts []Shift

	Publishes  int            // shares records published
	Damped     map[string]int // recomputations not published, by reason
	Refused    int            // handover results over the limit (schema.Encode refuses them)
	Writes     int            // instance record writes
	LostWrites int            // of which lost
}

// Shift is one scenario event and how long the shares took to follow it.
type Shift struct {
	At   time.Duration
	What string
	// Converged: from the window starting After past the event until the
	// next event (or the end), every window has utilization ≥ 97% or the
	// shares in force are within 1% of the limit of the ideal allocation of
	// the true demands. When false, After is how long was watched.
	Converged bool
	After     time.Duration
}

// MaxPercent is the fullest window the oracle saw as a percentage of what
// it may hold. Unlike MaxAdmitted it stays right across window changes,
// when the scenario's own length no longer is the window in force.
func (r Report) MaxPercent() float64 {
	if r.FullestMost == 0 {
		return 0
	}
	return 100 * float64(r.FullestAdmitted) / float64(r.FullestMost)
}

// SlowestShift returns the longest re-convergence, and whether every shift
// converged; ok is false when there was no shift.
func (r Report) SlowestShift() (d time.Duration, all, ok bool) {
	all = true
	for _, s := range r.Shifts {
		ok = true
		d = max(d, s.After)
		all = all && s.Converged
	}
	return d, all, ok
}

// Doorman's published simulation figures, for comparison.
const (
	DoormanUtilization = 96.6 // % of capacity handed out, on average
	DoormanPeak        = 106  // % of the limit, at its peak
	DoormanCatchUp     = 2 * time.Minute
)

// WriteTable writes reports as a table, Doorman's figures beside it, then
// each scenario's shifts.
func WriteTable(w io.Writer, reports []Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tinst\tlimit\tfullest window\tmax %\tover\tutil avg\tutil min\tslowest re-converge\tpublishes\t")
	for _, r := range reports {
		conv := "-"
		if d, all, ok := r.SlowestShift(); ok {
			conv = d.Round(time.Millisecond).String()
			if !all {
				conv = "not in " + conv
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d of %d\t%.1f%%\t%d\t%.1f%%\t%.1f%%\t%s\t%d\t\n",
			r.Name, r.Instances, r.Limit, r.FullestAdmitted, r.FullestMost, r.MaxPercent(), r.Over,
			100*r.Utilization, 100*r.MinUtil, conv, r.Publishes)
	}
	fmt.Fprintf(tw, "Doorman (published)\t\t\t\t%d%%\t\t%.1f%%\t\tup to %s\t\t\n", DoormanPeak, DoormanUtilization, DoormanCatchUp)
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range reports {
		fmt.Fprintf(w, "\n%s: %s\n", r.Name, r.Description)
		fmt.Fprintf(w, "  %d windows of %s measured, most admitted %d of %d at %s; the oracle checked %d aligned windows, the fullest held %d of %d (%s at %s)",
			r.Windows, r.Window, r.MaxAdmitted, r.MaxLimit, r.MaxAt, r.Checked, r.FullestAdmitted, r.FullestMost, r.FullestWindow, r.FullestAt)
		if r.Over > 0 {
			fmt.Fprintf(w, "; %d windows over the limit, by up to %d", r.Over, r.OverBy)
		}
		fmt.Fprintln(w)
		for _, v := range r.Violations {
			fmt.Fprintln(w, "  over:", v)
		}
		var damped []string
		for _, k := range slices.Sorted(maps.Keys(r.Damped)) {
			damped = append(damped, fmt.Sprintf("%s %d", k, r.Damped[k]))
		}
		fmt.Fprintf(w, "  publishes %d, damped: %s; record writes %d (lost %d)", r.Publishes, orNone(damped), r.Writes, r.LostWrites)
		if r.Refused > 0 {
			fmt.Fprintf(w, "; handover results refused as over the limit: %d", r.Refused)
		}
		fmt.Fprintln(w)
		for _, s := range r.Shifts {
			st := "re-converged after " + s.After.Round(time.Millisecond).String()
			if !s.Converged {
				st = "NOT re-converged within " + s.After.Round(time.Millisecond).String()
			}
			fmt.Fprintf(w, "  at %s: %s — %s\n", s.At, s.What, st)
		}
	}
	return nil
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
