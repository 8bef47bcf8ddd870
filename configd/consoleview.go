package main

// What the console shows of one provider, computed from what configd's
// store reads (statusView, the history) and from what the provider's feed
// remembers between two reads. Pure functions of their arguments: no I/O
// and no clock, so that every figure and every sentence is tested.

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
)

// Bounds of what the console keeps and shows.
const (
	// chartBuckets is how many aligned windows (or buckets of windows) the
	// chart shows.
	chartBuckets = 60
	// minBucket is the shortest chart bucket: shorter windows are charted
	// in groups of whole windows, k of them, with the limit times k.
	minBucket = 500 * time.Millisecond
	// maxRows bounds the instances listed; the rest are counted.
	maxRows = 1000
	// historyRows is how many history entries the console lists.
	historyRows = 50
)

// providerPanel is the live view of one provider, as the browser gets it.
type providerPanel struct {
	Provider string `json:"provider"`
	// Found is false when the provider has no config, shares or instance
	// (never created, or deleted and every instance gone).
	Found    bool   `json:"found"`
	Error    string `json:"error,omitempty"` // why it could not be read (etcd)
	Revision int64  `json:"revision"`        // of the config: what a change sends as If-Match
	// Config is the config in force; nil when malformed or deleted.
	Config *configView `json:"config"`
	Shares *sharesView `json:"shares"`
	// Ledger is, for a provider coordinated by the ledger, its fullest
	// upcoming window against its limit, as configd status says it;
	// LedgerOver says the ledger breaks its invariant somewhere.
	Ledger     string `json:"ledger,omitempty"`
	LedgerOver bool   `json:"ledger_over,omitempty"`
	// Leader names the replica whose election key is oldest, Election
	// says what an operator needs to know of the election ("" when a
	// replica leads as usual).
	Leader       string        `json:"leader"`
	Election     string        `json:"election,omitempty"`
	PublishError string        `json:"publish_error,omitempty"`
	Instances    []instanceRow `json:"instances"`
	MoreRows     int           `json:"more_rows,omitempty"` // live instances not listed
	Held         []heldRow     `json:"held"`
	Chart        chartView     `json:"chart"`
	// Classes is, for a provider with priority classes, each class's
	// admissions in the chart's last buckets against its reserve, in the
	// config's order; empty: no classes.
	Classes   []classRow   `json:"classes"`
	History   []historyRow `json:"history"`
	Malformed []string     `json:"malformed,omitempty"`
	Read      time.Time    `json:"read"` // when configd read it
}

// configView is a provider's config as the console shows and edits it.
type configView struct {
	Limit      int64  `json:"limit"`
	Window     string `json:"window"`
	Mode       string `json:"mode"`
	Algorithm  string `json:"algorithm"`
	Pacing     bool   `json:"pacing"`
	FailStatic string `json:"fail_static"`
	ClockBound string `json:"clock_bound"` // max_clock_offset, or its default
	Summary    string `json:"summary"`     // as configd get and set print it
	// MoreLimits are the further limits in force, as --limit takes them
	// ("tokens=200000/1m,50000/1h"); empty: none.
	MoreLimits string `json:"more_limits,omitempty"`
	// Classes are the provider's priority classes, highest first, as
	// --class takes them ("critical=60%,default,batch"); empty: none.
	Classes string `json:"classes,omitempty"`
	// Adaptive is set for an adaptive provider: Limit is then its
	// effective limit (in shadow mode, the ceiling).
	Adaptive *adaptiveView `json:"adaptive,omitempty"`
}

// adaptiveView is what configd's controller keeps of an adaptive
// provider, as the console shows it.
type adaptiveView struct {
	Ceiling int64 `json:"ceiling"`
	Floor   int64 `json:"floor"`
	// Effective is the limit the controller decided: the config's limit,
	// or in shadow mode what it would be (the ceiling until it moved).
	Effective  int64     `json:"effective"`
	Shadow     bool      `json:"shadow"`
	Reason     string    `json:"reason,omitempty"` // why it last moved
	PauseUntil time.Time `json:"pause_until,omitzero"`
}

