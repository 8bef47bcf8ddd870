package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
)

// TestPrintStatusListsHeldShares: a grant of an instance the shares no
// longer name (its lease expired; held for the fail_static) is listed,
// and nothing is listed when there is none.
func TestPrintStatusListsHeldShares(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	cfg := schema.ProviderConfig{Name: "pay", Limit: 300}.WithDefaults()
	sh := &schema.Shares{Version: 1, Provider: "pay", Generation: 7, Window: schema.Duration(time.Second), Total: 300, Instances: 2,
		Shares:  map[string]int64{"a": 100, "b": 100},
		Granted: map[string]int64{"a": 100, "b": 100, "c": 100, "d": 0},
	}
	for _, tc := range []struct {
		name   string
		shares *schema.Shares
		want   []string
		absent []string
	}{
		{"held", sh, []string{"held:      c 100 (gone; reserved for the provider's fail_static if its lease expired, and a window more)"}, []string{"held:      d", "held:      a"}},
		{"none held", &schema.Shares{Version: 1, Provider: "pay", Generation: 8, Window: schema.Duration(time.Second), Total: 300, Instances: 1,
			Shares: map[string]int64{"a": 300}, Granted: map[string]int64{"a": 300}}, nil, []string{"held:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			printStatus(&b, statusView{Provider: "pay", Config: &cfg, ConfigRevision: 3, Shares: tc.shares}, now)
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("status lacks %q:\n%s", w, b.String())
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(b.String(), a) {
					t.Errorf("status has %q:\n%s", a, b.String())
				}
			}
		})
	}
}

// TestPrintStatusElection: the election lines, oldest key first; what was
// read from etcd reaches the terminal quoted when it holds characters a
// terminal would act on (a replica ID may hold an escape sequence).
func TestPrintStatusElection(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		name string
		v    statusView
		want []string
	}{
		{"none", statusView{Election: []electionKeyView{}}, []string{"election:  no configd replica campaigns\n"}},
		{"unreadable", statusView{ElectionError: "configd: etcd request failed: permission denied"},
			[]string{"election:  unknown: configd: etcd request failed: permission denied\n"}},
		{"replicas", statusView{Election: []electionKeyView{
			{Key: "/sluice/configd/leader/1", Replica: "configd-1"},
			{Key: "/sluice/configd/leader/2", Replica: "\x1b[2Jconfigd-2"},
		}, ElectionMore: 3}, []string{
			"election:  configd-1 leads (/sluice/configd/leader/1)\n",
			"election:  \"\\x1b[2Jconfigd-2\" waits (/sluice/configd/leader/2)\n",
			"election:  and 3 more keys\n",
		}},
		{"foreign", statusView{Election: []electionKeyView{
			{Key: "/sluice/configd/leader/x\x1b", Foreign: "no lease"},
			{Key: "/sluice/configd/leader/2", Replica: "configd-2"},
			{Key: "/sluice/configd/leader/y", Foreign: "bad name"},
		}}, []string{
			"election:  FOREIGN \"/sluice/configd/leader/x\\x1b\" blocks the election: no lease; configd serve removes it\n",
			"election:  configd-2 waits (/sluice/configd/leader/2)\n",
			"election:  FOREIGN /sluice/configd/leader/y is no replica's: bad name; configd serve removes it\n",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			tc.v.Provider = "pay"
			printStatus(&b, tc.v, now)
			out := b.String()
			rest := out
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("status lacks %q (in this order):\n%s", w, out)
				}
				rest = rest[i+len(w):]
			}
			if strings.Contains(out, "\x1b") {
				t.Errorf("status passes an escape character through:\n%q", out)
			}
		})
	}
}

// TestPrintStatusOnTheLedger: a ledger provider's instances show what
// each may admit in the window under way by the grants stored for the
// holder its record names, "-" for one with none, and that holder; the
// leader is named as the ledger's writer.
func TestPrintStatusOnTheLedger(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	cfg := schema.ProviderConfig{Name: "pay", Limit: 300, Coordination: schema.CoordinationLedger}.WithDefaults()
	v := statusView{Provider: "pay", Config: &cfg, ConfigRevision: 3, Owner: "r1",
		Ledger: &ledgerView{Provider: "pay", Era: 1, Window: schema.Duration(time.Second), Sum: 300, Limit: 300,
			Grants: map[string]int64{"a.1": 200, "b.1": 100}},
		Instances: []instanceView{
			{ID: "a", Record: &schema.InstanceRecord{ID: "a", Host: "h1", Holder: "a.1", Demand: 250, Updated: now}},
			{ID: "c", Record: &schema.InstanceRecord{ID: "c", Host: "h3", Holder: "c.1", Updated: now}},
		}}
	var b strings.Builder
	printStatus(&b, v, now)
	out := b.String()
	for _, re := range []string{
		`led by:    r1 \(it writes this provider's ledger\)`,
		`INSTANCE +HOST +GRANT +DEMAND +ADMITTED +CLOCK OFFSET +LAST SEEN +HOLDER`,
		`a +h1 +200 +250 +0 +unknown +0s ago +a\.1`,
		`c +h3 +- +0 +0 +unknown +0s ago +c\.1`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("status lacks %q:\n%s", re, out)
		}
	}
	if strings.Contains(out, "GENERATION") || strings.Contains(out, "publishes this provider's shares") {
		t.Errorf("a ledger provider's status speaks of shares:\n%s", out)
	}
}
