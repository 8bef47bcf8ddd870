// Package deploy holds no Go code: its test keeps the files of deploy/ true
// to the code they run. It parses every Kubernetes manifest, alert rule,
// the Grafana dashboard, the Dockerfile and the systemd units, and checks
// that each flag they pass exists in the binary (from the binaries' own
// --help), each probe's port and path is served, and each metric name is one
// the code registers (from the collectors themselves, and configd's source).
package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/segmentio/kafka-go"
	"go.etcd.io/etcd/server/v3/embed"
	"sigs.k8s.io/yaml"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/cluster"
	"github.com/sluice-go/sluice/limiter/metrics"
)

// root is the module's root, relative to this package.
const root = ".."

// program is a binary deploy/ runs: its package, the name the image and the
// units install it under, and how to ask for the flags it accepts.
type program struct {
	pkg      string   // relative to root
	installs string   // file name under /usr/local/bin
	subcmd   string   // a required first argument, "" for none
	helpArgs []string // prints the flags
}

var programs = []program{
	{pkg: "configd", installs: "configd", subcmd: "serve", helpArgs: []string{"serve", "--help"}},
	{pkg: "examples/kafka", installs: "sluice-kafka-example", helpArgs: []string{"-help"}},
	{pkg: "agent/sluice-agent", installs: "sluice-agent", helpArgs: []string{"-help"}},
}

func programByPath(path string) (program, bool) {
	for _, p := range programs {
		if path == "/usr/local/bin/"+p.installs {
			return p, true
		}
	}
	return program{}, false
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
	flagCache = map[string]map[string]bool{}
	flagMu    sync.Mutex
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// flagsOf builds p (once for all programs) and returns the flag names its
// help output lists.
func flagsOf(t *testing.T, p program) map[string]bool {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "sluice-deploy-test")
		if buildErr != nil {
			return
		}
		args := []string{"build", "-o", buildDir + string(os.PathSeparator)}
		for _, p := range programs {
			args = append(args, "./"+p.pkg)
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	flagMu.Lock()
	defer flagMu.Unlock()
	if f, ok := flagCache[p.pkg]; ok {
		return f
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(buildDir, filepath.Base(p.pkg)), p.helpArgs...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", p.pkg, strings.Join(p.helpArgs, " "), err, out)
	}
	f := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-{1,2}([A-Za-z0-9][A-Za-z0-9-]*)`).FindAllStringSubmatch(string(out), -1) {
		f[m[1]] = true
	}
	if len(f) < 3 {
		t.Fatalf("%s: found only %d flags in its help:\n%s", p.pkg, len(f), out)
	}
	flagCache[p.pkg] = f
	return f
}

// etcdFlags returns the flags the etcd server of the module's version
// accepts: embed.Config's, plus the few etcdmain adds.
func etcdFlags(t *testing.T) map[string]bool {
	t.Helper()
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	embed.NewConfig().AddFlags(fs)
	f := map[string]bool{}
	fs.VisitAll(func(fl *flag.Flag) { f[fl.Name] = true })
	src, err := os.ReadFile(filepath.Join(moduleDir(t, "go.etcd.io/etcd/server/v3"), "etcdmain", "config.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`fs\.\w*Var\([^,]+,\s*"([a-z0-9-]+)"`).FindAllSubmatch(src, -1) {
		f[string(m[1])] = true
	}
	return f
}

func moduleDir(t *testing.T, mod string) string {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", mod)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m %s: %v", mod, err)
	}
	return strings.TrimSpace(string(out))
}

func moduleVersion(t *testing.T, mod string) string {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", mod)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m %s: %v", mod, err)
	}
	return strings.TrimSpace(string(out))
}

// checkArgs checks that every flag in args is one of known. A flag is an
// argument starting with "-" (up to "="); "--" ends the flags.
func checkArgs(t *testing.T, where string, args []string, known map[string]bool) {
	t.Helper()
	for _, a := range args {
		if a == "--" {
			return
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !known[name] {
			t.Errorf("%s: flag %q does not exist (known: %s)", where, a, strings.Join(sortedKeys(known), ", "))
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// --- metric names --------------------------------------------------------

type metricSet struct {
	names  map[string]bool            // every name PromQL may use, histogram series included
	values map[string]map[string]bool // label -> allowed values, for enumerated labels
}

var (
	metricsOnce sync.Once
	known       metricSet
	metricsErr  error
)

// knownMetrics collects the metric names the code registers: from the
// limiter's and the consumer's collectors (gathered, with their types), the
// cluster member's descriptors, and configd's source (package main).
func knownMetrics(t *testing.T) metricSet {
	t.Helper()
	metricsOnce.Do(func() { known, metricsErr = collectMetrics() })
	if metricsErr != nil {
		t.Fatal(metricsErr)
	}
	return known
}

func collectMetrics() (metricSet, error) {
	ms := metricSet{names: map[string]bool{}, values: map[string]map[string]bool{}}
	addFamily := func(name string, histogram bool) {
		ms.names[name] = true
		if histogram {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				ms.names[name+s] = true
			}
		}
	}

	lim, err := limiter.New(1, time.Second)
	if err != nil {
		return ms, err
	}
	defer lim.Close()
	reg := prometheus.NewRegistry()
	if err := metrics.Register(reg, lim, prometheus.Labels{"provider": "p", "instance": "i"}); err != nil {
		return ms, err
	}
	if _, err := consumer.New(consumer.Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t", GroupID: "g"}, lim,
		func(context.Context, kafka.Message) error { return nil }, consumer.WithRegisterer(reg)); err != nil {
		return ms, err
	}
	fams, err := reg.Gather()
	if err != nil {
		return ms, err
	}
	for _, f := range fams {
		addFamily(f.GetName(), f.GetType().String() == "HISTOGRAM")
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "outcome" {
					if ms.values["outcome"] == nil {
						ms.values["outcome"] = map[string]bool{}
					}
					ms.values["outcome"][lp.GetValue()] = true
				}
			}
		}
	}

	// A Member's collector describes without a Member; all its metrics
	// are gauges.
	descs := make(chan *prometheus.Desc, 64)
	cluster.NewCollector(nil, nil).Describe(descs)
	close(descs)
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		m := fq.FindStringSubmatch(d.String())
		if m == nil {
			return ms, fmt.Errorf("cannot read the name of %s", d)
		}
		addFamily(m[1], false)
	}
	ms.values["source"] = map[string]bool{}
	for _, s := range cluster.Sources {
		ms.values["source"][s] = true
	}

	// configd is package main: read its metric names from the source.
	names, goCollectors, err := configdMetrics(filepath.Join(root, "configd"))
	if err != nil {
		return ms, err
	}
	if len(names) == 0 {
		return ms, fmt.Errorf("no configd_* metric found in configd's source")
	}
	for n, histogram := range names {
		addFamily(n, histogram)
	}
	if goCollectors {
		r := prometheus.NewRegistry()
		r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		fams, err := r.Gather()
		if err != nil {
			return ms, err
		}
		for _, f := range fams {
			addFamily(f.GetName(), f.GetType().String() == "HISTOGRAM")
		}
	}
	return ms, nil
}

// configdMetrics returns the metric names configd's non-test files give in
// prometheus options (Name: "..."), whether each is a histogram, and
// whether the Go and process collectors are registered.
func configdMetrics(dir string) (names map[string]bool, goCollectors bool, err error) {
	names = map[string]bool{}
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, false, err
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return nil, false, err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if id, ok := n.X.(*ast.Ident); ok && id.Name == "collectors" && n.Sel.Name == "NewGoCollector" {
					goCollectors = true
				}
			case *ast.CompositeLit:
				sel, ok := n.Type.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if id, ok := sel.X.(*ast.Ident); !ok || id.Name != "prometheus" || !strings.HasSuffix(sel.Sel.Name, "Opts") {
					return true
				}
				for _, el := range n.Elts {
					kv, ok := el.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Name" {
						if lit, ok := kv.Value.(*ast.BasicLit); ok && lit.Kind == token.STRING {
							s, _ := strconv.Unquote(lit.Value)
							names[s] = sel.Sel.Name == "HistogramOpts"
						}
					}
				}
			}
			return true
		})
	}
	return names, goCollectors, nil
}

// promql holds PromQL's functions and keywords: any other identifier in an
// expression is a metric name.
var (
	promqlFuncs = set("abs", "absent", "absent_over_time", "avg", "avg_over_time", "bottomk", "ceil", "changes", "clamp",
		"clamp_max", "clamp_min", "count", "count_over_time", "count_values", "day_of_month", "day_of_week", "delta",
		"deriv", "exp", "floor", "group", "histogram_quantile", "holt_winters", "idelta", "increase", "irate",
		"label_join", "label_replace", "label_values", "last_over_time", "ln", "log2", "log10", "max", "max_over_time", "min",
		"min_over_time", "predict_linear", "present_over_time", "quantile", "quantile_over_time", "rate", "resets",
		"round", "scalar", "sgn", "sort", "sort_desc", "sqrt", "stddev", "stddev_over_time", "stdvar", "sum",
		"sum_over_time", "time", "timestamp", "topk", "vector")
	promqlKeywords = set("and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
		"group_right", "inf", "nan", "Inf", "NaN")
	reMatchers    = regexp.MustCompile(`\{[^}]*\}`)
	reMatcher     = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	reRange       = regexp.MustCompile(`\[[^\]]*\]`)
	reGrouping    = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	reString      = regexp.MustCompile(`"[^"]*"`)
	reIdent       = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	reNumberish   = regexp.MustCompile(`[0-9.]$`)
	reLabelValues = regexp.MustCompile(`(label_values\(.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$`)
)