// adaptiveOf returns the console's view of c's adaptive setting; nil:
// not adaptive.
func adaptiveOf(c schema.ProviderConfig) *adaptiveView {
	a := c.Adaptive
	if a == nil {
		return nil
	}
	av := &adaptiveView{Ceiling: a.Ceiling, Floor: a.Floor, Effective: c.Limit, Shadow: a.Shadow, Reason: a.Reason}
	if a.Shadow {
		av.Effective = cmp.Or(a.Effective, a.Ceiling)
	}
	if !a.PauseUntil.IsZero() {
		av.PauseUntil = a.PauseUntil.UTC()
	}
	return av
}

// sharesView is the shares record configd's leader published last.
type sharesView struct {
	Generation    int64     `json:"generation"`
	Total         int64     `json:"total"`
	Instances     int       `json:"instances"`
	Window        string    `json:"window"`
	EffectiveFrom time.Time `json:"effective_from"`
	PublishedBy   string    `json:"published_by"`
	Published     time.Time `json:"published"`
	Sum           int64     `json:"sum"`     // of the shares
	Granted       int64     `json:"granted"` // the most the instances may still enforce, together
}

// instanceRow is one live instance.
type instanceRow struct {
	ID   string `json:"id"`
	Host string `json:"host"`
	// Share is what configd published for it; nil: none (not named yet,
	// or no shares record). Granted is what configd counts it as still
	// enforcing (its share, or a larger one it has not acknowledged
	// giving up).
	Share   *int64 `json:"share"`
	Granted int64  `json:"granted"`
	// Enforced is what its limiter enforces, by its record; nil when the
	// record does not say (an older member, or malformed).
	Enforced *int64 `json:"enforced"`
	// Source is where its quota comes from: "configd", "even split",
	// "fallback", "lapsed" or "unknown".
	Source string `json:"source"`
	Demand int64  `json:"demand"`
	// AdmittedPerWindow is its admissions between its last two records,
	// per window; nil until it has written two.
	AdmittedPerWindow *float64  `json:"admitted_per_window"`
	AdmittedOver      string    `json:"admitted_over,omitempty"` // the time those two records span
	Admitted          int64     `json:"admitted"`                // since it started
	Clock             string    `json:"clock"`                   // "−400 ms ± 5.2 ms", "unknown"
	LastSeen          time.Time `json:"last_seen"`
	Generation        int64     `json:"generation"` // applied (acknowledged)
	Why               string    `json:"why"`
	Problem           bool      `json:"problem"` // the row needs an operator's eye
}

// heldRow is a grant configd keeps for an instance whose key is gone.
type heldRow struct {
	ID      string    `json:"id"`
	Granted int64     `json:"granted"`
	Source  string    `json:"source"`
	Since   time.Time `json:"since,omitzero"` // when this console saw its key go
	Until   time.Time `json:"until,omitzero"` // about when configd hands it on
	Why     string    `json:"why"`
}

// historyRow is one change, as configd history prints it.
type historyRow struct {
	When     time.Time `json:"when"`
	Who      string    `json:"who"`
	Revision int64     `json:"revision"`
	Change   string    `json:"change"`
}

// chartView is admitted per aligned window (or bucket of whole windows)
// against the limit, oldest first.
type chartView struct {
	Bucket  string       `json:"bucket"`  // its length
	Windows int64        `json:"windows"` // windows per bucket
	Points  []chartPoint `json:"points"`
}

// chartPoint is one bucket. A nil value is not known: Admitted before
// every live instance has reported past the bucket's end (or before the
// console watched), Limit and Granted before the console saw them.
//
// Admitted is exact only when no instance's records straddle the bucket's
// edges with admissions between them. Otherwise Estimated is set: Admitted
// spreads those admissions evenly over the time between the records, and
// the bucket's true count lies between Least and Most, which is all the
// records can say.
type chartPoint struct {
	Start   time.Time `json:"start"`
	Limit   *float64  `json:"limit"`
	Granted *float64  `json:"granted"`
	// Ceiling is an adaptive provider's ceiling, and Shadow the effective
	// limit its controller computes in shadow mode (Limit being the
	// ceiling then); nil where the provider was not adaptive, or not in
	// shadow mode.
	Ceiling   *float64 `json:"ceiling,omitempty"`
	Shadow    *float64 `json:"shadow,omitempty"`
	Admitted  *float64 `json:"admitted"`
	Estimated bool     `json:"estimated,omitempty"`
	Least     *float64 `json:"least,omitempty"`
	Most      *float64 `json:"most,omitempty"`
}

