// Command kafka is the Kafka consumer example: it consumes a topic through a
// sluice limiter into a provider stub that has a rate limit, and prints
// progress and the achieved rate against the limit.
//
// With no flags it is the one-machine demo: it starts an in-process
// Kafka-protocol broker (kfake), produces a backlog to a new topic, consumes
// it through a local limiter, and ends once the backlog is handled:
//
//	go run ./examples/kafka
//	go run ./examples/kafka -messages 20000 -limit 5000 -window 100ms
//
// Run for real, it consumes an existing topic in a consumer group, takes its
// share of the provider's limit from configd through etcd, and serves its
// metrics until SIGINT/SIGTERM:
//
//	go run ./examples/kafka -brokers kafka-1:9092 -topic orders -group orders-api \
//	    -etcd-endpoints http://127.0.0.1:2379 -provider orders-api \
//	    -metrics-listen :9090 -ntp-servers pool.ntp.org
//
// With -tokens-limit it enforces a second limit, on tokens, as for a model
// API: each message takes its estimated tokens (consumer.WithCost), the
// stub answers with what the call used (50-100% of the estimate), and the
// handler settles that (consumer.Settle), giving back what was charged too
// much. With etcd, -tokens-provider joins a second provider whose limit
// counts tokens, and both shares are enforced together:
//
//	go run ./examples/kafka -limit 500 -tokens-limit 30000
//
// With -topic set, nothing is produced unless -messages is given, and it runs
// until signalled unless -duration is given. The first signal stops it
// gracefully (in-flight messages finish and are committed), a second one
// kills it (what was not committed is delivered again later).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sluice-go/sluice/examples/internal/join"
)

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err == flag.ErrHelp {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kafka example:", err)
		os.Exit(2)
	}
	// The first SIGINT/SIGTERM cancels ctx: the consumer drains and commits.
	// stop() then restores the default action, so a second signal kills.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	err = run(ctx, cfg, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kafka example:", err)
		os.Exit(1)
	}
}

// config is what the flags select.
type config struct {
	messages   int // backlog to produce first; 0: none
	limit      int64
	window     time.Duration
	duration   time.Duration // 0: until signalled
	brokers    []string      // nil: in-process broker
	topic      string        // "": a new demo topic
	group      string
	partitions int
	workers    int
	verbose    bool

	etcdEndpoints []string // nil: a local limiter of limit per window
	etcdCA        string
	etcdCert      string
	etcdKey       string
	etcdPrefix    string
	etcdUser      string
	etcdPassFile  string
	provider      string
	instanceID    string
	fallback      int64

	tokensLimit    int64  // the stub's tokens per window, and the local tokens limit; 0: none
	tokensProvider string // with etcd: the provider of the tokens limit
	tokensFallback int64
	ntpServers     []string
	metricsListen  string
}

