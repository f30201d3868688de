package fencegocron_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOncePerTick runs three gocron schedulers, each in its own process,
// that schedule the same short job on the same ticks: each tick, one of
// them runs it and the other two skip, their Lock refused with
// ErrNotObtained. The job takes 20ms, far less than the spread of the
// schedulers' firings may be under load; WithMinHold keeps the lock for half
// the interval so that a scheduler firing late finds it taken.
func TestOncePerTick(t *testing.T) {
	const ticks = 10
	cfg := schedConfig{
		RedisAddr: startRedis(t),
		KeyPrefix: "fencegocron-test:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":",
		Job:       "report",
		Interval:  300 * time.Millisecond,
		TTL:       2 * time.Second,
		MinHold:   150 * time.Millisecond,
		Work:      20 * time.Millisecond,
	}
	c := newCluster(t, cfg, 3)
	start := c.start(t)
	stopAt := start.Add(ticks*cfg.Interval - cfg.Interval/2) // tick ticks-1 has fired, tick ticks has not

	var runs []procEvent
	for pe := range c.until(t, stopAt) {
		switch pe.Kind {
		case "run":
			runs = append(runs, pe)
		case "job_error":
			t.Errorf("%s: job error: %s", pe.proc.name, pe.Err)
		case "lock_error":
			assert.True(t, pe.Busy, "%s: Lock failed, and not because the lock was busy: %s", pe.proc.name, pe.Err)
		}
	}
	c.stop(t)

	perTick := make(map[int][]procEvent)
	var b strings.Builder
	for _, r := range runs {
		perTick[r.Tick] = append(perTick[r.Tick], r)
		fmt.Fprintf(&b, "  tick %2d at %+6.0fms: %s, fence %d\n", r.Tick,
			float64(r.time().Sub(start.Add(time.Duration(r.Tick)*cfg.Interval)))/1e6, r.proc.name, r.Fence)
	}
	t.Logf("runs (time after the tick's scheduled time):\n%s", b.String())
	var last int64
	for tick := range ticks {
		got := perTick[tick]
		if assert.Len(t, got, 1, "runs of tick %d", tick) {
			assert.Greater(t, got[0].Fence, last, "fence of tick %d", tick)
			last = got[0].Fence
		}
	}
	assert.Len(t, runs, ticks, "runs in all")
	c.assertNoLock(t)
}

