//go:build unix

// Package docs holds no Go code: its test keeps architecture.md and
// operations.md true to the code. Every shell command the two files show is
// either run or checked against the binaries and files it names, and every
// flag, metric, key, record field, alert, test name, API name and quoted
// message is looked up in the code.
//
// What the markdown may contain, and what the test does with it:
//
//	```sh                      run. The block runs as one sh script in a
//	                           temporary directory, every command in turn, and
//	                           each must exit 0 unless its comment says
//	                           "# exit N". `configd` and `sluice-kafka-example`
//	                           are the binaries of ./configd and
//	                           ./examples/kafka, built once by the test; `go run
//	                           ./configd` means the same binary. The one
//	                           `configd serve` that is not sent to the
//	                           background is started by the test before any
//	                           block runs (embedded etcd, a temporary
//	                           --data-dir), and the client subcommands reach it
//	                           through --server, the documented flag. The
//	                           documented local addresses (documentedAddrs) are
//	                           replaced by free ports; no other local address
//	                           may appear. Processes sent to the background are
//	                           killed when the test ends.
//	```sh title="static"       checked, not run: every command must be one the
//	                           test knows how to check (see checkCommand):
//	                           configd's subcommands and flags against its
//	                           --help, the example's flags against -help, go
//	                           packages and -run patterns against the tree,
//	                           make targets, kubectl's paths, resources,
//	                           labels and namespace against deploy/kubernetes,
//	                           systemd units against deploy/systemd, curl URLs
//	                           against configd's routes.
//	```text title="output"     what the run block just before it printed:
//	                           each line must appear in the real output, in
//	                           order, with the same first word and number of
//	                           words (digits may differ); table headers and
//	                           "configd: ..." error lines must match exactly
//	                           up to digits and spacing.
//	```json title="T"          a record of internal/schema (T is
//	                           ProviderConfig, InstanceRecord, Shares or
//	                           HistoryEntry): decoded with its strict decoder.
//	```text title="keys"       one etcd key per line: each must belong to the
//	                           key layout (schema.Keys.Parse).
//
// Inline code is checked too: commands (configd, go, kubectl, ...) as in a
// static block, but flags only; `--flag`s; metric names and their label
// values; etcd keys (with <name>, <id>, <seq>, <lease-hex> placeholders);
// snake_case record fields and label values; pkg.Name identifiers of the
// module's packages; `msg="..."` log messages and "configd: ..." errors
// (literally in the source). Anywhere in the files: test names must exist,
// alert names must be rules of deploy/prometheus/alerts.yml, and
// operations.md must name every alert and every sluice_limiter_*,
// sluice_member_* and configd_* metric.
//
// go test -short checks everything but runs nothing.
package docs

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"sigs.k8s.io/yaml"

	"github.com/sluice-go/sluice/agent"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/cluster"
	"github.com/sluice-go/sluice/limiter/metrics"
)

// root is the module's root, relative to this package.
const root = ".."

// docFiles are checked in this order; run blocks run in this order.
var docFiles = []string{"operations.md", "architecture.md"}

// documentedAddrs are the local addresses run blocks may use: configd's
// admin API (a second replica on 7071), the embedded etcd's client and peer
// URLs, and the example instances' metrics. Each is replaced by a free port.
var documentedAddrs = []string{
	"127.0.0.1:7070", "127.0.0.1:7071", "127.0.0.1:2379", "127.0.0.1:2380",
	"127.0.0.1:9090", "127.0.0.1:9091", "127.0.0.1:9092",
}

// documentedDataDir is the --data-dir the docs' configd serve uses.
const documentedDataDir = "/tmp/sluice"

const (
	adminAddr = "127.0.0.1:7070"
	etcdAddr  = "127.0.0.1:2379"
	peerAddr  = "127.0.0.1:2380"
)

// clientSubcommands are configd's subcommands that talk to the admin API.
var clientSubcommands = []string{"set", "get", "list", "delete", "status", "history", "audit"}

// nameSubcommands take exactly one provider NAME.
var nameSubcommands = []string{"set", "get", "delete", "status", "history"}

// optionalNameSubcommands take a provider NAME or none.
var optionalNameSubcommands = []string{"audit"}

// --- the binaries ---------------------------------------------------------

var (
	buildOnce sync.Once
	buildDir  string // configd (the wrapper), sluice-kafka-example, real/configd
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// binaries builds ./configd and ./examples/kafka once, into buildDir/real
// and buildDir/sluice-kafka-example, and returns buildDir.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "sluice-docs-test")
		if buildErr != nil {
			return
		}
		real := filepath.Join(buildDir, "real")
		if buildErr = os.Mkdir(real, 0o755); buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", real+string(os.PathSeparator), "./configd", "./examples/kafka", "./agent/sluice-agent")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./configd ./examples/kafka ./agent/sluice-agent: %v\n%s", err, out)
			return
		}
		buildErr = os.Rename(filepath.Join(real, "kafka"), filepath.Join(buildDir, "sluice-kafka-example"))
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

// flagSpec maps a flag's name to whether it takes a value.
type flagSpec map[string]bool

var helpFlagRE = regexp.MustCompile(`(?m)^  -([A-Za-z0-9][A-Za-z0-9-]*)(?: (\w+))?$`)

// helpFlags runs a binary's help and returns the flags it lists.
func helpFlags(t *testing.T, bin string, args ...string) flagSpec {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, out)
	}
	fs := flagSpec{}
	for _, m := range helpFlagRE.FindAllStringSubmatch(string(out), -1) {
		fs[m[1]] = m[2] != ""
	}
	if len(fs) < 3 {
		t.Fatalf("%s %s: found only %d flags in:\n%s", bin, strings.Join(args, " "), len(fs), out)
	}
	return fs
}

// --- markdown -------------------------------------------------------------

type block struct {
	file, lang, title string
	line              int      // the opening fence's line
	body              []string // the lines between the fences
}

func (b block) where() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

type span struct {
	file string
	line int
	text string
}

type doc struct {
	name   string
	text   string
	blocks []block
	spans  []span // inline code outside fenced blocks
}

var (
	titleRE  = regexp.MustCompile(`title="([^"]*)"`)
	inlineRE = regexp.MustCompile("`([^`]+)`")
)

func parseDoc(name, text string) (doc, error) {
	d := doc{name: name, text: text}
	var cur *block
	for i, line := range strings.Split(text, "\n") {
		n := i + 1
		trimmed := strings.TrimSpace(line)
		if cur != nil {
			if trimmed == "```" {
				d.blocks = append(d.blocks, *cur)
				cur = nil
			} else {
				cur.body = append(cur.body, line)
			}
			continue
		}
		if info, ok := strings.CutPrefix(trimmed, "```"); ok {
			b := block{file: name, line: n}
			if f := strings.Fields(info); len(f) > 0 {
				b.lang = f[0]
			}
			if m := titleRE.FindStringSubmatch(info); m != nil {
				b.title = m[1]
			}
			cur = &b
			continue
		}
		for _, m := range inlineRE.FindAllStringSubmatch(line, -1) {
			d.spans = append(d.spans, span{file: name, line: n, text: m[1]})
		}
	}
	if cur != nil {
		return d, fmt.Errorf("%s: the block opened at line %d is not closed", name, cur.line)
	}
	return d, nil
}

var (
	docsOnce sync.Once
	docs     []doc
	docsErr  error
)

