package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sync"
)

// The examples that need several processes (settlement's pods, transfer's
// workers) run them as child processes of their own executable. A parent
// and its children talk over the children's standard streams. A child
// writes one JSON event per line to stdout; the parent prints each event's
// message on its timeline, stamped with the parent's clock, and acts on the
// events it waits for. The parent writes commands to a child's stdin, one
// per line: "go" to start (FireTogether), and whatever else the example
// needs.

// childEnv is the environment variable that makes an example's process one
// of its children: Procs.Start sets it to a childSpec, as JSON, when it
// re-executes the program.
const childEnv = "FENCELOCK_EXAMPLE_CHILD"

// childSpec is what a parent tells a child.
type childSpec struct {
	Name   string          `json:"name"`   // for the child's error messages
	Config json.RawMessage `json:"config"` // the example's configuration of the child
}

// IsChild reports whether this process is a child that Procs.Start started.
func IsChild() bool {
	_, ok := os.LookupEnv(childEnv)
	return ok
}

// An Event is one line a child writes to its stdout. R is the type of the
// results the example's children report.
type Event[R any] struct {
	Kind   string `json:"kind"`             // "ready", "say", "result", "done", or one of the example's own
	Msg    string `json:"msg,omitempty"`    // printed on the parent's timeline when not empty
	Result *R     `json:"result,omitempty"` // with "result"
}

// Procs is a parent's side of its children: it starts them, relays their
// events, and kills and waits for those still running in StopAll.
type Procs[R any] struct {
	tl     *Timeline
	stderr io.Writer
	procs  []*Proc[R] // only the goroutine that calls Start and StopAll touches it
}

// NewProcs returns a Procs that prints its children's messages on tl and
// passes their standard error to stderr (os.Stderr if nil). Defer StopAll.
func NewProcs[R any](tl *Timeline, stderr io.Writer) *Procs[R] {
	if stderr == nil {
		stderr = os.Stderr
	}
	return &Procs[R]{tl: tl, stderr: stderr}
}

// Proc is one child process, seen from its parent.
type Proc[R any] struct {
	Name string

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan Event[R] // the child's events; closed when its stdout ends
	done   chan struct{} // closed once the process has been waited for
	err    error         // cmd.Wait's error; read only after done is closed
}

// Process returns the child's process.
func (p *Proc[R]) Process() *os.Process { return p.cmd.Process }

// Start starts a child process running this executable, which runs the
// command's Child (see Command) with cfg, marshalled as JSON, instead of the
// command itself. The child reports "ready" once it is set up and waits for
// "go" (see Parent.Ready and FireTogether).
func (s *Procs[R]) Start(name string, cfg any) (*Proc[R], error) {
	config, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	spec, err := json.Marshal(childSpec{Name: name, Config: config})
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this program to run %s: %w", name, err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	cmd.Stderr = s.stderr
	setDeathSignal(cmd)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc[R]{Name: name, cmd: cmd, stdin: stdin, events: make(chan Event[R], 64), done: make(chan struct{})}
	s.procs = append(s.procs, p)
	go p.read(stdout, s.tl)
	return p, nil
}

// read relays the child's events until its stdout ends, then waits for the
// process. It is the only goroutine a Proc has; StopAll waits for it.
func (p *Proc[R]) read(stdout io.Reader, tl *Timeline) {
	defer close(p.done)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var ev Event[R]
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			tl.Printf(p.Name, "%s", sc.Text()) // not an event: show it as it is
			continue
		}
		if ev.Msg != "" {
			tl.Printf(p.Name, "%s", ev.Msg)
		}
		p.events <- ev // StopAll and Exit drain events, so this cannot block forever
	}
	close(p.events)
	// Wait closes stdin and the stdout pipe once the process has exited.
	p.err = p.cmd.Wait()
}

// FireTogether waits until every one of procs is ready, then tells them all
// to go, so that what they do next starts within a millisecond in all of
// them rather than after each one's process start-up.
func (s *Procs[R]) FireTogether(ctx context.Context, procs ...*Proc[R]) error {
	for _, p := range procs {
		if _, err := p.Await(ctx, "ready"); err != nil {
			return err
		}
	}
	for _, p := range procs {
		if err := p.Send("go"); err != nil {
			return err
		}
	}
	return nil
}

// Send writes a command line to the child's stdin.
func (p *Proc[R]) Send(cmd string) error {
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		return fmt.Errorf("tell %s %q: %w", p.Name, cmd, err)
	}
	return nil
}

// Await returns the child's next event of one of kinds, skipping others. It
// fails if the child exits first or ctx ends.
func (p *Proc[R]) Await(ctx context.Context, kinds ...string) (Event[R], error) {
	for {
		select {
		case ev, ok := <-p.events:
			if !ok {
				return Event[R]{}, p.exitedEarly(ctx)
			}
			if slices.Contains(kinds, ev.Kind) {
				return ev, nil
			}
		case <-ctx.Done():
			return Event[R]{}, fmt.Errorf("waiting for %s: %w", p.Name, context.Cause(ctx))
		}
	}
}

// exitedEarly returns the error for a child whose stdout ended before the
// event the parent waited for.
func (p *Proc[R]) exitedEarly(ctx context.Context) error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited before finishing its run (%v); see its messages above", p.Name, p.err)
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s: %w", p.Name, context.Cause(ctx))
	}
}