// defaultInstanceID is $POD_NAME (set from the downward API in Kubernetes),
// else the host name.
func defaultInstanceID() string {
	if p := os.Getenv("POD_NAME"); p != "" {
		return p
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	return "kafka-example"
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	var brokers, endpoints, ntpServers string
	fs := flag.NewFlagSet("kafka", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.messages, "messages", 3000, "messages to produce first (with -topic: 0 unless given)")
	fs.Int64Var(&c.limit, "limit", 1000, "the provider stub's limit, calls per window; also the local limiter's quota without -etcd-endpoints")
	fs.DurationVar(&c.window, "window", time.Second, "limit window (10ms..1h, divides 24h)")
	fs.DurationVar(&c.duration, "duration", 30*time.Second, "stop after this long; 0 runs until signalled (with -topic: 0 unless given)")
	fs.StringVar(&brokers, "brokers", "", "comma-separated Kafka brokers; empty starts an in-process broker")
	fs.StringVar(&c.topic, "topic", "", "topic to consume; empty creates a new demo topic")
	fs.StringVar(&c.group, "group", "", "consumer group (default: the demo topic's name, or sluice-kafka-example with -topic)")
	fs.IntVar(&c.partitions, "partitions", 4, "partitions of the demo topic")
	fs.IntVar(&c.workers, "workers", 8, "consumer workers")
	fs.BoolVar(&c.verbose, "v", false, "log debug messages")
	fs.StringVar(&endpoints, "etcd-endpoints", "", "comma-separated etcd URLs; when set, join -provider through etcd and take the share configd publishes")
	fs.StringVar(&c.etcdCA, "etcd-ca", "", "PEM file of the CA that signed etcd's server certificate (enables TLS)")
	fs.StringVar(&c.etcdCert, "etcd-cert", "", "PEM client certificate for etcd (with -etcd-key)")
	fs.StringVar(&c.etcdKey, "etcd-key", "", "PEM client key for etcd (with -etcd-cert)")
	fs.StringVar(&c.etcdPrefix, "etcd-prefix", "", "etcd key prefix shared with configd (default /sluice/)")
	fs.StringVar(&c.etcdUser, "etcd-username", "", "etcd user (configd's embedded etcd: instance)")
	fs.StringVar(&c.etcdPassFile, "etcd-password-file", "", "file holding the etcd user's password (configd's embedded etcd: DATA-DIR/credentials/instance)")
	fs.StringVar(&c.provider, "provider", "kafka-demo", "provider name: the metrics' provider label, and what to join with -etcd-endpoints")
	fs.StringVar(&c.instanceID, "instance-id", defaultInstanceID(), "this instance's id ($POD_NAME, else the host name)")
	fs.Int64Var(&c.fallback, "fallback", 0, "quota per window when etcd is unreachable at a cold start (0: admit nothing until a share is known)")
	fs.Int64Var(&c.tokensLimit, "tokens-limit", 0, "the provider stub's tokens limit per window; also a local tokens limit without -etcd-endpoints; 0: tokens are not limited")
	fs.StringVar(&c.tokensProvider, "tokens-provider", "", "with -etcd-endpoints: a second provider, whose limit counts tokens; both shares are enforced together (cluster.JoinGroup)")
	fs.Int64Var(&c.tokensFallback, "tokens-fallback", 0, "with -tokens-provider: tokens per window when etcd is unreachable at a cold start (0: admit nothing until a share is known)")
	fs.StringVar(&ntpServers, "ntp-servers", "", "comma-separated NTP servers to measure the clock offset with (with -etcd-endpoints); empty trusts the clock")
	fs.StringVar(&c.metricsListen, "metrics-listen", "", "serve Prometheus /metrics on this address (e.g. :9090); empty: none")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	c.brokers, c.etcdEndpoints, c.ntpServers = join.List(brokers), join.List(endpoints), join.List(ntpServers)
	if c.topic != "" {
		if !set["messages"] {
			c.messages = 0
		}
		if !set["duration"] {
			c.duration = 0
		}
		if c.group == "" {
			c.group = "sluice-kafka-example"
		}
	}
	switch {
	case c.messages < 0:
		return c, fmt.Errorf("-messages %d: must be ≥ 0", c.messages)
	case c.topic == "" && c.messages == 0:
		return c, fmt.Errorf("-messages 0: the demo topic needs a backlog (or give -topic)")
	case c.limit <= 0:
		return c, fmt.Errorf("-limit %d: must be > 0", c.limit)
	case c.duration < 0:
		return c, fmt.Errorf("-duration %v: must be ≥ 0", c.duration)
	case c.partitions <= 0:
		return c, fmt.Errorf("-partitions %d: must be > 0", c.partitions)
	case c.workers <= 0:
		return c, fmt.Errorf("-workers %d: must be > 0", c.workers)
	case c.topic != "" && len(c.brokers) == 0:
		return c, fmt.Errorf("-topic needs -brokers")
	case c.fallback < 0:
		return c, fmt.Errorf("-fallback %d: must be ≥ 0", c.fallback)
	case c.tokensLimit < 0 || c.tokensFallback < 0:
		return c, fmt.Errorf("-tokens-limit %d, -tokens-fallback %d: must be ≥ 0", c.tokensLimit, c.tokensFallback)
	case c.tokensProvider != "" && len(c.etcdEndpoints) == 0:
		return c, fmt.Errorf("-tokens-provider needs -etcd-endpoints (a local tokens limit is -tokens-limit)")
	case c.tokensFallback > 0 && c.tokensProvider == "":
		return c, fmt.Errorf("-tokens-fallback is the fallback of -tokens-provider's share")
	case (c.etcdCert == "") != (c.etcdKey == ""):
		return c, fmt.Errorf("-etcd-cert and -etcd-key go together")
	case (c.etcdUser == "") != (c.etcdPassFile == ""):
		return c, fmt.Errorf("-etcd-username and -etcd-password-file go together")
	case len(c.ntpServers) > 0 && len(c.etcdEndpoints) == 0:
		return c, fmt.Errorf("-ntp-servers needs -etcd-endpoints")
	case c.instanceID == "":
		return c, fmt.Errorf("-instance-id must not be empty")
	}
	return c, nil
}