func loadDocs(t *testing.T) []doc {
	t.Helper()
	docsOnce.Do(func() {
		for _, name := range docFiles {
			b, err := os.ReadFile(name)
			if err != nil {
				docsErr = err
				return
			}
			d, err := parseDoc(name, string(b))
			if err != nil {
				docsErr = err
				return
			}
			docs = append(docs, d)
		}
	})
	if docsErr != nil {
		t.Fatal(docsErr)
	}
	return docs
}

// cmdLine is one command line of an sh block: continuation lines joined.
type cmdLine struct {
	text string
	line int
	want int // expected exit status ("# exit N"), 0 by default
}

var exitRE = regexp.MustCompile(`#[^'"]*\bexit (\d+)\b[^'"]*$`)

func commandLines(b block) []cmdLine {
	var out []cmdLine
	var cur *cmdLine
	for i, raw := range b.body {
		line := strings.TrimRight(raw, " \t")
		if cur == nil {
			t := strings.TrimSpace(line)
			if t == "" || strings.HasPrefix(t, "#") {
				continue
			}
			cur = &cmdLine{line: b.line + 1 + i}
		}
		if s, ok := strings.CutSuffix(line, `\`); ok {
			cur.text += strings.TrimSpace(s) + " "
			continue
		}
		cur.text += strings.TrimSpace(line)
		if m := exitRE.FindStringSubmatch(cur.text); m != nil {
			cur.want, _ = strconv.Atoi(m[1])
		}
		out = append(out, *cur)
		cur = nil
	}
	if cur != nil {
		out = append(out, *cur)
	}
	return out
}

// --- a small shell parser -------------------------------------------------

// parseShell splits a command line into simple commands (split at |, ||,
// &&, ; and &), drops redirections and comments, and returns the bodies of
// command substitutions $(...) for the caller to check too. A substitution
// stands in its word as "$SUBST".
func parseShell(s string) (cmds [][]string, subs []string, err error) {
	var cur []string
	var word strings.Builder
	inWord := false
	flushWord := func() {
		if inWord {
			cur = append(cur, word.String())
			word.Reset()
			inWord = false
		}
	}
	flushCmd := func() {
		flushWord()
		if len(cur) > 0 {
			cmds = append(cmds, cur)
		}
		cur = nil
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s):
			i++
			word.WriteByte(s[i])
			inWord = true
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, nil, fmt.Errorf("unterminated ' in %q", s)
			}
			word.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) {
					i++
					word.WriteByte(s[i])
					continue
				}
				if strings.HasPrefix(s[i:], "$(") {
					inner, n, err := substitution(s[i:])
					if err != nil {
						return nil, nil, err
					}
					subs = append(subs, inner)
					word.WriteString("$SUBST")
					i += n - 1
					continue
				}
				word.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, nil, fmt.Errorf(`unterminated " in %q`, s)
			}
			inWord = true
		case strings.HasPrefix(s[i:], "$("):
			inner, n, err := substitution(s[i:])
			if err != nil {
				return nil, nil, err
			}
			subs = append(subs, inner)
			word.WriteString("$SUBST")
			i += n - 1
			inWord = true
		case c == ' ' || c == '\t':
			flushWord()
		case c == '#' && !inWord:
			i = len(s)
		case c == '|' || c == ';' || c == '&':
			flushCmd()
			if i+1 < len(s) && (s[i+1] == '|' || s[i+1] == '&') {
				i++
			}
		case c == '>' || c == '<':
			// A redirection: drop its file-descriptor number, itself and
			// its target.
			if inWord && strings.Trim(word.String(), "0123456789") == "" {
				word.Reset()
				inWord = false
			}
			flushWord()
			if i+1 < len(s) && s[i+1] == '>' {
				i++
			}
			if i+1 < len(s) && s[i+1] == '&' {
				for i++; i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9'; i++ {
				}
				continue
			}
			for i+1 < len(s) && (s[i+1] == ' ' || s[i+1] == '\t') {
				i++
			}
			for i+1 < len(s) && !strings.ContainsRune(" \t|;&<>", rune(s[i+1])) {
				i++
			}
		default:
			word.WriteByte(c)
			inWord = true
		}
	}
	flushCmd()
	return cmds, subs, nil
}

// substitution returns the body of the $(...) that s starts with and the
// length of the whole substitution.
func substitution(s string) (string, int, error) {
	depth := 0
	quote := byte(0)
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '(':
			depth++
		case c == ')':
			depth--
			if depth == 0 {
				return s[2:i], i + 1, nil
			}
		}
	}
	return "", 0, fmt.Errorf("unterminated $( in %q", s)
}

// --- what the code defines ------------------------------------------------

// facts is everything the docs are checked against.
type facts struct {
	configdFlags map[string]flagSpec // by subcommand
	kafkaFlags   flagSpec
	agentFlags   flagSpec
	metrics      map[string]bool            // every metric name, histogram series included
	families     map[string]bool            // metric families of limiter, member and configd
	labelValues  map[string]map[string]bool // label → values, for enumerated labels
	snake        map[string]bool            // record fields and label values in snake_case
	idents       map[string]map[string]bool // package → exported names (funcs, methods, types, values)
	tests        map[string]bool            // Test/Fuzz/Benchmark functions anywhere in the module
	testsIn      map[string][]string        // package dir → its test functions
	alerts       map[string]bool
	routes       []route
	apiSource    string
	source       string // every non-test Go file of the module, concatenated
	makeTargets  map[string]bool
	units        map[string]bool
	k8s          []k8sObject
	namespace    string
}

type route struct {
	method string // "" for any
	re     *regexp.Regexp
}

type k8sObject struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Template struct {
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
		} `json:"template"`
	} `json:"spec"`
}

var (
	factsOnce sync.Once
	theFacts  *facts
)

func loadFacts(t *testing.T) *facts {
	t.Helper()
	dir := binaries(t)
	factsOnce.Do(func() {
		f := &facts{configdFlags: map[string]flagSpec{}}
		real := filepath.Join(dir, "real", "configd")
		for _, sub := range append([]string{"serve"}, clientSubcommands...) {
			f.configdFlags[sub] = helpFlags(t, real, sub, "--help")
		}
		f.kafkaFlags = helpFlags(t, filepath.Join(dir, "sluice-kafka-example"), "-help")
		f.agentFlags = helpFlags(t, filepath.Join(dir, "real", "sluice-agent"), "-help")
		f.collectMetrics(t)
		f.collectSource(t)
		f.collectDeploy(t)
		theFacts = f
	})
	if theFacts == nil {
		t.FailNow()
	}
	return theFacts
}