// classRow is one priority class: its reserve per bucket by the config in
// force, and what it was admitted in each of the chart's last
// classBuckets buckets against its reserve then, oldest first.
type classRow struct {
	Name    string       `json:"name"`
	Reserve float64      `json:"reserve"`
	Points  []classPoint `json:"points"`
}

// classPoint is one bucket of a class, as chartPoint is of the total:
// Admitted summed over the instances (nil: not known yet), Estimated with
// Least and Most when records straddle the bucket's edges. Reserve is the
// class's reserve of the limit in force then, per bucket; nil when the
// config then did not list the class.
type classPoint struct {
	Start     time.Time `json:"start"`
	Reserve   *float64  `json:"reserve"`
	Admitted  *float64  `json:"admitted"`
	Estimated bool      `json:"estimated,omitempty"`
	Least     *float64  `json:"least,omitempty"`
	Most      *float64  `json:"most,omitempty"`
}

// classBuckets is how many of the chart's last buckets the classes show.
const classBuckets = 5

// bucketCount is what the records say of one bucket's admissions: spread
// evenly between records, and the least and most they allow. Unless
// estimated, the three are equal: spread is the exact count. classes
// holds the same of each priority class the records name.
type bucketCount struct {
	spread, least, most float64
	estimated           bool
	classes             map[string]*bucketCount
}

// sample is one report of an instance: its running total of admissions
// at a time on its corrected clock, and of each class's (nil: the record
// names none).
type sample struct {
	at       time.Time
	admitted int64
	classes  map[string]int64
}

// sharesPoint is a published shares record as the chart needs it.
type sharesPoint struct {
	from    time.Time
	window  time.Duration
	granted int64
}

// gone is an instance whose key went while the console watched.
type gone struct {
	at  time.Time
	rec *schema.InstanceRecord // its last good record; nil: none
}

// consoleState is what a provider's feed remembers from one read to the
// next: the instances' reports (admitted is a running total, so any two
// reports give what was admitted between them, however many the feed
// missed), the admissions of each bucket once every instance reported past
// it, the shares records seen, and when instances went.
type consoleState struct {
	watched time.Time // the first read: nothing before it is charted
	samples map[string][]sample
	live    map[string]bool                   // live instances of the last read with a good record
	last    map[string]*schema.InstanceRecord // their records
	gone    map[string]gone
	shares  []sharesPoint
	lastGen int64
	// frozen is the admissions of each bucket of length bucket (by its
	// start, Unix ns) that every instance reported past: complete, so never
	// computed again. next is the start of the first bucket not frozen yet.
	bucket time.Duration
	frozen map[int64]bucketCount
	next   time.Time
}

func newConsoleState() *consoleState {
	return &consoleState{samples: map[string][]sample{}, live: map[string]bool{}, last: map[string]*schema.InstanceRecord{},
		gone: map[string]gone{}, frozen: map[int64]bucketCount{}}
}

// corrected returns t on the instance's corrected clock.
func corrected(rec *schema.InstanceRecord, t time.Time) time.Time {
	if rec.ClockKnown {
		return t.Add(rec.ClockOffset.D())
	}
	return t
}

// bucketOf returns the chart's bucket for a window: the window itself, or
// the fewest whole windows that last at least minBucket.
func bucketOf(w time.Duration) (time.Duration, int64) {
	if w <= 0 {
		w = schema.DefaultWindow
	}
	if w >= minBucket {
		return w, 1
	}
	k := int64((minBucket + w - 1) / w)
	return time.Duration(k) * w, k
}

