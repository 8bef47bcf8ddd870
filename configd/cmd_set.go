package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

const setUsage = `Usage: configd set NAME --limit [DIM=]N[/W] [--limit [DIM=]N/W ...] [--only] [--window 1s]
                   [--mode enforce|shadow] [--algorithm even|fair]
                   [--pacing] [--floor N] [--max-clock-offset D] [--fail-static D]
                   [--adaptive floor=N[,shadow]|off] [--coordination shares|ledger]
                   [--class NAME[=RESERVE] ...|--no-classes]
                   [--if-revision R] [--dry-run]

Creates provider NAME or changes it, and prints the change (old → new). Flags
not given keep their current values (or defaults for a new provider: window
1s, mode enforce, algorithm even, no pacing). --limit is required to create.

The write is a transaction on the revision read: if someone else changes the
provider in between, set fails with a conflict instead of overwriting it.
--if-revision R makes the write conditional on revision R (from 'configd get';
0 means "only if it does not exist yet").

A provider may hold up to 4 limits, enforced together: "100 per second and
50,000 per hour", "500 requests and 200,000 tokens per minute". Give --limit
once per limit; the provider's limits become those given, and one no longer
given is removed (with --only, a lone --limit removes the others too). A lone
--limit changes the limit of its dimension (the first limit's when it names
none; give the window where a dimension has several) and keeps the others.
Instances enforce every limit when they join with cluster.JoinProvider.

A provider may list up to 8 priority classes, highest first: give --class
once per class, in order; the provider's classes become those given.
NAME=RESERVE keeps part of the limit for the class in every window, a count
(critical=600) or a share of the limit (critical=60%); the reserves add up
to at most the limit. --no-classes removes them. Under the ledger (the
default) each reserve is kept across the fleet.

Examples:
  configd set payments --limit 300000
  configd set payments --limit 5000/1m
  configd set llm-tokens --limit tokens=200000/1m
  configd set llm --limit 500/1m --limit tokens=200000/1m
  configd set payments --limit 100/1s --limit 50000/1h
  configd set payments --limit 100/1s --only
  configd set payments --limit 250000 --window 100ms --pacing
  configd set payments --mode shadow --if-revision 42
  configd set llm --limit 1000/1s --adaptive floor=200
  configd set api --limit 1000/1s --class critical=60% --class default --class batch

Flags:
`

// optString is a string flag that remembers whether it was given.
type optString struct {
	val string
	set bool
}

func (o *optString) String() string     { return o.val }
func (o *optString) Set(s string) error { o.val, o.set = s, true; return nil }

// revision parses an --if-revision value for command cmd: anyRevision when
// the flag was not given, else a revision number of at least least (set
// allows 0: "the provider must not exist yet").
func (o *optString) revision(cmd string, least int64) (int64, error) {
	if !o.set {
		return anyRevision, nil
	}
	rev, err := strconv.ParseInt(o.val, 10, 64)
	if err != nil || rev < least {
		return 0, usageErrorf("%s: --if-revision must be a revision number >= %d, got %q", cmd, least, o.val)
	}
	return rev, nil
}

// edit is a change to a provider's config as an operator gives it: only
// the fields given, as typed. set's flags fill it, and so does the
// console's preview, so that both parse and check a change alike.
type edit struct {
	limit, window, mode, algorithm, floor, maxOffset, failStatic optString
	coordination                                                 optString
	pacing                                                       *bool // nil: not given
	// adaptive is --adaptive: "off", or floor=N[,shadow|enforce]
	// [,decrease=F][,probe=F] (applyAdaptive).
	adaptive optString
	// more are the --limit flags after the first, and only says the
	// limits given are all the provider's: then the provider's limits
	// become those given (setLimits). A lone --limit changes the one it
	// names (changeLimit).
	more []string
	only bool
	// classes are the --class flags, in order: given, they are the
	// provider's classes; noClasses removes them.
	classes   []string
	noClasses bool
}

