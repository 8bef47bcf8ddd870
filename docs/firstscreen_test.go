//go:build unix

package docs

// What a newcomer reads first: the headline table of BENCHMARKS.md, whose
// every figure is one its linked sections state.

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