// observe folds one read, made at now, into the state.
func (st *consoleState) observe(v statusView, now time.Time) {
	bucket, _ := bucketOf(windowOf(v))
	if st.watched.IsZero() {
		// Charted from the first whole bucket after the first read.
		st.watched = now.Truncate(bucket).Add(bucket)
	}
	if bucket != st.bucket {
		st.bucket, st.frozen = bucket, map[int64]bucketCount{}
		st.next = maxTime(st.watched, now.Truncate(bucket).Add(-time.Duration(chartBuckets)*bucket)).Truncate(bucket)
	}
	live := map[string]bool{}
	last := map[string]*schema.InstanceRecord{}
	for _, in := range v.Instances {
		r := in.Record
		if r == nil {
			continue
		}
		live[in.ID], last[in.ID] = true, r
		s := st.samples[in.ID]
		if len(s) == 0 {
			// A running total counts from the instance's start: one that
			// joined while watched gives its first span whole.
			if started := corrected(r, r.Started); !started.Before(st.watched.Add(-bucket)) {
				s = append(s, sample{at: started, classes: zeros(r.ClassAdmitted)})
			}
		}
		at := corrected(r, r.Updated)
		if r.Updated.IsZero() {
			at = corrected(r, r.Started)
		}
		switch n := len(s); {
		case n > 0 && r.Admitted < s[n-1].admitted:
			s = []sample{{at: at, admitted: r.Admitted, classes: r.ClassAdmitted}} // another process under the same id
		case n == 0 || at.After(s[n-1].at):
			s = append(s, sample{at: at, admitted: r.Admitted, classes: r.ClassAdmitted})
		}
		st.samples[in.ID] = s
		delete(st.gone, in.ID)
	}
	for id := range st.live {
		if !live[id] {
			st.gone[id] = gone{at: now, rec: st.last[id]}
		}
	}
	st.live, st.last = live, last
	if sh := v.Shares; sh != nil && sh.Generation != st.lastGen {
		st.lastGen = sh.Generation
		var g int64
		for _, id := range sh.Named() {
			g += sh.Enforcing(id)
		}
		st.shares = append(st.shares, sharesPoint{from: sh.EffectiveTime(), window: sh.Window.D(), granted: g})
	}
	st.freeze(now)
	st.prune(now)
}

// freeze computes the admissions of every bucket that every live instance
// has reported past, in order, up to now.
func (st *consoleState) freeze(now time.Time) {
	for {
		s, e := st.next, st.next.Add(st.bucket)
		if e.After(now) {
			return
		}
		var c bucketCount
		for id, ps := range st.samples {
			if n := len(ps); st.live[id] && (n == 0 || ps[n-1].at.Before(e)) {
				return // not reported past e yet
			}
			for i := 1; i < len(ps); i++ {
				c.add(ps[i-1], ps[i], s, e)
			}
		}
		st.frozen[s.UnixNano()] = c
		st.next = e
	}
}

// zeros returns the classes of m, each at 0: an instance's totals when it
// started.
func zeros(m map[string]int64) map[string]int64 {
	if m == nil {
		return nil
	}
	out := make(map[string]int64, len(m))
	for name := range m {
		out[name] = 0
	}
	return out
}

// add counts the admissions between two records a and b of one instance
// into the bucket [s, e), of all and of each class b names. A span inside
// the bucket counts whole; one that straddles an edge may have admitted
// anything from none to all of its admissions in the bucket, so it makes
// the count an estimate.
//
// A class a does not name is new to the instance's limiter, which counts
// it from 0; one whose total fell was counted anew (the limiter keeps a
// class's counts across a change of the classes, so only a class dropped
// and listed again does), and counts from 0 as well.
func (c *bucketCount) add(a, b sample, s, e time.Time) {
	lo, hi := maxTime(a.at, s), minTime(b.at, e)
	if !hi.After(lo) {
		return
	}
	c.tally(float64(b.admitted-a.admitted), a.at, b.at, s, e, lo, hi)
	for name, m := range b.classes {
		n := m - a.classes[name]
		if n < 0 {
			n = m
		}
		if c.classes == nil {
			c.classes = map[string]*bucketCount{}
		}
		cc := c.classes[name]
		if cc == nil {
			cc = &bucketCount{}
			c.classes[name] = cc
		}
		cc.tally(float64(n), a.at, b.at, s, e, lo, hi)
	}
}

// tally counts n admissions between records at at and bt into the bucket
// [s, e), whose part [lo, hi) the span covers.
func (c *bucketCount) tally(n float64, at, bt, s, e, lo, hi time.Time) {
	c.spread += n * float64(hi.Sub(lo)) / float64(bt.Sub(at))
	c.most += n
	if at.Before(s) || bt.After(e) {
		c.estimated = c.estimated || n > 0
		return
	}
	c.least += n
}