func (f *facts) collectMetrics(t *testing.T) {
	f.metrics, f.families = map[string]bool{}, map[string]bool{}
	f.labelValues = map[string]map[string]bool{"outcome": {}, "source": {}, "reason": {}}
	add := func(name string, histogram bool) {
		f.metrics[name] = true
		if histogram {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				f.metrics[name+s] = true
			}
		}
		if strings.HasPrefix(name, "sluice_limiter_") || strings.HasPrefix(name, "sluice_member_") || strings.HasPrefix(name, "configd_") {
			f.families[name] = true
		}
	}
	lim, err := limiter.New(1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	reg := prometheus.NewRegistry()
	if err := metrics.Register(reg, lim, prometheus.Labels{"provider": "p", "instance": "i"}); err != nil {
		t.Fatal(err)
	}
	if _, err := consumer.New(consumer.Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t", GroupID: "g"}, lim,
		func(context.Context, kafka.Message) error { return nil }, consumer.WithRegisterer(reg)); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range fams {
		add(fam.GetName(), fam.GetType().String() == "HISTOGRAM")
	}
	for _, o := range append(metrics.Outcomes, metrics.ClassOutcomes...) {
		f.labelValues["outcome"][o] = true
	}
	descs := make(chan *prometheus.Desc, 64)
	cluster.NewCollector(nil, nil).Describe(descs)
	// The per-class metrics show only on a limiter with classes.
	metrics.New(lim, nil).Describe(descs)
	close(descs)
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		m := fq.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the name of %s", d)
		}
		add(m[1], false)
	}
	for _, s := range cluster.Sources {
		f.labelValues["source"][s] = true
	}
	// configd is package main: its metric names from its source; the
	// reasons of configd_shares_damped_total from package plan's.
	src := readGo(t, filepath.Join(root, "configd"), false)
	for _, m := range regexp.MustCompile(`Name:\s*"(configd_[a-z0-9_]+)"`).FindAllStringSubmatch(src, -1) {
		add(m[1], false)
	}
	for _, m := range regexp.MustCompile(`Damped\w+\s*=\s*"([a-z_]+)"`).FindAllStringSubmatch(readGo(t, filepath.Join(root, "configd", "plan"), false), -1) {
		f.labelValues["reason"][m[1]] = true
	}
	// The local agent's requests counter, whose outcome is "ok" or a
	// refusal's reason in lower case.
	add(agent.MetricRequests, false)
	f.labelValues["outcome"]["ok"] = true
	for _, m := range regexp.MustCompile(`Reason\w+\s*=\s*"([A-Z_]+)"`).FindAllStringSubmatch(readGo(t, filepath.Join(root, "agent"), false), -1) {
		f.labelValues["outcome"][strings.ToLower(m[1])] = true
	}
	if len(f.labelValues["reason"]) == 0 {
		t.Fatal("found no damping reasons in configd/plan")
	}
	if !f.metrics["configd_leader"] || !f.metrics["sluice_member_connected"] || !f.metrics["sluice_limiter_permits_total"] {
		t.Fatalf("metric collection found too little: %v", slices.Sorted(mapsKeys(f.metrics)))
	}
}

// readGo concatenates the Go files of dir (tests only if tests is set).
func readGo(t *testing.T, dir string, tests bool) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	for _, p := range files {
		if strings.HasSuffix(p, "_test.go") != tests {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		sb.Write(b)
		sb.WriteByte('\n')
	}
	return sb.String()
}

// pkgDirs maps the package names the docs use in pkg.Name references to
// their directories.
var pkgDirs = map[string]string{
	"limiter": "limiter", "cluster": "limiter/cluster", "skew": "limiter/skew", "metrics": "limiter/metrics",
	"alloc": "configd/alloc", "plan": "configd/plan", "schema": "internal/schema", "follow": "internal/follow",
	"consumer": "consumer",
}

func (f *facts) collectSource(t *testing.T) {
	f.idents = map[string]map[string]bool{}
	fset := token.NewFileSet()
	for pkg, dir := range pkgDirs {
		names := map[string]bool{}
		files, _ := filepath.Glob(filepath.Join(root, dir, "*.go"))
		for _, p := range files {
			if strings.HasSuffix(p, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(fset, p, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range file.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					names[d.Name.Name] = true
				case *ast.GenDecl:
					for _, s := range d.Specs {
						switch s := s.(type) {
						case *ast.TypeSpec:
							names[s.Name.Name] = true
						case *ast.ValueSpec:
							for _, n := range s.Names {
								names[n.Name] = true
							}
						}
					}
				}
			}
		}
		f.idents[pkg] = names
	}

	// Test functions, per package directory, and all non-test source.
	f.tests, f.testsIn = map[string]bool{}, map[string][]string{}
	testRE := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark|Example)\w*)\(`)
	var all strings.Builder
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "docs" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.HasSuffix(p, "_test.go") {
			rel, _ := filepath.Rel(root, filepath.Dir(p))
			for _, m := range testRE.FindAllSubmatch(b, -1) {
				f.tests[string(m[1])] = true
				f.testsIn[rel] = append(f.testsIn[rel], string(m[1]))
			}
			return nil
		}
		all.Write(b)
		all.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	f.source = all.String()

	// snake_case names the docs may quote: JSON fields of the records, of
	// the admin API's answers and of the agent's API, and enumerated label
	// values.
	f.snake = map[string]bool{}
	tagRE := regexp.MustCompile("json:\"([a-z0-9_]+)")
	for _, p := range []string{"internal/schema/records.go", "configd/store.go", "agent/http.go", "agent/status.go"} {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range tagRE.FindAllSubmatch(b, -1) {
			f.snake[string(m[1])] = true
		}
	}
	for _, vs := range f.labelValues {
		for v := range vs {
			f.snake[v] = true
		}
	}

	// The admin API's routes and the headers it reads.
	api, err := os.ReadFile(filepath.Join(root, "configd", "api.go"))
	if err != nil {
		t.Fatal(err)
	}
	f.apiSource = string(api)
	for _, m := range regexp.MustCompile(`mux\.Handle(?:Func)?\("(?:([A-Z]+) )?(/[^"]*)"`).FindAllStringSubmatch(f.apiSource, -1) {
		if m[2] == "/" {
			continue
		}
		pat := regexp.QuoteMeta(m[2])
		pat = regexp.MustCompile(`\\\{[a-z]+\\\}`).ReplaceAllString(pat, `[^/]+`)
		f.routes = append(f.routes, route{method: m[1], re: regexp.MustCompile("^" + pat + "$")})
	}
	if len(f.routes) < 6 {
		t.Fatalf("found only %d admin API routes in configd/api.go", len(f.routes))
	}
}

