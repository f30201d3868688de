package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"

	"github.com/fencelock/fencelock/examples/internal/demo"
)

// The parent and its pods talk over the pods' standard streams. A pod
// writes one JSON event per line to stdout; the parent prints each event's
// message on the timeline, stamped with the parent's clock, and acts on the
// events it waits for. The parent writes commands to a pod's stdin, one per
// line: "go" to fire, "write" to let a held pod write.

// event is one line a pod writes to stdout.
type event struct {
	Kind   string  `json:"kind"`             // ready, acquired, hold, result
	Msg    string  `json:"msg,omitempty"`    // printed on the timeline when not empty
	Fence  int64   `json:"fence,omitempty"`  // with acquired and hold
	Firing *Firing `json:"firing,omitempty"` // with result, the pod's last event
}

// story is the parent's side of a run: the pods it started, which it kills
// and waits for in stopAll.
type story struct {
	tl     *demo.Timeline
	stderr io.Writer
	base   podConfig // what every pod is told; start adds the pod's own part

	pods []*podProc // every pod started; only the goroutine running tell touches it
}

// podProc is one pod process, seen from the parent.
type podProc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan event    // the pod's events; closed when its stdout ends
	done   chan struct{} // closed once the process has been waited for
	err    error         // cmd.Wait's error; read only after done is closed
}

// start starts a pod process running this executable in the pod role, with
// the story's configuration changed by edit (if not nil). The pod connects to
// Redis and the database, reports "ready" and waits for "go".
func (s *story) start(ctx context.Context, name, at string, edit func(*podConfig)) (*podProc, error) {
	cfg := s.base
	cfg.Pod, cfg.At = name, at
	if edit != nil {
		edit(&cfg)
	}
	env, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this program to run its pods: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), podEnv+"="+string(env))
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
	p := &podProc{name: name, cmd: cmd, stdin: stdin, events: make(chan event, 16), done: make(chan struct{})}
	s.pods = append(s.pods, p)
	go p.read(stdout, s.tl)
	return p, nil
}

// read relays the pod's events until its stdout ends, then waits for the
// process. It is the only goroutine a podProc has; stopAll waits for it.
func (p *podProc) read(stdout io.Reader, tl *demo.Timeline) {
	defer close(p.done)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			tl.Printf(p.name, "%s", sc.Text()) // not an event: show it as it is
			continue
		}
		if ev.Msg != "" {
			tl.Printf(p.name, "%s", ev.Msg)
		}
		p.events <- ev // stopAll drains events, so this cannot block forever
	}
	close(p.events)
	// Wait closes stdin and the stdout pipe once the process has exited.
	p.err = p.cmd.Wait()
}

// fireTogether waits until every pod is ready, then tells them all to fire,
// so that their RunWithLock calls start within microseconds of each other
// rather than after each one's process start-up.
func (s *story) fireTogether(ctx context.Context, pods ...*podProc) error {
	for _, p := range pods {
		if _, err := p.await(ctx, "ready"); err != nil {
			return err
		}
	}
	for _, p := range pods {
		if err := p.send("go"); err != nil {
			return err
		}
	}
	return nil
}

// send writes a command line to the pod's stdin.
func (p *podProc) send(cmd string) error {
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		return fmt.Errorf("tell %s %q: %w", p.name, cmd, err)
	}
	return nil
}

// await returns the pod's next event of one of kinds, skipping others. It
// fails if the pod exits first or ctx ends.
func (p *podProc) await(ctx context.Context, kinds ...string) (event, error) {
	for {
		select {
		case ev, ok := <-p.events:
			if !ok {
				return event{}, p.exitedEarly(ctx)
			}
			if slices.Contains(kinds, ev.Kind) {
				return ev, nil
			}
		case <-ctx.Done():
			return event{}, fmt.Errorf("waiting for %s: %w", p.name, context.Cause(ctx))
		}
	}
}

// exitedEarly returns the error for a pod whose stdout ended before the
// event the parent waited for.
func (p *podProc) exitedEarly(ctx context.Context) error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited before finishing its run (%v); see its messages above", p.name, p.err)
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s: %w", p.name, context.Cause(ctx))
	}
}

// firing waits for the pod's result and for the process to exit.
func (p *podProc) firing(ctx context.Context) (Firing, error) {
	ev, err := p.await(ctx, "result")
	if err != nil {
		return Firing{}, err
	}
	return p.finish(ctx, ev)
}

// finish waits for the pod, whose result event is ev, to exit.
func (p *podProc) finish(ctx context.Context, ev event) (Firing, error) {
	if ev.Firing == nil {
		return Firing{}, fmt.Errorf("%s sent a result without a firing", p.name)
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return Firing{}, fmt.Errorf("waiting for %s to exit: %w", p.name, context.Cause(ctx))
	}
	if p.err != nil {
		return Firing{}, fmt.Errorf("%s: %w", p.name, p.err)
	}
	return *ev.Firing, nil
}

// stopAll kills every pod still running and waits for all of them, so that
// no pod outlives the run, whichever way it ends. SIGKILL also ends a pod
// that is stopped by SIGSTOP.
func (s *story) stopAll() {
	for _, p := range s.pods {
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
