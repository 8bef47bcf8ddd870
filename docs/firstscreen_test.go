//go:build unix

package docs

// What a newcomer reads first: the README's first screen and the headline
// table of BENCHMARKS.md. Each claim they make is checked where it can be:
// the go get line names this module, the make targets exist, the picture
// exists and a make target takes it again, the identifiers of the examples
// exist, and every figure of the headline table is one its linked sections
// state.

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func readRoot(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// firstScreen is how many lines of the README a newcomer sees before
// scrolling: what sluice is, how to install it and how to run the demo must
// be within them.
const firstScreen = 40

func TestReadmeFirstScreen(t *testing.T) {
	readme := readRoot(t, "README.md")
	mod := regexp.MustCompile(`(?m)^module (\S+)$`).FindStringSubmatch(readRoot(t, "go.mod"))
	if mod == nil {
		t.Fatal("go.mod names no module")
	}
	lines := strings.Split(readme, "\n")
	top := strings.Join(lines[:min(firstScreen, len(lines))], "\n")
	get := regexp.MustCompile("(?m)^go get (\\S+)$").FindStringSubmatch(top)
	switch {
	case get == nil:
		t.Errorf("README.md: no `go get` line in its first %d lines", firstScreen)
	case get[1] != mod[1] && !strings.HasPrefix(get[1], mod[1]+"/") && !strings.HasPrefix(get[1], mod[1]+"@"):
		t.Errorf("README.md: go get %s, but the module is %s", get[1], mod[1])
	}
	if !strings.Contains(top, "`make demo`") {
		t.Errorf("README.md: its first %d lines do not say how to run the demo (`make demo`)", firstScreen)
	}

	// Every make target the README names exists.
	makefile := readRoot(t, "Makefile")
	for _, m := range regexp.MustCompile("(?m)(?:^|`)make ([a-z][a-z-]*)").FindAllStringSubmatch(readme, -1) {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(m[1]) + `:`).MatchString(makefile) {
			t.Errorf("README.md names make %s, which the Makefile does not have", m[1])
		}
	}

	// The picture exists, and make screenshot takes it again from the demo.
	for _, img := range regexp.MustCompile(`!\[[^\]]*\]\(([^)]+)\)`).FindAllStringSubmatch(readme, -1) {
		if _, err := os.Stat(filepath.Join(root, img[1])); err != nil {
			t.Errorf("README.md shows %s: %v", img[1], err)
		}
		recipe := regexp.MustCompile(`(?m)^screenshot:.*\n\t(.*)$`).FindStringSubmatch(makefile)
		if recipe == nil || !strings.Contains(recipe[1], "bin/demo") || !strings.Contains(recipe[1], "-screenshot "+img[1]) {
			t.Errorf("README.md shows %s, but make screenshot does not take it from the demo (recipe %q)", img[1], recipe)
		}
	}

	// Its links lead somewhere: a heading of its own, or a file.
	headings := map[string]bool{}
	for _, h := range regexp.MustCompile(`(?m)^#+ (.*)$`).FindAllStringSubmatch(readme, -1) {
		headings[slug(h[1])] = true
	}
	for _, l := range regexp.MustCompile(`\]\(([^)#]*)(?:#([^)]*))?\)`).FindAllStringSubmatch(readme, -1) {
		switch {
		case strings.Contains(l[1], "://"):
		case l[1] == "" && !headings[l[2]]:
			t.Errorf("README.md links to #%s, which none of its headings has", l[2])
		case l[1] != "":
			if _, err := os.Stat(filepath.Join(root, l[1])); err != nil {
				t.Errorf("README.md links to %s: %v", l[1], err)
			}
		}
	}

	// The examples' pkg.Name identifiers exist.
	f := &facts{}
	f.collectSource(t)
	for _, m := range regexp.MustCompile(`\b(limiter|cluster|skew|metrics|consumer)\.([A-Z]\w*)`).FindAllStringSubmatch(readme, -1) {
		if !f.idents[m[1]][m[2]] {
			t.Errorf("README.md names %s.%s, which package %s does not declare", m[1], m[2], m[1])
		}
	}
}

// slug is the anchor GitHub gives a heading: lower case, spaces to
// hyphens, and only letters, digits, hyphens and underscores kept.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestBenchmarksHeadline: the table on BENCHMARKS.md's first screen quotes
// figures, it does not measure them. Each row links to sections that
// exist, and every number in its figures is one those sections state.
// Every numbered section says the command that measured it.
func TestBenchmarksHeadline(t *testing.T) {
	bench := readRoot(t, "BENCHMARKS.md")
	lines := strings.Split(bench, "\n")

	// Sections by anchor: a heading's text runs to the next heading of
	// its level or above.
	type section struct {
		level int
		text  string
	}
	sections := map[string]section{}
	heading := regexp.MustCompile(`^(#{2,6}) (.*)$`)
	for i, l := range lines {
		m := heading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		j := i + 1
		for ; j < len(lines); j++ {
			if n := heading.FindStringSubmatch(lines[j]); n != nil && len(n[1]) <= len(m[1]) {
				break
			}
		}
		sections[slug(m[2])] = section{len(m[1]), strings.Join(lines[i:j], "\n")}
		if len(m[1]) == 2 && regexp.MustCompile(`^\d+\. `).MatchString(m[2]) && !strings.Contains(strings.Join(lines[i:j], "\n"), "Command") {
			t.Errorf("BENCHMARKS.md section %q does not say its command", m[2])
		}
	}

	// The headline table: the first table, before the first section.
	first := strings.Index(bench, "\n## ")
	var rows []string
	for _, l := range strings.Split(bench[:first], "\n") {
		if strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| ---") {
			rows = append(rows, l)
		}
	}
	if len(rows) < 2 {
		t.Fatal("BENCHMARKS.md: no headline table before its first section")
	}
	link := regexp.MustCompile(`\]\(#([^)]+)\)`)
	number := regexp.MustCompile(`\d+(?:[.,]\d+)*`)
	noCommas := func(s string) string { return regexp.MustCompile(`(\d),(\d)`).ReplaceAllString(s, "$1$2") }
	for _, row := range rows[1:] {
		cells := strings.Split(strings.Trim(row, "| "), " | ")
		what := cells[0]
		anchors := link.FindAllStringSubmatch(cells[len(cells)-1], -1)
		if len(anchors) == 0 {
			t.Errorf("BENCHMARKS.md headline %q links to no section", what)
			continue
		}
		var source strings.Builder
		for _, a := range anchors {
			s, ok := sections[a[1]]
			if !ok {
				t.Errorf("BENCHMARKS.md headline %q links to #%s, which no heading has", what, a[1])
				continue
			}
			source.WriteString(noCommas(s.text) + "\n")
		}
		src := source.String()
		for _, n := range number.FindAllString(noCommas(strings.Join(cells[:len(cells)-1], " ")), -1) {
			n = strings.TrimRight(n, ".")
			if !regexp.MustCompile(`(^|[^\d.])` + regexp.QuoteMeta(n) + `([^\d]|\.\D|\.$|$)`).MatchString(src) {
				t.Errorf("BENCHMARKS.md headline %q quotes %s, which its sections do not state", what, n)
			}
		}
	}
}