func (f *facts) collectDeploy(t *testing.T) {
	// Alerts.
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
			} `json:"rules"`
		} `json:"groups"`
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	f.alerts = map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				f.alerts[r.Alert] = true
			}
		}
	}

	// make targets.
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	f.makeTargets = map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z0-9_-]*):`).FindAllSubmatch(mk, -1) {
		f.makeTargets[string(m[1])] = true
	}

	// systemd units.
	f.units = map[string]bool{}
	units, _ := filepath.Glob(filepath.Join(root, "deploy", "systemd", "*.service"))
	for _, u := range units {
		f.units[strings.TrimSuffix(filepath.Base(u), ".service")] = true
	}

	// Kubernetes objects and the namespace.
	var kust struct {
		Namespace string `json:"namespace"`
	}
	kb, err := os.ReadFile(filepath.Join(root, "deploy", "kubernetes", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(kb, &kust); err != nil {
		t.Fatal(err)
	}
	f.namespace = kust.Namespace
	manifests, _ := filepath.Glob(filepath.Join(root, "deploy", "kubernetes", "*.yaml"))
	for _, p := range manifests {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, part := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
			var o k8sObject
			if err := yaml.Unmarshal([]byte(part), &o); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			if o.Kind != "" {
				f.k8s = append(f.k8s, o)
			}
		}
	}
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// --- static checks of commands --------------------------------------------

// checker checks commands against facts, reporting through errorf.
type checker struct {
	f       *facts
	errorf  func(format string, args ...any)
	partial bool // inline code: flags only, arguments may be elided
}

// checkLine checks every simple command of a command line, and those of
// its command substitutions.
func (c *checker) checkLine(where, line string) {
	cmds, subs, err := parseShell(line)
	if err != nil {
		c.errorf("%s: %v", where, err)
		return
	}
	for _, s := range subs {
		c.checkLine(where, s)
	}
	for _, words := range cmds {
		c.checkCommand(where, words)
	}
}

var assignRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// shellPrefixes are words before a command: keywords of loops and
// conditions, and sudo.
var shellPrefixes = map[string]bool{"until": true, "while": true, "do": true, "if": true, "then": true, "else": true, "!": true, "sudo": true}

// generic are commands with nothing of the project's to check.
var generic = map[string]bool{
	"sleep": true, "kill": true, "grep": true, "awk": true, "head": true, "tail": true, "cat": true,
	"echo": true, "export": true, "cd": true, "mkdir": true, "openssl": true, "printf": true,
	"wait": true, "sort": true, "ls": true, "rm": true, "true": true, "watch": true,
}

func (c *checker) checkCommand(where string, words []string) {
	for len(words) > 0 && (assignRE.MatchString(words[0]) || shellPrefixes[words[0]]) {
		words = words[1:]
	}
	if len(words) == 0 || words[0] == "done" || words[0] == "fi" {
		return
	}
	name, args := words[0], words[1:]
	switch {
	case name == "configd" || strings.HasSuffix(name, "/configd"):
		c.checkConfigd(where, args)
	case name == "sluice-kafka-example" || strings.HasSuffix(name, "/sluice-kafka-example"):
		if pos := c.checkFlags(where, "sluice-kafka-example", c.f.kafkaFlags, args); len(pos) > 0 {
			c.errorf("%s: sluice-kafka-example takes no arguments, got %q", where, pos)
		}
	case name == "go":
		c.checkGo(where, args)
	case name == "make":
		for _, a := range args {
			if !strings.HasPrefix(a, "-") && !strings.Contains(a, "=") && !c.f.makeTargets[a] {
				c.errorf("%s: make: no target %q in the Makefile", where, a)
			}
		}
	case name == "kubectl":
		c.checkKubectl(where, args)
	case name == "systemctl" || name == "journalctl":
		c.checkSystemd(where, name, args)
	case name == "curl":
		c.checkCurl(where, args)
	case strings.HasPrefix(name, "deploy/"):
		if _, err := os.Stat(filepath.Join(root, name)); err != nil {
			c.errorf("%s: %v", where, err)
		}
	case name == "install" || name == "cp" || name == "docker":
		for _, a := range args {
			if strings.HasPrefix(a, "deploy/") {
				if _, err := os.Stat(filepath.Join(root, a)); err != nil {
					c.errorf("%s: %s: %v", where, name, err)
				}
			}
		}
	case generic[name]:
	default:
		c.errorf("%s: the test does not know how to check %q (add it to checkCommand, or run it)", where, name)
	}
}

// checkFlags checks each flag in args against fs and returns the
// positional arguments.
func (c *checker) checkFlags(where, prog string, fs flagSpec, args []string) (pos []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(pos, args[i+1:]...)
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		name, _, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name == "h" || name == "help" {
			continue
		}
		takes, ok := fs[name]
		if !ok {
			c.errorf("%s: %s has no flag %q (it has: %s)", where, prog, a, strings.Join(slices.Sorted(mapsKeys(fs)), ", "))
			continue
		}
		if takes && !hasVal {
			i++
		}
	}
	return pos
}

func (c *checker) checkConfigd(where string, args []string) {
	if len(args) == 0 {
		if !c.partial {
			c.errorf("%s: configd needs a subcommand", where)
		}
		return
	}
	sub := args[0]
	if sub == "help" || sub == "-h" || sub == "--help" || sub == "-help" || c.partial && (sub == "…" || sub == "...") {
		return
	}
	fs, ok := c.f.configdFlags[sub]
	if !ok {
		c.errorf("%s: configd has no subcommand %q", where, sub)
		return
	}
	pos := c.checkFlags(where, "configd "+sub, fs, args[1:])
	if c.partial || slices.ContainsFunc(args, func(a string) bool { return a == "--help" || a == "-h" || a == "-help" }) {
		return
	}
	want := 0
	if slices.Contains(nameSubcommands, sub) {
		want = 1
	}
	if slices.Contains(optionalNameSubcommands, sub) && len(pos) <= 1 {
		want = len(pos)
	}
	if len(pos) != want {
		c.errorf("%s: configd %s takes %d argument(s), got %q", where, sub, want, pos)
		return
	}
	for _, p := range pos {
		if !strings.Contains(p, "$") {
			if err := schema.ValidateName(p); err != nil {
				c.errorf("%s: configd %s %s: %v", where, sub, p, err)
			}
		}
	}
}

// goValueFlags are the go command's flags (of build, install, test, vet)
// that take a value.
var goValueFlags = map[string]bool{
	"o": true, "run": true, "count": true, "bench": true, "timeout": true, "fuzz": true,
	"fuzztime": true, "ldflags": true, "tags": true, "p": true, "skip": true,
}

func (c *checker) checkGo(where string, args []string) {
	if len(args) == 0 {
		c.errorf("%s: go needs a command", where)
		return
	}
	verb, args := args[0], args[1:]
	switch verb {
	case "run":
		if len(args) == 0 {
			c.errorf("%s: go run needs a package", where)
			return
		}
		switch args[0] {
		case "./configd":
			c.checkConfigd(where, args[1:])
		case "./examples/kafka":
			c.checkCommand(where, append([]string{"sluice-kafka-example"}, args[1:]...))
		default:
			c.checkPkgs(where, args[:1])
		}
	case "build", "install", "test", "vet":
		var pkgs []string
		var run string
		for i := 0; i < len(args); i++ {
			a := args[i]
			if strings.HasPrefix(a, "-") {
				name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
				if goValueFlags[name] && !hasVal && i+1 < len(args) {
					i++
					val = args[i]
				}
				if name == "run" {
					run = val
				}
				continue
			}
			pkgs = append(pkgs, a)
		}
		c.checkPkgs(where, pkgs)
		if run != "" && run != "^$" {
			re, err := regexp.Compile(run)
			if err != nil {
				c.errorf("%s: go test -run %q: %v", where, run, err)
				return
			}
			matched := false
			for _, p := range pkgs {
				for dir, names := range c.f.testsIn {
					if pkgMatches(p, dir) && slices.ContainsFunc(names, re.MatchString) {
						matched = true
					}
				}
			}
			if !matched {
				c.errorf("%s: go test -run %q matches no test in %v", where, run, pkgs)
			}
		}
	case "mod", "version", "env":
	default:
		c.errorf("%s: the test does not know how to check 'go %s'", where, verb)
	}
}

// pkgMatches reports whether the package pattern p (./x or ./x/...)
// covers directory dir (relative to the root).
func pkgMatches(p, dir string) bool {
	p = strings.TrimPrefix(p, "./")
	if base, ok := strings.CutSuffix(p, "/..."); ok {
		return base == "." || dir == base || strings.HasPrefix(dir, base+"/")
	}
	return strings.TrimSuffix(p, "/") == dir
}

func (c *checker) checkPkgs(where string, pkgs []string) {
	for _, p := range pkgs {
		if !strings.HasPrefix(p, "./") {
			c.errorf("%s: package %q: write packages as ./dir", where, p)
			continue
		}
		dir := strings.TrimSuffix(strings.TrimSuffix(p, "/..."), "/")
		if st, err := os.Stat(filepath.Join(root, dir)); err != nil || !st.IsDir() {
			c.errorf("%s: package %q does not exist", where, p)
		}
	}
}

// kubectlValueFlags are kubectl's flags that take a value.
var kubectlValueFlags = map[string]bool{
	"n": true, "namespace": true, "l": true, "selector": true, "f": true, "filename": true, "k": true,
	"kustomize": true, "o": true, "output": true, "c": true, "container": true, "replicas": true,
	"grace-period": true, "timeout": true, "since": true, "tail": true,
}

func (c *checker) checkKubectl(where string, args []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			c.checkCommand(where, args[i+1:])
			return
		}
		if strings.HasPrefix(a, "-") {
			name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if kubectlValueFlags[name] && !hasVal && i+1 < len(args) {
				i++
				val = args[i]
			}
			switch name {
			case "n", "namespace":
				if val != c.f.namespace {
					c.errorf("%s: kubectl -n %s: deploy/kubernetes uses namespace %q", where, val, c.f.namespace)
				}
			case "f", "filename", "k", "kustomize":
				if _, err := os.Stat(filepath.Join(root, val)); err != nil {
					c.errorf("%s: kubectl -%s: %v", where, name, err)
				}
			case "l", "selector":
				k, v, _ := strings.Cut(val, "=")
				if !slices.ContainsFunc(c.f.k8s, func(o k8sObject) bool {
					return o.Metadata.Labels[k] == v || o.Spec.Template.Metadata.Labels[k] == v
				}) {
					c.errorf("%s: kubectl -l %s: no object of deploy/kubernetes has that label", where, val)
				}
			}
			continue
		}
		kind, name, ok := strings.Cut(a, "/")
		if !ok || strings.Contains(name, "$") {
			continue
		}
		kinds := map[string]string{
			"deployment": "Deployment", "deploy": "Deployment", "statefulset": "StatefulSet", "sts": "StatefulSet",
			"svc": "Service", "service": "Service", "pdb": "PodDisruptionBudget",
		}
		k, known := kinds[kind]
		if !known {
			continue
		}
		if !slices.ContainsFunc(c.f.k8s, func(o k8sObject) bool { return o.Kind == k && o.Metadata.Name == name }) {
			c.errorf("%s: kubectl %s: deploy/kubernetes has no %s %q", where, a, k, name)
		}
	}
}

var systemctlVerbs = map[string]bool{
	"start": true, "stop": true, "restart": true, "reload": true, "status": true, "enable": true,
	"disable": true, "daemon-reload": true, "kill": true, "is-active": true, "show": true,
}

func (c *checker) checkSystemd(where, prog string, args []string) {
	var units []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case prog == "journalctl" && (a == "-u" || a == "--unit") && i+1 < len(args):
			i++
			units = append(units, args[i])
		case strings.HasPrefix(a, "-"), prog == "journalctl", systemctlVerbs[a]:
		default:
			units = append(units, a)
		}
	}
	for _, u := range units {
		u = strings.TrimSuffix(u, ".service")
		if base, _, ok := strings.Cut(u, "@"); ok {
			u = base + "@"
		}
		if !c.f.units[u] {
			c.errorf("%s: %s: deploy/systemd has no unit %q", where, prog, u)
		}
	}
}

// curlValueFlags are curl's flags that take a value.
var curlValueFlags = map[string]bool{
	"X": true, "request": true, "H": true, "header": true, "d": true, "data": true, "o": true,
	"output": true, "w": true, "write-out": true, "m": true, "max-time": true, "data-binary": true,
}

func (c *checker) checkCurl(where string, args []string) {
	method, data := "GET", false
	var urls, headers []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") {
			name := strings.TrimLeft(a, "-")
			val := ""
			if curlValueFlags[name] && i+1 < len(args) {
				i++
				val = args[i]
			}
			switch name {
			case "X", "request":
				method = val
			case "H", "header":
				h, _, _ := strings.Cut(val, ":")
				headers = append(headers, h)
			case "d", "data", "data-binary":
				data = true
			}
			continue
		}
		urls = append(urls, a)
	}
	if data && method == "GET" {
		c.errorf("%s: curl sends data with POST by default; configd takes PUT (-X PUT)", where)
	}
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			c.errorf("%s: curl: %q is not a URL", where, raw)
			continue
		}
		switch port := u.Port(); {
		case port == "7070" || port == "7071":
			if !slices.ContainsFunc(c.f.routes, func(r route) bool {
				return (r.method == "" || r.method == method) && r.re.MatchString(u.Path)
			}) {
				c.errorf("%s: curl: configd serves no %s %s", where, method, u.Path)
			}
			for _, h := range headers {
				if !strings.Contains(strings.ToLower(c.f.apiSource), `"`+strings.ToLower(h)) {
					c.errorf("%s: curl: configd's API does not read the header %q", where, h)
				}
			}
		case port == "2379":
			if u.Path != "/health" {
				c.errorf("%s: curl: the docs use only etcd's /health, not %s", where, u.Path)
			}
		case strings.HasPrefix(port, "909"):
			if u.Path != "/metrics" {
				c.errorf("%s: curl: an instance serves only /metrics, not %s", where, u.Path)
			}
		default:
			c.errorf("%s: curl: unknown endpoint %s", where, raw)
		}
	}
}

