package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// Records placed in etcd by hand, of every kind a Member reads: each
// malformed one must be ignored — the share in force stays the last good
// one — and listed in Status.Problems under its key, without a panic; a
// good record then repairs it. TestMalformedRecordsKeepTheLastGoodValue
// covers three bad configs; these tables cover the rest.

// badCase is one hand-written record.
type badCase struct {
	name, value string
	want        string // substring of the problem listed
}

// outcome waits until m lists a problem for key or its share moves away
// from share, and returns its status then (the last one seen after 10s).
func outcome(t *testing.T, m *Member, key string, share int64) (st Status, listed bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second) // a bound on a shared machine, not a measurement
	for {
		st = m.Status()
		for _, p := range st.Problems {
			if strings.HasPrefix(p, key+": ") {
				return st, true
			}
		}
		if st.Share != share || time.Now().After(deadline) {
			return st, false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkIgnored asserts that m ignored the bad record at key (share kept,
// problem listed and naming what was wrong).
func checkIgnored(t *testing.T, m *Member, key string, share int64, tc badCase) {
	t.Helper()
	st, listed := outcome(t, m, key, share)
	var problems []string
	if !listed {
		problems = append(problems, "not listed in Status.Problems")
	}
	if st.Share != share {
		problems = append(problems, fmt.Sprintf("share moved from %d to %d (source %s)", share, st.Share, st.Source))
	}
	if listed && !strings.Contains(strings.Join(st.Problems, "\n"), tc.want) {
		problems = append(problems, fmt.Sprintf("problems %q do not say %q", st.Problems, tc.want))
	}
	if len(problems) == 0 {
		return
	}
	t.Errorf("record %.200q: %s", tc.value, strings.Join(problems, "; "))
}

func TestHandWrittenConfigRecords(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	w := 100 * time.Millisecond
	good := schema.ProviderConfig{Name: "api", Limit: 40, Window: schema.Duration(w)}
	putConfig(t, cli, good)
	a := join(t, cli, "api", "a")
	enforcing(t, a, 40)
	big := `{"version":1,"name":"api","limit":40,"window":"100ms","mode":"` + strings.Repeat("x", 1<<20) + `"}`
	for _, tc := range []badCase{
		{"limit as string", `{"version":1,"name":"api","limit":"40","window":"100ms"}`, "limit must be"},
		{"window as number", `{"version":1,"name":"api","limit":40,"window":100000000}`, "window must be"},
		{"mode as number", `{"version":1,"name":"api","limit":40,"window":"100ms","mode":1}`, "mode must be"},
		{"pacing as string", `{"version":1,"name":"api","limit":40,"window":"100ms","mode":"enforce","algorithm":"even","pacing":"yes"}`, "pacing must be of type boolean"},
		{"missing limit", `{"version":1,"name":"api","window":"100ms","mode":"enforce","algorithm":"even"}`, "limit must be"},
		{"missing window", `{"version":1,"name":"api","limit":20,"mode":"enforce","algorithm":"even"}`, "window must be"},
		{"missing mode", `{"version":1,"name":"api","limit":20,"window":"100ms","algorithm":"even"}`, "mode must be"},
		{"missing name", `{"version":1,"limit":20,"window":"100ms","mode":"enforce","algorithm":"even"}`, "name must match"},
		{"version 2", `{"version":2,"name":"api","limit":20,"window":"100ms","mode":"enforce","algorithm":"even"}`, "version must be 1"},
		{"version -1", `{"version":-1,"name":"api","limit":20,"window":"100ms","mode":"enforce","algorithm":"even"}`, "version must be 1"},
		{"version as string", `{"version":"1","name":"api","limit":20,"window":"100ms","mode":"enforce","algorithm":"even"}`, "version must be 1"},
		{"name of another provider", `{"version":1,"name":"other","limit":20,"window":"100ms","mode":"enforce","algorithm":"even"}`, `config names provider "other"`},
		{"oversized", big, "larger than 1048576 bytes"},
		{"empty", ``, "empty or truncated"},
		{"null", `null`, "must match"},
		{"array", `[1,2]`, "malformed JSON"},
		{"binary", "\x00\xff\xfe{", "malformed JSON"},
		{"truncated", `{"version":1,"name":"api","limit":20`, "empty or truncated"},
		{"nested", `{"version":1,"name":"api","limit":20,"x":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`, "malformed JSON"},
		{"window not dividing a day", `{"version":1,"name":"api","limit":20,"window":"7s","mode":"enforce","algorithm":"even"}`, "divides 24h"},
		{"limit too large", `{"version":1,"name":"api","limit":1000000000001,"window":"100ms","mode":"enforce","algorithm":"even"}`, "up to 1000000000000"},
		{"duplicated limit", `{"version":1,"name":"api","limit":40,"window":"100ms","mode":"enforce","algorithm":"even","limit":20}`, `duplicate key "limit"`},
		{"limit in another case", `{"version":1,"name":"api","limit":40,"window":"100ms","mode":"enforce","algorithm":"even","LIMIT":20}`, `unknown field "LIMIT" (field names are case-sensitive; did you mean "limit"?)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() {
				putConfig(t, cli, good)
				waitFor(t, "repaired", func() bool { return len(a.Status().Problems) == 0 && a.Status().Share == 40 })
			})
			put(t, cli, keys.Config("api"), tc.value)
			checkIgnored(t, a, keys.Config("api"), 40, tc)
		})
	}
}

func TestHandWrittenSharesRecords(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	w := 100 * time.Millisecond
	putConfig(t, cli, schema.ProviderConfig{Name: "api", Limit: 90, Window: schema.Duration(w)})
	// A configd leader, as concurrency.Election leaves it: published
	// shares are in force.
	lease, err := cli.Grant(context.Background(), 30)
	if err != nil {
		t.Fatal(err)
	}
	putLeader(t, cli, lease.ID)
	a := join(t, cli, "api", "a")
	gen := int64(10)
	goodShares := func() string {
		gen++
		return mustEncode(t, schema.ShareRecord{Version: 1, Provider: "api", Instance: "a", Generation: gen, Window: schema.Duration(w),
			Total: 90, Share: 60, Granted: 60})
	}
	put(t, cli, keys.Share("api", "a"), goodShares())
	enforcing(t, a, 60)
	// GEN in a record is replaced, when the case runs, by a generation
	// newer than any good one so far: an older one would be ignored as
	// late, whatever it holds.
	rec := func(fields string) string {
		return `{"version":1,"provider":"api","instance":"a","generation":GEN,"effective_from":0,"window":"100ms",` + fields + `}`
	}
	for _, tc := range []badCase{
		{"share as string", rec(`"total":90,"share":"70","granted":70`), "share"},
		{"generation as string", `{"version":1,"provider":"api","instance":"a","generation":"99","window":"100ms","total":90,"share":70,"granted":70}`, "generation"},
		{"share as object", rec(`"total":90,"share":{"a":70},"granted":70`), "share"},
		{"missing generation", `{"version":1,"provider":"api","instance":"a","window":"100ms","total":90,"share":70,"granted":70}`, "generation"},
		{"missing window", `{"version":1,"provider":"api","instance":"a","generation":GEN,"total":90,"share":70,"granted":70}`, "window must be"},
		{"missing provider", `{"version":1,"instance":"a","generation":GEN,"window":"100ms","total":90,"share":70,"granted":70}`, "provider"},
		{"missing instance", `{"version":1,"provider":"api","generation":GEN,"window":"100ms","total":90,"share":70,"granted":70}`, "instance"},
		{"version 2", strings.Replace(rec(`"total":90,"share":70,"granted":70`), `"version":1`, `"version":2`, 1), "version must be 1"},
		{"share above the total", rec(`"total":90,"share":91,"granted":91`), "share must be from 0 to the total"},
		{"negative share", rec(`"total":90,"share":-1,"granted":0`), "share"},
		{"granted below share", rec(`"total":90,"share":70,"granted":1`), "granted"},
		{"held with a share", rec(`"total":90,"share":70,"granted":70,"held":true`), "held record's share must be 0"},
		{"effective_from off a boundary", `{"version":1,"provider":"api","instance":"a","generation":GEN,"effective_from":7,"window":"100ms","total":90,"share":70,"granted":70}`, "effective_from"},
		{"unknown field", rec(`"total":90,"share":70,"granted":70,"burst":5`), "unknown field"},
		{"duplicated share", rec(`"total":90,"share":30,"share":70,"granted":70`), `duplicate key "share"`},
		{"duplicated total", rec(`"total":90,"share":70,"granted":70,"total":70`), `duplicate key "total"`},
		{"total in another case", rec(`"total":90,"share":70,"granted":70,"Total":70`), `unknown field "Total"`},
		{"oversized", rec(`"total":90,"share":70,"granted":70,"leader":"` + strings.Repeat("l", 1<<20) + `"`), "larger than"},
		{"empty", ``, "empty or truncated"},
		{"binary", "\xff\x00", "malformed JSON"},
		{"provider of another name", strings.Replace(rec(`"total":90,"share":70,"granted":70`), `"provider":"api"`, `"provider":"other"`, 1), `"other"`},
		{"another instance", strings.Replace(rec(`"total":90,"share":70,"granted":70`), `"instance":"a"`, `"instance":"b"`, 1), `"b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.value = strings.ReplaceAll(tc.value, "GEN", strconv.FormatInt(gen+1, 10))
			gen++
			t.Cleanup(func() {
				put(t, cli, keys.Share("api", "a"), goodShares())
				waitFor(t, "repaired", func() bool { return len(a.Status().Problems) == 0 && a.Status().Share == 60 })
			})
			put(t, cli, keys.Share("api", "a"), tc.value)
			checkIgnored(t, a, keys.Share("api", "a"), 60, tc)
		})
	}
}

// TestEvenSplitCountsKeys: with no configd, a member reads no other
// instance's record: it counts the keys under instances/, each of them a
// live instance whatever it holds (it may be a running instance that
// wrote a record this version does not read; a smaller share is safe),
// and the even-split confirmations under even/. Until every counted
// instance has confirmed, it enforces at most its last grant (here none);
// once all have, the even split; after an instance's key goes, the count
// is held up for the hold, then the member takes the whole limit again.
func TestEvenSplitCountsKeys(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	putConfig(t, cli, schema.ProviderConfig{Name: "api", Limit: 40, Window: schema.Duration(100 * time.Millisecond),
		FailStatic: schema.Duration(300 * time.Millisecond)})
	a := join(t, cli, "api", "a")
	alone := func(what string) {
		t.Helper()
		waitFor(t, what+": a alone takes the whole limit", func() bool {
			st := a.Status()
			return st.Source == "even" && st.Share == 40 && st.Instances == 1
		})
	}
	alone("at start")
	ctx := context.Background()
	for _, value := range []string{"not json", `{"version":2,"id":"zzz"}`, `{"version":1,"id":"b","demand":1}`} {
		put(t, cli, keys.Instance("api", "b"), value)
		waitFor(t, "b counted, not confirmed: a enforces no more than its grant, none", func() bool {
			st := a.Status()
			return st.Instances == 2 && st.Share == 0 && a.Limiter().Stats().Quota == 0
		})
		put(t, cli, keys.EvenMark("api", "b"), "{}")
		waitFor(t, "b confirmed: the even split", func() bool {
			st := a.Status()
			return st.Instances == 2 && st.Share == 20
		})
		if _, err := cli.Delete(ctx, keys.Instance("api", "b")); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Delete(ctx, keys.EvenMark("api", "b")); err != nil {
			t.Fatal(err)
		}
		alone("after b's key went and the hold")
	}
}

// TestProblemListedAtOnce: a malformed record is in Status.Problems as soon
// as it is observed, not only when some later event arrives.
func TestProblemListedAtOnce(t *testing.T) {
	lim, err := limiter.New(0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	m := &Member{provider: "api", id: "a", keys: keys, cfg: defaultOptions(), lim: lim, log: slog.New(slog.DiscardHandler)}
	v := newView()
	good := `{"version":1,"name":"api","limit":40,"window":"100ms","mode":"enforce","algorithm":"even","pacing":false}`
	m.observe(v, keys.Config("api"), []byte(good), false, 1)
	for _, tc := range []struct{ key, value string }{
		{keys.Config("api"), `{"version":1,"name":"api","limit":-1,"window":"100ms"}`},
		{keys.Share("api", "a"), `not json`},
	} {
		m.observe(v, tc.key, []byte(tc.value), false, 2)
		if _, ok := v.problems[tc.key]; !ok {
			t.Fatalf("%s = %q: not in the view's problems", tc.key, tc.value)
		}
		if p := m.Status().Problems; !slices.ContainsFunc(p, func(s string) bool { return strings.HasPrefix(s, tc.key+": ") }) {
			t.Errorf("%s = %q: not in Status.Problems %q right after observe", tc.key, tc.value, p)
		}
	}
}

// TestShareRecordBeforeItsConfig: an instance watches its config and its
// share record on two watches, so a record computed under a new config
// can arrive before the config does — a raised limit's record over the
// limit it knows, or one naming a config revision it has not seen. It is
// refused then, and followed once the config arrives. Found by make scale:
// a retune raising the limit left an instance on its old share for good.
func TestShareRecordBeforeItsConfig(t *testing.T) {
	m, v := observing(t)
	rec := func(gen, total, share, cfgRev int64) []byte {
		return []byte(mustEncode(t, schema.ShareRecord{Version: 1, Provider: "api", Instance: "a", Generation: gen, Window: schema.Duration(time.Second),
			Total: total, Share: share, Granted: share, ConfigRevision: cfgRev}))
	}
	m.observe(v, keys.Config("api"), apiConfig(900), false, 5)
	m.observe(v, keys.Share("api", "a"), rec(1, 900, 900, 5), false, 6)
	// The limit is raised to 1000 at revision 7; the record computed under
	// it (revision 8) comes first.
	m.observe(v, keys.Share("api", "a"), rec(2, 1000, 1000, 7), false, 8)
	if v.share.Share != 900 {
		t.Fatalf("a record over the limit known was followed: share %d", v.share.Share)
	}
	// Nothing is wrong with it: at a retune of 2,000 instances, 100
	// logged it as malformed and listed it among their problems.
	if len(v.problems) != 0 {
		t.Errorf("a record ahead of its config listed as a problem: %v", v.problems)
	}
	m.observe(v, keys.Config("api"), apiConfig(1000), false, 7)
	if v.share.Share != 1000 || v.share.Generation != 2 || len(v.problems) != 0 {
		t.Fatalf("after its config arrived: share %d of generation %d, problems %v; want the record of generation 2 followed", v.share.Share, v.share.Generation, v.problems)
	}
	// A follower of the common record: the content is the common
	// record's, written after the config it names, though its own
	// pointer was written before that config (found by make scale: 905
	// errors logged at 2,000 instances).
	pointer := &mvccpb.KeyValue{Key: []byte(keys.Share("api", "a")), ModRevision: 8,
		Value: []byte(mustEncode(t, schema.ShareRecord{Version: 1, Provider: "api", Instance: "a", Common: true, Generation: 4}))}
	common := &mvccpb.KeyValue{Key: []byte(keys.CommonShare("api")), ModRevision: 21,
		Value: []byte(mustEncode(t, schema.ShareRecord{Version: 1, Provider: "api", Instance: schema.CommonInstance, Generation: 5,
			Window: schema.Duration(time.Second), Total: 1200, Share: 600, Granted: 600, ConfigRevision: 20}))}
	m.observeShare(v, []*mvccpb.KeyValue{pointer}, []*mvccpb.KeyValue{common}, 21)
	if v.share.Generation != 2 || len(v.problems) != 0 {
		t.Fatalf("a common record ahead of the config: generation %d followed, problems %v; want generation 2 kept, none listed", v.share.Generation, v.problems)
	}
	m.observe(v, keys.Config("api"), apiConfig(1200), false, 20)
	if v.share.Share != 600 || v.share.Generation != 5 {
		t.Fatalf("after its config arrived: share %d of generation %d; want the common record's 600 of generation 5", v.share.Share, v.share.Generation)
	}
	// One that names a config written after itself was not computed by
	// configd: refused and listed.
	m.observe(v, keys.Share("api", "a"), rec(6, 1200, 1200, 32), false, 30)
	if v.share.Generation != 5 || len(v.problems) != 1 {
		t.Fatalf("a record naming a later config (32) than its own revision (30): generation %d followed, problems %v; want generation 5 kept and the record listed", v.share.Generation, v.problems)
	}
}

// TestConfigSeenAnew: the instant a config was first seen (view.configAt)
// bounds when a late growth under it may apply at once (follow.Schedule):
// the config was written before. Read again at the same revision (a
// reload) it stays; at another revision, or at the same with other
// content (an etcd restored from a backup counts revisions from lower
// down again; found by review), it is seen anew.
func TestConfigSeenAnew(t *testing.T) {
	m, v := observing(t)
	m.observe(v, keys.Config("api"), apiConfig(900), false, 5)
	first := v.configAt
	for _, c := range []struct {
		name  string
		limit int64
		rev   int64
		anew  bool
	}{
		{"the same revision read again", 900, 5, false},
		{"the same revision with another limit (a restored etcd)", 1000, 5, true},
		{"another revision", 1000, 6, true},
	} {
		before := v.configAt
		time.Sleep(time.Millisecond) // a monotonic reading later: not a synchronisation
		m.observe(v, keys.Config("api"), apiConfig(c.limit), false, c.rev)
		if anew := v.configAt.After(before); anew != c.anew {
			t.Errorf("%s: seen anew %v, want %v (first seen %v, now %v)", c.name, anew, c.anew, first, v.configAt)
		}
	}
}

// observing returns a Member of provider "api" with id "a", with no etcd,
// and its view, to observe records into.
func observing(t *testing.T) (*Member, *view) {
	t.Helper()
	lim, err := limiter.New(0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	return &Member{provider: "api", id: "a", keys: keys, cfg: defaultOptions(), lim: lim, log: slog.New(slog.DiscardHandler)}, newView()
}

// apiConfig is provider "api"'s config of limit per 1 s, encoded.
func apiConfig(limit int64) []byte {
	return []byte(fmt.Sprintf(`{"version":1,"name":"api","limit":%d,"window":"1s","mode":"enforce","algorithm":"even","pacing":false}`, limit))
}
