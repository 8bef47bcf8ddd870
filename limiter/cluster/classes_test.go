package cluster

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/etcdtest"
	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

func classesOf(t *testing.T, s ...string) []schema.Class {
	t.Helper()
	out := make([]schema.Class, len(s))
	for i, c := range s {
		cl, err := schema.ParseClass(c)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = cl
	}
	return out
}

func classStat(m *Member, name string) (limiter.ClassStats, bool) {
	for _, c := range m.Limiter().Stats().Classes {
		if c.Name == name {
			return c, true
		}
	}
	return limiter.ClassStats{}, false
}

// TestMemberAppliesClasses: a member of a provider with classes keeps
// each reserve at the part of its own quota the class's reserve is of the
// limit, follows a retune and the removal of the classes, and reports its
// demand by class in its record.
func TestMemberAppliesClasses(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	cfg := schema.ProviderConfig{Name: "api", Limit: 100, Window: schema.Duration(time.Second), Classes: classesOf(t, "critical=60%", "batch")}
	putConfig(t, cli, cfg)
	a := join(t, cli, "api", "a")
	join(t, cli, "api", "b")
	enforcing(t, a, 50)
	waitFor(t, "critical's reserve of 30 of a's 50", func() bool {
		c, ok := classStat(a, "critical")
		return ok && c.Reserve == 30
	})
	// batch may take 20 of any window of a's 50: 30 are critical's.
	batch, critical := limiter.WithClass(context.Background(), "batch"), limiter.WithClass(context.Background(), "critical")
	for a.Limiter().Acquire(batch, 0) == nil {
	}
	if b, _ := classStat(a, "batch"); b.Used > 20 || b.Refused == 0 {
		t.Errorf("batch %+v: want at most 20 used in a window and a refusal", b)
	}
	if err := a.Limiter().Acquire(critical, 0); err != nil {
		t.Errorf("critical within its reserve: %v", err)
	}

	// The record says what each class asks for, and what each was
	// admitted since a started: its running totals, which never pass
	// what the limiter counts.
	waitFor(t, "a's record with its demand and admissions by class", func() bool {
		for range 5 {
			a.Limiter().Acquire(batch, 0)
		}
		r := record(t, cli, "a")
		_, hasCritical := r.ClassDemand["critical"]
		return hasCritical && r.ClassDemand["batch"] > 0 && r.ClassAdmitted["critical"] >= 1 && r.ClassAdmitted["batch"] > 0
	})
	r := record(t, cli, "a")
	for _, name := range []string{"critical", "batch"} {
		if c, _ := classStat(a, name); r.ClassAdmitted[name] > c.Admitted {
			t.Errorf("%s: the record says %d admitted, the limiter %d", name, r.ClassAdmitted[name], c.Admitted)
		}
	}

	// A retune: a's share doubles, and with it critical's reserve.
	cfg.Limit = 200
	putConfig(t, cli, cfg)
	enforcing(t, a, 100)
	waitFor(t, "critical's reserve of 60 of a's 100", func() bool {
		c, ok := classStat(a, "critical")
		return ok && c.Reserve == 60
	})

	// Without classes, the limiter has none and the record says none.
	cfg.Classes = nil
	putConfig(t, cli, cfg)
	waitFor(t, "no classes", func() bool { return a.Limiter().Stats().Classes == nil })
	waitFor(t, "a record without class demand", func() bool {
		r := record(t, cli, "a")
		return r.ClassDemand == nil && r.ClassAdmitted == nil
	})
}

// record reads instance id's record of provider api.
func record(t *testing.T, cli *clientv3.Client, id string) schema.InstanceRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, keys.Instance("api", id))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return schema.InstanceRecord{}
	}
	r, err := schema.DecodeInstanceRecord(resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