// TestPausedHolder pauses (SIGSTOP) the scheduler whose run holds the lock,
// for twice the lock's TTL. Its watchdog is frozen with it, so the lock
// expires and another scheduler takes it over with a larger fence. When the
// paused scheduler resumes, its task's context is cancelled with cause
// ErrLost and its run returns an error matching ErrLost, which gocron hands
// to the AfterJobRunsWithError listener.
func TestPausedHolder(t *testing.T) {
	cfg := schedConfig{
		RedisAddr: startRedis(t),
		KeyPrefix: "fencegocron-test:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":",
		Job:       "sync",
		Interval:  200 * time.Millisecond,
		TTL:       600 * time.Millisecond,
		Work:      1500 * time.Millisecond,
	}
	c := newCluster(t, cfg, 3)
	c.start(t)
	events := c.until(t, time.Now().Add(15*time.Second))
	next := func(what string, match func(procEvent) bool) procEvent {
		t.Helper()
		for pe := range events {
			if match(pe) {
				return pe
			}
		}
		t.Fatalf("no %s before the test's deadline", what)
		return procEvent{}
	}

	first := next("first run", func(pe procEvent) bool { return pe.Kind == "run" })
	holder := first.proc
	require.NoError(t, holder.pause())
	pausedAt := time.Now()
	t.Logf("%s runs tick %d with fence %d; paused it (SIGSTOP) %.0fms after the run started",
		holder.name, first.Tick, first.Fence, float64(pausedAt.Sub(first.time()))/1e6)

	takeover := next("takeover", func(pe procEvent) bool {
		if pe.proc == holder {
			t.Errorf("%s reported %q while paused", holder.name, pe.Kind)
		}
		return pe.Kind == "run"
	})
	t.Logf("%s took over %.0fms after the pause, tick %d, fence %d", takeover.proc.name,
		float64(takeover.time().Sub(pausedAt))/1e6, takeover.Tick, takeover.Fence)
	assert.Greater(t, takeover.Fence, first.Fence, "the takeover's fence")
	// The holder renewed at most TTL/3 before the pause, so its lock lived
	// on for at least about 2/3 of the TTL.
	assert.Greater(t, takeover.time().Sub(pausedAt), cfg.TTL/2, "takeover while the paused holder's lock was still valid")

	if d := time.Until(pausedAt.Add(2 * cfg.TTL)); d > 0 {
		time.Sleep(d)
	}
	require.NoError(t, holder.resume())
	resumedAt := time.Now()
	t.Logf("resumed %s (SIGCONT) after %.0fms", holder.name, float64(resumedAt.Sub(pausedAt))/1e6)

	var cancelled, jobErr procEvent
	for cancelled.Kind == "" || jobErr.Kind == "" {
		pe := next("the resumed holder's loss", func(pe procEvent) bool { return pe.proc == holder })
		switch pe.Kind {
		case "cancelled":
			cancelled = pe
		case "job_error":
			jobErr = pe
		case "done", "run":
			t.Fatalf("%s reported %q after resuming, before its loss: %+v", holder.name, pe.Kind, pe.event)
		}
	}
	t.Logf("%s: task context cancelled %.1fms after SIGCONT: %s", holder.name,
		float64(cancelled.time().Sub(resumedAt))/1e6, cancelled.Err)
	t.Logf("%s: gocron's AfterJobRunsWithError got: %s", holder.name, jobErr.Err)
	assert.True(t, cancelled.Lost, "the task context's cause matches ErrLost: %s", cancelled.Err)
	assert.Equal(t, first.Fence, cancelled.Fence)
	assert.Less(t, cancelled.time().Sub(resumedAt), 500*time.Millisecond, "loss seen soon after resuming")
	assert.True(t, jobErr.Lost, "the run's error matches ErrLost: %s", jobErr.Err)

	c.stop(t)
	for range events {
		// Drained by stop; nothing is left to check.
	}
	c.assertNoLock(t)
}

// A cluster is the scheduler processes of one test, all sharing one Redis.
type cluster struct {
	cfg    schedConfig
	procs  []*proc
	events chan procEvent // every process's events, in the order read
	wg     sync.WaitGroup // the readers of the processes' stdout
}

// procEvent is an event and the process that sent it.
type procEvent struct {
	event
	proc *proc
}

// A proc is one scheduler process.
type proc struct {
	name    string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	exited  chan struct{} // closed once cmd has been waited for
	stderr  bytes.Buffer  // written by exec's copier until exited is closed
	garbage []string      // stdout lines that are not events; written by read until exited is closed
}

// newCluster starts n scheduler processes and waits until all are ready.
// t.Cleanup kills any still running.
func newCluster(t *testing.T, cfg schedConfig, n int) *cluster {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	c := &cluster{cfg: cfg, events: make(chan procEvent, 1024)}
	t.Cleanup(c.kill)
	for i := range n {
		p := &proc{name: fmt.Sprintf("scheduler-%c", 'a'+i), exited: make(chan struct{})}
		pcfg := cfg
		pcfg.Name = p.name
		env, err := json.Marshal(pcfg)
		require.NoError(t, err)
		p.cmd = exec.Command(exe)
		p.cmd.Env = append(os.Environ(), envScheduler+"="+string(env))
		p.cmd.Stderr = &p.stderr
		setDeathSignal(p.cmd)
		p.stdin, err = p.cmd.StdinPipe()
		require.NoError(t, err)
		stdout, err := p.cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, p.cmd.Start())
		c.procs = append(c.procs, p)
		c.wg.Go(func() { c.read(p, stdout) })
	}
	go func() {
		c.wg.Wait()
		close(c.events)
	}()
	ready := 0
	timeout := time.After(30 * time.Second)
	for ready < n {
		select {
		case pe, ok := <-c.events:
			require.True(t, ok, "a scheduler exited before it was ready: %s", c.stderrs())
			if pe.Kind == "ready" {
				ready++
			}
		case <-timeout:
			t.Fatalf("schedulers not ready after 30s: %s", c.stderrs())
		}
	}
	return c
}

