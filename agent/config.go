package agent

import (
	"errors"
	"fmt"
	"net"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-go/sluice/internal/schema"
	"github.com/sluice-go/sluice/limiter"
)

// Config is the agent's configuration. Start from DefaultConfig; Validate
// says what is wrong with one, field by field.
type Config struct {
	// Socket is the Unix socket of the HTTP/JSON API; GRPCSocket that of
	// the gRPC API. "" serves neither on a socket.
	Socket     string
	GRPCSocket string
	// SocketMode is the sockets' permission bits (0660: owner and group);
	// SocketGroup, when set, their group (a name or a numeric gid): who may
	// call the agent is who may open the socket.
	SocketMode  uint32
	SocketGroup string

	// Listen and GRPCListen are optional loopback TCP addresses of the two
	// APIs ("127.0.0.1:7071"). Every request on them needs the token in
	// TokenFile ("Authorization: Bearer TOKEN"): a TCP port is open to
	// every user of the machine.
	Listen, GRPCListen string
	TokenFile          string

	// Endpoints are etcd's client URLs. Username and PasswordFile, and
	// CAFile, CertFile and KeyFile, authenticate to it as an instance does
	// (configd's embedded etcd: user "instance", password in
	// <data-dir>/credentials/instance).
	Endpoints                 []string
	Username, PasswordFile    string
	CAFile, CertFile, KeyFile string
	// Prefix is etcd's key prefix shared with configd ("": the default).
	Prefix string
	// ID is this agent's instance id under every provider ("": the
	// cluster package's default, from the host name and process id).
	ID string
	// LeaseTTL is the members' etcd lease (0: the cluster default).
	LeaseTTL time.Duration

	// Providers are joined at start. Allow lists patterns (path.Match:
	// "llm-*") of further providers joined on first use; "*" allows any.
	// MaxProviders bounds how many the agent holds at once.
	Providers    []string
	Allow        []string
	MaxProviders int

	// Local are providers this agent enforces alone, without etcd: a
	// single machine's limits, or a test's.
	Local []LocalProvider

	// MaxWait caps what a request may ask to wait.
	MaxWait time.Duration
	// GrantTTL is how long a grant or reservation can be settled or
	// cancelled; MaxGrants bounds how many are kept (the oldest go
	// first). A grant forgotten keeps what it was charged.
	GrantTTL  time.Duration
	MaxGrants int
	// MaxCallers bounds the callers counted by name in status and metrics;
	// the rest are counted as "_other".
	MaxCallers int
	// ShutdownTimeout bounds the graceful shutdown.
	ShutdownTimeout time.Duration
	// HeaderTimeout bounds how long an HTTP request may take to arrive,
	// from its first byte to its last: a client that sends part of one
	// and stalls (slowloris) is answered 408 and closed. A kept
	// connection with no request under way is idle, not timed.
	HeaderTimeout time.Duration
}

// LocalProvider is a provider enforced by this agent alone.
type LocalProvider struct {
	Name   string
	Limits []limiter.Limit
}

// DefaultConfig returns the defaults: the HTTP API on
// /run/sluice/agent.sock and gRPC on /run/sluice/agent-grpc.sock, mode
// 0660, no TCP, no providers.
func DefaultConfig() Config {
	return Config{
		Socket:          "/run/sluice/agent.sock",
		GRPCSocket:      "/run/sluice/agent-grpc.sock",
		SocketMode:      0o660,
		MaxProviders:    64,
		MaxWait:         time.Hour,
		GrantTTL:        10 * time.Minute,
		MaxGrants:       100_000,
		MaxCallers:      256,
		ShutdownTimeout: 5 * time.Second,
		HeaderTimeout:   10 * time.Second,
	}
}

// ErrConfig is wrapped by every ConfigValidationError.
var ErrConfig = errors.New("agent: invalid config")

// ConfigValidationError says which field of a Config is wrong and why.
type ConfigValidationError struct {
	Field string
	Value any
	Err   error
}

func (e *ConfigValidationError) Error() string {
	return fmt.Sprintf("agent: config %s = %v: %v", e.Field, e.Value, e.Err)
}

func (e *ConfigValidationError) Unwrap() []error { return []error{ErrConfig, e.Err} }

func invalid(field string, v any, format string, args ...any) error {
	return &ConfigValidationError{Field: field, Value: v, Err: fmt.Errorf(format, args...)}
}