// apply returns cfg with the fields e gives changed, validated. Fields not
// given keep their values.
func (e edit) apply(cfg schema.ProviderConfig) (schema.ProviderConfig, error) {
	var err error
	switch {
	case e.limit.set && (len(e.more) > 0 || e.only):
		if cfg, err = e.setLimits(cfg); err != nil {
			return cfg, err
		}
	case e.limit.set:
		if cfg, err = e.changeLimit(cfg); err != nil {
			return cfg, err
		}
	case e.only:
		return cfg, usageErrorf("--only says the --limit flags given are all the provider's limits: give them")
	}
	if e.limit.set && cfg.Adaptive != nil {
		// The operator's limit is the ceiling; the effective limit starts
		// from it again.
		a := *cfg.Adaptive
		a.Ceiling, a.Effective, a.PauseUntil, a.Reason = cfg.Limit, 0, time.Time{}, ""
		cfg.Adaptive = &a
	}
	if e.adaptive.set {
		if cfg, err = applyAdaptive(cfg, e.adaptive.val); err != nil {
			return cfg, err
		}
	}
	if e.window.set {
		w, err := schema.ParseWindow(e.window.val)
		if err != nil {
			return cfg, err
		}
		cfg.Window = schema.Duration(w)
	}
	if e.mode.set {
		cfg.Mode = schema.Mode(e.mode.val)
	}
	if e.algorithm.set {
		cfg.Algorithm = schema.Algorithm(e.algorithm.val)
	}
	if e.pacing != nil {
		cfg.Pacing = *e.pacing
	}
	if e.floor.set {
		n, err := strconv.ParseInt(e.floor.val, 10, 64)
		if err != nil {
			return cfg, &schema.ValidationError{Field: "floor", Value: strconv.Quote(e.floor.val), Err: schema.ErrInvalidFloor}
		}
		cfg.Floor = n
	}
	if e.maxOffset.set {
		d, err := time.ParseDuration(e.maxOffset.val)
		if err != nil {
			return cfg, &schema.ValidationError{Field: "max_clock_offset", Value: strconv.Quote(e.maxOffset.val), Err: schema.ErrInvalidClockOffset}
		}
		cfg.MaxClockOffset = schema.Duration(d)
	}
	if e.failStatic.set {
		d, err := time.ParseDuration(e.failStatic.val)
		if err != nil {
			return cfg, &schema.ValidationError{Field: "fail_static", Value: strconv.Quote(e.failStatic.val), Err: schema.ErrInvalidFailStatic}
		}
		cfg.FailStatic = schema.Duration(d)
	}
	if e.coordination.set {
		cfg.Coordination = schema.Coordination(e.coordination.val)
	}
	if cfg, err = e.applyClasses(cfg); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// applyClasses makes the --class flags given the provider's classes, in
// their order, or removes them for --no-classes. Each is checked as it is
// parsed; the list as a whole (unique names, reserves within the limit) by
// Validate.
func (e edit) applyClasses(cfg schema.ProviderConfig) (schema.ProviderConfig, error) {
	switch {
	case e.noClasses && len(e.classes) > 0:
		return cfg, usageErrorf("--no-classes removes the provider's classes: give it without --class")
	case e.noClasses:
		cfg.Classes = nil
	case len(e.classes) > 0:
		classes := make([]schema.Class, 0, len(e.classes))
		for _, v := range e.classes {
			cl, err := schema.ParseClass(v)
			if err != nil {
				return cfg, err
			}
			classes = append(classes, cl)
		}
		cfg.Classes = classes
	}
	return cfg, nil
}

// classFlag is --class, given once per class.
type classFlag struct{ e *edit }

func (c classFlag) String() string {
	if c.e == nil {
		return ""
	}
	return strings.Join(c.e.classes, ",")
}

func (c classFlag) Set(s string) error {
	if len(c.e.classes) >= schema.MaxClasses {
		return fmt.Errorf("a provider has at most %d classes", schema.MaxClasses)
	}
	c.e.classes = append(c.e.classes, s)
	return nil
}

// applyAdaptive applies an --adaptive value to cfg: "off" restores the
// ceiling as the limit; otherwise comma-separated settings: floor=N (the
// least effective limit; default 10% of the ceiling), shadow or enforce,
// decrease=F and probe=F (the controller's; see configd/adapt). Turning
// it on makes the limit the ceiling; the effective limit stays within
// the new floor and the ceiling.
func applyAdaptive(cfg schema.ProviderConfig, spec string) (schema.ProviderConfig, error) {
	bad := func(why string) error {
		return &schema.ValidationError{Field: "adaptive", Value: strconv.Quote(spec), Err: fmt.Errorf("%w: %s", schema.ErrInvalidAdaptive, why)}
	}
	if strings.TrimSpace(spec) == "off" {
		if cfg.Adaptive != nil {
			cfg.Limit, cfg.Adaptive = cfg.Adaptive.Ceiling, nil
		}
		return cfg, nil
	}
	var a schema.Adaptive
	if cfg.Adaptive != nil {
		a = *cfg.Adaptive
	} else {
		a = schema.Adaptive{Ceiling: cfg.Limit, Floor: max(1, cfg.Limit/10)}
	}
	for part := range strings.SplitSeq(spec, ",") {
		k, v, hasValue := strings.Cut(strings.TrimSpace(part), "=")
		var err error
		switch {
		case k == "shadow" && !hasValue:
			a.Shadow = true
		case k == "enforce" && !hasValue:
			a.Shadow, a.Effective = false, 0
		case k == "floor" && hasValue:
			a.Floor, err = strconv.ParseInt(v, 10, 64)
		case k == "decrease" && hasValue:
			a.Decrease, err = strconv.ParseFloat(v, 64)
		case k == "probe" && hasValue:
			a.Probe, err = strconv.ParseFloat(v, 64)
		default:
			return cfg, bad(fmt.Sprintf("unknown setting %q (want off, or floor=N, shadow, enforce, decrease=F, probe=F)", part))
		}
		if err != nil {
			return cfg, bad(fmt.Sprintf("%s: not a number: %q", k, v))
		}
	}
	if a.Shadow {
		cfg.Limit = a.Ceiling
	} else {
		cfg.Limit = min(max(cfg.Limit, a.Floor), a.Ceiling)
	}
	cfg.Adaptive = &a
	return cfg, nil
}

// applyLimit sets cfg's limit from --limit, [DIMENSION=]N[/W]: "100/1s"
// is 100 per 1 s window, and then --window may not say otherwise;
// "tokens=200000/1m" counts tokens. Without a dimension the provider's
// stays as it is.
func (e edit) applyLimit(cfg schema.ProviderConfig) (schema.ProviderConfig, error) {
	amount, window, rate := strings.Cut(e.limit.val, "/")
	if dim, n, named := strings.Cut(amount, "="); named {
		if err := limiter.ValidateDimension(dim); err != nil {
			return cfg, &schema.ValidationError{Field: "dimension", Value: strconv.Quote(dim), Err: schema.ErrInvalidDimension}
		}
		cfg.Dimension, amount = dim, n
		if dim == limiter.Requests {
			cfg.Dimension = ""
		}
	}
	var err error
	if cfg.Limit, err = schema.ParseLimit(amount); err != nil || !rate {
		return cfg, err
	}
	w, err := schema.ParseLimitWindow(window) // a first limit's is checked by Validate
	if err != nil {
		return cfg, err
	}
	if e.window.set {
		if other, err := schema.ParseWindow(e.window.val); err == nil && other != w {
			return cfg, usageErrorf("--limit %s names window %v, and --window says %v: give the window once", e.limit.val, w, other)
		}
	}
	cfg.Window = schema.Duration(w)
	return cfg, nil
}

// changeLimit applies a lone --limit to the limit of cfg it names: the
// first if it counts the first's dimension (in the first's window, or no
// other of that dimension has the window named), else the further limit
// of that dimension (and window, if several). A provider of one limit
// takes it as before (applyLimit). Found by a new user: a lone --limit
// tokens=100000/1m on a provider of 600/1m and tokens=150000/1m turned
// the first limit into tokens instead of changing the second.
func (e edit) changeLimit(cfg schema.ProviderConfig) (schema.ProviderConfig, error) {
	if len(cfg.InForce()) == 1 {
		return e.applyLimit(cfg)
	}
	one, err := edit{limit: e.limit}.applyLimit(schema.ProviderConfig{Window: cfg.Window, Dimension: cfg.Dimension})
	if err != nil {
		return cfg, err
	}
	_, w, windowNamed := strings.Cut(e.limit.val, "/")
	windowNamed = windowNamed && w != ""
	if !windowNamed && e.window.set {
		return cfg, usageErrorf("--window applies to a provider of one limit; give the limit's window as N/W (100/1s)")
	}
	var same []int // further limits in force of the dimension named
	exact := -1
	for j, l := range cfg.Lanes {
		if !l.Retired && l.DimensionOrDefault() == (schema.Lane{Dimension: one.Dimension}).DimensionOrDefault() {
			same = append(same, j)
			if windowNamed && l.Window == one.Window {
				exact = j
			}
		}
	}
	first := one.Dimension == cfg.Dimension
	switch {
	case exact < 0 && first:
		return e.applyLimit(cfg)
	case exact < 0 && len(same) == 0:
		return cfg, usageErrorf("--limit %s: the provider has no limit of %s; give all its limits, --limit once each, to add one", e.limit.val, schema.Lane{Dimension: one.Dimension}.DimensionOrDefault())
	case exact < 0 && len(same) > 1:
		return cfg, usageErrorf("--limit %s: the provider has several limits of %s; name the window of the one to change (N/W)", e.limit.val, schema.Lane{Dimension: one.Dimension}.DimensionOrDefault())
	case exact < 0:
		exact = same[0]
	}
	lanes := slices.Clone(cfg.Lanes)
	lanes[exact].Limit = one.Limit
	if windowNamed {
		if lanes[exact].Window != one.Window && (schema.IsBudget(lanes[exact].Window.D()) || schema.IsBudget(one.Window.D())) {
			// Another limit: a budget's counters are of its window
			// (schema.NumberLanes gives it a lane of its own).
			lanes[exact].Lane = 0
		}
		lanes[exact].Window = one.Window
	}
	cfg.Lanes = lanes
	return cfg, nil
}

// setLimits makes the limits --limit gives all of cfg's: the one that
// counts what cfg's first limit counts (in the same window if one does)
// stays first, so that the instances' first lane keeps its dimension (for
// a new provider, the first given), but never a budget (a window over
// schema.MaxWindow, which only a further limit may have), and
// the others become lanes (numbered when written: schema.NumberLanes,
// which retires the lanes not given). A limit without a window takes
// --window, or else the first limit's window.
func (e edit) setLimits(cfg schema.ProviderConfig) (schema.ProviderConfig, error) {
	if e.window.set {
		return cfg, usageErrorf("--window applies to a lone --limit; give each limit's window as N/W (100/1s)")
	}
	given := make([]schema.Lane, 0, 1+len(e.more))
	for _, v := range append([]string{e.limit.val}, e.more...) {
		one, err := edit{limit: optString{val: v, set: true}}.applyLimit(schema.ProviderConfig{Window: cfg.Window})
		if err != nil {
			return cfg, err
		}
		given = append(given, schema.Lane{Dimension: one.Dimension, Limit: one.Limit, Window: one.Window})
	}
	shared := func(l schema.Lane) bool { return !schema.IsBudget(l.Window.D()) }
	first := slices.IndexFunc(given, func(l schema.Lane) bool { return l.Dimension == cfg.Dimension && l.Window == cfg.Window })
	if cfg.Limit == 0 { // a new provider: the first given that configd shares
		first = slices.IndexFunc(given, shared)
	}
	if first < 0 {
		first = slices.IndexFunc(given, func(l schema.Lane) bool { return l.Dimension == cfg.Dimension && shared(l) })
	}
	if first < 0 {
		first = slices.IndexFunc(given, shared)
	}
	if first < 0 {
		return cfg, usageErrorf("every --limit given has a window over %v: a provider's first limit is shared by configd, up to %v; give one beside the others (--limit 100/1s --limit %s)", schema.MaxWindow, schema.MaxWindow, given[0])
	}
	cfg.Dimension, cfg.Limit, cfg.Window = given[first].Dimension, given[first].Limit, given[first].Window
	cfg.Lanes = slices.Delete(given, first, first+1)
	return cfg, nil
}

// limitFlag is --limit: the first is edit.limit, the others edit.more.
type limitFlag struct{ e *edit }

func (l limitFlag) String() string {
	if l.e == nil {
		return ""
	}
	return l.e.limit.val
}

func (l limitFlag) Set(s string) error {
	if !l.e.limit.set {
		return l.e.limit.Set(s)
	}
	if 1+len(l.e.more) >= schema.MaxLimits {
		return fmt.Errorf("a provider enforces at most %d limits together", schema.MaxLimits)
	}
	l.e.more = append(l.e.more, s)
	return nil
}

func runSet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("set", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	var e edit
	var ifRevision optString
	fs.Var(limitFlag{&e}, "limit", "permits per window, all instances together (1..1000000000000); N/W: per window W (100/1s); DIM=N[/W]: what the limit counts (tokens=200000/1m; default requests). Given again, a further limit, whose window may be up to 24h (50000/24h: a budget the instances take from): the provider's limits become those given")
	fs.BoolVar(&e.only, "only", false, "the --limit flags given are all the provider's limits: remove the others")
	fs.Var(&e.window, "window", "window length, 10ms..1h, dividing 24h (default 1s for a new provider)")
	fs.Var(&e.mode, "mode", "enforce or shadow")
	fs.Var(&e.algorithm, "algorithm", "even or fair")
	pacing := fs.Bool("pacing", false, "spread each window's permits evenly across it (--pacing=false to turn off)")
	fs.Var(&e.floor, "floor", "least share an idle instance keeps under fair (0: allocator default)")
	fs.Var(&e.maxOffset, "max-clock-offset", "clock measurement uncertainty beyond which an instance's share is cut (0: the default, 2% of the window)")
	fs.Var(&e.failStatic, "fail-static", "how long an instance cut off from etcd keeps admitting: on the ledger how far ahead its grants reach, on the shares how long past its lease it keeps its share while configd keeps it reserved (0: the default, 10s; at most 1h)")
	fs.Var(&e.coordination, "coordination", "how the limit reaches the instances: shares or ledger (grants stored in etcd, checked by configd audit); fixed when the provider is created, the ledger by default")
	fs.Var(&e.adaptive, "adaptive", "follow the provider's pushback: floor=N[,shadow][,decrease=F][,probe=F] keeps an effective limit between N and --limit (the ceiling); off turns it off")
	fs.Var(classFlag{&e}, "class", "a priority class, highest first: NAME, or NAME=RESERVE to keep a count (critical=600) or a share (critical=60%) of every window's limit for it. Given once per class, in order; the provider's classes become those given (at most 8, reserves adding up to at most the limit)")
	fs.BoolVar(&e.noClasses, "no-classes", false, "remove the provider's classes: every call is alike")
	fs.Var(&ifRevision, "if-revision", "write only if the provider is at this revision (0: only if it does not exist)")
	dryRun := fs.Bool("dry-run", false, "print the change without making it")
	pos, err := parseArgs(fs, setUsage, args, stdout)
	if err != nil {
		return helpOK(err)
	}
	name, err := oneName("set", pos)
	if err != nil {
		return err
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "pacing" {
			e.pacing = pacing
		}
	})

	ifRev, err := ifRevision.revision("set", 0)
	if err != nil {
		return err
	}
	b, closeFn, err := cf.open(stderr)
	if err != nil {
		return err
	}
	defer closeFn()
	ctx, cancel := cf.withTimeout(ctx)
	defer cancel()

	var old *schema.ProviderConfig
	cfg := schema.ProviderConfig{Name: name}.WithDefaults()
	cur, err := b.get(ctx, name)
	created := errors.Is(err, ErrNotFound)
	switch {
	case err == nil:
		old, cfg = &cur.Config, cur.Config
		if !ifRevision.set {
			ifRev = cur.Revision // never overwrite a change made after our read
		}
	case errors.Is(err, ErrNotFound):
		if !ifRevision.set {
			ifRev = 0
		}
	case errors.Is(err, ErrMalformedStored):
		fmt.Fprintf(stderr, "configd: warning: %v; overwriting it\n", err)
	default:
		return err
	}
	if old == nil && !e.limit.set {
		return usageErrorf("set: --limit is required to create provider %q", name)
	}
	if cfg, err = e.apply(cfg); err != nil {
		return err
	}
	if *dryRun {
		if created {
			cfg = cfg.Created() // as the store creates it
		}
		fmt.Fprintf(stdout, "%s: dry run, nothing written: %s\n", name, describeChange(old, &cfg))
		return nil
	}
	ch, err := b.put(ctx, cfg, ifRev, cf.who)
	if err != nil {
		return err
	}
	if !ch.Changed {
		fmt.Fprintf(stdout, "%s: unchanged (revision %d)\n", name, ch.Revision)
		return nil
	}
	fmt.Fprintf(stdout, "%s: %s (revision %d)\n", name, describeChange(ch.Old, ch.New), ch.Revision)
	return nil
}

