package main

// Security tests: etcd over TLS with client certificates and with
// user/password auth, against a real embedded etcd configured that way
// (internal/etcdtest), and what the admin API's token rules leave to
// TestTokenRules and TestServeRefusesNonLoopbackWithoutToken. Helpers here
// are prefixed "sec".

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// secJoin joins a cluster.Member of provider with an etcd client built from
// cfg (its own TLS material or credentials); Cleanup closes both.
func secJoin(t *testing.T, cfg clientv3.Config, provider, id string, logs *logbuf.Buffer) *cluster.Member {
	t.Helper()
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("member %s client: %v", id, err)
	}
	t.Cleanup(func() { cli.Close() })
	m, err := cluster.Join(ctxT(t), cli, provider,
		cluster.WithID(id),
		cluster.WithLeaseTTL(time.Second),
		cluster.WithReportInterval(100*time.Millisecond),
		cluster.WithFallback(0, time.Second),
		cluster.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatalf("join %s: %v", id, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// secHasShare waits until configd's leader has published shares of provider
// that give m exactly share, and m enforces them.
func secHasShare(t *testing.T, cli *clientv3.Client, provider string, m *cluster.Member, share int64) {
	t.Helper()
	waitShares(t, cli, provider, "shares giving "+m.ID()+" "+itoa(share), func(sh schema.Shares) bool {
		return sh.Shares[m.ID()] == share
	})
	waitFor(t, 15*time.Second, m.ID()+" to enforce the published share", func() bool {
		st := m.Status()
		return st.Source == "shares" && st.Share == share && m.Limiter().Stats().Quota == share
	})
}

// secHasGrant waits until m enforces a quota of share granted by the
// ledger: what a member of a provider created with no coordination named
// gets.
func secHasGrant(t *testing.T, m *cluster.Member, share int64) {
	t.Helper()
	waitFor(t, 15*time.Second, m.ID()+" to enforce its grant of "+itoa(share)+" from the ledger", func() bool {
		st := m.Status()
		return st.Source == schema.SourceLedger && st.Share == share && m.Limiter().Stats().Quota == share
	})
}

// secOneLine checks what main would print for err: exit code want and a
// single line naming the cause.
func secOneLine(t *testing.T, what string, err error, want int, cause string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: succeeded, want exit code %d", what, want)
	}
	if got := exitCode(err); got != want {
		t.Errorf("%s: exit code %d, want %d (%v)", what, got, want, err)
	}
	if msg := err.Error(); strings.ContainsAny(msg, "\r\n") || !strings.Contains(msg, cause) {
		t.Errorf("%s: stderr line %q, want one line containing %q", what, msg, cause)
	}
}

// TestSecurityEtcdTLS: configd serve and the CLI talk to an etcd that
// requires client certificates through --etcd-ca/--etcd-cert/--etcd-key;
// the leader grants the limit in the ledger, and a cluster.Member whose
// client is built from the same TLS material joins and enforces its grant. A CLI that
// trusts the CA but presents no certificate is refused and changes nothing.
func TestSecurityEtcdTLS(t *testing.T) {
	certs := etcdtest.NewCerts(t)
	srv := etcdtest.Start(t, etcdtest.WithClientCerts(certs))
	ep := srv.Endpoints()[0]
	if !strings.HasPrefix(ep, "https://127.0.0.1:") {
		t.Fatalf("endpoint %s is not https on loopback", ep)
	}
	tlsFlags := []string{"--etcd-endpoints", ep, "--etcd-ca", certs.CAFile, "--etcd-cert", certs.ClientCertFile, "--etcd-key", certs.ClientKeyFile}
	r := startReplica(t, nil, "r1", tlsFlags...)
	waitFor(t, 15*time.Second, "r1 to lead over TLS", r.leading)

	out := cliOK(t, append([]string{"set", "tls-p", "--limit", "100"}, tlsFlags...)...)
	if !strings.Contains(out, "limit=100") {
		t.Errorf("set over TLS printed %q", out)
	}
	var logs logbuf.Buffer
	m := secJoin(t, srv.Config(t), "tls-p", "inst-a", &logs) // the same CA and client certificate
	secHasGrant(t, m, 100)
	if out := cliOK(t, append([]string{"status", "tls-p"}, tlsFlags...)...); !strings.Contains(out, "inst-a") {
		t.Errorf("status over TLS does not list the member:\n%s", out)
	}

	noCert := []string{"--etcd-endpoints", ep, "--etcd-ca", certs.CAFile, "--timeout", "2s"}
	_, err := cliRun(t, append([]string{"set", "tls-p", "--limit", "5"}, noCert...)...)
	secOneLine(t, "set without a client certificate", err, 1, "etcd request failed")
	t.Logf("set without a client certificate: %v", err)
	_, err = cliRun(t, "set", "tls-p", "--limit", "5", "--etcd-endpoints", ep, "--timeout", "2s") // no TLS at all
	secOneLine(t, "set with no TLS flags against https", err, 1, "etcd request failed")
	_, err = cliRun(t, append([]string{"set", "tls-p", "--limit", "5", "--etcd-cert", certs.ClientCertFile, "--etcd-key", certs.CAFile}, noCert...)...)
	secOneLine(t, "set with a key that is not a key", err, 1, "etcd TLS")
	if out := cliOK(t, append([]string{"get", "tls-p", "--json"}, tlsFlags...)...); !strings.Contains(out, `"limit": 100,`) {
		t.Errorf("a refused set changed the config:\n%s", out)
	}
	if st := m.Status(); st.Share != 100 || !st.Connected {
		t.Errorf("member after the refused writes: %+v", st)
	}
}

// TestSecurityEtcdAuth: with etcd auth on, configd (serve and CLI) works as
// a user whose role can touch only the /sluice/ prefix — leader election,
// publishing, set, status, history — and members join as another such
// user. A user whose role lacks the prefix gets a permission error from
// set (exit code 1, one line) and, as serve, never becomes ready or leads;
// a wrong password is an authentication error. No password appears in
// serve's logs (at debug level), in errors, or in status/history output.
func TestSecurityEtcdAuth(t *testing.T) {
	const (
		rootPW     = "root-pw-a1b2c3d4e5"
		configdPW  = "configd-pw-f6g7h8i9j0"
		instancePW = "instance-pw-k1l2m3n4o5"
		outsidePW  = "outside-pw-p6q7r8s9t0"
	)
	srv := etcdtest.Start(t, etcdtest.WithAuth(rootPW))
	srv.AddUser(t, "configd", configdPW, "/sluice/")
	srv.AddUser(t, "instance", instancePW, "/sluice/")
	srv.AddUser(t, "outsider", outsidePW, "/elsewhere/")
	ep := srv.Endpoints()[0]
	as := func(user, pwFile string) []string {
		return []string{"--etcd-endpoints", ep, "--etcd-username", user, "--etcd-password-file", pwFile}
	}
	configd := as("configd", writeFile(t, "configd-pw", configdPW+"\n"))
	r := startReplica(t, nil, "r1", configd...)
	waitFor(t, 15*time.Second, "r1 to lead as user configd", r.leading)

	cliOK(t, append([]string{"set", "auth-p", "--limit", "100"}, configd...)...)
	var logs logbuf.Buffer
	mcfg := srv.Config(t)
	mcfg.Username, mcfg.Password = "instance", instancePW
	m := secJoin(t, mcfg, "auth-p", "inst-a", &logs)
	secHasGrant(t, m, 100)

	// A user without the prefix: a permission error, nothing written.
	outsider := as("outsider", writeFile(t, "outsider-pw", outsidePW))
	_, err := cliRun(t, append([]string{"set", "auth-p", "--limit", "5"}, outsider...)...)
	secOneLine(t, "set as a user without the prefix", err, 1, "permission denied")
	t.Logf("set as a user without the prefix: %v", err)
	if !errors.Is(err, rpctypes.ErrPermissionDenied) || !errors.Is(err, ErrEtcd) {
		t.Errorf("set as outsider: %v, want ErrEtcd wrapping etcd's permission denied", err)
	}
	_, err = cliRun(t, append([]string{"status", "auth-p"}, outsider...)...)
	secOneLine(t, "status as a user without the prefix", err, 1, "permission denied")
	if out := cliOK(t, append([]string{"get", "auth-p"}, configd...)...); !strings.Contains(out, "100") {
		t.Errorf("config after the refused set:\n%s", out)
	}
	// serve as that user: it runs, but is not ready and never leads.
	ro := startReplica(t, nil, "r-outsider", outsider...)
	status, body := do(t, "GET", ro.url()+"/readyz", nil, "")
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "permission denied") {
		t.Errorf("readyz of serve as outsider: %d %s, want 503 permission denied", status, body)
	}
	if ro.leading() {
		t.Errorf("serve as outsider leads")
	}

	// A wrong password and no password.
	_, err = cliRun(t, append([]string{"get", "auth-p"}, as("configd", writeFile(t, "wrong-pw", "wrong-password-zz9"))...)...)
	secOneLine(t, "get with a wrong password", err, 1, "authentication failed")
	t.Logf("get with a wrong password: %v", err)
	if err != nil && strings.Contains(err.Error(), "wrong-password-zz9") {
		t.Errorf("the error shows the password: %v", err)
	}
	_, err = cliRun(t, "get", "auth-p", "--etcd-endpoints", ep, "--timeout", "3s")
	secOneLine(t, "get without credentials", err, 1, "etcd request failed")

	// The password from $CONFIGD_ETCD_PASSWORD works too.
	t.Setenv(passwordEnv, configdPW)
	outs := []string{
		cliOK(t, "status", "auth-p", "--etcd-endpoints", ep, "--etcd-username", "configd"),
		cliOK(t, append([]string{"status", "auth-p", "--json"}, configd...)...),
		cliOK(t, append([]string{"history", "auth-p"}, configd...)...),
		cliOK(t, "status", "auth-p", "--server", r.url()),
		cliOK(t, "history", "auth-p", "--server", r.url(), "--json"),
	}
	_, metrics := do(t, "GET", r.url()+"/metrics", nil, "")
	outs = append(outs, metrics, r.log.String(), ro.log.String(), logs.String())
	for i, out := range outs {
		for _, pw := range []string{rootPW, configdPW, instancePW, outsidePW} {
			if strings.Contains(out, pw) {
				t.Errorf("output %d shows a password:\n%s", i, out)
			}
		}
	}
	if !strings.Contains(outs[0], "inst-a") {
		t.Errorf("status with the password from $%s:\n%s", passwordEnv, outs[0])
	}
}