// prune forgets what no bucket to freeze needs, and what the chart no
// longer shows.
func (st *consoleState) prune(now time.Time) {
	for id, ps := range st.samples {
		// Keep the last sample at or before next: it starts the span into
		// the first bucket not frozen.
		i := 0
		for i+1 < len(ps) && !ps[i+1].at.After(st.next) {
			i++
		}
		ps = ps[i:]
		if !st.live[id] && (len(ps) == 0 || !ps[len(ps)-1].at.After(st.next)) {
			delete(st.samples, id)
			continue
		}
		st.samples[id] = ps
	}
	horizon := now.Add(-time.Duration(chartBuckets+1) * st.bucket)
	for start := range st.frozen {
		if time.Unix(0, start).Before(horizon) {
			delete(st.frozen, start)
		}
	}
	for id, g := range st.gone {
		if g.at.Before(horizon) {
			delete(st.gone, id)
		}
	}
	for len(st.shares) > 1 && !st.shares[1].from.After(horizon) {
		st.shares = st.shares[1:]
	}
}

// windowOf returns the provider's window: the config's, or the shares
// record's when the config is missing.
func windowOf(v statusView) time.Duration {
	switch {
	case v.Config != nil:
		return v.Config.Window.D()
	case v.Shares != nil:
		return v.Shares.Window.D()
	}
	return schema.DefaultWindow
}

// buildPanel returns the panel for a read of the provider, after
// st.observe folded it in.
func buildPanel(st *consoleState, v statusView, hist []schema.HistoryEntry, now time.Time) providerPanel {
	p := providerPanel{Provider: v.Provider, Found: true, Revision: v.ConfigRevision, Read: now,
		Instances: []instanceRow{}, Held: []heldRow{}, History: []historyRow{}, Classes: []classRow{}, PublishError: v.PublishError}
	if c := v.Config; c != nil {
		p.Config = &configView{Limit: c.Limit, Window: c.Window.String(), Mode: string(c.Mode), Algorithm: string(c.Algorithm),
			Pacing: c.Pacing, FailStatic: c.FailStaticOrDefault().String(), ClockBound: c.ClockBound().String(), Summary: summary(*c)}
		if more := moreLimits(*c); more != "none" {
			p.Config.MoreLimits = more
		}
		if len(c.Classes) > 0 {
			p.Config.Classes = c.ClassesString()
		}
		p.Config.Adaptive = adaptiveOf(*c)
	}
	if s := v.Shares; s != nil {
		sv := &sharesView{Generation: s.Generation, Total: s.Total, Instances: s.Instances, Window: s.Window.String(),
			EffectiveFrom: s.EffectiveTime().UTC(), PublishedBy: s.Leader, Published: s.Published.UTC()}
		for _, id := range s.Named() {
			sv.Sum += s.Shares[id]
			sv.Granted += s.Enforcing(id)
		}
		p.Shares = sv
	}
	if l := v.Ledger; l != nil {
		p.Ledger, p.LedgerOver = l.says(), l.over()
	}
	p.Leader, p.Election = electionSays(v)
	for _, m := range v.Malformed {
		p.Malformed = append(p.Malformed, fmt.Sprintf("%s (revision %d): %s", m.Key, m.Revision, m.Error))
	}
	live := map[string]bool{}
	for i, in := range v.Instances {
		live[in.ID] = true
		if i >= maxRows {
			p.MoreRows++
			continue
		}
		p.Instances = append(p.Instances, instanceRowOf(st, v, in))
	}
	p.Held = heldRows(st, v, live)
	p.Chart = chart(st, v, hist, now)
	p.Classes = classRows(st, v, hist, now)
	for i := len(hist) - 1; i >= 0 && len(p.History) < historyRows; i-- {
		h := hist[i]
		p.History = append(p.History, historyRow{When: h.When.UTC(), Who: h.Who, Revision: h.Revision, Change: describeChange(h.Old, h.New)})
	}
	return p
}

// electionSays names the leading replica and says what is wrong with the
// election, if anything.
func electionSays(v statusView) (leader, problem string) {
	switch {
	case v.ElectionError != "":
		return "", "the election could not be read: " + v.ElectionError
	case len(v.Election) == 0:
		return "", "no configd replica campaigns: the instances use the even split"
	case v.Election[0].Foreign != "":
		return "", "a foreign key blocks the election (" + v.Election[0].Foreign + "); configd serve removes it"
	}
	return v.Election[0].Replica, ""
}

