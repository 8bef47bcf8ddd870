package cluster

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// syncBuffer is a log sink the Members write to from their goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestJoinProviderAppliesClasses: a provider with classes and a tokens
// limit, joined with JoinProvider. The provider's classes are its first
// limit's: the Group gives them to that limit of its Multi, without the
// error a Multi used to log, the tokens lane (a lane provider lists no
// classes) keeps none, and a critical call is admitted where a batch one
// is refused at the reserve. The reserves a ledger grant keeps for each
// class (what configd split of the fleet-wide reserve) reach the limit as
// they do a lone Member's.
func TestJoinProviderAppliesClasses(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	sec := schema.Duration(time.Second)
	api := schema.ProviderConfig{Name: "api", Limit: 20, Window: sec, FailStatic: sec,
		Classes: classesOf(t, "critical=60%", "batch"),
		Lanes:   []schema.Lane{{Lane: 1, Dimension: "tokens", Limit: 2000, Window: sec}}}
	putConfig(t, cli, api)
	for _, l := range api.Lanes {
		putConfig(t, cli, l.Derive(api.WithDefaults()))
	}
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	g, err := JoinProvider(context.Background(), cli, "api", WithID("a"), WithLogger(log),
		WithLeaseTTL(time.Second), WithReportInterval(50*time.Millisecond), WithChangeMargin(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	enforcing(t, g.Members()[0], 20)
	enforcing(t, g.Members()[1], 2000)
	m := g.Multi()
	waitFor(t, "the provider's classes on its first limit", func() bool {
		cs := m.Limiter(0).Classes()
		return len(cs) == 2 && cs[0] == limiter.Class{Name: "critical", Reserve: 12, Of: 20}
	})
	if cs := m.Limiter(1).Classes(); cs != nil {
		t.Errorf("the tokens lane's classes %v, want none", cs)
	}
	if s := logs.String(); strings.Contains(s, "cannot apply the provider's classes") {
		t.Errorf("the Group logged that it cannot apply the classes:\n%s", s)
	}

	batch, critical := limiter.WithClass(context.Background(), "batch"), limiter.WithClass(context.Background(), "critical")
	// Batch takes what the window leaves beyond critical's 12 (a window
	// may have begun with some taken: at most 8).
	waitFor(t, "a window whose batch is refused at critical's reserve", func() bool {
		for {
			if _, ok := m.TryAcquireContext(batch, limiter.Cost("tokens", 10)); !ok {
				break
			}
		}
		_, ok := m.TryAcquireContext(critical, limiter.Cost("tokens", 10))
		st := m.Limiter(0).Stats()
		return ok && len(st.Classes) == 2 && st.Classes[1].Used <= 8 && st.Classes[1].Refused > 0
	})

	// A ledger grant's reserves replace the part of the limit: critical
	// keeps 5 of this instance's windows.
	g.Members()[0].grantReserved(map[string]int64{"critical": 5}, true)
	waitFor(t, "the grant's reserve on the first limit", func() bool {
		cs := m.Limiter(0).Classes()
		return len(cs) == 2 && cs[0] == limiter.Class{Name: "critical", Reserve: 5}
	})
}
