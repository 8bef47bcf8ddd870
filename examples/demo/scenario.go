package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/sluice-go/sluice/internal/ledger"
	ledgerstore "github.com/sluice-go/sluice/internal/ledger/store"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/internal/stub"
)

// sampleEvery is how often the instances' metrics are read (and events'
// follow conditions checked); the view is redrawn every viewEvery.
const (
	sampleEvery = 250 * time.Millisecond
	viewEvery   = time.Second
)

// The instances' offered loads (calls per second), before and after the
// "load moves" event. They are chosen so that the fair allocation moves:
// before, load-2 wants less than an equal part and gets its demand while
// load-1 gets more; after, load-1 wants less than an equal part, so load-2
// gets more than load-1 (TestLoadMoveMovesFairShares checks it with
// configd's allocator, for the default limit). A load-1 still wanting an
// equal part or more would leave every share equal, and the event's check
// could then pass only because of a later event.
var (
	startLoads = []struct {
		id, kind string
		rate     int
	}{{"load-1", "load", 300}, {"load-2", "load", 60}, {"load-3", "load", 150}, {"kafka-1", "kafka", 120}, {"http-1", "http", 100}}
	movedLoad1, movedLoad2 = 20, 320
)

// event is one thing the demo does to the running system, and the
// condition that says the grants followed it. Its condition is checked
// only until the next event: what follows after that may be the next
// event's doing, so it is not counted as this one's.
type event struct {
	name, what string
	followWhat string
	at         time.Time
	membership bool // it changed the set of instances
	check      func(d *demo) bool
	followed   time.Duration
	done       bool
	closedBy   *event // the next event, when it came before the condition held
}

// scenario starts the instances, waits until they all hold a grant of
// the ledger, then runs the timeline for cfg.duration while the sampler
// shows the view.
func (d *demo) scenario(ctx context.Context) error {
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go d.followLedger(wctx)

	for _, s := range startLoads {
		if _, err := d.startInstance(ctx, s.id, s.kind, s.rate); err != nil {
			return err
		}
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	sctx, stopSampler := context.WithCancel(ctx)
	defer stopSampler()
	ready := make(chan struct{})
	wg.Go(func() { d.sampler(sctx, ready) })
	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		return fmt.Errorf("the instances did not all get a grant of the ledger within 60s (see the logs with -keep)")
	case <-ctx.Done():
		return ctx.Err()
	}

	var shot *shooter
	if d.cfg.shot != "" {
		var err error
		if shot, err = d.openConsole(ctx); err != nil {
			return err
		}
		defer shot.close()
	}

	D := d.cfg.duration
	start := d.out.startTime()
	at := timeline(D)
	steps := []struct {
		at time.Duration
		do func() error
	}{
		{at[0], func() error { return d.moveLoad() }},
		{at[1], func() error { return d.retune(ctx) }},
		{at[2], func() error { return d.kill() }},
		{at[3], func() error { return d.join(ctx) }},
		{at[4], func() error { return d.skewClock(ctx) }},
	}
	for _, s := range steps {
		if err := sleepUntil(ctx, start.Add(s.at)); err != nil {
			return err
		}
		if err := s.do(); err != nil {
			return err
		}
	}
	if err := sleepUntil(ctx, start.Add(D)); err != nil {
		return err
	}
	if shot != nil {
		if err := shot.take(d, d.cfg.shot); err != nil {
			return err
		}
	}
	d.out.linef("the scenario's %v are over: stopping everything", D)
	return nil
}

// crashFollows is how long the crash takes to follow on the ledger: the
// killed instance's lease expires (leaseTTL at most), its last grant
// ends up to a horizon later (the provider's fail_static in windows, at
// least 4) and a window (a publish starts up to a window past the
// horizon), and the others are granted its room in the window after.
// With one window fewer (8s) a 25s run once did not follow in time.
const crashFollows = leaseTTL + max(failStatic, 4*window) + 2*window

// timeline returns when, in a scenario of d, the five events happen:
// at 18%, 34%, 48%, 64% and 76% of it, except that the crash is given
// crashFollows before the next event (up to half the scenario), the
// other stretches shrinking alike to make room. The crash's room is
// freed only at its grants' end, so in a short run (25 s) 16% of it is
// too little.
func timeline(d time.Duration) [5]time.Duration {
	// The stretches before each event and after the last; the crash's
	// is the fourth.
	parts := [6]float64{0.18, 0.16, 0.14, 0.16, 0.12, 0.24}
	crash := max(time.Duration(parts[3]*float64(d)), min(crashFollows, d/2))
	scale := float64(d-crash) / (1 - parts[3])
	var at [5]time.Duration
	var t time.Duration
	for i := range at {
		if i == 3 {
			t += crash
		} else {
			t += time.Duration(parts[i] * scale)
		}
		at[i] = t
	}
	return at
}

