package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"

	"github.com/fencelock/fencelock/examples/internal/demo"
)

// The parent and its workers talk over the workers' standard streams, as
// in examples/settlement: a worker writes one JSON event per line to
// stdout, which the parent prints on the timeline and acts on; the parent
// writes "go" to its stdin to start its transfers.

// event is one line a worker writes to stdout.
type event struct {
	Kind    string   `json:"kind"`              // ready, say, result, done
	Msg     string   `json:"msg,omitempty"`     // printed on the timeline when not empty
	Outcome *Outcome `json:"outcome,omitempty"` // with result
}

// story is the parent's side of a run: the workers it started, which it
// kills and waits for in stopAll.
type story struct {
	tl     *demo.Timeline
	stderr io.Writer
	procs  []*workerProc // only the goroutine running run touches it
}

// workerProc is one worker process, seen from the parent.
type workerProc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan event    // the worker's events; closed when its stdout ends
	done   chan struct{} // closed once the process has been waited for
	err    error         // cmd.Wait's error; read only after done is closed
}

// start starts a worker process running this executable in the worker
// role, configured by cfg. It connects, reports "ready" and waits for "go".
func (s *story) start(cfg workerConfig) (*workerProc, error) {
	env, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this program to run its workers: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), workerEnv+"="+string(env))
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
		return nil, fmt.Errorf("start %s: %w", cfg.Worker, err)
	}
	p := &workerProc{name: cfg.Worker, cmd: cmd, stdin: stdin, events: make(chan event, 64), done: make(chan struct{})}
	s.procs = append(s.procs, p)
	go p.read(stdout, s.tl)
	return p, nil
}

// read relays the worker's events until its stdout ends, then waits for
// the process. It is the only goroutine a workerProc has; stopAll waits
// for it.
func (p *workerProc) read(stdout io.Reader, tl *demo.Timeline) {
	defer close(p.done)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			tl.Printf(p.name, "%s", sc.Text())
			continue
		}
		if ev.Msg != "" {
			tl.Printf(p.name, "%s", ev.Msg)
		}
		p.events <- ev // stopAll drains events, so this cannot block forever
	}
	close(p.events)
	p.err = p.cmd.Wait()
}

// fireTogether waits until every worker is ready, then tells them all to
// start, so that their transfers start within a millisecond of each other.
func (s *story) fireTogether(ctx context.Context, procs []*workerProc) error {
	for _, p := range procs {
		if _, err := p.next(ctx, "ready"); err != nil {
			return err
		}
	}
	for _, p := range procs {
		if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
			return fmt.Errorf("tell %s to go: %w", p.name, err)
		}
	}
	return nil
}

// next returns the worker's next event of one of kinds, skipping others.
func (p *workerProc) next(ctx context.Context, kinds ...string) (event, error) {
	for {
		select {
		case ev, ok := <-p.events:
			if !ok {
				<-p.done
				return event{}, fmt.Errorf("%s exited before finishing (%v); see its messages above", p.name, p.err)
			}
			for _, k := range kinds {
				if ev.Kind == k {
					return ev, nil
				}
			}
		case <-ctx.Done():
			return event{}, fmt.Errorf("waiting for %s: %w", p.name, context.Cause(ctx))
		}
	}
}

// results collects the worker's outcomes until it is done, and waits for
// it to exit.
func (p *workerProc) results(ctx context.Context) ([]Outcome, error) {
	var out []Outcome
	for {
		ev, err := p.next(ctx, "result", "done")
		if err != nil {
			return nil, err
		}
		if ev.Kind == "done" {
			break
		}
		if ev.Outcome != nil {
			out = append(out, *ev.Outcome)
		}
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for %s to exit: %w", p.name, context.Cause(ctx))
	}
	if p.err != nil {
		return nil, fmt.Errorf("%s: %w", p.name, p.err)
	}
	return out, nil
}

// stopAll kills every worker still running and waits for all of them, so
// that none outlives the run, whichever way it ends.
func (s *story) stopAll() {
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
