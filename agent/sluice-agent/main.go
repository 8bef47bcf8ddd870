// Command sluice-agent is sluice's local agent: it holds this machine's
// share of each provider's limits, as a cluster member, and answers
// acquisitions from programs in any language over HTTP/JSON and gRPC on
// Unix sockets (and, with a token, on loopback TCP). The logic lives in
// package agent; this is its flags and signals.
//
//	sluice-agent --etcd-endpoints http://127.0.0.1:2379 --etcd-username instance \
//	    --etcd-password-file /var/lib/configd/credentials/instance \
//	    --provider llm-api --allow 'batch-*' --socket-group app
//	sluice-agent --local 'llm=500/1m,tokens=200000/1m' --socket /tmp/agent.sock --grpc-socket /tmp/agent-grpc.sock
//	sluice-agent --probe --socket /run/sluice/agent.sock   # exit 0 if the agent there answers
//
// The first SIGINT/SIGTERM shuts down gracefully (waits under way end with
// CLOSED, the leases are revoked so the other instances' shares grow); a
// second one aborts.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-go/sluice/agent"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

type list []string

func (l *list) String() string { return strings.Join(*l, ",") }
func (l *list) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

type locals []agent.LocalProvider

func (l *locals) String() string { return fmt.Sprint(len(*l)) }
func (l *locals) Set(s string) error {
	lp, err := agent.ParseLocal(s)
	if err != nil {
		return err
	}
	*l = append(*l, lp)
	return nil
}

// probe asks the agent on socket for /healthz. A container image without
// a shell or curl (distroless) can still probe the agent with its own
// binary, and the Unix socket is all a probe can reach: a TCP listener
// is on loopback and needs the token.
func probe(socket string, timeout time.Duration) error {
	if socket == "" {
		return errors.New("--socket is empty")
	}
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}}
	resp, err := c.Get("http://agent/healthz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var out struct{ OK bool }
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<10)).Decode(&out); err != nil || resp.StatusCode != http.StatusOK || !out.OK {
		return fmt.Errorf("%s answered %s", socket, resp.Status)
	}
	return nil
}

// run parses args, serves until a signal and returns the exit status: 2
// for a usage error, 1 for any other.
func run(args []string, stderr io.Writer) int {
	cfg := agent.DefaultConfig()
	fs := flag.NewFlagSet("sluice-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var endpoints, providers, allow list
	var local locals
	mode := fs.String("socket-mode", "0660", "the sockets' permission bits (octal)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	probeOnly := fs.Bool("probe", false, "ask the agent serving on --socket for /healthz and exit 0 if it answers (for exec probes)")
	fs.StringVar(&cfg.Socket, "socket", cfg.Socket, "Unix socket of the HTTP/JSON API (\"\": none)")
	fs.StringVar(&cfg.GRPCSocket, "grpc-socket", cfg.GRPCSocket, "Unix socket of the gRPC API (\"\": none)")
	fs.StringVar(&cfg.SocketGroup, "socket-group", "", "the sockets' group, a name or gid: its members may call the agent")
	fs.StringVar(&cfg.Listen, "listen", "", "loopback TCP address of the HTTP/JSON API (needs --token-file)")
	fs.StringVar(&cfg.GRPCListen, "grpc-listen", "", "loopback TCP address of the gRPC API (needs --token-file)")
	fs.StringVar(&cfg.TokenFile, "token-file", "", "file holding the bearer token requests over TCP must carry")
	fs.Var(&endpoints, "etcd-endpoints", "etcd client URLs, comma-separated (none: local providers only)")
	fs.StringVar(&cfg.Username, "etcd-username", "", "etcd user (configd's embedded etcd: instance)")
	fs.StringVar(&cfg.PasswordFile, "etcd-password-file", "", "file holding the etcd password")
	fs.StringVar(&cfg.CAFile, "etcd-ca", "", "PEM CA of etcd's server certificate (enables TLS)")
	fs.StringVar(&cfg.CertFile, "etcd-cert", "", "PEM client certificate for etcd")
	fs.StringVar(&cfg.KeyFile, "etcd-key", "", "PEM key of --etcd-cert")
	fs.StringVar(&cfg.Prefix, "prefix", "", "etcd key prefix shared with configd (default: sluice's)")
	fs.StringVar(&cfg.ID, "id", "", "this agent's instance id (default: host name and process id)")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", 0, "etcd lease TTL of each membership (0: the default)")
	fs.Var(&providers, "provider", "a provider to join at start; repeat or comma-separate")
	fs.Var(&allow, "allow", "a pattern (path.Match) of providers joined on first use; repeat; '*' allows any")
	fs.IntVar(&cfg.MaxProviders, "max-providers", cfg.MaxProviders, "most providers held at once")
	fs.Var(&local, "local", "a provider enforced by this agent alone: NAME=[DIM=]N/WINDOW[,...]; repeat")
	fs.DurationVar(&cfg.MaxWait, "max-wait", cfg.MaxWait, "longest wait a request may ask for")
	fs.DurationVar(&cfg.GrantTTL, "grant-ttl", cfg.GrantTTL, "how long a grant can be settled or cancelled")
	fs.IntVar(&cfg.MaxGrants, "max-grants", cfg.MaxGrants, "most grants kept for settling (the oldest go first)")
	fs.IntVar(&cfg.MaxCallers, "max-callers", cfg.MaxCallers, "most caller names counted in status and metrics")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "bound on the graceful shutdown")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice-agent: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *probeOnly {
		if err := probe(cfg.Socket, 2*time.Second); err != nil {
			fmt.Fprintln(stderr, "sluice-agent: probe:", err)
			return 1
		}
		return 0
	}
	m, err := strconv.ParseUint(*mode, 8, 32)
	if err != nil {
		fmt.Fprintf(stderr, "sluice-agent: --socket-mode %q: want octal permission bits such as 0660\n", *mode)
		return 2
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(stderr, "sluice-agent: --log-level: %v\n", err)
		return 2
	}
	cfg.SocketMode, cfg.Endpoints, cfg.Providers, cfg.Allow, cfg.Local = uint32(m), endpoints, providers, allow, local
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(stderr, "sluice-agent:", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv}))
	a, err := agent.New(cfg, agent.WithLogger(log))
	if err != nil {
		fmt.Fprintln(stderr, "sluice-agent:", err)
		return 1
	}
	defer a.Close()
	ls, err := a.Listen()
	if err != nil {
		fmt.Fprintln(stderr, "sluice-agent:", err)
		return 1
	}
	ctx, stop := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigs
		log.Info("shutting down; a second signal aborts")
		stop()
		<-sigs
		log.Error("aborted")
		os.Exit(1)
	}()
	if err := a.Serve(ctx, ls); err != nil {
		log.Error("serving failed", "err", err)
		return 1
	}
	return 0
}
