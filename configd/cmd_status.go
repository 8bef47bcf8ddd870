package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/sluice-go/sluice/internal/schema"
)

const statusUsage = `Usage: configd status NAME [--json]

Shows provider NAME's config, the shares the configd leader published (for a
provider coordinated by the ledger, its fullest upcoming window against its
limit: see 'configd audit'), and a table of its live instances: instance,
host, share, demand, admitted, clock offset, last seen, generation applied;
on the ledger, each instance's grant in the window under way in place of its
share, and the holder its record names in place of the generation.
Malformed records found in etcd are listed at the end (they are ignored; the
last good values stay in force).
Lines "election:" list configd's election keys, oldest (leading) first; a
FOREIGN one is no replica's, and blocks the election while it is oldest
(configd serve removes it).

Example:
  configd status payments

Flags:
`

func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	rc, err := openRead(ctx, "status", statusUsage, nameOne, args, stdout, stderr)
	if err != nil || rc == nil {
		return err
	}
	defer rc.done()
	v, err := rc.b.status(rc.ctx, rc.name)
	if err != nil {
		return err
	}
	if rc.asJSON {
		return printJSON(stdout, v)
	}
	printStatus(stdout, v, time.Now())
	return nil
}

func printStatus(w io.Writer, v statusView, now time.Time) {
	printProvider(w, v, now, true)
	for i, lane := range v.Lanes {
		fmt.Fprintf(w, "\nlimit %d of %s, kept by its lane provider:\n", i+2, v.Provider)
		printProvider(w, lane, now, false)
	}
}

// printProvider prints one provider's status, and configd's election
// keys (the same for every provider) if election.
func printProvider(w io.Writer, v statusView, now time.Time, election bool) {
	fmt.Fprintf(w, "provider:  %s\n", v.Provider)
	if v.Config != nil {
		fmt.Fprintf(w, "config:    %s (revision %d)\n", summary(*v.Config), v.ConfigRevision)
	} else {
		fmt.Fprintf(w, "config:    none or malformed (revision %d)\n", v.ConfigRevision)
	}
	if v.Config != nil && v.Config.Adaptive != nil {
		printAdaptive(w, v)
	}
	budget := v.Config != nil && v.Config.Budget()
	if budget {
		printBudget(w, v)
	} else if v.Ledger != nil {
		fmt.Fprintf(w, "ledger:    %s\n", v.Ledger.says())
	} else if s := v.Shares; s != nil {
		fmt.Fprintf(w, "shares:    generation %d, total %d over %d instances, effective from %s (window %s), published by %s at %s\n",
			s.Generation, s.Total, s.Instances, s.EffectiveTime().UTC().Format(time.RFC3339Nano), s.Window,
			orDash(s.Leader), s.Published.UTC().Format(time.RFC3339))
	} else {
		fmt.Fprintf(w, "shares:    none published (is a 'configd serve' leader running?)\n")
	}
	if v.PublishError != "" {
		fmt.Fprintf(w, "publish:   FAILING: %s\n", v.PublishError)
	}
	if election {
		printElection(w, v)
	}
	if budget {
		printMalformed(w, v.Malformed)
		return
	}
	if v.Owner != "" && v.Ledger != nil {
		fmt.Fprintf(w, "led by:    %s (it writes this provider's ledger)\n", printable(v.Owner))
	} else if v.Owner != "" {
		fmt.Fprintf(w, "led by:    %s (it publishes this provider's shares)\n", printable(v.Owner))
	} else if v.ElectionError == "" && len(v.Election) > 0 {
		fmt.Fprintf(w, "led by:    no replica now (being handed over, or its replica's session is expiring)\n")
	}
	fmt.Fprintln(w)
	if v.Ledger != nil {
		printHolders(w, v, now)
		printMalformed(w, v.Malformed)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tHOST\tSHARE\tDEMAND\tADMITTED\tCLOCK OFFSET\tLAST SEEN\tGENERATION")
	for _, in := range v.Instances {
		share := "-"
		if in.HasShare {
			share = strconv.FormatInt(in.Share, 10)
		}
		r := in.Record
		if r == nil {
			fmt.Fprintf(tw, "%s\t-\t%s\t-\t-\t-\t-\t-\t(malformed record)\n", in.ID, share)
			continue
		}
		offset, seen := clockAndSeen(r, now)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%d\n", in.ID, orDash(r.Host), share, r.Demand, r.Admitted,
			offset, seen, r.AppliedGeneration)
	}
	tw.Flush()
	if len(v.Instances) == 0 {
		fmt.Fprintln(w, "(no live instances)")
	}
	if s := v.Shares; s != nil {
		// Grants of instances the shares no longer name: their keys went
		// and their shares stay reserved while they may still enforce
		// them (a lease that expired: the fail_static) and a window more.
		for _, id := range slices.Sorted(maps.Keys(s.Granted)) {
			if _, named := s.Shares[id]; !named && s.Granted[id] > 0 {
				fmt.Fprintf(w, "held:      %s %d (gone; reserved for the provider's fail_static if its lease expired, and a window more)\n", id, s.Granted[id])
			}
		}
	}
	printMalformed(w, v.Malformed)
}

