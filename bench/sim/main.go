// Command sim runs the redistributor simulator (package internal/sim) over
// scenario files and prints, per scenario, the most admitted in any aligned
// window against the limit, the utilization of the limit and how long shares
// took to follow each event, beside Doorman's published figures.
//
//	go run ./bench/sim                       # every scenarios/*.json
//	go run ./bench/sim -run 'skew' -v        # a subset, with timings
//	go run ./bench/sim path/to/scenario.json # given files
//	go run ./bench/sim -trace failing.json   # a replay, with every publish and apply
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	"github.com/sluice-go/sluice/internal/sim"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "sim:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", filepath.Join("bench", "sim", "scenarios"), "folder of scenario files (*.json)")
	filter := fs.String("run", "", "only scenarios whose name matches this regular expression")
	verbose := fs.Bool("v", false, "print each scenario's run time on stderr")
	trace := fs.Bool("trace", false, "print every publish, apply and record write on stderr (to read why a window went over)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	re, err := regexp.Compile(*filter)
	if err != nil {
		return fmt.Errorf("-run: %w", err)
	}
	files := fs.Args()
	if len(files) == 0 {
		files, err = filepath.Glob(filepath.Join(*dir, "*.json"))
		if err != nil {
			return err
		}
		if len(files) == 0 {
			return fmt.Errorf("no scenario files in %s (run from the module root, or give -dir)", *dir)
		}
		slices.Sort(files)
	}
	var reports []sim.Report
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		sc, err := sim.ParseScenarioBytes(b)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if !re.MatchString(sc.Name) {
			continue
		}
		start := time.Now()
		s := &sim.Sim{Scenario: sc}
		if *trace {
			s.Trace = stderr
		}
		r, err := s.Run()
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if *verbose {
			fmt.Fprintf(stderr, "%s: %s\n", sc.Name, time.Since(start).Round(time.Millisecond))
		}
		reports = append(reports, r)
	}
	if len(reports) == 0 {
		return errors.New("no scenario matches -run")
	}
	return sim.WriteTable(stdout, reports)
}
