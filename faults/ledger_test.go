package faults

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
)

// ledgerSettle waits until every one of insts follows the ledger and
// their quotas, as each reports it, add up to want with none at 0. It
// returns when that was first seen.
func ledgerSettle(t *testing.T, want int64, insts ...*instance) time.Time {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var sum int64
		ok := true
		var parts []string
		for _, in := range insts {
			st := in.stats(t)
			q, _ := strconv.ParseInt(st["share"], 10, 64)
			sum += q
			ok = ok && q > 0 && st["source"] == schema.SourceLedger
			parts = append(parts, fmt.Sprintf("%s %d (%s)", in.id, q, st["source"]))
		}
		if ok && sum == want {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ledger's grants did not reach %d over %d instances within 30s: %s", want, len(insts), strings.Join(parts, ", "))
		}
		time.Sleep(100 * time.Millisecond) // polling interval, not synchronisation
	}
}

// TestLedgerFaults: a provider coordinated by the ledger, three instance
// processes under load and two configd replicas. One instance is
// SIGSTOPped past its lease and its grants' end, then woken; the configd
// leader is SIGKILLed; then another instance is. After each fault the
// instances left hold the whole limit again; no aligned window gets more
// than the limit by grant time, the zombie's wake included; and the
// ledger audits clean.
func TestLedgerFaults(t *testing.T) {
	r := newRig(t, "fault-ledger")
	a := startConfigd(t, r.endpoint, "cd-a")
	if _, _, err := a.errs.wait(0, 20*time.Second, func(s string) bool { return strings.Contains(s, `msg="became leader"`) }); err != nil {
		t.Fatalf("cd-a did not become leader: %v", err)
	}
	b := startConfigd(t, r.endpoint, "cd-b")
	a.cli(t, "set", r.provider, "--limit", fmt.Sprint(limit), "--coordination", "ledger", "--fail-static", "3s")
	insts := r.startInstances(t, 3)
	i1, i2, i3 := insts[0], insts[1], insts[2]
	ledgerSettle(t, limit, insts...)
	from := startLoad(i1, i2, i3)
	waitUntil(time.Unix(0, (from+2)*int64(window)).Add(100 * time.Millisecond))

	if err := i1.signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Logf("injected: SIGSTOP of inst-1 (pid %d), lease TTL %v, fail_static 3s", i1.pid(), leaseTTL)
	handed := ledgerSettle(t, limit, i2, i3)
	t.Logf("inst-1's room held by inst-2 and inst-3 %v after SIGSTOP (its lease expired, then its grants ended)", handed.Sub(stopped).Round(time.Millisecond))

	waitUntil(time.Unix(0, (windowIndex(time.Now())+2)*int64(window)).Add(100 * time.Millisecond))
	if err := i1.signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	woke := time.Now()
	back := ledgerSettle(t, limit, i1, i2, i3)
	t.Logf("injected: SIGCONT of inst-1 after %v stopped; the three hold the limit again %v later", woke.Sub(stopped).Round(time.Millisecond), back.Sub(woke).Round(time.Millisecond))

	if err := a.signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if _, _, err := b.errs.wait(0, 20*time.Second, func(s string) bool { return strings.Contains(s, `msg="became leader"`) }); err != nil {
		t.Fatalf("cd-b did not take over: %v", err)
	}
	t.Logf("injected: SIGKILL of the configd leader cd-a; cd-b leads %v later", time.Since(killed).Round(time.Millisecond))
	// Past the horizon the grants written by cd-a have ended: what the
	// three hold now cd-b extended.
	waitUntil(killed.Add(6 * window))
	ledgerSettle(t, limit, i1, i2, i3)

	if err := i2.signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	rest := ledgerSettle(t, limit, i1, i3)
	t.Logf("injected: SIGKILL of inst-2; inst-1 and inst-3 hold the whole limit %v later", rest.Sub(gone).Round(time.Millisecond))
	waitUntil(rest.Add(2 * window))
	to := stopLoad(i1, i3)

	tl := count(r.stub.calls(), from, to)
	logWindows(t, tl, "the ledger through a zombie, a leader killed and an instance killed")
	t.Logf("the wake window: %s", tl.row(windowIndex(woke)))
	for _, k := range tl.over(limit) {
		t.Errorf("window over the limit: %s", tl.row(k))
	}
	out := b.cli(t, "audit", r.provider)
	t.Logf("configd audit:\n%s", out)
	if !strings.Contains(out, " ok") || strings.Contains(out, "OVER") {
		t.Errorf("the ledger does not audit ok:\n%s", out)
	}
}