func set(words ...string) map[string]bool {
	m := map[string]bool{}
	for _, w := range words {
		m[w] = true
	}
	return m
}

// checkExpr checks that every metric name in a PromQL expression, and every
// value of an enumerated label it matches, is one the code defines.
func checkExpr(t *testing.T, where, expr string) (used []string) {
	t.Helper()
	return exprProblems(knownMetrics(t), t.Errorf, where, expr)
}

// exprProblems reports through errorf what checkExpr checks, and returns
// the metric names used.
func exprProblems(ms metricSet, errorf func(string, ...any), where, expr string) (used []string) {
	for _, sel := range reMatchers.FindAllString(expr, -1) {
		for _, m := range reMatcher.FindAllStringSubmatch(sel, -1) {
			allowed, ok := ms.values[m[1]]
			if !ok || strings.Contains(m[3], "$") {
				continue
			}
			for _, v := range strings.Split(m[3], "|") {
				if !allowed[v] {
					errorf("%s: label value %s=%q is not one the code produces (%s) in %q", where, m[1], v, strings.Join(sortedKeys(allowed), ", "), expr)
				}
			}
		}
	}
	// Grafana's label_values(METRIC, LABEL): the label is no metric.
	e := reLabelValues.ReplaceAllString(expr, "$1)")
	e = reMatchers.ReplaceAllString(e, " ")
	e = reRange.ReplaceAllString(e, " ")
	e = reGrouping.ReplaceAllString(e, " ")
	e = reString.ReplaceAllString(e, " ")
	for _, loc := range reIdent.FindAllStringIndex(e, -1) {
		word := e[loc[0]:loc[1]]
		if loc[0] > 0 && (reNumberish.MatchString(e[:loc[0]]) || e[loc[0]-1] == '$') {
			continue // a number's exponent or unit, or a Grafana variable
		}
		if strings.HasPrefix(strings.TrimLeft(e[loc[1]:], " \t\n"), "(") {
			if !promqlFuncs[word] {
				errorf("%s: unknown PromQL function %q in %q", where, word, expr)
			}
			continue
		}
		if promqlKeywords[word] {
			continue
		}
		if !ms.names[word] {
			errorf("%s: metric %q is not defined by the code, in %q", where, word, expr)
			continue
		}
		used = append(used, word)
	}
	return used
}

