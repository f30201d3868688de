package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
)

// Exit codes; see the package documentation.
const (
	exitOK      = 0
	exitFailed  = 1 // not found or refused
	exitUsage   = 2
	errorPrefix = "fencelock: "
)

func main() {
	// go-redis logs failed dials and pool events to stderr on its own; the
	// command reports errors itself, on one line.
	redis.SetLogger(quietLogger{})
	tty := false
	if fi, err := os.Stdout.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		tty = true
	}
	os.Exit(run(context.Background(), os.Args[1:], &env{
		stdout: os.Stdout,
		stderr: &lockedWriter{w: os.Stderr},
		tty:    tty,
		getenv: os.Getenv,
	}))
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// env is what a command sees of the process.
type env struct {
	stdout io.Writer
	stderr io.Writer // safe for concurrent use
	tty    bool      // stdout is a terminal
	getenv func(string) string
}

// warn writes one line to stderr.
func (e *env) warn(format string, args ...any) {
	fmt.Fprintln(e.stderr, errorPrefix+oneLine(fmt.Sprintf(format, args...)))
}

// lockedWriter serializes the writes of the goroutines of watch.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer // guarded by mu
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A command is one subcommand of fencelock.
type command struct {
	name     string
	synopsis string // the arguments after the name, for usage lines
	list     string // the arguments after the name, in fencelock help's list
	short    string // one line, for fencelock help
	help     string // the command's own help: what it does, its flags
	run      func(ctx context.Context, e *env, args []string) error
}

var commands []*command // in the order of fencelock help

func init() {
	commands = []*command{lsCommand, inspectCommand, watchCommand, releaseCommand, doctorCommand}
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// run runs the command line args (without the program name) and returns
// the exit code.
func run(ctx context.Context, args []string, e *env) int {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, usage())
		return exitUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		return help(e, args[1:])
	}
	global, name, rest, err := splitGlobal(args)
	if err != nil {
		e.warn("%s", err.Error())
		return exitUsage
	}
	switch name {
	case "":
		e.warn("missing the command after the connection flags: fencelock [connection flags] COMMAND ... (run 'fencelock help' for usage)")
		return exitUsage
	case "help":
		return help(e, rest)
	}
	c := lookup(name)
	if c == nil {
		e.warn("unknown command %q (run 'fencelock help' for usage)", name)
		return exitUsage
	}
	// The connection flags given before the command go first: one given
	// after it too is parsed later, and wins.
	err = c.run(ctx, e, append(global[:len(global):len(global)], rest...)) // a slice of its own: args stays as given
	var ce *cmdError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ce):
		if ce.msg != "" {
			e.warn("%s", ce.msg)
		}
		return ce.code
	case errors.Is(err, fencelock.ErrInvalid):
		e.warn("%s: %s", c.name, trimPrefix(err))
		return exitUsage
	default:
		e.warn("%s: %s", c.name, trimPrefix(err))
		return exitFailed
	}
}

func help(e *env, args []string) int {
	switch {
	case len(args) == 0:
		fmt.Fprint(e.stdout, usage())
		return exitOK
	case len(args) == 1 && lookup(args[0]) != nil:
		fmt.Fprint(e.stdout, commandHelp(lookup(args[0])))
		return exitOK
	}
	e.warn("help: unknown command %q (run 'fencelock help' for usage)", strings.Join(args, " "))
	return exitUsage
}

// usage is the text of fencelock help.
func usage() string {
	var b strings.Builder
	b.WriteString(`fencelock shows and manages the locks that github.com/fencelock/fencelock
keeps in Redis: who holds them, for how long, with which fence.

Usage:

	fencelock [connection flags] COMMAND [flags] [arguments]

Commands:

`)
	for _, c := range commands {
		fmt.Fprintf(&b, "\t%-20s  %s\n", strings.TrimSpace(c.name+" "+c.list), c.short)
	}
	fmt.Fprintf(&b, "\t%-20s  %s\n", "help [COMMAND]", "this text, or a command's")
	b.WriteString(`
Flags go after the command, before or after its arguments (after --,
everything is an argument). The connection flags go before the command
too: fencelock --url URL inspect NAME. A flag given before and after the
command takes the value after it.

`)
	b.WriteString(connectionHelp)
	b.WriteString(exitHelp)
	return b.String()
}

func commandHelp(c *command) string {
	return "Usage: fencelock " + c.name + " " + c.synopsis + "\n\n" + c.help + "\n" + connectionHelp + exitHelp
}

