package main

import (
	"context"
	"flag"
	"fmt"
	"io"
)

const deleteUsage = `Usage: configd delete NAME [--if-revision R]

Deletes provider NAME's config and published shares; the change is kept in
history. Running instances drop to their fallback quota (0 unless configured:
nothing admitted) as soon as they see the config gone.
--if-revision R deletes only if the provider is still at revision R.

Example:
  configd delete payments --if-revision 42

Flags:
`

func runDelete(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("delete", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs)
	var ifRevision optString
	fs.Var(&ifRevision, "if-revision", "delete only if the provider is at this revision")
	pos, err := parseArgs(fs, deleteUsage, args, stdout)
	if err != nil {
		return helpOK(err)
	}
	name, err := oneName("delete", pos)
	if err != nil {
		return err
	}
	ifRev, err := ifRevision.revision("delete", 1)
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
	ch, err := b.remove(ctx, name, ifRev, cf.who)
	if err != nil {
		return err
	}
	what := "delete (the stored config was malformed)"
	if ch.Old != nil {
		what = describeChange(ch.Old, nil)
	}
	fmt.Fprintf(stdout, "%s: %s (revision %d)\n", name, what, ch.Revision)
	return nil
}