// TestMetricNamesKnown guards the guard: the collection finds each part's
// metrics, and an unknown name fails.
func TestMetricNamesKnown(t *testing.T) {
	ms := knownMetrics(t)
	for _, n := range []string{
		"sluice_limiter_permits_total", "sluice_limiter_wait_seconds_bucket", "sluice_limiter_quota_permits",
		cluster.MetricConnected, cluster.MetricGeneration, cluster.MetricClockKnown,
		"sluice_consumer_handled_total", "sluice_consumer_permit_wait_seconds_bucket",
		"configd_shares_generation", "configd_leader",
	} {
		if !ms.names[n] {
			t.Errorf("%s not collected", n)
		}
	}
	good := `sum by (provider) (rate(sluice_limiter_permits_total{provider=~"$provider",outcome="admitted"}[$__rate_interval]))
		> on (provider) max by (provider) (sluice_member_total_permits) / 2 and sluice_member_source{source="even"} == 1`
	if used := checkExpr(t, "self-test", good); len(used) != 3 {
		t.Errorf("self-test: found metrics %v, want 3", used)
	}
	for _, bad := range []string{
		"sluice_member_conected == 0",
		`rate(sluice_limiter_permits_total{outcome="admited"}[5m])`,
		"nosuchfunc(configd_leader)",
		`sluice_member_source{source="configd"}`,
	} {
		n := 0
		exprProblems(ms, func(string, ...any) { n++ }, "self-test", bad)
		if n == 0 {
			t.Errorf("self-test: %q passed, want an error", bad)
		}
	}
}

