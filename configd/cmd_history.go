package main

import (
	"context"
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
	rc, err := openRead(ctx, "history", historyUsage, nameOne, args, stdout, stderr)
	if err != nil || rc == nil {
		return err
	}
	defer rc.done()
	v, err := rc.b.history(rc.ctx, rc.name)
	if err != nil {
		return err
	}
	if rc.asJSON {
		return printJSON(stdout, v)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WHEN\tWHO\tREVISION\tCHANGE")
	for _, h := range v {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", h.When.UTC().Format(time.RFC3339), h.Who, h.Revision, describeChange(h.Old, h.New))
	}
	return tw.Flush()
}
