package harness

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluice-go/sluice/limiter/cluster"
)

// Dial connects to etcd at comma-separated endpoints, counting every
// request the client sends in c.
func (c *Counter) Dial(endpoints string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(endpoints, ","),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: append(c.DialOptions(), cluster.DialOptions()...),
	})
}

// MemberOptions are the cluster options every bench instance joins with:
// its lease TTL and report interval, fail-closed until its first share in
// the provider's window, its applied shares printed to out, and id if set.
func MemberOptions(id string, leaseTTL, report, window time.Duration, out *Lines) []cluster.Option {
	opts := []cluster.Option{
		cluster.WithLeaseTTL(leaseTTL),
		cluster.WithReportInterval(report),
		cluster.WithFallback(0, window),
		cluster.WithLogger(slog.New(&AppliedHandler{Out: out})),
	}
	if id != "" {
		opts = append(opts, cluster.WithID(id))
	}
	return opts
}

// WorkDir makes a temporary directory named after prefix and builds pkgs
// into it (see Build), printing how long that took. The returned cleanup
// removes the directory, or with keep prints where it was kept.
func WorkDir(prefix string, keep bool, pkgs ...string) (dir string, bins []string, cleanup func(), err error) {
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	if keep {
		cleanup = func() { fmt.Printf("\nkept %s\n", dir) }
	}
	t0 := time.Now()
	if bins, err = Build(dir, pkgs...); err != nil {
		cleanup()
		return "", nil, nil, err
	}
	fmt.Printf("built %s in %v\n", strings.Join(pkgs, ", "), time.Since(t0).Round(time.Millisecond))
	return dir, bins, cleanup, nil
}
