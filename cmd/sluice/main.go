// Command sluice shows and steers a distributed bucket (package bucket)
// from outside the processes that use it: what it is doing now (inspect),
// the policies in force (limits, set-policies), a fleet-wide pause when
// the upstream asked for one (hold), and the limiters themselves over
// HTTP/JSON for callers in any language (serve). `go run ./cmd/sluice --help` lists the
// subcommands; `sluice <command> --help` lists each one's flags.
//
// Each subcommand is one file: a command value listed in commands().
// Exit codes: 0 done (and --help), 1 the command failed (Redis, or a
// bucket it cannot act on), 2 bad usage.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/redis/go-redis/v9"
)

func main() {
	// go-redis logs each failed dial to stderr; the command says once
	// what failed instead.
	redis.SetLogger(quiet{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice:", err)
	}
	os.Exit(exitCode(err))
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// command is one subcommand: its name, a line for the list, and its run
// function, which parses its own flags from args.
type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"inspect", "what a bucket is doing now, across every process (--watch, --json)", runInspect},
		{"policies", "the policies in force", runPolicies},
		{"set-policies", "change the policies for every process at once", runSetPolicies},
		{"hold", "stop every process's grants for a while (the upstream asked us to back off)", runHold},
		{"serve", "serve buckets and semaphores over HTTP/JSON, for callers in any language (a sidecar)", runServe},
	}
}

// run runs the subcommand args name. --help writes the usage to stdout and
// returns nil; a usage error is a *usageError (exit code 2).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("no command given\n%s", commandList())
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, "Usage: sluice <command> [flags] NAME ...\n\n"+commandList()+
			"\nRun 'sluice <command> --help' for a command's flags.\n"+
			"Exit codes: 0 done, 1 the command failed, 2 bad usage.\n")
		return nil
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	return usagef("no command %q\n%s", args[0], commandList())
}

func commandList() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "Commands:")
	for _, c := range commands() {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	tw.Flush()
	return b.String()
}

// usageError is a command line the command cannot run: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...)}
}

// exitCode is the process's exit code after run returned err.
func exitCode(err error) int {
	var u *usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &u):
		return 2
	default:
		return 1
	}
}