func sleepUntil(ctx context.Context, t time.Time) error {
	select {
	case <-time.After(time.Until(t)):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// addEvent records an event and prints it. An earlier event whose
// condition has not held yet is closed: from now on, what happens may be
// this event's doing.
func (d *demo) addEvent(e *event) {
	e.at = time.Now()
	d.mu.Lock()
	var closed []*event
	for _, prev := range d.events {
		if !prev.done && prev.closedBy == nil {
			prev.closedBy = e
			closed = append(closed, prev)
		}
	}
	d.events = append(d.events, e)
	n := len(d.events)
	d.mu.Unlock()
	for _, prev := range closed {
		d.out.linef("%q did not follow before the next event (%s): %s", prev.name, e.name, prev.followWhat)
	}
	d.out.linef("EVENT %d %s: %s", n, e.name, e.what)
}

// checkEvents checks the open events' conditions at now and returns a line
// for each that holds now. d.mu is held.
func (d *demo) checkEvents(now time.Time) []string {
	var followed []string
	for _, e := range d.events {
		if !e.done && e.closedBy == nil && e.check(d) {
			e.done, e.followed = true, now.Sub(e.at)
			followed = append(followed, fmt.Sprintf("followed %q in %.1fs: %s", e.name, e.followed.Seconds(), e.followWhat))
		}
	}
	return followed
}

func (d *demo) byID(id string) *instance {
	for _, in := range d.insts {
		if in.id == id && in.gone == "" {
			return in
		}
	}
	return nil
}

// share returns the quota instance id enforces (its member's metric), -1
// if unknown.
func (d *demo) share(id string) float64 {
	in := d.byID(id)
	if in == nil {
		return -1
	}
	v, ok := in.m.get("sluice_member_share_permits")
	if !ok {
		return -1
	}
	return v
}

// get is byID with d.mu taken.
func (d *demo) get(id string) *instance {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.byID(id)
}

func (d *demo) moveLoad() error {
	l1, l2 := d.get("load-1"), d.get("load-2")
	d.mu.Lock()
	r1, r2 := l1.rate, l2.rate
	was1, was2 := d.share("load-1"), d.share("load-2")
	d.mu.Unlock()
	d.addEvent(&event{
		name: "load moves", what: fmt.Sprintf("load-1 %d → %d/s, load-2 %d → %d/s (nothing else changes; grants now load-1 %.0f, load-2 %.0f)",
			r1, movedLoad1, r2, movedLoad2, was1, was2),
		followWhat: fmt.Sprintf("under fair, load-2's grant grew past its %.0f and passed load-1's, which shrank below its %.0f", was2, was1),
		check: func(d *demo) bool {
			s1, s2 := d.share("load-1"), d.share("load-2")
			return s1 >= 0 && s2 > was2 && s1 < was1 && s2 > s1
		},
	})
	d.setRate(l1, movedLoad1)
	d.setRate(l2, movedLoad2)
	return nil
}

func (d *demo) retune(ctx context.Context) error {
	old, to := d.cfg.limit, d.cfg.retuneTo
	d.addEvent(&event{
		name: "retune", what: fmt.Sprintf("the provider now allows %d/s: the stub's limit is raised first, then the operator retunes sluice", to),
		followWhat: fmt.Sprintf("the ledger's limit is %d, and the grants the instances enforce add up to ≥ 99%% of it", to),
		check: func(d *demo) bool {
			if _, limit, ok := d.granted(time.Now()); !ok || limit != to {
				return false
			}
			var sum float64
			for _, in := range d.insts {
				if in.gone == "" {
					sum += in.m.value("sluice_member_share_permits")
				}
			}
			return sum >= 0.99*float64(to)
		},
	})
	if to > old {
		d.stub.SetLimit(to)
	}
	err := d.configdCLI(ctx, "set", provider, "--limit", fmt.Sprint(to))
	if to < old {
		d.stub.SetLimit(to)
	}
	return err
}

func (d *demo) kill() error {
	in := d.get("load-3")
	d.addEvent(&event{
		name: "crash", what: fmt.Sprintf("$ kill -KILL %d   (load-3: no goodbye; its lease expires after %v)", in.p.Pid(), leaseTTL),
		followWhat: fmt.Sprintf("the ledger grants load-3 nothing in the window now and the others the whole limit: configd handed them load-3's room once its grants had ended (an instance whose lease expired may only be cut off from etcd, and keeps enforcing its grants until their end, the provider's fail_static of %v past its lease at most)", failStatic),
		membership: true,
		check: func(d *demo) bool {
			alw, limit, ok := d.granted(time.Now())
			if !ok {
				return false
			}
			var sum int64
			for holder, q := range alw {
				if strings.HasPrefix(holder, "load-3.") {
					return false
				}
				sum += q
			}
			return sum == limit
		},
	})
	d.stopInstance(in, true)
	return nil
}

func (d *demo) join(ctx context.Context) error {
	d.addEvent(&event{
		name: "join", what: "a new instance, load-4, starts offering 200/s",
		followWhat: "load-4 enforces a grant of configd's ledger", membership: true,
		check: func(d *demo) bool {
			in := d.byID("load-4")
			return in != nil && d.share("load-4") > 0 && in.m.source() == schema.SourceLedger
		},
	})
	_, err := d.startInstance(ctx, "load-4", "load", 200)
	return err
}

func (d *demo) skewClock(ctx context.Context) error {
	old := d.get("load-1")
	d.addEvent(&event{
		name: "clock", what: fmt.Sprintf("load-1 restarts on a host whose clock is %v fast (-clock-skew %v); its NTP monitor must find it", skewAfter, skewAfter),
		followWhat: fmt.Sprintf("load-1 measured its offset (≈ -%v), corrects its windows by it, and enforces a grant again "+
			"(until its offset is measured it keeps only half its grant, and while its guard band is wider than the provider's clock bound it admits only in the part of each window its clock is sure of)", skewAfter),
		membership: true,
		check: func(d *demo) bool {
			in := d.byID("load-1")
			if in == nil || in.note == "" {
				return false
			}
			off := in.m.value("sluice_limiter_clock_offset_seconds")
			return in.m.value("sluice_member_clock_known") == 1 && math.Abs(off+skewAfter.Seconds()) < 0.05 && d.share("load-1") > 0
		},
	})
	d.mu.Lock()
	rate := old.rate
	d.mu.Unlock()
	d.stopInstance(old, false)
	d.mu.Lock()
	d.insts = slices.DeleteFunc(d.insts, func(in *instance) bool { return in == old })
	d.mu.Unlock()
	in, err := d.startInstance(ctx, "load-1", "load", rate, "-clock-skew", skewAfter.String())
	if err != nil {
		return err
	}
	d.mu.Lock()
	in.note = "clock +" + skewAfter.String()
	d.mu.Unlock()
	return nil
}

func sum(m map[string]int64) (s int64) {
	for _, v := range m {
		s += v
	}
	return s
}

// followLedger reads the provider's ledger, where configd grants the
// instances their room, every sampleEvery until ctx ends.
func (d *demo) followLedger(ctx context.Context) {
	keys := ledger.Keys(schema.DefaultKeys().Ledger(provider))
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, sampleEvery)
		st, _, _, _, err := ledgerstore.Read(rctx, d.cli, keys)
		cancel()
		if err == nil {
			d.mu.Lock()
			d.ledger = st
			alw, _, _ := d.granted(time.Now())
			for _, q := range alw {
				d.maxShare = max(d.maxShare, q)
			}
			d.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// granted returns what the ledger, as last read, grants each holder in
// the window of now (holders are named "<instance id>.<incarnation>"),
// and its limit for that window; ok is false while it holds no era.
// d.mu is held.
func (d *demo) granted(now time.Time) (alw map[string]int64, limit int64, ok bool) {
	if d.ledger == nil {
		return nil, 0, false
	}
	era, ok := d.ledger.Head.Current()
	if !ok {
		return nil, 0, false
	}
	k := ledger.WindowOf(now.UnixNano(), era.Window)
	return d.ledger.Allowances(era.Seq, k), era.Limit(k), true
}

// sampler reads every live instance's metrics each sampleEvery, checks the
// events' follow conditions, and redraws the view each viewEvery. It
// closes ready once every instance enforces a grant of configd's ledger,
// and starts the scenario's clock then.
func (d *demo) sampler(ctx context.Context, ready chan struct{}) {
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	lastView := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		d.mu.Lock()
		live := slices.DeleteFunc(slices.Clone(d.insts), func(in *instance) bool { return in.gone != "" })
		d.mu.Unlock()
		got := make([]metrics, len(live))
		var wg sync.WaitGroup
		for i, in := range live {
			wg.Go(func() {
				if m, err := scrape(ctx, d.client, in.metricsURL); err == nil {
					got[i] = m
				}
			})
		}
		wg.Wait()
		now := time.Now()
		d.mu.Lock()
		for i, in := range live {
			if got[i] != nil && in.gone == "" {
				in.m = got[i]
			}
		}
		if ready != nil && d.allHoldGrants() {
			close(ready)
			ready = nil
			d.out.begin(now)
			d.out.linef("every instance enforces a grant of configd's ledger: the scenario starts")
		}
		followed := d.checkEvents(now)
		var view string
		if el := now.Sub(lastView); el >= viewEvery-sampleEvery/2 {
			d.rates(el)
			lastView = now
			if ready == nil && (d.cfg.table || d.out.tty) {
				view = d.render()
			}
		}
		d.mu.Unlock()
		for _, l := range followed {
			d.out.linef("%s", l)
		}
		if view != "" {
			d.out.view(view)
		}
	}
}

// allHoldGrants reports whether every live instance enforces a grant of
// configd's ledger. d.mu is held.
func (d *demo) allHoldGrants() bool {
	for _, in := range d.insts {
		if in.gone == "" && (in.m.source() != schema.SourceLedger || in.m.value("sluice_member_share_permits") <= 0) {
			return false
		}
	}
	return len(d.insts) > 0
}

// rates turns counters into per-second rates over el. d.mu is held.
func (d *demo) rates(el time.Duration) {
	for _, in := range d.insts {
		if in.gone != "" || in.m == nil {
			continue
		}
		adm := in.m.value("sluice_limiter_permits_total", "outcome", "admitted")
		off, ref := in.m.value("sluice_example_offered_total"), in.m.value("sluice_example_refused_total")
		if in.driver != nil {
			st := in.driver.Stats()
			off, ref = float64(st.Offered), float64(st.Refused)
		}
		s := el.Seconds()
		in.rates = [3]float64{(off - in.offered) / s, (adm - in.admitted) / s, (ref - in.refused) / s}
		in.offered, in.admitted, in.refused = off, adm, ref
	}
}

// render formats the view. d.mu is held.
func (d *demo) render() string {
	var b strings.Builder
	last, _ := d.stub.Last()
	flag := "ok"
	if last.Over() {
		flag = "OVER THE LIMIT"
	}
	busiest := "none yet"
	if w := busiestWindow(d.stub.Windows()); w.Limit > 0 {
		busiest = fmt.Sprintf("%d/%d", w.Calls, w.Limit)
	}
	alw, limit, _ := d.granted(time.Now())
	fmt.Fprintf(&b, "provider %s: window %s  %d/%d calls (%s)   busiest window so far %s   configd's ledger: %d granted of %d to %d instances this window\n",
		provider, last.Start.Format("15:04:05"), last.Calls, last.Limit, flag, busiest, sum(alw), limit, len(alw))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "instance\tkind\toffered/s\tadmitted/s\trefused/s\tkafka lag\twaiting\tdemand\tgrant\tsource\tclock offset\tnote\t")
	for _, in := range d.insts {
		if in.gone != "" {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\t%s\t\n", in.id, in.kind, in.gone)
			continue
		}
		m := in.m
		lag := "-"
		if in.kind == "kafka" {
			lag = fmt.Sprintf("%.0f", m.value("sluice_example_lag_messages"))
		}
		clock := "unknown"
		if m.value("sluice_member_clock_known") == 1 {
			clock = (time.Duration(m.value("sluice_limiter_clock_offset_seconds") * 1e9)).Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%.0f\t%s\t%.0f\t%.0f\t%.0f\t%s\t%s\t%s\t\n", in.id, in.kind,
			in.rates[0], in.rates[1], in.rates[2], lag, m.value("sluice_limiter_waiting_permits"),
			m.value("sluice_member_demand_permits"), m.value("sluice_member_share_permits"), m.source(), clock, in.note)
	}
	tw.Flush()
	return b.String()
}

func busiestWindow(ws []stub.Window) stub.Window {
	var best stub.Window
	for _, w := range ws {
		if w.Calls > best.Calls {
			best = w
		}
	}
	return best
}