const connectionHelp = `Connection flags (every command; before or after it):

	--url URL          a redis:// or rediss:// URL: address, user, password,
	                   database, TLS, go-redis options (?dial_timeout=1s).
	                   Default $REDIS_URL, else redis://127.0.0.1:6379.
	--sentinel ADDRS   Sentinels, host:port,host:port: connect to the master
	                   they name; the URL gives only the credentials, the
	                   database, TLS and options.
	--master NAME      the master's name at the Sentinels (with --sentinel).
	--cluster ADDRS    Redis Cluster nodes, host:port,host:port (one is
	                   enough; the others are discovered); the URL gives only
	                   the credentials, TLS and options.
	--db N             the database, when the URL does not say (default 0).
	--prefix PREFIX    the services' Options.KeyPrefix (default "lock:").
	--timeout D        bound on the command's Redis calls (default 10s; for
	                   watch, on each read).

`

const exitHelp = `Exit status: 0 done; 1 not found or refused (a lock that is not held, for
inspect and release; release without --yes; a critical doctor finding;
Redis unreachable or refusing); 2 usage error.
`

// A cmdError ends the command with its exit code, and its message on
// stderr unless it is empty.
type cmdError struct {
	code int
	msg  string
}

func (e *cmdError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &cmdError{code: exitUsage, msg: fmt.Sprintf(format, args...)}
}

func failf(format string, args ...any) error {
	return &cmdError{code: exitFailed, msg: fmt.Sprintf(format, args...)}
}

// trimPrefix returns err's message on one line without the library's
// "fencelock: " prefix, which the command prints once itself.
func trimPrefix(err error) string {
	return oneLine(strings.TrimPrefix(err.Error(), errorPrefix))
}

func oneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}

// newFlagSet returns the flag set of command name, with the connection
// flags registered in cf.
func newFlagSet(name string, cf *connFlags) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported by parse, help by fencelock help
	fs.Usage = func() {}
	cf.register(fs)
	return fs
}

// parse parses args with fs, allowing flags before and after the
// positional arguments, and returns the positional ones. After "--" every
// argument is positional. -h and --help print the command's help.
func parse(e *env, c *command, fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(e.stdout, commandHelp(c))
			return nil, &cmdError{code: exitOK}
		}
		if err != nil {
			return nil, usagef("%s: %v (run 'fencelock help %s' for usage)", c.name, err, c.name)
		}
		rest := fs.Args()
		consumed := args[:len(args)-len(rest)]
		if n := len(consumed); n > 0 && consumed[n-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// splitGlobal splits args into the connection flags before the command,
// as given, the command's name ("" when there is none) and the arguments
// after it. Any other flag before the command is a usage error.
func splitGlobal(args []string) (global []string, name string, rest []string, err error) {
	var cf connFlags
	fs := flag.NewFlagSet("fencelock", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	cf.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, "help", nil, nil
		}
		if strings.HasPrefix(err.Error(), "flag provided but not defined") {
			return nil, "", nil, fmt.Errorf("%v: only the connection flags go before the command (%s); the command's own flags go after the command (run 'fencelock help' for usage)",
				err, strings.Join(connFlagNames(fs), ", "))
		}
		return nil, "", nil, fmt.Errorf("%v (run 'fencelock help' for usage)", err)
	}
	after := fs.Args()
	global = args[:len(args)-len(after)]
	if n := len(global); n > 0 && global[n-1] == "--" {
		global = global[:n-1] // the next argument is the command, whatever it looks like
	}
	if len(after) == 0 {
		return global, "", nil, nil
	}
	// Every connection flag takes a value, so the tokens before the
	// command read the same when the command parses them again.
	return global, after[0], after[1:], nil
}

// connFlagNames returns the names of the flags of fs, as --name.
func connFlagNames(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, "--"+f.Name) })
	return names
}

// oneName returns the single lock name in pos.
func oneName(c *command, pos []string) (string, error) {
	switch {
	case len(pos) == 0:
		return "", usagef("%s: missing the lock's NAME (usage: fencelock %s %s)", c.name, c.name, c.synopsis)
	case len(pos) > 1:
		return "", usagef("%s: one NAME only, got %d arguments: %q", c.name, len(pos), pos)
	}
	return pos[0], checkName(c.name, "NAME", pos[0])
}

// checkName rejects what the library rejects as a lock name.
func checkName(cmd, what, name string) error {
	switch {
	case name == "":
		return usagef("%s: empty %s", cmd, what)
	case strings.ContainsAny(name, "{}"):
		return usagef("%s: %s %q contains '{' or '}', which lock names cannot", cmd, what, name)
	}
	return nil
}
