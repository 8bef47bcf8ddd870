package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

const historyUsage = `Usage: configd history NAME [--json]

Shows who changed provider NAME, when, and what changed, oldest first (the
last 100 changes). Deleted providers keep their history.

Example:
  configd history payments

Flags:
`

func runHistory(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("history", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseArgs(fs, historyUsage, args, stdout)
	if err != nil {
		return helpOK(err)
	}
	name, err := oneName("history", pos)
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
	v, err := b.history(ctx, name)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, v)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WHEN\tWHO\tREVISION\tCHANGE")
	for _, h := range v {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", h.When.UTC().Format(time.RFC3339), h.Who, h.Revision, describeChange(h.Old, h.New))
	}
	return tw.Flush()
}