// --- Prometheus rules ----------------------------------------------------

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Record      string            `json:"record"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func TestPrometheusRules(t *testing.T) {
	files, _ := filepath.Glob("prometheus/*.yml")
	if len(files) == 0 {
		t.Fatal("no rule files in prometheus/")
	}
	used := map[string]bool{}
	for _, path := range files {
		var rf ruleFile
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(b, &rf); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, g := range rf.Groups {
			for _, r := range g.Rules {
				where := fmt.Sprintf("%s: %s", path, r.Alert+r.Record)
				if r.Alert == "" || r.Expr == "" {
					t.Errorf("%s: a rule needs alert and expr", where)
				}
				if r.For != "" {
					if _, err := time.ParseDuration(r.For); err != nil {
						t.Errorf("%s: for %q: %v", where, r.For, err)
					}
				}
				if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
					t.Errorf("%s: needs a summary and a description", where)
				}
				if !slices.Contains([]string{"info", "warning", "critical"}, r.Labels["severity"]) {
					t.Errorf("%s: severity %q", where, r.Labels["severity"])
				}
				for _, m := range checkExpr(t, where, r.Expr) {
					used[m] = true
				}
			}
		}
	}
	// The alerts the issue asks for rest on these.
	for _, m := range []string{cluster.MetricConnected, cluster.MetricClockKnown, cluster.MetricGeneration, "configd_shares_generation",
		"sluice_limiter_quota_permits", cluster.MetricTotal} {
		if !used[m] {
			t.Errorf("no alert uses %s", m)
		}
	}
}

// --- Grafana dashboard ---------------------------------------------------

func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana/sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana/sluice.json: %v", err)
	}
	if d["uid"] == "" || d["title"] == "" {
		t.Error("the dashboard needs a uid and a title")
	}
	used := map[string]bool{}
	n := 0
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || (k == "query" && strings.Contains(s, "("))) {
					n++
					for _, m := range checkExpr(t, "grafana/sluice.json "+path, s) {
						used[m] = true
					}
					continue
				}
				walk(path+"."+k, x)
			}
		case []any:
			for i, x := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), x)
			}
		}
	}
	walk("", d)
	if n < 10 {
		t.Errorf("found only %d queries in the dashboard", n)
	}
	for _, m := range []string{"sluice_limiter_permits_total", cluster.MetricShare, cluster.MetricDemand, "sluice_limiter_clock_offset_seconds",
		cluster.MetricConnected, "configd_shares_generation"} {
		if !used[m] {
			t.Errorf("no dashboard panel shows %s", m)
		}
	}
}

// --- Dockerfile ----------------------------------------------------------

// image is what the Dockerfile says of the image.
type image struct {
	binaries   map[string]string // installed path -> package built into it
	entrypoint string
}

func parseDockerfile(t *testing.T) image {
	t.Helper()
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	// Join continuation lines, drop comments.
	var lines []string
	var cur strings.Builder
	for _, l := range strings.Split(string(b), "\n") {
		trim := strings.TrimSpace(l)
		if strings.HasPrefix(trim, "#") && cur.Len() == 0 {
			continue
		}
		if strings.HasSuffix(trim, "\\") {
			cur.WriteString(strings.TrimSuffix(trim, "\\") + " ")
			continue
		}
		cur.WriteString(trim)
		if cur.Len() > 0 {
			lines = append(lines, cur.String())
		}
		cur.Reset()
	}
	goMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(goMod)
	if goVersion == nil {
		t.Fatal("go.mod has no go directive")
	}

	img := image{binaries: map[string]string{}}
	built := map[string]string{} // output path in the builder -> package
	var froms []string
	user := ""
	for _, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		switch strings.ToUpper(instr) {
		case "FROM":
			froms = append(froms, rest)
			user = ""
		case "RUN":
			for _, cmd := range strings.Split(rest, "&&") {
				f := strings.Fields(cmd)
				i := slices.Index(f, "go")
				if i < 0 || i+1 >= len(f) || f[i+1] != "build" {
					continue
				}
				if !slices.Contains(f[:i], "CGO_ENABLED=0") {
					t.Errorf("Dockerfile: %q does not set CGO_ENABLED=0 (static binary)", strings.TrimSpace(cmd))
				}
				out := f[slices.Index(f, "-o")+1]
				pkg := f[len(f)-1]
				if st, err := os.Stat(filepath.Join(root, pkg)); err != nil || !st.IsDir() {
					t.Errorf("Dockerfile: builds %s, which is not a folder of the module", pkg)
				}
				built[out] = strings.TrimPrefix(pkg, "./")
			}
		case "COPY":
			f := strings.Fields(rest)
			if len(f) == 3 && strings.HasPrefix(f[0], "--from=") {
				if pkg, ok := built[f[1]]; ok {
					img.binaries[f[2]] = pkg
				} else {
					t.Errorf("Dockerfile: copies %s, which no go build produced", f[1])
				}
			}
		case "USER":
			user = rest
		case "ENTRYPOINT":
			var ep []string
			if err := json.Unmarshal([]byte(rest), &ep); err != nil || len(ep) == 0 {
				t.Errorf("Dockerfile: ENTRYPOINT %s: want exec form", rest)
			} else {
				img.entrypoint = ep[0]
			}
		}
	}
	if len(froms) < 2 {
		t.Fatalf("Dockerfile: want a multi-stage build, got %d stages", len(froms))
	}
	if want := "golang:" + string(goVersion[1]); !strings.HasPrefix(froms[0], want+" ") && froms[0] != want {
		t.Errorf("Dockerfile: builder is %q, want %s (go.mod's go %s)", froms[0], want, goVersion[1])
	}
	final := froms[len(froms)-1]
	if !strings.Contains(final, "distroless/static") && !strings.HasPrefix(final, "scratch") {
		t.Errorf("Dockerfile: final stage %q is neither distroless/static nor scratch", final)
	}
	if u, _, _ := strings.Cut(user, ":"); u != "65532" {
		t.Errorf("Dockerfile: final stage runs as %q, want USER 65532", user)
	}
	for _, p := range programs {
		if img.binaries["/usr/local/bin/"+p.installs] != p.pkg {
			t.Errorf("Dockerfile: /usr/local/bin/%s should be built from ./%s, have %v", p.installs, p.pkg, img.binaries)
		}
	}
	if _, ok := img.binaries[img.entrypoint]; !ok {
		t.Errorf("Dockerfile: ENTRYPOINT %s is not a binary of the image", img.entrypoint)
	}
	return img
}

func TestDockerfile(t *testing.T) { parseDockerfile(t) }

// --- HTTP routes ---------------------------------------------------------

// routes returns the paths a package's non-test files register on a mux
// (Handle/HandleFunc patterns, with their method dropped).
func routes(t *testing.T, pkg string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	fset := token.NewFileSet()
	files, _ := filepath.Glob(filepath.Join(root, pkg, "*.go"))
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Handle" && sel.Sel.Name != "HandleFunc") {
				return true
			}
			if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				s, _ := strconv.Unquote(lit.Value)
				if i := strings.Index(s, " "); i >= 0 {
					s = strings.TrimSpace(s[i:])
				}
				out[s] = true
			}
			return true
		})
	}
	if len(out) == 0 {
		t.Fatalf("no HTTP route found in %s", pkg)
	}
	return out
}

// switchRoutes returns the paths a package's non-test files serve by a
// switch on the request's path (the agent's handler): the "/..." strings
// of its case clauses.
func switchRoutes(t *testing.T, pkg string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	fset := token.NewFileSet()
	files, _ := filepath.Glob(filepath.Join(root, pkg, "*.go"))
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			cc, ok := n.(*ast.CaseClause)
			if !ok {
				return true
			}
			for _, e := range cc.List {
				if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if s, _ := strconv.Unquote(lit.Value); strings.HasPrefix(s, "/") {
						out[s] = true
					}
				}
			}
			return true
		})
	}
	if !out["/healthz"] {
		t.Fatalf("no /healthz among the paths %s serves: %v", pkg, sortedKeys(out))
	}
	return out
}

// --- Kubernetes ----------------------------------------------------------

type kustomization struct {
	Namespace string   `json:"namespace"`
	Resources []string `json:"resources"`
	Images    []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
	ConfigMapGenerator []generator `json:"configMapGenerator"`
	SecretGenerator    []generator `json:"secretGenerator"`
}

type generator struct {
	Name     string   `json:"name"`
	Literals []string `json:"literals"`
	Files    []string `json:"files"`
}

type object struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Replicas    *int              `json:"replicas"`
		ServiceName string            `json:"serviceName"`
		Selector    json.RawMessage   `json:"selector"`
		ClusterIP   string            `json:"clusterIP"`
		Ports       []servicePort     `json:"ports"`
		Template    *podTemplate      `json:"template"`
		MinAvail    any               `json:"minAvailable"`
		Extra       map[string]string `json:"-"`
	} `json:"spec"`
}

type servicePort struct {
	Name       string `json:"name"`
	Port       int    `json:"port"`
	TargetPort any    `json:"targetPort"`
}

type podTemplate struct {
	Metadata struct {
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		SecurityContext struct {
			RunAsNonRoot bool `json:"runAsNonRoot"`
			RunAsGroup   *int `json:"runAsGroup"`
		} `json:"securityContext"`
		InitContainers []container `json:"initContainers"`
		Containers     []container `json:"containers"`
		Volumes        []struct {
			Name     string    `json:"name"`
			EmptyDir *struct{} `json:"emptyDir"`
			Secret   *struct {
				SecretName string `json:"secretName"`
				Items      []struct {
					Key string `json:"key"`
				} `json:"items"`
			} `json:"secret"`
		} `json:"volumes"`
	} `json:"spec"`
}

type container struct {
	Name          string   `json:"name"`
	Image         string   `json:"image"`
	RestartPolicy string   `json:"restartPolicy"` // "Always": a native sidecar (init container)
	Command       []string `json:"command"`
	Args          []string `json:"args"`
	Env           []envVar `json:"env"`
	Ports         []struct {
		Name          string `json:"name"`
		ContainerPort int    `json:"containerPort"`
	} `json:"ports"`
	LivenessProbe   *probe `json:"livenessProbe"`
	ReadinessProbe  *probe `json:"readinessProbe"`
	StartupProbe    *probe `json:"startupProbe"`
	SecurityContext struct {
		RunAsGroup *int `json:"runAsGroup"`
	} `json:"securityContext"`
	VolumeMounts []struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
	} `json:"volumeMounts"`
}

// env returns the value of env variable name set literally, "" if none.
func (c container) env(name string) string {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom == nil {
			return e.Value
		}
	}
	return ""
}

// mountOf returns the volume mounted at dir, "" if none.
func (c container) mountOf(dir string) string {
	for _, m := range c.VolumeMounts {
		if filepath.Clean(m.MountPath) == filepath.Clean(dir) {
			return m.Name
		}
	}
	return ""
}

type envVar struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	ValueFrom *struct {
		SecretKeyRef    *keyRef `json:"secretKeyRef"`
		ConfigMapKeyRef *keyRef `json:"configMapKeyRef"`
		FieldRef        *struct {
			FieldPath string `json:"fieldPath"`
		} `json:"fieldRef"`
	} `json:"valueFrom"`
}

type keyRef struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

type probe struct {
	HTTPGet *struct {
		Path string `json:"path"`
		Port any    `json:"port"`
	} `json:"httpGet"`
	Exec *struct {
		Command []string `json:"command"`
	} `json:"exec"`
}

// resolvePort returns the container port a probe or Service port names.
func (c container) resolvePort(p any) (int, bool) {
	for _, cp := range c.Ports {
		switch v := p.(type) {
		case string:
			if cp.Name == v {
				return cp.ContainerPort, true
			}
		case float64:
			if cp.ContainerPort == int(v) {
				return cp.ContainerPort, true
			}
		}
	}
	return 0, false
}

func (c container) hasPort(port int) bool { _, ok := c.resolvePort(float64(port)); return ok }

func readKustomization(t *testing.T) (kustomization, []object) {
	t.Helper()
	dir := "kubernetes"
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	all, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	for _, f := range all {
		if base := filepath.Base(f); base != "kustomization.yaml" && !slices.Contains(k.Resources, base) {
			t.Errorf("kubernetes/%s is not listed in kustomization.yaml's resources", base)
		}
	}
	var objs []object
	for _, r := range k.Resources {
		b, err := os.ReadFile(filepath.Join(dir, r))
		if err != nil {
			t.Fatalf("kustomization resource: %v", err)
		}
		for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			var o object
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				t.Fatalf("kubernetes/%s document %d: %v", r, i, err)
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Errorf("kubernetes/%s document %d: needs apiVersion, kind and metadata.name", r, i)
			}
			objs = append(objs, o)
		}
	}
	return k, objs
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func TestKubernetes(t *testing.T) {
	k, objs := readKustomization(t)
	img := parseDockerfile(t)
	script, err := os.ReadFile("kubernetes/secrets/generate.sh")
	if err != nil {
		t.Fatal(err)
	}

	// What the generators provide: name -> keys.
	provided := map[string]map[string]bool{}
	for _, g := range append(append([]generator{}, k.ConfigMapGenerator...), k.SecretGenerator...) {
		keys := map[string]bool{}
		for _, l := range g.Literals {
			key, _, _ := strings.Cut(l, "=")
			keys[key] = true
		}
		for _, f := range g.Files {
			key, file, ok := strings.Cut(f, "=")
			if !ok {
				key, file = filepath.Base(f), f
			}
			keys[key] = true
			if !bytes.Contains(script, []byte(filepath.Base(file))) {
				t.Errorf("secret %s reads %s, which secrets/generate.sh does not create", g.Name, file)
			}
		}
		provided[g.Name] = keys
	}
	sluiceImage := map[string]bool{}
	for _, i := range k.Images {
		sluiceImage[i.Name] = true
	}
	etcdVersion := moduleVersion(t, "go.etcd.io/etcd/server/v3")
	etcdRoutes := etcdPaths(t)

	var services []object
	podsByLabels := map[string]podTemplate{}
	sawConfigd, sawConsumer, sawEtcd, sawAgent := false, false, false, false
	for _, o := range objs {
		if o.Kind == "Service" {
			services = append(services, o)
		}
		tpl := o.Spec.Template
		if tpl == nil {
			continue
		}
		where := fmt.Sprintf("%s/%s", o.Kind, o.Metadata.Name)
		podsByLabels[labelKey(tpl.Metadata.Labels)] = *tpl
		if !tpl.Spec.SecurityContext.RunAsNonRoot {
			t.Errorf("%s: pods should set runAsNonRoot", where)
		}
		volumes := map[string]bool{}
		emptyDirs := map[string]bool{}
		for _, v := range tpl.Spec.Volumes {
			volumes[v.Name] = true
			emptyDirs[v.Name] = v.EmptyDir != nil
			if v.Secret == nil {
				continue
			}
			keys, ok := provided[v.Secret.SecretName]
			if !ok {
				t.Errorf("%s: volume %s uses secret %s, which the kustomization does not generate", where, v.Name, v.Secret.SecretName)
			}
			for _, it := range v.Secret.Items {
				if !keys[it.Key] {
					t.Errorf("%s: volume %s wants key %s of secret %s, which has %v", where, v.Name, it.Key, v.Secret.SecretName, sortedKeys(keys))
				}
			}
		}
		for _, c := range slices.Concat(tpl.Spec.InitContainers, tpl.Spec.Containers) {
			cw := where + " container " + c.Name
			for _, m := range c.VolumeMounts {
				if !volumes[m.Name] && !strings.EqualFold(o.Kind, "StatefulSet") {
					t.Errorf("%s: mounts unknown volume %s", cw, m.Name)
				}
			}
			env := map[string]bool{}
			for _, e := range c.Env {
				env[e.Name] = true
				if e.ValueFrom == nil {
					continue
				}
				for _, ref := range []*keyRef{e.ValueFrom.SecretKeyRef, e.ValueFrom.ConfigMapKeyRef} {
					if ref != nil && !provided[ref.Name][ref.Key] {
						t.Errorf("%s: env %s reads %s/%s, which the kustomization does not generate", cw, e.Name, ref.Name, ref.Key)
					}
				}
			}
			for _, a := range append(append([]string{}, c.Command...), c.Args...) {
				for _, m := range regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).FindAllStringSubmatch(a, -1) {
					if !env[m[1]] {
						t.Errorf("%s: %q refers to $(%s), which is not in env", cw, a, m[1])
					}
				}
			}

			var paths map[string]bool
			var listen []int // ports the program listens on, from its flags
			switch {
			case sluiceImage[c.Image]:
				if len(c.Command) == 0 {
					t.Errorf("%s: set command to the binary (the image holds several)", cw)
					continue
				}
				if _, ok := img.binaries[c.Command[0]]; !ok {
					t.Errorf("%s: command %s is not a binary of the image (%v)", cw, c.Command[0], img.binaries)
				}
				p, ok := programByPath(c.Command[0])
				if !ok {
					t.Errorf("%s: unknown program %s", cw, c.Command[0])
					continue
				}
				args := c.Args
				if p.subcmd != "" {
					if len(args) == 0 || args[0] != p.subcmd {
						t.Errorf("%s: args should start with %q", cw, p.subcmd)
						continue
					}
					args = args[1:]
				}
				checkArgs(t, cw, args, flagsOf(t, p))
				if p.pkg == "agent/sluice-agent" {
					paths = switchRoutes(t, "agent")
				} else {
					paths = routes(t, p.pkg)
				}
				for _, a := range args {
					name, val, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
					if name == "listen" || name == "metrics-listen" {
						port, err := strconv.Atoi(val[strings.LastIndex(val, ":")+1:])
						if err != nil {
							t.Errorf("%s: %s has no port", cw, a)
						}
						listen = append(listen, port)
					}
				}
				switch p.pkg {
				case "configd":
					sawConfigd = true
					if o.Spec.Replicas == nil || *o.Spec.Replicas != 2 {
						t.Errorf("%s: want 2 replicas (leader election)", where)
					}
					for _, want := range []string{"--admin-token-file", "--etcd-endpoints", "--etcd-ca", "--etcd-cert", "--etcd-key"} {
						if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, want+"=") }) {
							t.Errorf("%s: should pass %s", cw, want)
						}
					}
				case "agent/sluice-agent":
					sawAgent = true
					checkAgentSidecar(t, cw, *tpl, c, args, emptyDirs)
				case "examples/kafka":
					sawConsumer = true
					if !slices.ContainsFunc(c.Env, func(e envVar) bool {
						return e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
					}) {
						t.Errorf("%s: POD_NAME must come from the downward API (metadata.name)", cw)
					}
				}
			case strings.Contains(c.Image, "etcd"):
				sawEtcd = true
				if _, tag, _ := strings.Cut(c.Image, ":"); tag != etcdVersion {
					t.Errorf("%s: image %s, want tag %s (the etcd server in go.mod, whose flags are checked)", cw, c.Image, etcdVersion)
				}
				checkArgs(t, cw, c.Args, etcdFlags(t))
				paths = etcdRoutes
			case c.Name == "app" && strings.HasPrefix(c.Image, "python:"):
				continue // an application's stand-in beside the agent: checkAgentSidecar checks its wiring
			default:
				t.Errorf("%s: image %s is neither the kustomization's sluice image nor etcd", cw, c.Image)
				continue
			}
			for _, port := range listen {
				if !c.hasPort(port) {
					t.Errorf("%s: listens on %d, which is not a containerPort", cw, port)
				}
			}
			if ann := tpl.Metadata.Annotations["prometheus.io/port"]; ann != "" {
				if port, _ := strconv.Atoi(ann); !c.hasPort(port) {
					t.Errorf("%s: prometheus.io/port %s is not a containerPort", cw, ann)
				}
			}
			if ann := tpl.Metadata.Annotations["prometheus.io/path"]; ann != "" && !paths[ann] {
				t.Errorf("%s: prometheus.io/path %s is not served", cw, ann)
			}
			for name, pr := range map[string]*probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
				if pr != nil && pr.Exec != nil && sluiceImage[c.Image] {
					// The program asks itself: its flags must be its own.
					cmd := pr.Exec.Command
					if len(cmd) == 0 || cmd[0] != c.Command[0] {
						t.Errorf("%s: %s probe runs %v, want the container's own binary %s", cw, name, cmd, c.Command[0])
					} else {
						p, _ := programByPath(cmd[0])
						checkArgs(t, cw+" "+name+" probe", cmd[1:], flagsOf(t, p))
					}
				}
				if pr == nil || pr.HTTPGet == nil {
					continue
				}
				port, ok := c.resolvePort(pr.HTTPGet.Port)
				if !ok {
					t.Errorf("%s: %s probe port %v is not a container port", cw, name, pr.HTTPGet.Port)
				}
				if sluiceImage[c.Image] && !slices.Contains(listen, port) {
					t.Errorf("%s: %s probe port %d is not one the program listens on (%v)", cw, name, port, listen)
				}
				if !paths[pr.HTTPGet.Path] {
					t.Errorf("%s: %s probe path %s is not served (routes: %v)", cw, name, pr.HTTPGet.Path, sortedKeys(paths))
				}
			}
			if sluiceImage[c.Image] && strings.HasSuffix(c.Command[0], "/configd") {
				if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
					t.Errorf("%s: liveness should probe /healthz", cw)
				}
				if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
					t.Errorf("%s: readiness should probe /readyz", cw)
				}
			}
		}
	}
	if !sawConfigd || !sawConsumer || !sawEtcd || !sawAgent {
		t.Errorf("want a configd, a consumer, an agent and an etcd workload; saw %v %v %v %v", sawConfigd, sawConsumer, sawAgent, sawEtcd)
	}

	for _, s := range services {
		var sel map[string]string
		if err := json.Unmarshal(s.Spec.Selector, &sel); err != nil {
			t.Errorf("Service/%s: selector: %v", s.Metadata.Name, err)
			continue
		}
		pod, ok := podsByLabels[labelKey(sel)]
		if !ok {
			t.Errorf("Service/%s: selector %v matches no workload here", s.Metadata.Name, sel)
			continue
		}
		for _, p := range s.Spec.Ports {
			tp := p.TargetPort
			if tp == nil {
				tp = float64(p.Port)
			}
			if !slices.ContainsFunc(pod.Spec.Containers, func(c container) bool { _, ok := c.resolvePort(tp); return ok }) {
				t.Errorf("Service/%s: targetPort %v is not a port of the selected pods", s.Metadata.Name, tp)
			}
		}
	}
}

// checkAgentSidecar checks the wiring of sluice-agent beside an app: a
// native sidecar (so it starts first and stops last), its socket on an
// emptyDir that every other container mounts at the same place and names
// in SLUICE_AGENT_SOCKET (the clients' variable), its probes on that
// socket, the pod's group the socket's (mode 0660), the instance id the
// pod name.
func checkAgentSidecar(t *testing.T, cw string, pod podTemplate, c container, args []string, emptyDirs map[string]bool) {
	t.Helper()
	if c.RestartPolicy != "Always" || !slices.ContainsFunc(pod.Spec.InitContainers, func(x container) bool { return x.Name == c.Name }) {
		t.Errorf("%s: should be a native sidecar (an init container with restartPolicy Always): it must answer before the app starts and after it stops", cw)
	}
	flag := func(name string) string {
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v
			}
		}
		return ""
	}
	sock := flag("socket")
	if sock == "" || !filepath.IsAbs(sock) {
		t.Errorf("%s: should pass --socket=/ABSOLUTE/PATH", cw)
		return
	}
	vol := c.mountOf(filepath.Dir(sock))
	if !emptyDirs[vol] {
		t.Errorf("%s: the socket's directory %s should be an emptyDir mount, shared with the app", cw, filepath.Dir(sock))
	}
	if g := flag("grpc-socket"); g != "" && filepath.Dir(g) != filepath.Dir(sock) {
		t.Errorf("%s: --grpc-socket %s is not beside --socket %s on the shared volume", cw, g, sock)
	}
	if m := flag("socket-mode"); m != "" && m != "0660" && m != "660" {
		t.Errorf("%s: --socket-mode %s: the pod's group is the way in (0660)", cw, m)
	}
	if flag("id") != "$(POD_NAME)" || !slices.ContainsFunc(c.Env, func(e envVar) bool {
		return e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
	}) {
		t.Errorf("%s: --id should be $(POD_NAME), from the downward API, so that configd status names pods", cw)
	}
	for _, want := range []string{"--etcd-endpoints", "--etcd-ca", "--etcd-cert", "--etcd-key"} {
		if flag(strings.TrimPrefix(want, "--")) == "" {
			t.Errorf("%s: should pass %s", cw, want)
		}
	}
	if c.StartupProbe == nil || c.StartupProbe.Exec == nil || !slices.Contains(c.StartupProbe.Exec.Command, "--socket="+sock) {
		t.Errorf("%s: a startup probe should run --probe on %s, so that the app starts once the agent answers", cw, sock)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.Exec == nil || !slices.Contains(c.LivenessProbe.Exec.Command, "--socket="+sock) {
		t.Errorf("%s: a liveness probe should run --probe on %s", cw, sock)
	}
	if pod.Spec.SecurityContext.RunAsGroup == nil {
		t.Errorf("%s: the pod should set runAsGroup: the socket's group, which the app needs (mode 0660)", cw)
	}
	apps := 0
	for _, a := range pod.Spec.Containers {
		aw := strings.TrimSuffix(cw, c.Name) + a.Name
		apps++
		if a.mountOf(filepath.Dir(sock)) != vol {
			t.Errorf("%s: should mount volume %s at %s, where the agent's socket is", aw, vol, filepath.Dir(sock))
		}
		if got := a.env("SLUICE_AGENT_SOCKET"); got != sock {
			t.Errorf("%s: SLUICE_AGENT_SOCKET is %q, want the agent's --socket %s", aw, got, sock)
		}
		for _, x := range []container{a, c} {
			if g := x.SecurityContext.RunAsGroup; g != nil && pod.Spec.SecurityContext.RunAsGroup != nil && *g != *pod.Spec.SecurityContext.RunAsGroup {
				t.Errorf("%s: container %s runs as group %d, not the pod's: the app could not open the socket", aw, x.Name, *g)
			}
		}
	}
	if apps == 0 {
		t.Errorf("%s: a sidecar with no app beside it", cw)
	}
	// The clients read the variable the manifest sets.
	for _, f := range []string{"clients/python/sluice_agent/client.py", "clients/python/sluice_agent/aio.py"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil || !bytes.Contains(b, []byte(`"SLUICE_AGENT_SOCKET"`)) {
			t.Errorf("%s: does not read SLUICE_AGENT_SOCKET (%v)", f, err)
		}
	}
}

func labelKey(m map[string]string) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

// etcdPaths returns the health paths etcd serves: /health, /livez and
// /readyz, if its source defines them.
func etcdPaths(t *testing.T) map[string]bool {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(moduleDir(t, "go.etcd.io/etcd/server/v3"), "etcdserver", "api", "etcdhttp", "health.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{"/metrics": true}
	for _, p := range []string{"health", "livez", "readyz"} {
		if bytes.Contains(src, []byte(`"/`+p+`"`)) || bytes.Contains(src, []byte(`"`+p+`"`)) {
			out["/"+p] = true
		}
	}
	return out
}

// TestKustomizeBuild renders the kustomization with placeholder secrets,
// when kubectl is installed.
func TestKustomizeBuild(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not installed")
	}
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS("kubernetes")); err != nil {
		t.Fatal(err)
	}
	k, _ := readKustomization(t)
	for _, g := range k.SecretGenerator {
		for _, f := range g.Files {
			_, file, ok := strings.Cut(f, "=")
			if !ok {
				file = f
			}
			if err := os.WriteFile(filepath.Join(dir, file), []byte("placeholder"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, kubectl, "kustomize", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("namespace: "+k.Namespace)) {
		t.Errorf("rendered objects are not in namespace %s", k.Namespace)
	}
}

// --- systemd -------------------------------------------------------------

// unitFile is a parsed unit: section -> key -> values (in order).
type unitFile map[string]map[string][]string

func parseUnit(t *testing.T, path string) unitFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unitFile{}
	section := ""
	var pending strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if pending.Len() == 0 && (line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";")) {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			pending.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		pending.WriteString(line)
		line = pending.String()
		pending.Reset()
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		if !ok || section == "" {
			t.Fatalf("%s: cannot parse %q", path, line)
		}
		u[section][key] = append(u[section][key], strings.TrimSpace(val))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

// readEnvFile returns the variables an EnvironmentFile example defines.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			t.Errorf("%s: cannot parse %q", path, l)
		}
		vars[k] = v
	}
	return vars
}

func TestSystemdUnits(t *testing.T) {
	units := map[string]string{ // unit -> the example EnvironmentFile shipped with it
		"systemd/configd.service":               "systemd/configd.env",
		"systemd/sluice-kafka-example@.service": "systemd/sluice-kafka-example.env",
		"systemd/sluice-agent.service":          "systemd/sluice-agent.env",
	}
	all, _ := filepath.Glob("systemd/*.service")
	for _, f := range all {
		if _, ok := units[f]; !ok {
			t.Errorf("%s is not checked: add it to TestSystemdUnits", f)
		}
	}
	for path, envPath := range units {
		u := parseUnit(t, path)
		svc := u["Service"]
		if svc == nil {
			t.Fatalf("%s: no [Service] section", path)
		}
		for key, want := range map[string]string{"NoNewPrivileges": "yes", "ProtectSystem": "strict"} {
			if got := svc[key]; len(got) != 1 || got[0] != want {
				t.Errorf("%s: %s=%v, want %s", path, key, got, want)
			}
		}
		if !slices.Equal(svc["DynamicUser"], []string{"yes"}) && len(svc["User"]) == 0 {
			t.Errorf("%s: run as DynamicUser=yes or a service User", path)
		}
		if len(svc["EnvironmentFile"]) == 0 {
			t.Errorf("%s: no EnvironmentFile", path)
		}
		if len(u["Install"]["WantedBy"]) == 0 {
			t.Errorf("%s: no WantedBy", path)
		}
		env := readEnvFile(t, envPath)
		exec := svc["ExecStart"]
		if len(exec) != 1 {
			t.Fatalf("%s: want one ExecStart, got %d", path, len(exec))
		}
		argv := strings.Fields(exec[0])
		p, ok := programByPath(argv[0])
		if !ok {
			t.Fatalf("%s: ExecStart runs %s, not a sluice program", path, argv[0])
		}
		args := argv[1:]
		if p.subcmd != "" {
			if len(args) == 0 || args[0] != p.subcmd {
				t.Fatalf("%s: %s needs %q first", path, argv[0], p.subcmd)
			}
			args = args[1:]
		}
		checkArgs(t, path, args, flagsOf(t, p))
		for k, v := range env { // flags passed through a variable, as EXTRA_FLAGS
			checkArgs(t, envPath+" "+k, strings.Fields(v), flagsOf(t, p))
		}
		systemdVars := set("STATE_DIRECTORY", "CREDENTIALS_DIRECTORY", "RUNTIME_DIRECTORY", "MAINPID")
		for _, m := range regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`).FindAllStringSubmatch(exec[0], -1) {
			if _, ok := env[m[1]]; !ok && !systemdVars[m[1]] {
				t.Errorf("%s: ExecStart uses $%s, which %s does not define", path, m[1], envPath)
			}
		}
		for k := range env {
			if !strings.Contains(exec[0], "$"+k) && !strings.Contains(exec[0], "${"+k+"}") {
				t.Errorf("%s defines %s, which %s does not use", envPath, k, path)
			}
		}
		if p.pkg == "configd" {
			state := svc["StateDirectory"]
			if len(state) != 1 {
				t.Errorf("%s: configd needs a StateDirectory for --data-dir", path)
			} else if !slices.ContainsFunc(args, func(a string) bool {
				return strings.HasPrefix(a, "--data-dir=%S/"+state[0]) || strings.HasPrefix(a, "--data-dir=${STATE_DIRECTORY}")
			}) {
				t.Errorf("%s: --data-dir should be under StateDirectory %v", path, state)
			}
			if cred := svc["LoadCredential"]; slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--admin-token-file=%d/") }) {
				if len(cred) == 0 {
					t.Errorf("%s: --admin-token-file under %%d needs a LoadCredential", path)
				}
			}
		}
	}
}
