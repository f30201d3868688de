package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// An event is one request from a worker as the test process read it.
type event struct {
	request
	T     time.Duration // when the test process read it, since the coordinator started
	TWall int64         // the same instant on the wall clock, µs since the epoch

	RT       time.Duration // fwrite: when the reply was sent
	Accepted bool          // fwrite: the fenced register's decision
	Counter  int64         // ubegin: the value read; uend: the value before the write
}

// coord is the test process's side: it configures and drives the workers,
// serves the two resources their critical sections write, and records every
// request with its own timestamps.
type coord struct {
	t       testing.TB
	ln      net.Listener
	t0      time.Time
	config  func(w int) workerConfig
	workers []*proc
	done    chan struct{} // closed by close: blocking hooks give up

	mu       sync.Mutex
	events   []event                      // guarded by mu
	notify   chan struct{}                // guarded by mu; closed and replaced on each event
	counter  int64                        // guarded by mu; the unfenced resource
	highest  int64                        // guarded by mu; the fenced resource: the greatest fence accepted
	stop     bool                         // guarded by mu; workers are told to stop
	onCommit func(ev event)               // guarded by mu; called before a commit is answered
	onBegin  func(ev event) time.Duration // guarded by mu; called before a ubegin is answered
	conns    map[net.Conn]bool            // guarded by mu
	closed   bool                         // guarded by mu

	wg sync.WaitGroup
}

// startCoord starts the coordinator and n workers configured by config. It
// and the workers are stopped when the test ends.
func startCoord(t testing.TB, n int, config func(w int) workerConfig) *coord {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("chaos: coordinator: %v", err)
	}
	c := &coord{t: t, ln: ln, t0: time.Now(), config: config, done: make(chan struct{}),
		notify: make(chan struct{}), conns: make(map[net.Conn]bool)}
	c.wg.Add(1)
	go c.accept()
	t.Cleanup(c.close)
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("FENCELOCK_CHAOS_DUMP") == "1" {
			c.dump()
		}
	})

	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("chaos: %v", err)
	}
	for i := range n {
		p, err := startProc(t, fmt.Sprintf("worker%d", i),
			[]string{envRole + "=worker", envCoord + "=" + ln.Addr().String(), envWorker + "=" + strconv.Itoa(i)},
			exe, "-test.run=^$")
		if err != nil {
			t.Fatalf("chaos: %v", err)
		}
		c.workers = append(c.workers, p)
	}
	return c
}

func (c *coord) accept() {
	defer c.wg.Done()
	for {
		conn, err := c.ln.Accept()
		if err != nil {
			return
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			_ = conn.Close()
			return
		}
		c.conns[conn] = true
		c.mu.Unlock()
		c.wg.Add(1)
		go c.serve(conn)
	}
}

func (c *coord) serve(conn net.Conn) {
	defer c.wg.Done()
	defer func() {
		c.mu.Lock()
		delete(c.conns, conn)
		c.mu.Unlock()
		_ = conn.Close()
	}()
	dec := json.NewDecoder(bufio.NewReader(conn))
	enc := json.NewEncoder(conn)
	for {
		var req request
		if err := dec.Decode(&req); err != nil {
			return
		}
		if err := enc.Encode(c.handle(req)); err != nil {
			return
		}
	}
}