// Result waits for the child's result and for the process to exit.
func (p *Proc[R]) Result(ctx context.Context) (R, error) {
	ev, err := p.Await(ctx, "result")
	if err != nil {
		var zero R
		return zero, err
	}
	return p.Finish(ctx, ev)
}

// Finish returns the result of ev, the child's result event, once the
// process has exited.
func (p *Proc[R]) Finish(ctx context.Context, ev Event[R]) (R, error) {
	var zero R
	if ev.Result == nil {
		return zero, fmt.Errorf("%s sent a result without one", p.Name)
	}
	if err := p.Exit(ctx); err != nil {
		return zero, err
	}
	return *ev.Result, nil
}

// Results collects the child's results until it is done, and waits for the
// process to exit.
func (p *Proc[R]) Results(ctx context.Context) ([]R, error) {
	var out []R
	for {
		ev, err := p.Await(ctx, "result", "done")
		if err != nil {
			return nil, err
		}
		if ev.Kind == "done" {
			break
		}
		if ev.Result != nil {
			out = append(out, *ev.Result)
		}
	}
	if err := p.Exit(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

// Exit waits for the child, which has nothing more to report, to exit, and
// returns an error unless it exited with status 0.
func (p *Proc[R]) Exit(ctx context.Context) error {
	events := p.events
	for {
		select {
		case _, ok := <-events: // such as the "done" that follows a result
			if !ok {
				events = nil
			}
		case <-p.done:
			if p.err != nil {
				return fmt.Errorf("%s: %w", p.Name, p.err)
			}
			return nil
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s to exit: %w", p.Name, context.Cause(ctx))
		}
	}
}

// StopAll kills every child still running and waits for all of them, so
// that no child outlives the run, whichever way it ends. SIGKILL also ends a
// child stopped by SIGSTOP.
func (s *Procs[R]) StopAll() {
	for _, p := range s.procs {
		select {
		case <-p.done:
			continue
		default:
		}
		_ = p.cmd.Process.Kill()
		for range p.events {
			// Drain so that read reaches Wait.
		}
		<-p.done
	}
}

// Parent is a child process's line to its parent: the commands it reads
// from stdin and the events it writes to stdout. It is safe for concurrent
// use.
type Parent[R any] struct {
	name  string
	stdin *bufio.Scanner

	mu  sync.Mutex
	out *json.Encoder // guarded by mu
}

// ChildMain returns the main function of an example's children, for
// Command.Child. It reads the configuration that Procs.Start gave the child,
// runs run with it, and tells the parent "done" when run returns nil. An
// error ends the child with exit code 1, after printing it on stderr after
// the child's name; a child reports the outcomes of its story as events,
// not as exit codes.
func ChildMain[C, R any](run func(ctx context.Context, parent *Parent[R], cfg C) error) func() int {
	return func() int {
		var spec childSpec
		var cfg C
		if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &spec); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", childEnv, err)
			return 1
		}
		if err := json.Unmarshal(spec.Config, &cfg); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %s: %v\n", spec.Name, childEnv, err)
			return 1
		}
		p := NewParent[R](spec.Name, os.Stdin, os.Stdout)
		if err := run(context.Background(), p, cfg); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", spec.Name, err)
			return 1
		}
		p.send(Event[R]{Kind: "done"})
		return 0
	}
}

// NewParent returns a child's line to its parent that reads commands from
// in and writes events to out. ChildMain gives a child one on its standard
// streams; a test can give one on a buffer to run a child's code in the
// test's own process.
func NewParent[R any](name string, in io.Reader, out io.Writer) *Parent[R] {
	return &Parent[R]{name: name, stdin: bufio.NewScanner(in), out: json.NewEncoder(out)}
}

// Ready tells the parent that the child is ready and waits for its "go".
func (p *Parent[R]) Ready() error {
	p.send(Event[R]{Kind: "ready"})
	return p.WaitFor("go")
}

// WaitFor reads the parent's next command and checks that it is want.
func (p *Parent[R]) WaitFor(want string) error {
	if !p.stdin.Scan() {
		return fmt.Errorf("parent gone while waiting for %q", want)
	}
	if got := p.stdin.Text(); got != want {
		return fmt.Errorf("parent said %q, want %q", got, want)
	}
	return nil
}

// Say sends the parent a line for its timeline.
func (p *Parent[R]) Say(format string, args ...any) {
	p.send(Event[R]{Kind: "say", Msg: fmt.Sprintf(format, args...)})
}

// Emit sends the parent an event of kind, with a line for its timeline.
func (p *Parent[R]) Emit(kind, format string, args ...any) {
	p.send(Event[R]{Kind: kind, Msg: fmt.Sprintf(format, args...)})
}

// Result sends the parent a result.
func (p *Parent[R]) Result(r R) {
	p.send(Event[R]{Kind: "result", Result: &r})
}

// send writes ev to the parent. A child whose parent is gone cannot report
// anything, so a failed write ends it.
func (p *Parent[R]) send(ev Event[R]) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.out.Encode(ev); err != nil {
		fmt.Fprintf(os.Stderr, "%s: parent gone: %v\n", p.name, err)
		os.Exit(1)
	}
}