// Validate reports the first field of c that is wrong, as a
// *ConfigValidationError.
func (c Config) Validate() error {
	if c.Socket == "" && c.GRPCSocket == "" && c.Listen == "" && c.GRPCListen == "" {
		return invalid("Socket", "", "nothing to serve on: give a socket or a loopback address")
	}
	if c.SocketMode&^0o777 != 0 || c.SocketMode&0o600 != 0o600 {
		return invalid("SocketMode", fmt.Sprintf("%#o", c.SocketMode), "want permission bits that let the owner read and write, such as 0660")
	}
	if c.Socket != "" && c.Socket == c.GRPCSocket {
		return invalid("GRPCSocket", c.GRPCSocket, "the two APIs need two sockets")
	}
	for _, l := range []struct{ field, addr string }{{"Listen", c.Listen}, {"GRPCListen", c.GRPCListen}} {
		if l.addr == "" {
			continue
		}
		if err := loopback(l.addr); err != nil {
			return invalid(l.field, l.addr, "%v", err)
		}
		if c.TokenFile == "" {
			return invalid("TokenFile", "", "a TCP listener needs a token: every user of the machine can reach a port")
		}
	}
	if len(c.Endpoints) == 0 && (len(c.Providers) > 0 || len(c.Allow) > 0) {
		return invalid("Endpoints", "", "shared providers need etcd")
	}
	for _, p := range c.Providers {
		if err := schema.ValidateUserName(p); err != nil {
			return invalid("Providers", p, "%v", err)
		}
	}
	for _, p := range c.Allow {
		if _, err := path.Match(p, ""); err != nil || p == "" {
			return invalid("Allow", p, "not a pattern (path.Match)")
		}
	}
	seen := map[string]bool{}
	for _, p := range c.Providers {
		seen[p] = true
	}
	for _, lp := range c.Local {
		if err := schema.ValidateUserName(lp.Name); err != nil {
			return invalid("Local", lp.Name, "%v", err)
		}
		if seen[lp.Name] {
			return invalid("Local", lp.Name, "named twice")
		}
		seen[lp.Name] = true
		if _, err := limiter.NewMulti(lp.Limits); err != nil {
			return invalid("Local", lp.Name, "%v", err)
		}
	}
	if c.MaxProviders < 1 || c.MaxProviders < len(seen) {
		return invalid("MaxProviders", c.MaxProviders, "want at least 1 and at least the providers named (%d)", len(seen))
	}
	switch {
	case c.MaxWait <= 0 || c.MaxWait > 24*time.Hour:
		return invalid("MaxWait", c.MaxWait, "want more than 0 and at most 24h")
	case c.GrantTTL <= 0:
		return invalid("GrantTTL", c.GrantTTL, "want more than 0")
	case c.MaxGrants < 1:
		return invalid("MaxGrants", c.MaxGrants, "want at least 1")
	case c.MaxCallers < 1:
		return invalid("MaxCallers", c.MaxCallers, "want at least 1")
	case c.ShutdownTimeout <= 0:
		return invalid("ShutdownTimeout", c.ShutdownTimeout, "want more than 0")
	case c.HeaderTimeout <= 0:
		return invalid("HeaderTimeout", c.HeaderTimeout, "want more than 0")
	case c.LeaseTTL < 0:
		return invalid("LeaseTTL", c.LeaseTTL, "want 0 (the default) or more")
	}
	if c.ID != "" {
		if err := schema.ValidateInstanceID(c.ID); err != nil {
			return invalid("ID", c.ID, "%v", err)
		}
	}
	return nil
}

// loopback reports whether addr is host:port on a loopback address.
func loopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("not a loopback address: the agent answers only this machine")
	}
	return nil
}

// ParseLocal parses a local provider as the --local flag gives it:
// NAME=LIMIT[,LIMIT...], each LIMIT [DIMENSION=]N/WINDOW, as in
// "llm=500/1m,tokens=200000/1m".
func ParseLocal(s string) (LocalProvider, error) {
	name, rest, ok := strings.Cut(s, "=")
	if !ok || rest == "" {
		return LocalProvider{}, fmt.Errorf("%w: local provider %q: want NAME=[DIM=]N/WINDOW[,...]", ErrConfig, s)
	}
	lp := LocalProvider{Name: strings.TrimSpace(name)}
	for _, part := range strings.Split(rest, ",") {
		var lm limiter.Limit
		if d, v, ok := strings.Cut(part, "="); ok {
			lm.Dimension, part = strings.TrimSpace(d), v
		}
		n, w, ok := strings.Cut(part, "/")
		if !ok {
			return LocalProvider{}, fmt.Errorf("%w: local provider %q: limit %q: want N/WINDOW", ErrConfig, s, part)
		}
		q, err := strconv.ParseInt(strings.TrimSpace(n), 10, 64)
		if err != nil {
			return LocalProvider{}, fmt.Errorf("%w: local provider %q: limit %q: %v", ErrConfig, s, part, err)
		}
		win, err := time.ParseDuration(strings.TrimSpace(w))
		if err != nil {
			return LocalProvider{}, fmt.Errorf("%w: local provider %q: window %q: %v", ErrConfig, s, w, err)
		}
		lm.Quota, lm.Window = q, win
		lp.Limits = append(lp.Limits, lm)
	}
	if _, err := limiter.NewMulti(lp.Limits); err != nil {
		return LocalProvider{}, fmt.Errorf("%w: local provider %q: %w", ErrConfig, s, err)
	}
	return lp, nil
}
