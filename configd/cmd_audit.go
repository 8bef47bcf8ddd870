package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

const auditUsage = `Usage: configd audit [NAME] [--json]

Checks the ledger of provider NAME, or of every provider coordinated by the
ledger when no NAME is given, as anyone can: in no window may the grants
add up to more than the limit in force. It prints a line per limit (the
provider's own, and each further limit's lane provider, NAME~N): the fullest
window from the current one on, its index and start, what the grants add up
to in it against the limit in force there, and ok or OVER; for a budget
(a window over 1h), taken from a counter and not granted, what was taken
of it in the window under way. Then, under
"problems:", every window over, past or to come, and every record under the
ledger that does not decode, by key. A provider coordinated by the shares
has no ledger: nothing to audit.

Exit code 0 when every ledger is within its limits and decodes whole, 1
when one is over or holds a record that does not decode.

Example:
  configd audit payments

Flags:
`

// ErrAudit: a ledger is over its limit, or holds a record that does not
// decode.
var ErrAudit = errors.New("configd: audit failed")

func runAudit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	rc, err := openRead(ctx, "audit", auditUsage, nameOptional, args, stdout, stderr)
	if err != nil || rc == nil {
		return err
	}
	defer rc.done()
	var views []auditView
	if rc.name != "" {
		v, err := rc.b.audit(rc.ctx, rc.name)
		if err != nil {
			return err
		}
		views = append(views, v)
	} else {
		l, err := rc.b.list(rc.ctx)
		if err != nil {
			return err
		}
		for _, p := range l.Providers {
			if !p.Config.Ledger() {
				continue
			}
			v, err := rc.b.audit(rc.ctx, p.Config.Name)
			if errors.Is(err, ErrNotFound) {
				continue // deleted since it was listed
			}
			if err != nil {
				return err
			}
			views = append(views, v)
		}
	}
	if rc.asJSON {
		if views == nil {
			views = []auditView{}
		}
		if err := printJSON(stdout, views); err != nil {
			return err
		}
	} else {
		printAudit(stdout, views)
	}
	return auditResult(views)
}

// printAudit prints a line per limit, then the problems found.
func printAudit(w io.Writer, views []auditView) {
	if len(views) == 0 {
		fmt.Fprintln(w, "no provider is coordinated by the ledger: nothing to audit")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROVIDER\tFULLEST WINDOW\tSTARTS\tSUM\tLIMIT\tAUDIT")
	for _, v := range views {
		if len(v.Ledgers) == 0 {
			fmt.Fprintf(tw, "%s\tcoordination %s: nothing to audit\n", v.Provider, v.Coordination)
		}
		for _, l := range v.Ledgers {
			if b := l.Budget; b != nil {
				fmt.Fprintf(tw, "%s\tbudget: %d of %d taken in the window from %s (taken, not granted)\n", l.Provider, b.Taken, b.Limit, b.Start.Format(time.RFC3339))
				if l.Era == 0 {
					continue // no grant of an earlier limit of its name
				}
			}
			if l.Era == 0 {
				fmt.Fprintf(tw, "%s\t-\t-\t0\t-\t%s: nothing granted yet\n", l.Provider, l.verdict())
				continue
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%s\n", l.Provider, l.Fullest, l.Start.UTC().Format(time.RFC3339Nano), l.Sum, l.Limit, l.verdict())
		}
	}
	var problems []string
	for _, v := range views {
		for _, l := range v.Ledgers {
			for _, x := range l.Violations {
				problems = append(problems, fmt.Sprintf("  %s\tOVER\t%s\n", l.Provider, x))
			}
			for _, b := range l.Bad {
				problems = append(problems, fmt.Sprintf("  %s\tBAD\t%s (revision %d) does not decode: %s\n", l.Provider, printable(b.Key), b.Revision, b.Error))
			}
		}
	}
	if len(problems) > 0 {
		fmt.Fprintln(tw, "\nproblems:")
		for _, p := range problems {
			fmt.Fprint(tw, p)
		}
	}
	tw.Flush()
}

// auditResult returns nil when every ledger in views is within its
// limits and decodes whole, else an ErrAudit that counts what is not.
func auditResult(views []auditView) error {
	var limits, over, bad int
	for _, v := range views {
		for _, l := range v.Ledgers {
			limits++
			if l.over() {
				over++
			}
			bad += len(l.Bad)
		}
	}
	var says []string
	if over > 0 {
		says = append(says, fmt.Sprintf("%d of %d limits over", over, limits))
	}
	switch {
	case bad == 1:
		says = append(says, "1 record does not decode")
	case bad > 1:
		says = append(says, fmt.Sprintf("%d records do not decode", bad))
	}
	if len(says) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrAudit, strings.Join(says, ", "))
}
