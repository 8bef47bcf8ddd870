package main

import (
	"context"
	"flag"
	"fmt"
	"io"
)

const getUsage = `Usage: configd get NAME [--json]

Prints provider NAME's config and its revision (the value for
'configd set --if-revision').

Example:
  configd get payments

Flags:
`

func runGet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("get", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseArgs(fs, getUsage, args, stdout)
	if err != nil {
		return helpOK(err)
	}
	name, err := oneName("get", pos)
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
	v, err := b.get(ctx, name)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, v)
	}
	fmt.Fprintf(stdout, "%-17s %s\n%-17s %d\n", "name:", v.Config.Name, "revision:", v.Revision)
	for _, f := range fields(v.Config) {
		fmt.Fprintf(stdout, "%-17s %s\n", f[0]+":", f[1])
	}
	return nil
}