// --- the checks -----------------------------------------------------------

// TestStatic checks every block and inline code span of the docs without
// running anything.
func TestStatic(t *testing.T) {
	f := loadFacts(t)
	ds := loadDocs(t)
	c := &checker{f: f, errorf: t.Errorf}
	for _, d := range ds {
		for _, b := range d.blocks {
			switch {
			case b.lang == "sh":
				if b.title != "" && b.title != "static" {
					t.Errorf("%s: unknown sh block title %q (want none or \"static\")", b.where(), b.title)
				}
				for _, cl := range commandLines(b) {
					c.checkLine(fmt.Sprintf("%s:%d", b.file, cl.line), cl.text)
				}
			case b.lang == "json" && b.title != "":
				checkRecord(t, b)
			case b.lang == "text" && b.title == "keys":
				for i, line := range b.body {
					if fs := strings.Fields(line); len(fs) > 0 {
						if err := checkKey(fs[0]); err != nil {
							t.Errorf("%s:%d: %v", b.file, b.line+1+i, err)
						}
					}
				}
			case b.lang == "text" && (b.title == "" || b.title == "output"):
			default:
				t.Errorf("%s: unknown block %q title %q", b.where(), b.lang, b.title)
			}
			if b.lang != "json" {
				checkMetricMentions(t, f, b.where(), strings.Join(b.body, "\n"))
			}
		}
		inline := &checker{f: f, errorf: t.Errorf, partial: true}
		for _, s := range d.spans {
			checkSpan(t, f, inline, s)
		}
		checkNames(t, f, d)
	}
	checkCoverage(t, f, ds)
}

