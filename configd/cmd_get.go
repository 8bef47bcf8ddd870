package main

import (
	"context"
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
	rc, err := openRead(ctx, "get", getUsage, nameOne, args, stdout, stderr)
	if err != nil || rc == nil {
		return err
	}
	defer rc.done()
	v, err := rc.b.get(rc.ctx, rc.name)
	if err != nil {
		return err
	}
	if rc.asJSON {
		return printJSON(stdout, v)
	}
	fmt.Fprintf(stdout, "%-17s %s\n%-17s %d\n", "name:", v.Config.Name, "revision:", v.Revision)
	for _, f := range shown(v.Config) {
		fmt.Fprintf(stdout, "%-17s %s\n", f[0]+":", f[1])
	}
	return nil
}
