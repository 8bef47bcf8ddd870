package etcdtest

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Cluster is several embedded members forming one etcd cluster, in the test
// process. Members are ordinary Servers: a test stops, kills and restarts
// them one by one while clients use the cluster's endpoints.
//
// Goroutine-leak checks: once the members have stopped, the HTTP
// connections between them end within etcd's peer read timeout (5 s),
// longer than goleak waits by default.
type Cluster struct {
	// Members are the cluster's members, named m0, m1, …, in order.
	Members []*Server
}

// StartCluster starts n members (n ≥ 1) forming one cluster, each on free
// loopback ports with its data in a temporary directory, and registers each
// one's Stop with tb.Cleanup. opts apply to every member (WithAuth is
// enabled once, cluster-wide). It fails the test if the cluster is not
// ready within StartTimeout.
func StartCluster(tb testing.TB, n int, opts ...Option) *Cluster {
	tb.Helper()
	if n < 1 {
		tb.Fatalf("etcdtest: StartCluster(%d): want at least one member", n)
	}
	c := &Cluster{}
	var initial []string
	for i := range n {
		s := newServer(tb, fmt.Sprintf("m%d", i), opts)
		c.Members = append(c.Members, s)
		initial = append(initial, s.name+"="+s.peerURL.String())
	}
	// The members of a new cluster must start together: none is ready
	// before a quorum of them has joined.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range c.Members {
		s.cluster = strings.Join(initial, ",")
		wg.Go(func() { errs[i] = s.start() })
	}
	wg.Wait()
	for _, s := range c.Members {
		tb.Cleanup(s.Stop)
	}
	for i, err := range errs {
		if err != nil {
			tb.Fatalf("etcdtest: member m%d: %v", i, err)
		}
	}
	if c.Members[0].opts.rootPassword != "" {
		if err := c.Members[0].enableAuth(); err != nil {
			tb.Fatalf("etcdtest: enabling auth: %v", err)
		}
	}
	return c
}

// Endpoints returns every member's client URL, for clientv3.Config.Endpoints.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, s := range c.Members {
		eps = append(eps, s.Endpoints()...)
	}
	return eps
}

// Config is Server.Config with every member's endpoint.
func (c *Cluster) Config(tb testing.TB) clientv3.Config {
	tb.Helper()
	cfg := c.Members[0].Config(tb)
	cfg.Endpoints = c.Endpoints()
	return cfg
}

// Client returns a new client of the cluster (every member's endpoint)
// built from Config; it is closed by tb.Cleanup.
func (c *Cluster) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(c.Config(tb))
	if err != nil {
		tb.Fatalf("etcdtest: client: %v", err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// Stop stops every member at once, gracefully as Server.Stop does: the
// whole cluster is down until Restart.
func (c *Cluster) Stop() {
	var wg sync.WaitGroup
	for _, s := range c.Members {
		wg.Go(s.Stop)
	}
	wg.Wait()
}

// Restart starts every stopped member at once on its data directory and
// ports (no member becomes ready before a quorum of them is back), and
// fails the test if one does not come back.
func (c *Cluster) Restart() {
	tb := c.Members[0].tb
	tb.Helper()
	errs := make([]error, len(c.Members))
	var wg sync.WaitGroup
	for i, s := range c.Members {
		s.mu.Lock()
		stopped := s.etcd == nil
		s.mu.Unlock()
		if stopped {
			wg.Go(func() { errs[i] = s.start() })
		}
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			tb.Fatalf("etcdtest: restart of member m%d: %v", i, err)
		}
	}
}