var (
	commandWords = []string{"configd", "go", "make", "kubectl", "systemctl", "journalctl", "curl", "sluice-kafka-example"}
	snakeRE      = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)+$`)
	flagSpanRE   = regexp.MustCompile(`^(--?)([a-z][a-z0-9-]*)(=\S*)?( .*)?$`)
	identRE      = regexp.MustCompile(`\b(limiter|cluster|skew|metrics|alloc|plan|schema|follow|consumer)\.([A-Z][A-Za-z0-9]*)`)
	msgRE        = regexp.MustCompile(`^msg="(.+)"$`)
	errPrefixRE  = regexp.MustCompile(`^(configd|limiter|cluster|skew|alloc|schema): `)
	metricRE     = regexp.MustCompile(`(?:^|[^A-Za-z0-9_/.-])((?:sluice|configd)_[a-z0-9_]*\*?)`)
	labelRE      = regexp.MustCompile(`\b(outcome|source|reason)="([a-z_|]*)"`)
)

func checkSpan(t *testing.T, f *facts, c *checker, s span) {
	where := fmt.Sprintf("%s:%d", s.file, s.line)
	text := s.text
	checkMetricMentions(t, f, where, text)
	for _, m := range identRE.FindAllStringSubmatch(text, -1) {
		if !f.idents[m[1]][m[2]] {
			t.Errorf("%s: %s.%s is not declared in %s", where, m[1], m[2], pkgDirs[m[1]])
		}
	}
	first := strings.Fields(text)[0]
	switch {
	case slices.Contains(commandWords, first):
		c.checkLine(where, text)
	case flagSpanRE.MatchString(text):
		m := flagSpanRE.FindStringSubmatch(text)
		_, inConfigd := anyConfigdFlag(f, m[2])
		_, inKafka := f.kafkaFlags[m[2]]
		_, inAgent := f.agentFlags[m[2]]
		if (m[1] == "--" && !inConfigd && !inAgent) || (m[1] == "-" && !inKafka && !inConfigd) {
			t.Errorf("%s: no binary has the flag %q", where, m[1]+m[2])
		}
	case strings.HasPrefix(text, "/sluice/") || strings.HasPrefix(text, "<prefix>"):
		if err := checkKey(first); err != nil {
			t.Errorf("%s: %v", where, err)
		}
	case snakeRE.MatchString(text) && !strings.HasPrefix(text, "sluice_") && !strings.HasPrefix(text, "configd_"):
		if !f.snake[text] {
			t.Errorf("%s: %q is no record field, API field or label value of the code", where, text)
		}
	case msgRE.MatchString(text):
		if msg := msgRE.FindStringSubmatch(text)[1]; !strings.Contains(f.source, msg) {
			t.Errorf("%s: the log message %q is not in the source", where, msg)
		}
	case errPrefixRE.MatchString(text):
		if !strings.Contains(f.source, text) && !strings.Contains(f.source, errPrefixRE.ReplaceAllString(text, "")) {
			t.Errorf("%s: the error text %q is not in the source", where, text)
		}
	}
}

func anyConfigdFlag(f *facts, name string) (string, bool) {
	for sub, fs := range f.configdFlags {
		if _, ok := fs[name]; ok {
			return sub, true
		}
	}
	return "", false
}

// checkMetricMentions checks metric names (a trailing * or _ is a prefix)
// and enumerated label values in text.
func checkMetricMentions(t *testing.T, f *facts, where, text string) {
	for _, m := range metricRE.FindAllStringSubmatch(text, -1) {
		name := m[1]
		if p, ok := strings.CutSuffix(name, "*"); ok || strings.HasSuffix(name, "_") {
			if !ok {
				p = name
			}
			if !slices.ContainsFunc(slices.Collect(mapsKeys(f.metrics)), func(n string) bool { return strings.HasPrefix(n, p) }) {
				t.Errorf("%s: no metric starts with %q", where, p)
			}
			continue
		}
		if !f.metrics[name] {
			t.Errorf("%s: metric %q is not defined by the code", where, name)
		}
	}
	for _, m := range labelRE.FindAllStringSubmatch(text, -1) {
		for _, v := range strings.Split(m[2], "|") {
			if v != "" && !strings.ContainsAny(v, ".*") && !f.labelValues[m[1]][v] {
				t.Errorf("%s: %s=%q is not a value the code produces", where, m[1], v)
			}
		}
	}
}

var (
	testNameRE  = regexp.MustCompile(`\b(?:Test|Fuzz|Benchmark)[A-Z]\w*`)
	alertNameRE = regexp.MustCompile(`\bSluice[A-Z][A-Za-z]+\b`)
)

// checkNames checks test and alert names anywhere in d.
func checkNames(t *testing.T, f *facts, d doc) {
	for i, line := range strings.Split(d.text, "\n") {
		for _, n := range testNameRE.FindAllString(line, -1) {
			if !f.tests[n] {
				t.Errorf("%s:%d: no test function %s in the module", d.name, i+1, n)
			}
		}
		for _, n := range alertNameRE.FindAllString(line, -1) {
			if !f.alerts[n] {
				t.Errorf("%s:%d: %s is no alert of deploy/prometheus/alerts.yml", d.name, i+1, n)
			}
		}
	}
}

// checkCoverage: operations.md names every alert and every limiter, member
// and configd metric.
func checkCoverage(t *testing.T, f *facts, ds []doc) {
	for _, d := range ds {
		if d.name != "operations.md" {
			continue
		}
		for _, a := range slices.Sorted(mapsKeys(f.alerts)) {
			if !strings.Contains(d.text, a) {
				t.Errorf("operations.md does not say what alert %s means", a)
			}
		}
		for _, m := range slices.Sorted(mapsKeys(f.families)) {
			if !regexp.MustCompile(`\b` + m + `\b`).MatchString(d.text) {
				t.Errorf("operations.md does not explain metric %s", m)
			}
		}
		return
	}
	t.Error("operations.md not loaded")
}

// checkRecord decodes a json block with the schema decoder its title names.
func checkRecord(t *testing.T, b block) {
	body := []byte(strings.Join(b.body, "\n"))
	var err error
	switch b.title {
	case "ProviderConfig":
		_, err = schema.DecodeProviderConfig(body)
	case "InstanceRecord":
		_, err = schema.DecodeInstanceRecord(body)
	case "HistoryEntry":
		_, err = schema.DecodeHistoryEntry(body)
	case "ShareRecord":
		_, err = schema.DecodeShareRecord(body)
	default:
		t.Errorf("%s: unknown record type %q", b.where(), b.title)
		return
	}
	if err != nil {
		t.Errorf("%s: %s record: %v", b.where(), b.title, err)
	}
}

var (
	placeholders = strings.NewReplacer("<prefix>", "/sluice/", "<name>", "payments-api", "<id>", "inst-a",
		"<seq>", "00000001795316939051796", "<lease-hex>", "694d7a2b3c4d5e6f", "~k", "~1", "<seconds>", "86400", "<start>", "01795305600000000000")
	hexRE = regexp.MustCompile(`^[0-9a-f]+$`)
)

// checkKey checks that k is a key, or a directory of keys, of the layout.
func checkKey(k string) error {
	k = placeholders.Replace(k)
	keys := schema.DefaultKeys()
	if _, err := keys.Parse(k); err == nil {
		return nil
	}
	if rest, ok := strings.CutPrefix(k, keys.Election()+"/"); ok && (rest == "" || hexRE.MatchString(rest)) {
		return nil
	}
	if k == keys.Prefix() || k == keys.Providers() || k == keys.Election() || k == keys.Owners() {
		return nil
	}
	if name, ok := strings.CutPrefix(k, keys.Owners()); ok && schema.ValidateName(name) == nil {
		return nil
	}
	if rest, ok := strings.CutPrefix(k, keys.Ledgers()); ok {
		// A provider's ledger: package internal/ledger parses the rest.
		if name, _, _ := strings.Cut(rest, "/"); schema.ValidateName(name) == nil {
			return nil
		}
	}
	if rest, ok := strings.CutPrefix(k, keys.Providers()); ok {
		name, leaf, _ := strings.Cut(rest, "/")
		if schema.ValidateName(name) == nil && (leaf == "" || leaf == "instances/" || leaf == "history/") {
			return nil
		}
	}
	return fmt.Errorf("%q is not a key of the layout (internal/schema/keys.go)", k)
}

// --- running the run blocks -----------------------------------------------

// TestCommandsRun runs every run block against a configd serve with an
// embedded etcd, and compares the output blocks with what the commands
// printed.
func TestCommandsRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs configd and example instances; -short checks the docs statically only")
	}
	dir := binaries(t)
	ds := loadDocs(t)
	work := t.TempDir()

	// Free ports for the documented addresses, below the kernel's
	// ephemeral range: a port taken from that range (listening on :0) and
	// closed again until the walk-through's process used it seconds later
	// went meanwhile to a test of another package run in parallel, which
	// then answered on inst-b's metrics port while inst-b had exited
	// (seen once in .ci/run).
	addrs := map[string]string{}
	for _, a := range documentedAddrs {
		addrs[a] = lowFreeAddr(t, addrs)
	}
	var pairs []string
	for _, a := range documentedAddrs {
		pairs = append(pairs, a, addrs[a])
	}
	// The documented data directory: where the test's serve keeps it (its
	// credentials are read from there).
	pairs = append(pairs, documentedDataDir+"/", filepath.Join(work, "configd.etcd")+"/")
	remap := strings.NewReplacer(pairs...)
	unmapped := regexp.MustCompile(`(?:127\.0\.0\.1|localhost):\d+`)

	// The wrapper: `configd` on PATH, sending client subcommands to the
	// test's admin API.
	adminURL := "http://" + addrs[adminAddr]
	real := filepath.Join(dir, "real", "configd")
	wrapper := fmt.Sprintf(`#!/bin/sh