// printHolders prints a ledger provider's live instances: what each may
// admit in the window under way by the grants stored for the holder its
// record names, and that holder.
func printHolders(w io.Writer, v statusView, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tHOST\tGRANT\tDEMAND\tADMITTED\tCLOCK OFFSET\tLAST SEEN\tHOLDER")
	for _, in := range v.Instances {
		r := in.Record
		if r == nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\t(malformed record)\n", in.ID)
			continue
		}
		grant := "-"
		if q, ok := v.Ledger.Grants[r.Holder]; ok && r.Holder != "" {
			grant = strconv.FormatInt(q, 10)
		}
		offset, seen := clockAndSeen(r, now)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", in.ID, orDash(r.Host), grant, r.Demand, r.Admitted,
			offset, seen, orDash(r.Holder))
	}
	tw.Flush()
	if len(v.Instances) == 0 {
		fmt.Fprintln(w, "(no live instances)")
	}
}

// clockAndSeen returns an instance record's clock offset, "unknown"
// when unmeasured, and how long ago it was last written.
func clockAndSeen(r *schema.InstanceRecord, now time.Time) (offset, seen string) {
	offset = "unknown"
	if r.ClockKnown {
		offset = r.ClockOffset.String()
	}
	at := r.Updated
	if at.IsZero() {
		at = r.Started
	}
	return offset, ago(now, at)
}

// printAdaptive says where an adaptive provider's effective limit stands
// against its ceiling, and the fleet's pushback that moves it.
func printAdaptive(w io.Writer, v statusView) {
	a := v.Config.Adaptive
	var pushbacks int64
	for _, in := range v.Instances {
		if in.Record != nil {
			pushbacks += in.Record.Pushbacks
		}
	}
	limit, how := v.Config.Limit, "enforced"
	if a.Shadow {
		limit, how = a.Ceiling, "shadow: not enforced"
		if a.Effective != 0 {
			limit = a.Effective
		}
	}
	fmt.Fprintf(w, "adaptive:  effective %d of ceiling %d (floor %d; %s); %d pushbacks reported by the live instances", limit, a.Ceiling, a.Floor, how, pushbacks)
	if !a.PauseUntil.IsZero() {
		fmt.Fprintf(w, "; probing paused until %s", a.PauseUntil.UTC().Format(time.RFC3339Nano))
	}
	if a.Reason != "" {
		fmt.Fprintf(w, "; last: %s", a.Reason)
	}
	fmt.Fprintln(w)
}

// printBudget says what the instances took of a budget lane's window
// under way: configd shares none of it.
func printBudget(w io.Writer, v statusView) {
	b := v.Budget
	if b == nil {
		return
	}
	fmt.Fprintf(w, "budget:    %d of %d taken by the instances in the window from %s (a budget: the instances take it from its counter; configd publishes no shares of it)\n",
		b.Taken, v.Config.Limit, time.Unix(0, b.Start).UTC().Format(time.RFC3339))
}

// printElection lists configd's election keys, oldest first: the oldest
// leads, unless it is foreign, when it blocks the election until a
// replica removes it.
func printElection(w io.Writer, v statusView) {
	switch {
	case v.ElectionError != "":
		fmt.Fprintf(w, "election:  unknown: %s\n", v.ElectionError)
		return
	case len(v.Election) == 0:
		fmt.Fprintf(w, "election:  no configd replica campaigns\n")
		return
	}
	for i, e := range v.Election {
		switch {
		case e.Foreign != "" && i == 0:
			fmt.Fprintf(w, "election:  FOREIGN %s blocks the election: %s; configd serve removes it\n", printable(e.Key), e.Foreign)
		case e.Foreign != "":
			fmt.Fprintf(w, "election:  FOREIGN %s is no replica's: %s; configd serve removes it\n", printable(e.Key), e.Foreign)
		case i == 0:
			fmt.Fprintf(w, "election:  %s leads (%s)\n", printable(e.Replica), printable(e.Key))
		default:
			fmt.Fprintf(w, "election:  %s waits (%s)\n", printable(e.Replica), printable(e.Key))
		}
	}
	if v.ElectionMore > 0 {
		fmt.Fprintf(w, "election:  and %d more keys\n", v.ElectionMore)
	}
}

// printable returns s as it is, or quoted when it holds characters a
// terminal would not show as themselves (it was read from etcd).
func printable(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return !unicode.IsGraphic(r) || r == '"' }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ago formats how long before now t was, e.g. "3s ago".
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	if d < 0 {
		d = 0
	}
	return d.Round(time.Second).String() + " ago"
}
