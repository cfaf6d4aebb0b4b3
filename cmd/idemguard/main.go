// Command idemguard shows, measures and operates idemguard.
//
//	idemguard demo [--redis ADDR] [--postgres DSN] [--metrics ADDR]
//	idemguard bench [--scenario LIST] [--concurrency LIST] [--duration D] [--target ADDR] [--chart FILE]
//	idemguard inspect [--redis ADDR] [--prefix P] [--postgres DSN [--schema S] [--table-prefix T]] SCOPE ID | REDIS-KEY
//	idemguard list [--redis ADDR] [--state pending|completed|failed] [--prefix P] [--limit N] [--format table|json]
//	idemguard release [--redis ADDR] [--prefix P] [--force] SCOPE ID
//	idemguard migrate --postgres DSN [--schema S] [--table-prefix T] up | --postgres DSN [--schema S] [--table-prefix T] --force down
//	idemguard purge --postgres DSN [--before DURATION] [--schema S] [--table-prefix T] [--batch N] [--lock-addrs LIST]
//	idemguard inventory [--format markdown|json] [--unsafe METHODS]
//	idemguard serve --config FILE [--print-inventory [--format markdown|json]]
//
// `go run ./cmd/idemguard demo` needs no service: it starts an embedded
// Redis (miniredis) in the process.
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
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	os.Exit(interruptible(os.Args[1:], os.Stdout, os.Stderr))
}

// interruptible runs the command args names under a context that the
// first SIGINT or SIGTERM ends: the command stops as it should (serve
// drains its requests for shutdown_timeout, list writes the rows it has).
// A second signal ends the process at once, as it would without the
// command, for an operator who will not wait.
func interruptible(args []string, stdout, stderr io.Writer) int {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	finished := make(chan struct{})
	defer close(finished)
	go onSignals(sigs, finished, cancel, raise)
	return run(ctx, args, stdout, stderr)
}

// onSignals calls cancel on the first signal from sigs and exit with the
// second, until finished is closed. One goroutine reads both: a second
// signal that comes before the first is handled is not lost (the
// default action restored once the first had cancelled the context, by
// a goroutine of its own, swallowed one that came before it ran).
func onSignals(sigs <-chan os.Signal, finished <-chan struct{}, cancel func(), exit func(os.Signal)) {
	select {
	case <-sigs:
		cancel()
	case <-finished:
		return
	}
	select {
	case sig := <-sigs:
		exit(sig)
	case <-finished:
	}
}

// raise ends the process by sig, as its default action would have.
func raise(sig os.Signal) {
	signal.Reset(sig)
	if s, ok := sig.(syscall.Signal); ok {
		_ = syscall.Kill(os.Getpid(), s)
		time.Sleep(time.Second) // the signal is delivered at once; this is in case it is not
		os.Exit(128 + int(s))
	}
	os.Exit(1)
}

// command is one subcommand.
type command struct {
	name  string
	usage string // the arguments, for the help line
	about string
	run   func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"demo", "[--redis ADDR] [--postgres DSN] [--metrics ADDR]", "run duplicate storms through the HTTP and consumer adapters and count the effects", runDemo},
		{"bench", "[--scenario LIST] [--concurrency LIST] [--duration D] [--target ADDR] [--chart FILE]", "measure the guard against plain Redis baselines", runBench},
		{"inspect", "[--redis ADDR] [--prefix P] [--postgres DSN [--schema S] [--table-prefix T]] SCOPE ID | REDIS-KEY", "show the record of a key (by scope and id, or by the Redis key list shows)", runInspect},
		{"list", "[--redis ADDR] [--state pending|completed|failed] [--prefix P] [--limit N] [--format table|json]", "list keys in a state (SCAN)", runList},
		{"release", "[--redis ADDR] [--prefix P] [--force] SCOPE ID", "free a stuck pending key: its attempt fails, the next claim takes over with a larger fence (never a completed key)", runRelease},
		{"migrate", "--postgres DSN [--schema S] [--table-prefix T] up | --postgres DSN [--schema S] [--table-prefix T] --force down", "apply, or roll back and drop, the SQL backstop's schema", runMigrate},
		{"purge", "--postgres DSN [--before DURATION] [--schema S] [--table-prefix T] [--batch N] [--lock-addrs LIST]", "delete expired backstop rows", runPurge},
		{"inventory", "[--format markdown|json] [--unsafe METHODS]", "list what the demo service deduplicates, and its gaps", runInventory},
		{"serve", "--config FILE [--print-inventory [--format markdown|json]]", "run the idempotency gateway in front of an HTTP service", runServe},
	}
}

// usageError is a mistake in the command line: it prints the usage hint.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// run runs the command line args (without the program name) and returns
// the exit code: 0 on success, 1 when the work failed, 2 for a bad command
// line. Every error is one line on stderr naming what is wrong.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	redis.SetLogger(quietLogger{}) // errors are reported once, by the command
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		}
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "idemguard %s: %s (usage: idemguard %s %s)\n", c.name, oneLine(err.Error()), c.name, c.usage)
			return 2
		}
		fmt.Fprintf(stderr, "idemguard %s: %s\n", c.name, oneLine(err.Error()))
		return 1
	}
	fmt.Fprintf(stderr, "idemguard: unknown command %q (run idemguard help)\n", args[0])
	return 2
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: idemguard COMMAND [flags]")
	fmt.Fprintln(w)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.about)
		fmt.Fprintf(w, "            idemguard %s %s\n", c.name, c.usage)
	}
}

// oneLine shows an error on one line: its line breaks, and what a
// terminal could obey in it (an escape sequence in a key or a stored
// reason), are shown escaped (\n, \x1b), and every other byte is kept, so
// that a key in it is named exactly (folding its spaces named another key).
// A backslash is doubled as shown doubles it, so the line reads back as
// the message in Go's quoting or bash's $'…' (a quoted value's \" shows
// as \\").
func oneLine(s string) string {
	return shown(s)
}

// newFlags returns a flag set that reports mistakes as errors and prints
// its defaults only when asked with -h.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parse parses args into fs and turns flag mistakes into usage errors.
// With -h it prints the flags to stderr and returns flag.ErrHelp.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stderr)
		fmt.Fprintf(stderr, "usage of idemguard %s:\n", fs.Name())
		fs.PrintDefaults()
		return flag.ErrHelp
	}
	if err != nil {
		return usageError{err.Error()}
	}
	// The flag package stops at the first argument: a flag after it
	// (release SCOPE ID --force) would be read as one more argument.
	rest := fs.Args()
	if i := len(args) - len(rest); i > 0 && args[i-1] == "--" {
		return nil // the caller ended the flags: these are arguments
	}
	for _, a := range rest {
		name, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if strings.HasPrefix(a, "-") && name != "" && fs.Lookup(name) != nil {
			return usagef("flag %s after the arguments: give flags before them (an argument that starts with - goes after --)", a)
		}
	}
	return nil
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