# Written by docs/docs_test.go: the client subcommands talk to the configd
# serve the test started (--server, the documented flag).
case "$1" in
%s)
	sub=$1; shift
	exec %q "$sub" --server=%q "$@" ;;
esac
exec %q "$@"
`, strings.Join(clientSubcommands, "|"), real, adminURL, real)
	if err := os.WriteFile(filepath.Join(dir, "configd"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}

	type runBlock struct {
		b     block
		lines []cmdLine
		out   *block // the output block after it, if any
	}
	var runs []runBlock
	var serveLine *cmdLine
	var serveFile string
	for _, d := range ds {
		for i, b := range d.blocks {
			if b.lang != "sh" || b.title == "static" {
				continue
			}
			rb := runBlock{b: b, lines: commandLines(b)}
			if i+1 < len(d.blocks) && d.blocks[i+1].lang == "text" && d.blocks[i+1].title == "output" {
				rb.out = &d.blocks[i+1]
			}
			for j, cl := range rb.lines {
				if isForegroundServe(cl.text) {
					if serveLine != nil {
						t.Fatalf("%s:%d: a second foreground 'configd serve' in a run block (the test runs one; send others to the background or mark the block static)", b.file, cl.line)
					}
					serveLine, serveFile = &rb.lines[j], b.file
				}
				if m := unmapped.FindAllString(remap.Replace(cl.text), -1); slices.ContainsFunc(m, func(a string) bool { return !slices.Contains(slices.Collect(mapValues(addrs)), a) }) {
					t.Fatalf("%s:%d: a local address other than %v: %q", b.file, cl.line, documentedAddrs, cl.text)
				}
			}
			runs = append(runs, rb)
		}
	}
	if serveLine == nil {
		t.Fatal("no run block starts 'configd serve': the commands would have nothing to talk to")
	}

	var pgids []int
	var pgMu sync.Mutex
	t.Cleanup(func() {
		pgMu.Lock()
		defer pgMu.Unlock()
		for _, p := range pgids {
			syscall.Kill(-p, syscall.SIGKILL)
		}
	})
	start := func(name string, args []string, env []string, dir string, out *os.File) (*exec.Cmd, error) {
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, out, out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		pgMu.Lock()
		pgids = append(pgids, cmd.Process.Pid)
		pgMu.Unlock()
		return cmd, nil
	}
	env := []string{"PATH=" + dir + string(os.PathListSeparator) + os.Getenv("PATH"), "HOME=" + work, "LC_ALL=C"}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k == "TMPDIR" || k == "USER" {
			env = append(env, kv)
		}
	}

	// Start the documented configd serve, on the test's ports and data dir.
	cmds, _, err := parseShell(rewriteGoRun(serveLine.text))
	if err != nil || len(cmds) != 1 {
		t.Fatalf("cannot parse the serve line %q: %v", serveLine.text, err)
	}
	args := cmds[0][1:]
	if slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, "etcd-endpoints") }) {
		t.Fatalf("the run blocks' configd serve must run the embedded etcd: %q", serveLine.text)
	}
	for i := range args {
		args[i] = remap.Replace(args[i])
	}
	args = append(args, "--data-dir="+filepath.Join(work, "configd.etcd"), "--listen="+addrs[adminAddr],
		"--embedded-client-url=http://"+addrs[etcdAddr], "--embedded-peer-url=http://"+addrs[peerAddr])
	serveLog, err := os.Create(filepath.Join(work, "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer serveLog.Close()
	serve, err := start(real, args, env, work, serveLog)
	if err != nil {
		t.Fatal(err)
	}
	serveDone := make(chan error, 1)
	go func() { serveDone <- serve.Wait() }()
	t.Cleanup(func() {
		serve.Process.Signal(syscall.SIGTERM)
		select {
		case <-serveDone:
		case <-time.After(15 * time.Second):
			serve.Process.Kill()
			<-serveDone
		}
	})
	if err := waitLeader(adminURL, serveDone); err != nil {
		log, _ := os.ReadFile(serveLog.Name())
		t.Fatalf("configd serve %s: %v\n%s", strings.Join(args, " "), err, log)
	}
	t.Logf("%s %s: leading", real, strings.Join(args, " "))

	shell := "sh"
	if p, err := exec.LookPath("bash"); err == nil {
		shell = p
	}
	for n, rb := range runs {
		var sb strings.Builder
		for _, cl := range rb.lines {
			if rb.b.file == serveFile && cl.line == serveLine.line {
				sb.WriteString(": started by docs_test\n")
				continue
			}
			sb.WriteString(remap.Replace(rewriteGoRun(cl.text)) + "\n")
			if isBackground(cl.text) {
				continue
			}
			fmt.Fprintf(&sb, "__rc=$?; if [ $__rc -ne %d ]; then echo \"docs_test: %s:%d: exit $__rc, want %d\" >&2; exit 97; fi\n",
				cl.want, rb.b.file, cl.line, cl.want)
		}
		outPath := filepath.Join(work, fmt.Sprintf("block-%d.out", n))
		out, err := os.Create(outPath)
		if err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		cmd, err := start(shell, []string{"-c", sb.String()}, env, work, out)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err = <-done:
		case <-time.After(45 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			err = fmt.Errorf("timed out: %w", <-done)
		}
		out.Close()
		got, _ := os.ReadFile(outPath)
		t.Logf("%s (%v):\n%s", rb.b.where(), time.Since(began).Round(time.Millisecond), got)
		if err != nil {
			t.Errorf("%s: %v\n%s", rb.b.where(), err, got)
			continue
		}
		if rb.out != nil {
			compareOutput(t, rb.out.where(), rb.out.body, string(got))
		}
	}
}

func waitLeader(adminURL string, exited <-chan error) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("exited: %v", err)
		default:
		}
		resp, err := http.Get(adminURL + "/readyz")
		if err == nil {
			var body struct {
				Leader bool `json:"leader"`
			}
			derr := json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && derr == nil && body.Leader {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("not leading after 30s")
}

var goRunRE = regexp.MustCompile(`\bgo run \./(configd|examples/kafka)\b`)

// rewriteGoRun turns `go run ./configd` and `go run ./examples/kafka` into
// the binaries the test built.
func rewriteGoRun(s string) string {
	return goRunRE.ReplaceAllStringFunc(s, func(m string) string {
		if strings.HasSuffix(m, "configd") {
			return "configd"
		}
		return "sluice-kafka-example"
	})
}

var bgRE = regexp.MustCompile(`[^&]&\s*(#.*)?$`)

func isBackground(s string) bool { return bgRE.MatchString(s) }

// isForegroundServe reports whether s starts `configd serve` (not its
// help) in the foreground.
func isForegroundServe(s string) bool {
	cmds, _, err := parseShell(rewriteGoRun(s))
	if err != nil || len(cmds) != 1 || isBackground(s) {
		return false
	}
	w := cmds[0]
	return len(w) >= 2 && (w[0] == "configd" || strings.HasSuffix(w[0], "/configd")) && w[1] == "serve" &&
		!slices.ContainsFunc(w, func(a string) bool { return a == "--help" || a == "-h" || a == "-help" })
}

func mapValues(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

var digitsRE = regexp.MustCompile(`[0-9]+`)

func normalize(s string) string {
	return digitsRE.ReplaceAllString(strings.Join(strings.Fields(s), " "), "0")
}

// isHeader: a table header, every word in capitals.
func isHeader(s string) bool {
	f := strings.Fields(s)
	return len(f) >= 2 && !slices.ContainsFunc(f, func(w string) bool {
		return strings.ToUpper(w) != w || strings.Trim(w, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != ""
	})
}

// compareOutput checks documented output lines against what ran, in order:
// each must have a real line with the same first word and as many words
// (digits aside); headers and "configd: " errors must match exactly.
func compareOutput(t *testing.T, where string, documented []string, actual string) {
	t.Helper()
	var real []string
	sc := bufio.NewScanner(strings.NewReader(actual))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "docs_test:") {
			real = append(real, normalize(l))
		}
	}
	j := 0
	for _, d := range documented {
		nd := normalize(d)
		if nd == "" {
			continue
		}
		exact := isHeader(nd) || strings.HasPrefix(nd, "configd: ")
		df := strings.Fields(nd)
		found := false
		for k := j; k < len(real); k++ {
			rf := strings.Fields(real[k])
			if exact && real[k] == nd || !exact && rf[0] == df[0] && len(rf) == len(df) {
				j, found = k+1, true
				break
			}
		}
		if !found {
			t.Errorf("%s: documented output line %q has no counterpart (in order) in what ran:\n%s", where, d, actual)
			return
		}
	}
}

// --- figures ----------------------------------------------------------------

// figure is a measured figure the docs quote: where BENCHMARKS.md states
// it (a regexp whose first group is the figure), and the places that quote
// it (file, regexp with the figure as first group). Each quote must equal
// what BENCHMARKS.md says: a figure is measured once and quoted, never
// retyped from memory (issue 13: the crash drill said 5.0 s after the hold
// had made it 14.5 s).
type figure struct {
	name   string
	source *regexp.Regexp
	quotes []figureQuote
}

type figureQuote struct {
	file string
	re   *regexp.Regexp
}

var figures = []figure{
	{"retune median", regexp.MustCompile(`least the 200 ms propagation margin ahead — ([\d.]+ s) at the median`),
		[]figureQuote{{"docs/operations.md", regexp.MustCompile("new limit holds\\s+([\\d.]+ s) after `configd set` at the median")}}},
	{"retune worst", regexp.MustCompile(`at the median, ([\d.]+ s)\s+at worst with 1 s windows`),
		[]figureQuote{{"docs/operations.md", regexp.MustCompile("at the median and ([\\d.]+ s) at worst")}}},
	{"etcd requests per instance per second", regexp.MustCompile(`\*\*Coordination cost is flat\*\*: ([\d.–]+) etcd requests per instance`),
		[]figureQuote{{"docs/architecture.md", regexp.MustCompile(`that is ([\d.–]+) etcd requests per instance`)}}},
	{"etcd's growth without compaction", regexp.MustCompile(`\*\*Without it\*\* it grows ([\d.]+ MiB) a minute`),
		[]figureQuote{{"docs/operations.md", regexp.MustCompile(`100 ms windows write\s+about ([\d.]+ MiB) of it a minute`)}}},
	{"crashed instance's share handed on", regexp.MustCompile(`\*\*Instance crash\*\*:[^*]*?: ([\d.]+ s) here`),
		[]figureQuote{{"docs/operations.md", regexp.MustCompile(`ahead: ([\d.]+ s)\s+after a SIGKILL in BENCHMARKS.md`)}}},
}

func TestFiguresAgreeWithBenchmarks(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	bench := read("BENCHMARKS.md")
	for _, f := range figures {
		m := f.source.FindStringSubmatch(bench)
		if m == nil {
			t.Errorf("%s: BENCHMARKS.md no longer states it (%s): update this test with it", f.name, f.source)
			continue
		}
		for _, q := range f.quotes {
			qm := q.re.FindStringSubmatch(read(q.file))
			switch {
			case qm == nil:
				t.Errorf("%s: %s no longer quotes it (%s)", f.name, q.file, q.re)
			case qm[1] != m[1]:
				t.Errorf("%s: %s says %s, BENCHMARKS.md says %s", f.name, q.file, qm[1], m[1])
			}
		}
	}
}

// TestDurationsAgree: how long a make target takes is said in the
// Makefile's comment, the README and .ci/run alike.
func TestDurationsAgree(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	about := regexp.MustCompile(`(?:about|~)\s*(\d+)\s*min`)
	said := map[string]string{}
	for _, place := range []struct{ file, re string }{
		{"Makefile", `(?s)## faults:.*?\(([^)]*minutes)`},
		{"README.md", `(?s)` + "`make faults`" + `.*?Kafka broker restart; ([^;]*);`},
		{".ci/run", `fault suite[^(]*\(([^)]*)\)`},
	} {
		m := regexp.MustCompile(place.re).FindStringSubmatch(read(place.file))
		if m == nil {
			t.Errorf("%s: no duration of make faults found (%s)", place.file, place.re)
			continue
		}
		d := about.FindStringSubmatch(m[1])
		if d == nil {
			t.Errorf("%s: %q gives no duration in minutes", place.file, m[1])
			continue
		}
		said[place.file] = d[1]
	}
	for f, d := range said {
		if d != said["Makefile"] {
			t.Errorf("make faults takes %s minutes by %s, %s by the Makefile", d, f, said["Makefile"])
		}
	}
}

// lowFreeAddr returns a 127.0.0.1 address on a port from 20000 to 32767,
// below Linux's default ephemeral range (32768-60999), free when asked
// and none of taken's.
func lowFreeAddr(t *testing.T, taken map[string]string) string {
	t.Helper()
	used := map[string]bool{}
	for _, a := range taken {
		used[a] = true
	}
	for range 1000 {
		a := fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12768))
		if used[a] {
			continue
		}
		ln, err := net.Listen("tcp", a)
		if err != nil {
			continue
		}
		ln.Close()
		return a
	}
	t.Fatal("no free port from 20000 to 32767")
	return ""
}