// sourceName is how the console names a record's source.
func sourceName(s string) string {
	switch s {
	case schema.SourceShares:
		return "configd"
	case schema.SourceEven:
		return "even split"
	case "":
		return "unknown"
	}
	return s
}

// instanceRowOf describes one live instance, and says why it enforces
// what it does.
func instanceRowOf(st *consoleState, v statusView, in instanceView) instanceRow {
	row := instanceRow{ID: in.ID, Source: "unknown", Clock: "unknown"}
	sh := v.Shares
	if sh != nil {
		if in.HasShare {
			n := in.Share
			row.Share = &n
		}
		row.Granted = sh.Enforcing(in.ID)
	}
	r := in.Record
	if r == nil {
		row.Why = "its record is malformed (" + in.Error + "); it still counts as live, and configd keeps its last good values"
		row.Problem = true
		return row
	}
	row.Host, row.Demand, row.Admitted, row.Generation = r.Host, r.Demand, r.Admitted, r.AppliedGeneration
	row.LastSeen = r.Updated.UTC()
	if r.Updated.IsZero() {
		row.LastSeen = r.Started.UTC()
	}
	row.Source = sourceName(r.Source)
	if r.Source != "" {
		n := r.Enforced
		row.Enforced = &n
	}
	if r.ClockKnown {
		row.Clock = signedReadable(r.ClockOffset.D()) + " ± " + readable(r.ClockUncertainty.D())
	}
	if s := st.samples[in.ID]; len(s) >= 2 {
		a, b := s[len(s)-2], s[len(s)-1]
		w := windowOf(v)
		per := float64(b.admitted-a.admitted) * float64(w) / float64(b.at.Sub(a.at))
		row.AdmittedPerWindow = &per
		row.AdmittedOver = b.at.Sub(a.at).Round(time.Millisecond).String()
	}
	row.Why, row.Problem = whyInstance(v, in)
	return row
}

