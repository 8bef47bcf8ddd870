package join

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
)

// TestOpenJoinsTwoProviders: with TokensProvider, Open joins both
// providers and keeps each limit of Multi at this instance's share of
// its provider, with both in the registry.
func TestOpenJoinsTwoProviders(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	keys := schema.DefaultKeys()
	for _, c := range []schema.ProviderConfig{
		{Version: 1, Name: "llm", Limit: 10, Window: schema.Duration(time.Second), FailStatic: schema.Duration(time.Second)},
		{Version: 1, Name: "llm-tokens", Dimension: "tokens", Limit: 500, Window: schema.Duration(time.Second), FailStatic: schema.Duration(time.Second)},
	} {
		b, err := schema.Encode(c.WithDefaults())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(context.Background(), keys.Config(c.Name), string(b)); err != nil {
			t.Fatal(err)
		}
	}
	j, err := Open(context.Background(), Config{Endpoints: srv.Endpoints(), Provider: "llm", TokensProvider: "llm-tokens",
		ID: "a", Window: time.Second, LeaseTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if j.Multi == nil || j.Group == nil || j.Limiter != j.Multi.Limiter(0) {
		t.Fatalf("Open: Multi %v, Group %v; want both, Limiter the requests limit", j.Multi, j.Group)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := j.Multi.Stats()
		if st[0].Quota == 10 && st[1].Quota == 500 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("quotas %d and %d, want 10 and 500", st[0].Quota, st[1].Quota)
		}
		time.Sleep(10 * time.Millisecond) // polling the members' progress
	}
	if d := j.Describe(); !strings.Contains(d, "llm (share 10 of 10") || !strings.Contains(d, "llm-tokens (share 500 of 500") {
		t.Errorf("Describe: %s", d)
	}
	mfs, err := j.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	providers := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "provider" {
					providers[l.GetValue()] = true
				}
			}
		}
	}
	if !providers["llm"] || !providers["llm-tokens"] {
		t.Errorf("metrics for providers %v, want llm and llm-tokens", providers)
	}
}

// TestOpenGivesTheTokensLaneItsFallback: before the providers are
// configured, the requests limit keeps Fallback and the tokens limit
// TokensFallback, not the requests' count taken as tokens.
func TestOpenGivesTheTokensLaneItsFallback(t *testing.T) {
	srv := etcdtest.Start(t)
	j, err := Open(context.Background(), Config{Endpoints: srv.Endpoints(), Provider: "llm", TokensProvider: "llm-tokens",
		ID: "a", Window: time.Second, LeaseTTL: time.Second, Fallback: 5, TokensFallback: 700})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if st := j.Multi.Stats(); st[0].Quota != 5 || st[1].Quota != 700 {
		t.Errorf("quotas %d requests and %d tokens before any config, want the fallbacks 5 and 700", st[0].Quota, st[1].Quota)
	}
}

// TestOpenJoinsEveryLimitOfAProvider: without TokensProvider, Open joins
// every limit the provider's config holds (cluster.JoinProvider): one
// provider of requests and tokens gives a Multi of both, Tokens naming
// the tokens limit; a provider of one limit, a lone limiter.
func TestOpenJoinsEveryLimitOfAProvider(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	keys := schema.DefaultKeys()
	sec := schema.Duration(time.Second)
	llm := schema.ProviderConfig{Version: 1, Name: "llm", Limit: 10, Window: sec, FailStatic: sec,
		Lanes: []schema.Lane{{Lane: 1, Dimension: "tokens", Limit: 500, Window: sec}}}.WithDefaults()
	one := schema.ProviderConfig{Version: 1, Name: "one", Limit: 7, Window: sec, FailStatic: sec}.WithDefaults()
	for _, c := range []schema.ProviderConfig{llm, llm.Lanes[0].Derive(llm), one} {
		b, err := schema.Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(context.Background(), keys.Config(c.Name), string(b)); err != nil {
			t.Fatal(err)
		}
	}
	j, err := Open(context.Background(), Config{Endpoints: srv.Endpoints(), Provider: "llm", ID: "a", Window: time.Second, LeaseTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if j.Multi == nil || j.Tokens != 1 || len(j.Multi.Limits()) != 2 {
		t.Fatalf("Open: Multi %v, Tokens %d; want requests and tokens, tokens second", j.Multi, j.Tokens)
	}
	deadline := time.Now().Add(20 * time.Second)
	for st := j.Multi.Stats(); st[0].Quota != 10 || st[1].Quota != 500; st = j.Multi.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("quotas %d and %d, want 10 and 500", st[0].Quota, st[1].Quota)
		}
		time.Sleep(10 * time.Millisecond) // polling the members' progress
	}
	j1, err := Open(context.Background(), Config{Endpoints: srv.Endpoints(), Provider: "one", ID: "a", Window: time.Second, LeaseTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer j1.Close()
	if j1.Multi != nil || j1.Tokens != -1 || j1.Member == nil {
		t.Errorf("a provider of one limit: Multi %v, Tokens %d, Member %v; want a lone limiter", j1.Multi, j1.Tokens, j1.Member)
	}
}