// helpOK turns flag.ErrHelp into success.
func helpOK(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// describeChange says what changes from old to new, field by field:
// "limit 1000 → 2000, window 1s → 500ms", "create limit=1000 window=1s ...",
// or "delete (was limit=1000 ...)".
func describeChange(old, new *schema.ProviderConfig) string {
	switch {
	case old == nil && new == nil:
		return "no change"
	case old == nil:
		return "create " + summary(*new)
	case new == nil:
		return "delete (was " + summary(*old) + ")"
	}
	o, n := fields(*old), fields(*new)
	var parts []string
	for i := range o {
		if o[i][1] != n[i][1] {
			parts = append(parts, fmt.Sprintf("%s %s → %s", o[i][0], o[i][1], n[i][1]))
		}
	}
	if len(parts) == 0 {
		return "no change"
	}
	return strings.Join(parts, ", ")
}

// fields lists a config's fields as name/value pairs, in display order.
func fields(c schema.ProviderConfig) [][2]string {
	return [][2]string{
		{"limit", strconv.FormatInt(c.Limit, 10)},
		{"dimension", c.DimensionOrDefault()},
		{"window", c.Window.String()},
		{"mode", string(c.Mode)},
		{"algorithm", string(c.Algorithm)},
		{"pacing", strconv.FormatBool(c.Pacing)},
		{"floor", strconv.FormatInt(c.Floor, 10)},
		{"max_clock_offset", c.MaxClockOffset.String()},
		{"fail_static", c.FailStaticOrDefault().String()}, // 0 means the default: show what applies
		{"more_limits", moreLimits(c)},
		{"lane_of", c.Of},
		{"adaptive", adaptiveSummary(c.Adaptive)},
		{"coordination", coordinationOf(c)},
		{"classes", c.ClassesString()},
	}
}

// adaptiveSummary says an adaptive setting in a line: "off", or its
// ceiling and floor, what shadow mode computed, the pause and why it last
// moved.
func adaptiveSummary(a *schema.Adaptive) string {
	if a == nil {
		return "off"
	}
	s := fmt.Sprintf("ceiling %d, floor %d", a.Ceiling, a.Floor)
	if a.Shadow {
		eff := a.Effective
		if eff == 0 {
			eff = a.Ceiling
		}
		s += fmt.Sprintf(", shadow (would be %d)", eff)
	}
	if !a.PauseUntil.IsZero() {
		s += ", paused until " + a.PauseUntil.UTC().Format(time.RFC3339)
	}
	if a.Reason != "" {
		s += " (" + a.Reason + ")"
	}
	return s
}

// moreLimits says c's further limits in force, as --limit takes them:
// "tokens=200000/1m,50000/1h", or "none".
func moreLimits(c schema.ProviderConfig) string {
	var out []string
	for _, l := range c.InForce()[1:] {
		out = append(out, l.String())
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ",")
}

func summary(c schema.ProviderConfig) string {
	var parts []string
	for _, f := range shown(c) {
		parts = append(parts, f[0]+"="+f[1])
	}
	return strings.Join(parts, " ")
}

// shown is fields without the dimension of a limit of requests, the
// default, nor further limits when there are none: what summaries and get
// print.
func shown(c schema.ProviderConfig) [][2]string {
	fs := fields(c)
	return slices.DeleteFunc(fs, func(f [2]string) bool {
		return (f[0] == "dimension" && c.Dimension == "") || (f[0] == "more_limits" && f[1] == "none") || (f[0] == "lane_of" && f[1] == "") ||
			(f[0] == "adaptive" && c.Adaptive == nil) || (f[0] == "coordination" && !c.Ledger()) ||
			(f[0] == "classes" && len(c.Classes) == 0)
	})
}

// coordinationOf names c's coordination, the default for empty.
func coordinationOf(c schema.ProviderConfig) string {
	if c.Ledger() {
		return string(schema.CoordinationLedger)
	}
	return string(schema.CoordinationShares)
}
