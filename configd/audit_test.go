package main

import (
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/ledger"
	ledgerstore "github.com/sluice-go/sluice/internal/ledger/store"
	"github.com/sluice-go/sluice/internal/schema"
)

// putLedgerProvider creates provider name coordinated by the ledger, with
// limit per second and, if lane is set, a further limit of lane tokens a
// minute (lane provider name~1). The CLI has no flag for it yet.
func putLedgerProvider(t *testing.T, cli *clientv3.Client, name string, limit, lane int64) {
	t.Helper()
	cfg := schema.ProviderConfig{Name: name, Limit: limit, Window: schema.Duration(time.Second), Coordination: schema.CoordinationLedger}
	if lane > 0 {
		cfg.Lanes = []schema.Lane{{Dimension: "tokens", Limit: lane, Window: schema.Duration(time.Minute)}}
	}
	if _, err := (&store{cli: cli, keys: keys}).put(ctxT(t), cfg, 0, "test"); err != nil {
		t.Fatal(err)
	}
}

// publishLedger writes provider name's ledger as configd would: rounds
// of a publisher on the wall clock until the holders hold their quotas
// of limit per window. It returns the ledger as written.
func publishLedger(t *testing.T, cli *clientv3.Client, name string, limit int64, window time.Duration, target map[string]int64) *ledger.State {
	t.Helper()
	lk := ledger.Keys(keys.Ledger(name))
	pb := ledgerstore.NewPublisher(cli, lk, time.Now)
	p := ledger.Policy{Limit: limit, Window: window, Horizon: 20, Keep: 2}
	for i := 0; ; i++ {
		ch, err := pb.Round(ctxT(t), p, target)
		if errors.Is(err, ledgerstore.ErrMoved) && i < 10 {
			continue // configd's leader wrote first: decide again
		}
		if err != nil {
			t.Fatalf("round %d of %s's ledger: %v", i, name, err)
		}
		if ch.Empty() {
			break
		}
		if i == 10 {
			t.Fatalf("%s's ledger still changes after %d rounds: %v", name, i, ch.Why)
		}
	}
	s, _, _, bad, err := ledgerstore.Read(ctxT(t), cli, lk)
	if err != nil || len(bad) > 0 {
		t.Fatalf("reading %s's ledger: %v %v", name, err, bad)
	}
	return s
}

// auditLine returns the line of audit's table for provider name, its
// fields split on runs of spaces.
func auditLine(t *testing.T, out, name string) []string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == name {
			return f
		}
	}
	t.Fatalf("audit printed no line for %s:\n%s", name, out)
	return nil
}