// readable formats a clock's offset or uncertainty as an operator reads it
// at a glance: "0.2 ms", "5.2 ms", "400 ms", "2.0 s". A tenth of a
// millisecond is finer than any NTP measurement here is sure of.
func readable(d time.Duration) string {
	a := d.Abs()
	switch {
	case a < 10*time.Millisecond-50*time.Microsecond:
		return fmt.Sprintf("%.1f ms", float64(a)/float64(time.Millisecond))
	case a < time.Second-500*time.Microsecond:
		return fmt.Sprintf("%.0f ms", float64(a)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.1f s", a.Seconds())
}

// signedReadable is readable with the offset's sign: "+0.2 ms", "−400 ms";
// an offset that rounds to nothing has none ("0.0 ms").
func signedReadable(d time.Duration) string {
	s := readable(d)
	switch {
	case s == "0.0 ms":
		return s
	case d < 0:
		return "−" + s
	}
	return "+" + s
}

// whyInstance says why a live instance enforces what it does, and whether
// an operator should look.
func whyInstance(v statusView, in instanceView) (string, bool) {
	r, sh := in.Record, v.Shares
	var bound time.Duration
	if v.Config != nil {
		bound = v.Config.ClockBound()
	}
	switch {
	case r.Leaving:
		return "leaving: it stopped admitting, and configd hands its share on as soon as its lease is revoked", false
	case r.Source == "":
		return "a member from before records said what they enforce: see its sluice_member_share_permits", false
	case r.Source == schema.SourceEven:
		return "on the even split: no configd replica was alive when it last wrote its record", true
	case r.Source == schema.SourceFallback:
		return "on its fallback quota: it has not seen the provider's config", true
	case r.Source == schema.SourceLapsed:
		return "its last share lapsed while etcd was out of reach: it starts from nothing, as a joining instance does", true
	case sh == nil:
		return "no shares published yet: it enforces nothing until configd's leader publishes", true
	case !in.HasShare:
		return fmt.Sprintf("joined after generation %d: it enforces nothing until configd names it in the next", sh.Generation), false
	}
	var parts []string
	share := in.Share
	// Counted at its grant only until it acknowledges its record; the
	// record keeps the grant a little longer (share.Bound).
	if g := sh.Enforcing(in.ID); g > share && r.AppliedGeneration < sh.GenerationOf(in.ID) {
		parts = append(parts, fmt.Sprintf("its share shrinks to %d: configd counts it at %d until it acknowledges generation %d, and grows no one into the difference before", share, g, sh.Generation))
	}
	if r.AppliedGeneration < sh.Generation {
		parts = append(parts, fmt.Sprintf("applies generation %d; generation %d is on its way (it takes effect at %s)", r.AppliedGeneration, sh.Generation, sh.EffectiveTime().UTC().Format("15:04:05.000")))
	}
	problem := false
	switch {
	case r.Enforced >= share || r.AppliedGeneration != sh.Generation:
	case !r.ClockKnown:
		parts = append(parts, fmt.Sprintf("enforces %d of its %d: its clock offset is not measured yet (or NTP does not answer), so it keeps half its share", r.Enforced, share))
		problem = true
	case r.ClockUncertainty.D() > bound:
		parts = append(parts, fmt.Sprintf("enforces %d of its %d: its guard band (%s) is wider than the provider's bound (%s), so it admits only in the part of each window its clock is sure of", r.Enforced, share, readable(r.ClockUncertainty.D()), readable(bound)))
		problem = true
	default:
		parts = append(parts, fmt.Sprintf("enforces %d of its %d", r.Enforced, share))
	}
	if share == 0 && len(parts) == 0 {
		parts = append(parts, "share 0: the handover has not freed permits for it yet")
	}
	if len(parts) == 0 {
		if !r.ClockKnown {
			return "enforces its share (its clock is not measured: it runs without a clock monitor, or it is measured and cut, see above)", false
		}
		return "enforces its share", false
	}
	return strings.Join(parts, "; "), problem
}

// heldRows lists what the shares record leaves to instances whose keys are
// gone, and why.
func heldRows(st *consoleState, v statusView, live map[string]bool) []heldRow {
	out := []heldRow{}
	sh := v.Shares
	if sh == nil {
		return out
	}
	var cfg schema.ProviderConfig
	if v.Config != nil {
		cfg = *v.Config
	}
	for _, id := range sh.Named() {
		if live[id] {
			continue
		}
		g := sh.Enforcing(id)
		if g == 0 {
			continue
		}
		row := heldRow{ID: id, Granted: g, Source: "fail-static"}
		gone, seen := st.gone[id]
		var fs time.Duration
		if seen && gone.rec != nil {
			fs = gone.rec.FailStatic.D()
		}
		left := seen && gone.rec != nil && gone.rec.Leaving
		hold := cfg.HoldAfter(fs) + cfg.Settle()
		if left {
			hold = cfg.Settle()
		}
		if seen {
			row.Since = gone.at.UTC()
			row.Until = gone.at.Add(hold).UTC()
		}
		switch {
		case left:
			row.Source = "left"
			row.Why = fmt.Sprintf("it left gracefully: configd keeps its %d reserved for %v (a window and twice the clock bound) after its key went, so that no instance grows a late record into a window it admitted in",
				g, hold.Round(time.Millisecond))
		case seen:
			row.Why = fmt.Sprintf("its lease expired (it did not leave): configd keeps its %d reserved for %v (fail_static %v, plus the clock bound %v, plus a window and twice the bound) after its key went, in case it is only cut off from etcd and still enforcing it",
				g, hold.Round(time.Millisecond), max(cfg.FailStaticOrDefault(), fs), cfg.ClockBound())
		default:
			row.Why = fmt.Sprintf("its key went before this console watched: configd keeps its %d reserved for up to %v after that (fail_static plus the clock bound, plus a window and twice the bound), in case it still enforces it", g, hold.Round(time.Millisecond))
		}
		out = append(out, row)
	}
	return out
}

// chart returns admitted per bucket against the limit and what configd
// granted, over the last chartBuckets buckets that ended by now.
//
// Admitted is what the instances reported: each record carries a running
// total, so two records of an instance give exactly what it admitted
// between them, spread evenly over that time here (records are written on
// a change worth telling, and at least every ten report intervals). Spread
// so, a bucket can show more than was admitted in it: such a point says it
// is an estimate, with the bounds the records allow. A bucket is shown once
// every live instance has reported past its end; admissions of an instance
// that died after its last record are not known.
func chart(st *consoleState, v statusView, hist []schema.HistoryEntry, now time.Time) chartView {
	w := windowOf(v)
	bucket, k := bucketOf(w)
	cv := chartView{Bucket: bucket.String(), Windows: k, Points: make([]chartPoint, 0, chartBuckets)}
	end := now.Truncate(bucket)
	for i := chartBuckets; i > 0; i-- {
		s := end.Add(-time.Duration(i) * bucket)
		pt := chartPoint{Start: s.UTC()}
		if c, ok := configAt(hist, v, s); ok {
			per := func(n int64) *float64 {
				x := float64(n) * float64(bucket) / float64(c.Window.D())
				return &x
			}
			pt.Limit = per(c.Limit)
			if av := adaptiveOf(c); av != nil {
				pt.Ceiling = per(av.Ceiling)
				if av.Shadow {
					pt.Shadow = per(av.Effective)
				}
			}
		}
		if g, ok := grantedAt(st.shares, s, bucket); ok {
			pt.Granted = &g
		}
		if c, ok := st.frozen[s.UnixNano()]; ok {
			pt.Admitted = &c.spread
			if c.estimated {
				pt.Estimated, pt.Least, pt.Most = true, &c.least, &c.most
			}
		}
		cv.Points = append(cv.Points, pt)
	}
	return cv
}

// classRows returns, for each of the provider's classes, its admissions
// in the chart's last classBuckets buckets against its reserve, counted
// from the records' running totals by class as the chart counts the
// total: exact where records fall on the bucket's edges, an estimate with
// its bounds where they straddle them. The reserve is the class's part of
// the limit then in force (ProviderConfig.Reserves), per bucket.
func classRows(st *consoleState, v statusView, hist []schema.HistoryEntry, now time.Time) []classRow {
	out := []classRow{}
	if v.Config == nil {
		return out
	}
	bucket, _ := bucketOf(windowOf(v))
	end := now.Truncate(bucket)
	reserves := v.Config.Reserves(v.Config.Limit)
	for ci, cl := range v.Config.Classes {
		row := classRow{Name: cl.Name, Reserve: float64(reserves[ci]) * float64(bucket) / float64(v.Config.Window.D()),
			Points: make([]classPoint, 0, classBuckets)}
		for i := classBuckets; i > 0; i-- {
			s := end.Add(-time.Duration(i) * bucket)
			pt := classPoint{Start: s.UTC()}
			if c, ok := configAt(hist, v, s); ok {
				if j := slices.IndexFunc(c.Classes, func(x schema.Class) bool { return x.Name == cl.Name }); j >= 0 {
					r := float64(c.Reserves(c.Limit)[j]) * float64(bucket) / float64(c.Window.D())
					pt.Reserve = &r
				}
			}
			if c, ok := st.frozen[s.UnixNano()]; ok {
				cc := c.classes[cl.Name]
				if cc == nil {
					cc = &bucketCount{}
				}
				pt.Admitted = &cc.spread
				if cc.estimated {
					pt.Estimated, pt.Least, pt.Most = true, &cc.least, &cc.most
				}
			}
			row.Points = append(row.Points, pt)
		}
		out = append(out, row)
	}
	return out
}

// configAt returns the config in force at t by the history, or the
// current config when history has nothing that old.
func configAt(hist []schema.HistoryEntry, v statusView, t time.Time) (schema.ProviderConfig, bool) {
	for i := len(hist) - 1; i >= 0; i-- {
		h := hist[i]
		if h.When.After(t) {
			continue
		}
		if h.New == nil {
			return schema.ProviderConfig{}, false // deleted
		}
		return *h.New, true
	}
	if len(hist) == 0 && v.Config != nil {
		return *v.Config, true
	}
	return schema.ProviderConfig{}, false
}

// grantedAt returns what configd granted in total at t, per bucket.
func grantedAt(ps []sharesPoint, t time.Time, bucket time.Duration) (float64, bool) {
	for i := len(ps) - 1; i >= 0; i-- {
		if !ps[i].from.After(t) {
			return float64(ps[i].granted) * float64(bucket) / float64(ps[i].window), true
		}
	}
	return 0, false
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
