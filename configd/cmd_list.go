package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
)

const listUsage = `Usage: configd list [--json]

Lists every provider with its limit, window, mode, algorithm, pacing and
revision, and any malformed config found in etcd.

Flags:
`

func runList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	rc, err := openRead(ctx, "list", listUsage, nameNone, args, stdout, stderr)
	if err != nil || rc == nil {
		return err
	}
	defer rc.done()
	v, err := rc.b.list(rc.ctx)
	if err != nil {
		return err
	}
	if rc.asJSON {
		return printJSON(stdout, v)
	}
	if len(v.Providers) == 0 && len(v.Malformed) == 0 {
		fmt.Fprintln(stdout, "no providers yet: create one with configd set NAME --limit N")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tLIMIT\tWINDOW\tMODE\tALGORITHM\tPACING\tREVISION\tMORE LIMITS")
	for _, p := range v.Providers {
		c := p.Config
		more := moreLimits(c)
		if more == "none" {
			more = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%t\t%d\t%s\n", c.Name, c.Limit, c.Window, c.Mode, c.Algorithm, c.Pacing, p.Revision, more)
	}
	tw.Flush()
	printMalformed(stdout, v.Malformed)
	return nil
}

func printMalformed(w io.Writer, m []malformedView) {
	if len(m) == 0 {
		return
	}
	fmt.Fprintf(w, "\nmalformed records (ignored; last good values are kept):\n")
	for _, r := range m {
		fmt.Fprintf(w, "  %s (revision %d): %s\n", r.Key, r.Revision, r.Error)
	}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