// TestAuditCLI runs configd audit, through the admin API and straight to
// etcd, on ledgers written by the publisher configd runs: one of three
// holders within its limit, with a lane; one where a grant forged by hand
// pushes the windows to come over; one holding a record of garbage; a
// provider coordinated by the shares; and a name no provider has.
// configd status says what audit says of each.
func TestAuditCLI(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, "r1")
	cli := srv.Client(t)
	modes := map[string][]string{
		"api":  {"--server", r.url()},
		"etcd": {"--etcd-endpoints", srv.Endpoints()[0]},
	}
	three := map[string]int64{"a.1": 30, "b.1": 30, "c.1": 30}
	// The ledgers first: configd leads a ledger provider's rounds once its
	// config is there.
	publishLedger(t, cli, "llm", 100, time.Second, three)
	publishLedger(t, cli, "llm~1", 1000, time.Minute, map[string]int64{"a.1": 400, "b.1": 500})
	putLedgerProvider(t, cli, "llm", 100, 1000)
	cliOK(t, "set", "pay", "--limit", "100", "--coordination", "shares", "--server", r.url())

	for mode, conn := range modes {
		audit := func(args ...string) (string, error) {
			t.Helper()
			return cliRun(t, append(append([]string{"audit"}, args...), conn...)...)
		}
		t.Run(mode+"/within", func(t *testing.T) {
			out, err := audit("llm")
			t.Logf("configd audit llm:\n%s", out)
			if err != nil || exitCode(err) != 0 {
				t.Fatalf("audit of a ledger within its limits: %v (exit %d)\n%s", err, exitCode(err), out)
			}
			// PROVIDER WINDOW STARTS SUM LIMIT AUDIT
			if f := auditLine(t, out, "llm"); len(f) != 6 || f[3] != "90" || f[4] != "100" || f[5] != "ok" {
				t.Errorf("llm's line is %q, want a sum of 90 against 100, ok", f)
			}
			if f := auditLine(t, out, "llm~1"); len(f) != 6 || f[3] != "900" || f[4] != "1000" || f[5] != "ok" {
				t.Errorf("llm~1's line is %q, want a sum of 900 against 1000, ok", f)
			}
			if strings.Contains(out, "problems:") {
				t.Errorf("audit lists problems of a ledger within its limits:\n%s", out)
			}
			all, err := audit()
			if err != nil || !strings.Contains(all, "llm~1") || strings.Contains(all, "pay") {
				t.Errorf("audit of every provider: %v, want llm and its lane, not pay:\n%s", err, all)
			}
			js, err := audit("llm", "--json")
			var vs []auditView
			if err != nil || json.Unmarshal([]byte(js), &vs) != nil || len(vs) != 1 || len(vs[0].Ledgers) != 2 ||
				vs[0].Ledgers[0].Sum != 90 || vs[0].Ledgers[0].Limit != 100 || vs[0].Ledgers[0].Era != 1 {
				t.Errorf("audit --json: %v\n%s", err, js)
			}
			st := cliOK(t, append([]string{"status", "llm"}, conn...)...)
			if !regexp.MustCompile(`(?m)^ledger:    fullest upcoming window 90 of 100 \(ok\): window \d+ from `).MatchString(st) ||
				!strings.Contains(st, "fullest upcoming window 900 of 1000 (ok)") {
				t.Errorf("status lacks the ledger's lines:\n%s", st)
			}
		})
		t.Run(mode+"/shares", func(t *testing.T) {
			out, err := audit("pay")
			if err != nil || !regexp.MustCompile(`(?m)^pay +coordination shares: nothing to audit$`).MatchString(out) {
				t.Errorf("audit of a shares provider: %v\n%s", err, out)
			}
		})
		t.Run(mode+"/unknown", func(t *testing.T) {
			_, err := audit("nosuch")
			if !errors.Is(err, ErrNotFound) || exitCode(err) != 1 {
				t.Errorf("audit of an unknown provider: %v (exit %d), want not found, exit 1", err, exitCode(err))
			}
		})
	}

	// A grant forged into the last publish, to a holder configd never
	// named: the windows it covers hold 110 of 100.
	s := publishLedger(t, cli, "forged", 100, time.Second, three)
	putLedgerProvider(t, cli, "forged", 100, 0)
	var last ledger.Pub
	for _, p := range s.Pubs {
		if p.Seq > last.Seq {
			last = p
		}
	}
	lk := ledger.Keys(keys.Ledger("forged"))
	forged := ledger.Grant{Pub: last.Seq, Holder: "mallory.1", Quota: 20, From: last.A}
	b, err := ledger.Encode(forged)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctxT(t), lk.Grant(forged.Holder, forged.Pub), string(b)); err != nil {
		t.Fatal(err)
	}

	// A record of garbage under a ledger within its limits.
	publishLedger(t, cli, "junk", 100, time.Second, three)
	putLedgerProvider(t, cli, "junk", 100, 0)
	junkKey := keys.Ledger("junk") + "grant/x.1/7"
	if _, err := cli.Put(ctxT(t), junkKey, "garbage"); err != nil {
		t.Fatal(err)
	}

	for mode, conn := range modes {
		audit := func(args ...string) (string, error) {
			t.Helper()
			return cliRun(t, append(append([]string{"audit"}, args...), conn...)...)
		}
		t.Run(mode+"/forged", func(t *testing.T) {
			out, err := audit("forged")
			t.Logf("configd audit forged:\n%s", out)
			if !errors.Is(err, ErrAudit) || exitCode(err) != 1 || !strings.Contains(err.Error(), "1 of 1 limits over") {
				t.Fatalf("audit of a forged ledger: %v (exit %d), want ErrAudit, exit 1", err, exitCode(err))
			}
			f := auditLine(t, out, "forged")
			if len(f) != 6 || f[3] != "110" || f[4] != "100" || f[5] != "OVER" {
				t.Errorf("forged's line is %q, want a sum of 110 against 100, OVER", f)
			}
			// The window over is named, in the line and among the problems.
			want := regexp.MustCompile(`(?m)^  forged +OVER +era 1, window (\d+) from \S+: grants add up to 110, over the limit of 100$`)
			m := want.FindStringSubmatch(out)
			if m == nil || m[1] != itoa(last.A) {
				t.Errorf("audit names no window over from %d:\n%s", last.A, out)
			}
			st := cliOK(t, append([]string{"status", "forged"}, conn...)...)
			if !strings.Contains(st, "ledger:    fullest upcoming window 110 of 100 (OVER)") {
				t.Errorf("status does not say the ledger is over:\n%s", st)
			}
		})
		t.Run(mode+"/garbage", func(t *testing.T) {
			out, err := audit("junk")
			t.Logf("configd audit junk:\n%s", out)
			if !errors.Is(err, ErrAudit) || exitCode(err) != 1 || !strings.Contains(err.Error(), "audit failed: 1 record does not decode") {
				t.Fatalf("audit of a ledger with garbage: %v (exit %d), want ErrAudit, exit 1", err, exitCode(err))
			}
			if f := auditLine(t, out, "junk"); len(f) != 6 || f[3] != "90" || f[5] != "ok" {
				t.Errorf("junk's line is %q, want its sum of 90, ok", f)
			}
			if !regexp.MustCompile(`(?m)^  junk +BAD +` + regexp.QuoteMeta(junkKey) + ` \(revision \d+\) does not decode: ledger: invalid record: `).MatchString(out) {
				t.Errorf("audit does not name the bad record %s:\n%s", junkKey, out)
			}
			st := cliOK(t, append([]string{"status", "junk"}, conn...)...)
			t.Logf("configd status junk:\n%s", st)
			if !strings.Contains(st, junkKey) {
				t.Errorf("status does not list the bad record %s:\n%s", junkKey, st)
			}
		})
		t.Run(mode+"/all", func(t *testing.T) {
			out, err := audit()
			if !errors.Is(err, ErrAudit) || !strings.Contains(err.Error(), "audit failed: 1 of 4 limits over, 1 record does not decode") {
				t.Errorf("audit of every provider: %v, want 1 of 4 limits over and 1 bad record\n%s", err, out)
			}
			for _, name := range []string{"llm", "llm~1", "forged", "junk"} {
				auditLine(t, out, name)
			}
		})
	}
}

// TestAuditNoLedger: with no provider coordinated by the ledger (one
// created naming the shares), audit says there is nothing to audit and
// succeeds; a provider created naming no coordination is on the ledger,
// and audit finds nothing granted in it yet.
func TestAuditNoLedger(t *testing.T) {
	srv := etcdtest.Start(t)
	conn := []string{"--etcd-endpoints", srv.Endpoints()[0]}
	cliOK(t, append([]string{"set", "pay", "--limit", "100", "--coordination", "shares"}, conn...)...)
	out := cliOK(t, append([]string{"audit"}, conn...)...)
	if out != "no provider is coordinated by the ledger: nothing to audit\n" {
		t.Errorf("audit printed %q", out)
	}
	cliOK(t, append([]string{"set", "fresh", "--limit", "100"}, conn...)...)
	out = cliOK(t, append([]string{"audit"}, conn...)...)
	if f := auditLine(t, out, "fresh"); strings.Join(f[1:], " ") != "- - 0 - ok: nothing granted yet" || strings.Contains(out, "pay") {
		t.Errorf("audit of a provider created naming no coordination printed %q, want fresh's ledger with nothing granted yet, and no pay", out)
	}
}