// read relays p's events until its stdout ends, then waits for it.
func (c *cluster) read(p *proc, stdout io.Reader) {
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			p.garbage = append(p.garbage, sc.Text())
			continue
		}
		c.events <- procEvent{ev, p}
	}
	_ = p.cmd.Wait()
	close(p.exited)
}

// start tells every scheduler to start its job with the first tick a
// moment from now, and returns that tick's time.
func (c *cluster) start(t *testing.T) time.Time {
	t.Helper()
	start := time.Now().Add(200 * time.Millisecond)
	for _, p := range c.procs {
		_, err := fmt.Fprintf(p.stdin, "start %d\n", start.UnixNano())
		require.NoError(t, err)
	}
	return start
}

// until returns the events that arrive before deadline; the channel is
// closed at the deadline, when the processes' stdout ends, or when t ends.
func (c *cluster) until(t *testing.T, deadline time.Time) <-chan procEvent {
	out := make(chan procEvent)
	done, exited := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(done); <-exited })
	go func() {
		defer close(exited)
		defer close(out)
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		for {
			select {
			case pe, ok := <-c.events:
				if !ok {
					return
				}
				select {
				case out <- pe:
				case <-timer.C:
					return
				case <-done:
					return
				}
			case <-timer.C:
				return
			case <-done:
				return
			}
		}
	}()
	return out
}

// stop closes every scheduler's stdin, which shuts it down, and checks
// that each exits cleanly within 10s.
func (c *cluster) stop(t *testing.T) {
	t.Helper()
	for _, p := range c.procs {
		_ = p.stdin.Close()
	}
	timeout := time.After(10 * time.Second)
	for _, p := range c.procs {
		select {
		case <-p.exited:
			assert.True(t, p.cmd.ProcessState.Success(), "%s: %v; stderr: %s", p.name, p.cmd.ProcessState, p.stderr.String())
			assert.Empty(t, p.garbage, "%s wrote to stdout lines that are not events", p.name)
		case <-timeout:
			t.Errorf("%s did not exit within 10s of its stdin closing", p.name)
		}
	}
	c.kill()
}

// kill kills every process still running (SIGCONT first, for a paused one)
// and waits for the readers, draining the events no one reads any more.
func (c *cluster) kill() {
	for _, p := range c.procs {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			_ = p.cmd.Process.Kill()
		}
	}
	for range c.events {
		// Drain so that every reader reaches cmd.Wait.
	}
}

// stderrs returns what the processes that have exited wrote to stderr.
func (c *cluster) stderrs() string {
	var b strings.Builder
	for _, p := range c.procs {
		select {
		case <-p.exited:
			fmt.Fprintf(&b, "\n%s (%v): %s", p.name, p.cmd.ProcessState, p.stderr.String())
		default:
		}
	}
	return b.String()
}

// assertNoLock checks that the job's lock was released: nothing is left
// in Redis but its fence counter.
func (c *cluster) assertNoLock(t *testing.T) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: c.cfg.RedisAddr})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := rdb.Exists(ctx, c.cfg.KeyPrefix+"{"+c.cfg.Job+"}").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the lock is still held after the schedulers exited")
}

// pause stops the whole process with SIGSTOP and returns once the kernel
// reports it stopped, so that no thread of it runs on.
func (p *proc) pause() error {
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("%s: SIGSTOP: %w", p.name, err)
	}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if procState(p.cmd.Process.Pid) == 'T' {
			return nil
		}
	}
	return fmt.Errorf("%s: not stopped 2s after SIGSTOP", p.name)
}

// resume lets a paused process run on.
func (p *proc) resume() error {
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("%s: SIGCONT: %w", p.name, err)
	}
	return nil
}

// procState returns the state letter of /proc/<pid>/stat ('R', 'S', 'T',
// ...), or 0.
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}
