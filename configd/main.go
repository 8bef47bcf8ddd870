// Command configd keeps sluice's provider configs in etcd, publishes each
// live instance's share of every provider's limit, and serves an admin HTTP
// API. The same binary is the operator's CLI.
//
// Usage:
//
//	configd serve  [--listen 127.0.0.1:7070] [--etcd-endpoints URLS | --data-dir DIR] [--admin-token-file FILE]
//	configd set    NAME --limit N [--window 1s] [--mode enforce|shadow] [--algorithm even|fair] [--pacing] [--if-revision R]
//	configd get    NAME
//	configd list
//	configd delete NAME [--if-revision R]
//	configd status NAME
//	configd history NAME
//	configd audit  [NAME]
//
// The CLI subcommands talk to a running `configd serve` through its admin API
// (--server, default http://127.0.0.1:7070, with --token-file for writes), or,
// given --etcd-endpoints, straight to etcd. Both paths validate input with
// the same code (package internal/schema) and run the same store operations.
//
// Examples:
//
//	configd serve --data-dir /var/lib/configd                # one machine: embedded etcd
//	configd set payments --limit 300000 --window 1s          # prints old → new
//	configd status payments                                  # who holds which share
//	configd audit                                            # every ledger within its limits?
//	configd set payments --limit 250000 --if-revision 42     # fails if someone else changed it
//
// Exit codes: 0 success, 1 failure (etcd or server unreachable, conflict,
// not found, a ledger over its limit), 2 bad input (flags, names, limits, windows) — with one line on
// stderr.
//
// Every subcommand has --help.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/sluice-go/sluice/internal/schema"
)

func main() {
	// The first SIGINT/SIGTERM cancels ctx: serve drains and exits. stop()
	// then restores the default action, so a second signal kills the process.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		msg := err.Error()
		if !strings.HasPrefix(msg, "configd: ") {
			msg = "configd: " + msg
		}
		fmt.Fprintln(os.Stderr, msg)
	}
	os.Exit(exitCode(err))
}

// commands maps subcommand names to their implementations.
var commands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
	"serve":   runServe,
	"set":     runSet,
	"get":     runGet,
	"list":    runList,
	"delete":  runDelete,
	"status":  runStatus,
	"history": runHistory,
	"audit":   runAudit,
}

const mainUsage = `configd keeps sluice provider configs in etcd and publishes instance shares.

Usage:
  configd serve    run the daemon: admin API, leader election, share publishing
  configd set      create or change a provider: set NAME --limit N [--window 1s] ...
  configd get      show a provider's config: get NAME
  configd list     list providers
  configd delete   delete a provider: delete NAME
  configd status   show a provider's instances and shares: status NAME
  configd history  show who changed a provider, when, and how: history NAME
  configd audit    check that a ledger provider's grants keep within its limits: audit [NAME]

Run 'configd COMMAND --help' for a command's flags.
`

// run runs one subcommand. It returns nil on success and on --help.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, mainUsage)
		return usageErrorf("no command given")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, mainUsage)
		return nil
	}
	cmd, ok := commands[args[0]]
	if !ok {
		return usageErrorf("unknown command %q (commands: serve, set, get, list, delete, status, history, audit)", args[0])
	}
	return cmd(ctx, args[1:], stdout, stderr)
}

// errUsage marks bad command-line input; such errors exit with code 2.
var errUsage = errors.New("usage")

type usageError struct{ msg string }

func (e *usageError) Error() string        { return e.msg }
func (e *usageError) Is(target error) bool { return target == errUsage }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// exitCode maps an error from run to the process exit code.
func exitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage), errors.Is(err, schema.ErrInvalid):
		return 2
	}
	return 1
}

// parseFlags parses args with fs. --help prints the usage to stdout and
// returns flag.ErrHelp; a bad flag returns a usage error of one line.
func parseFlags(fs *flag.FlagSet, usage string, args []string, stdout io.Writer) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return flag.ErrHelp
	}
	if err != nil {
		return usageErrorf("%s: %v (see 'configd %s --help')", fs.Name(), err, fs.Name())
	}
	return nil
}

// parseArgs parses flags that may come before or after the positional
// arguments (Go's flag package stops at the first positional one), and
// returns the positional arguments.
func parseArgs(fs *flag.FlagSet, usage string, args []string, stdout io.Writer) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, usage, args, stdout); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// oneName checks that exactly one positional argument, a valid provider
// name, was given.
func oneName(cmd string, pos []string) (string, error) {
	if len(pos) != 1 {
		return "", usageErrorf("%s: want exactly one provider NAME, got %d arguments (see 'configd %s --help')", cmd, len(pos), cmd)
	}
	if err := schema.ValidateName(pos[0]); err != nil {
		return "", err
	}
	return pos[0], nil
}