// TestSecurityAdminAPI adds to TestTokenRules: a refused write (401, 403)
// writes nothing — no config, no history entry; 401 names the Bearer
// scheme; every read the API documents as open (list, get, status,
// history, metrics, healthz, readyz) works without a token; neither the
// token nor the wrong tokens tried appear in the logs, in status, history
// or list output, or in /metrics.
func TestSecurityAdminAPI(t *testing.T) {
	const token = "admin-token-Zq8Xw2Lm4Np6"
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	r := startReplica(t, srv, "r1", "--admin-token-file", writeFile(t, "token", token))
	tokenFile := writeFile(t, "cli-token", token)
	cliOK(t, "set", "p", "--limit", "50", "--server", r.url(), "--token-file", tokenFile)
	// What a write could touch: configs and history (the leader publishes
	// shares on its own, so those may change meanwhile).
	written := func() string {
		t.Helper()
		var b strings.Builder
		for _, k := range []string{keys.Config("p"), keys.Config("fresh"), keys.History("p"), keys.History("fresh")} {
			resp, err := cli.Get(ctxT(t), k, clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			for _, kv := range resp.Kvs {
				b.WriteString(string(kv.Key) + "@" + itoa(kv.ModRevision) + "=" + string(kv.Value) + "\n")
			}
		}
		return b.String()
	}
	before := written()

	wrong := []string{"", "Bearer wrong-token-AAAAAAAAAAAA", "Bearer " + token + "x", "Bearer  ", token}
	for _, auth := range wrong {
		hdr := map[string]string{"Content-Type": "application/json"}
		if auth != "" {
			hdr["Authorization"] = auth
		}
		for _, req := range []struct{ method, path, body string }{
			{"PUT", "/v1/providers/p", `{"limit":5}`},
			{"PUT", "/v1/providers/fresh", `{"limit":5}`},
			{"DELETE", "/v1/providers/p", ""},
		} {
			status, body := do(t, req.method, r.url()+req.path, hdr, req.body)
			if status != http.StatusUnauthorized && status != http.StatusForbidden {
				t.Errorf("%s %s with %q: %d %s, want 401 or 403", req.method, req.path, auth, status, body)
				continue
			}
			errorOf(t, body)
		}
	}
	// 401 tells the client which scheme to use.
	req, _ := http.NewRequestWithContext(ctxT(t), "PUT", r.url()+"/v1/providers/p", strings.NewReader(`{"limit":5}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
		t.Errorf("401 answer: %d, WWW-Authenticate %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	if after := written(); after != before || !strings.Contains(before, keys.Config("p")) {
		t.Errorf("refused writes changed etcd:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// Reads are open, as the API documents.
	for _, path := range []string{"/v1/providers", "/v1/providers/p", "/v1/providers/p/instances", "/v1/providers/p/history", "/v1/providers/p/audit", "/metrics", "/healthz", "/readyz"} {
		if status, body := do(t, "GET", r.url()+path, nil, ""); status != 200 {
			t.Errorf("GET %s without a token: %d %s", path, status, body)
		}
	}

	var outs []string
	for _, args := range [][]string{{"status", "p"}, {"status", "p", "--json"}, {"history", "p"}, {"history", "p", "--json"}, {"list"}, {"get", "p"}} {
		outs = append(outs, cliOK(t, append(args, "--server", r.url(), "--token-file", tokenFile)...))
	}
	_, metrics := do(t, "GET", r.url()+"/metrics", nil, "")
	outs = append(outs, metrics, r.log.String())
	if !strings.Contains(r.log.String(), "admin request refused") {
		t.Errorf("refused writes are not logged:\n%s", r.log.String())
	}
	for i, out := range outs {
		for _, secret := range []string{token, "wrong-token-AAAAAAAAAAAA", token[:12]} {
			if strings.Contains(out, secret) {
				t.Errorf("output %d shows a token (%q):\n%s", i, secret, out)
			}
		}
	}
}

// TestSecurityServeTokenFile: a token file that is missing, empty or too
// short (under 16 characters) stops serve before it listens — also on a
// non-loopback address, where a token is what lets it listen at all; the
// error names the file, never its content.
func TestSecurityServeTokenFile(t *testing.T) {
	for name, file := range map[string]string{
		"missing": t.TempDir() + "/no-such-token",
		"empty":   writeFile(t, "empty", "\n"),
		"short":   writeFile(t, "short", "tiny-secret\n"),
	} {
		for _, listen := range []string{"127.0.0.1:0", "0.0.0.0:0"} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var logs logbuf.Buffer
			err := run(ctx, []string{"serve", "--listen", listen, "--admin-token-file", file, "--etcd-endpoints", "http://127.0.0.1:1"}, &logs, &logs)
			cancel()
			if err == nil || !strings.Contains(err.Error(), "admin-token-file") || strings.Contains(err.Error(), "tiny-secret") {
				t.Errorf("%s token, --listen %s: %v, want an --admin-token-file error without the token", name, listen, err)
			}
			if strings.Contains(logs.String(), "configd serving") {
				t.Errorf("%s token, --listen %s: serve started:\n%s", name, listen, logs.String())
			}
		}
	}
}

// TestBearerSchemeIsCaseInsensitive: RFC 7235 makes the scheme
// case-insensitive; the token itself is not.
func TestBearerSchemeIsCaseInsensitive(t *testing.T) {
	srv := etcdtest.Start(t)
	token := "a-token-of-sixteen-or-more"
	r := startReplica(t, srv, "r1", "--admin-token-file", writeFile(t, "token", token))
	for _, tt := range []struct {
		header string
		want   int
	}{
		{"bearer " + token, http.StatusOK},
		{"BEARER " + token, http.StatusOK},
		{"Bearer " + strings.ToUpper(token), http.StatusForbidden},
		{"Basic " + token, http.StatusUnauthorized},
	} {
		req, err := http.NewRequest(http.MethodPut, r.url()+"/v1/providers/case", strings.NewReader(`{"limit": 10}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", tt.header)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("Authorization %q: status %d, want %d", strings.SplitN(tt.header, " ", 2)[0], resp.StatusCode, tt.want)
		}
	}
}

// TestLeastPrivilegeRoles (issue 16): with an external etcd, the roles
// docs/security.md gives each party are enough for it, and no more:
// configd reads and writes the prefix; an instance of provider pay, on
// the ledger (the default), reads pay's keys, the leader keys and pay's
// ledger and writes only pay's instance records, even-split
// confirmations and ledger releases; an operator's reader reads
// everything and writes nothing.
func TestLeastPrivilegeRoles(t *testing.T) {
	const rootPW, configdPW, instancePW, readerPW = "root-pw-1a2b3c4d", "configd-pw-5e6f7g8h", "pay-pw-9i0j1k2l", "reader-pw-3m4n5o6p"
	srv := etcdtest.Start(t, etcdtest.WithAuth(rootPW))
	p := schema.DefaultPrefix
	lk := ledger.Keys(keys.Ledger("pay"))
	srv.AddRole(t, "configd", configdPW, etcdtest.Perm{Key: p, Write: true})
	srv.AddRole(t, "instance-pay", instancePW,
		etcdtest.Perm{Key: keys.Provider("pay")},
		etcdtest.Perm{Key: keys.Instances("pay"), Write: true},
		etcdtest.Perm{Key: keys.Even("pay"), Write: true},
		etcdtest.Perm{Key: keys.Election()},
		etcdtest.Perm{Key: keys.Ledger("pay")},
		etcdtest.Perm{Key: lk.AllReleases(), Write: true})
	// A role from before the even split's confirmations: its instance
	// still registers and is granted its part (it says what the role
	// lacks).
	srv.AddRole(t, "instance-pay-old", instancePW,
		etcdtest.Perm{Key: keys.Provider("pay")},
		etcdtest.Perm{Key: keys.Instances("pay"), Write: true},
		etcdtest.Perm{Key: keys.Election()},
		etcdtest.Perm{Key: keys.Ledger("pay")},
		etcdtest.Perm{Key: lk.AllReleases(), Write: true})
	srv.AddRole(t, "reader", readerPW, etcdtest.Perm{Key: p})
	ep := srv.Endpoints()[0]
	as := func(user, pw string) []string {
		return []string{"--etcd-endpoints", ep, "--etcd-username", user, "--etcd-password-file", writeFile(t, user+"-pw", pw)}
	}
	r := startReplica(t, nil, "r1", as("configd", configdPW)...)
	waitFor(t, 15*time.Second, "r1 to lead as user configd", r.leading)
	cliOK(t, "set", "pay", "--limit", "60", "--server", r.url())

	mcfg := srv.Config(t)
	mcfg.Username, mcfg.Password = "instance-pay", instancePW
	var logs logbuf.Buffer
	m := secJoin(t, mcfg, "pay", "inst-a", &logs)
	secHasGrant(t, m, 60)
	oldcfg := srv.Config(t)
	oldcfg.Username, oldcfg.Password = "instance-pay-old", instancePW
	var oldLogs logbuf.Buffer
	old := secJoin(t, oldcfg, "pay", "inst-old", &oldLogs)
	secHasGrant(t, old, 30)
	if !strings.Contains(oldLogs.String(), "may not write the even-split confirmation") {
		t.Errorf("a member whose role may not write its confirmation did not say so; log:\n%s", oldLogs.String())
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	inst, err := clientv3.New(mcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close()
	ctx := ctxT(t)
	for what, key := range map[string]string{
		"pay's config": keys.Config("pay"), "pay's shares": keys.Share("pay", "x"), "a leader key": keys.Election() + "/x",
		"another provider's instance record": keys.Instance("other", "x"), "a history entry": keys.HistoryEntry("pay", 1),
		"pay's ledger head": lk.Head(), "a grant of pay's ledger": lk.Grant("x.1", 1), "a publish of pay's ledger": lk.Pub(1),
		"a release of another provider's ledger": ledger.Keys(keys.Ledger("other")).AllReleases() + "x.1/1",
	} {
		if _, err := inst.Put(ctx, key, "{}"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("instance writing %s: %v, want permission denied", what, err)
		}
	}
	if _, err := inst.Get(ctx, keys.Provider("other"), clientv3.WithPrefix()); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("instance reading another provider: %v, want permission denied", err)
	}
	if _, err := inst.Get(ctx, keys.Ledger("other"), clientv3.WithPrefix()); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("instance reading another provider's ledger: %v, want permission denied", err)
	}

	reader := as("reader", readerPW)
	if out := cliOK(t, append([]string{"status", "pay"}, reader...)...); !strings.Contains(out, "inst-a") {
		t.Errorf("status as reader:\n%s", out)
	}
	_, err = cliRun(t, append([]string{"set", "pay", "--limit", "5"}, reader...)...)
	secOneLine(t, "set as reader", err, 1, "permission denied")

	// Last, since a record that does not decode stops configd's writes to
	// pay's ledger: the instance may write a release of it.
	if _, err := inst.Put(ctx, lk.AllReleases()+"x.1/1", "{}"); err != nil {
		t.Errorf("instance writing a release of its provider's ledger: %v", err)
	}
}