// handle records req and serves it.
func (c *coord) handle(req request) reply {
	now := time.Now()
	ev := event{request: req, T: now.Sub(c.t0), TWall: wallMicros(now)}
	var r reply
	switch req.Op {
	case "hello":
		cfg := c.config(req.W)
		r.Config = &cfg
	case "commit":
		c.mu.Lock()
		hook := c.onCommit
		c.mu.Unlock()
		if hook != nil {
			hook(ev)
		}
	case "ubegin":
		c.mu.Lock()
		hook := c.onBegin
		c.mu.Unlock()
		if hook != nil {
			r.Hold = hook(ev)
		}
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	switch req.Op {
	case "next":
		r.Stop = c.stop
	case "ubegin":
		ev.Counter = c.counter
		r.Value = c.counter
	case "uend":
		ev.Counter = c.counter
		if req.Wrote {
			c.counter = req.Value
		}
	case "fwrite":
		// The fenced resource: accept only a fence greater than every fence
		// accepted so far.
		if req.Fence > c.highest {
			c.highest = req.Fence
			ev.Accepted = true
		}
		r.Accepted = ev.Accepted
		ev.RT = time.Since(c.t0)
	}
	c.events = append(c.events, ev)
	close(c.notify)
	c.notify = make(chan struct{})
	return r
}

// setOnCommit installs a hook called with each commit request before it is
// answered; the worker waits for the answer.
func (c *coord) setOnCommit(f func(ev event)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onCommit = f
}

// setOnBegin installs a hook called with each ubegin request before it is
// answered; a positive result overrides that section's hold.
func (c *coord) setOnBegin(f func(ev event) time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onBegin = f
}

// await returns the first event at index from or later that matches pred,
// and the index after it, waiting up to d for one to arrive.
func (c *coord) await(from int, d time.Duration, pred func(ev event) bool) (event, int, bool) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		for i := from; i < len(c.events); i++ {
			if pred(c.events[i]) {
				ev := c.events[i]
				c.mu.Unlock()
				return ev, i + 1, true
			}
		}
		from = len(c.events)
		notify := c.notify
		c.mu.Unlock()
		select {
		case <-notify:
		case <-deadline.C:
			return event{}, from, false
		}
	}
}

// mark returns the index the next event will have.
func (c *coord) mark() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.events)
}

// countFrom returns how many events from index from on match pred.
func (c *coord) countFrom(from int, pred func(ev event) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ev := range c.events[from:] {
		if pred(ev) {
			n++
		}
	}
	return n
}

// snapshot returns a copy of the events and the resources' final states.
func (c *coord) snapshot() (events []event, counter, highest int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]event(nil), c.events...), c.counter, c.highest
}

// pauseFor SIGSTOPs worker w, waits d, and SIGCONTs it.
func (c *coord) pauseFor(w int, d time.Duration) error {
	if err := c.workers[w].pause(); err != nil {
		return err
	}
	select {
	case <-time.After(d):
	case <-c.done:
	}
	return c.workers[w].resume()
}

// stopWorkers tells the workers to stop after their current attempt and
// waits up to d for them to exit. It fails the test if one does not exit
// cleanly in time (it is then killed).
func (c *coord) stopWorkers(d time.Duration) {
	c.t.Helper()
	c.mu.Lock()
	c.stop = true
	c.mu.Unlock()
	deadline := time.Now().Add(d)
	for _, w := range c.workers {
		_ = w.resume() // in case a failed scenario left it paused
		if !w.wait(time.Until(deadline)) {
			w.kill()
			c.t.Errorf("chaos: %s did not exit within %v; killed. Its output:\n%s", w.name, d, w.out)
			continue
		}
		if code := w.exitCode(); code != 0 {
			c.t.Errorf("chaos: %s exited with %d. Its output:\n%s", w.name, code, w.out)
		}
	}
}

// dump writes the events and the workers' output to the artifact directory,
// for a failed test or when FENCELOCK_CHAOS_DUMP=1.
func (c *coord) dump() {
	name := strings.NewReplacer("/", "_", " ", "_").Replace(c.t.Name())
	path := filepath.Join(artifactDir(), name+"-events.txt")
	var b strings.Builder
	events, counter, highest := c.snapshot()
	fmt.Fprintf(&b, "counter %d, highest fence %d\n", counter, highest)
	for _, ev := range events {
		line, _ := json.Marshal(ev)
		fmt.Fprintf(&b, "%10.3fms %s\n", float64(ev.T)/float64(time.Millisecond), line)
	}
	for _, w := range c.workers {
		fmt.Fprintf(&b, "--- %s output:\n%s\n", w.name, w.out)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		c.t.Logf("chaos: writing events: %v", err)
		return
	}
	c.t.Logf("chaos: events and worker output written to %s", path)
}

// close kills the workers, stops serving and waits for its goroutines.
func (c *coord) close() {
	for _, w := range c.workers {
		w.kill()
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	close(c.done)
	for conn := range c.conns {
		_ = conn.Close()
	}
	c.mu.Unlock()
	_ = c.ln.Close()
	c.wg.Wait()
}
