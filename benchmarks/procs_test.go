package benchmarks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// With -procs (and in BenchmarkRedlockContendedProcs) the waiters of a
// contended benchmark are processes, one each: the test binary run again as
// TestContendWaiter. The waiters are meant to be separate pods, and
// goroutines of one process are coupled by its runtime: a holder's 1ms sleep
// ends when the netpoller next wakes, which waits in whole milliseconds and
// starts its wait again after every network event of any other waiter, so
// the more network traffic the other waiters make during a hold, the longer
// the hold lasts (benchmarks/README.md, "Waiters as processes"). In their
// own processes a hold lasts what it lasts alone.
//
// The waiters share a board (see sharedBoard) in a memory-mapped file, and
// a clock: the wall clock's time since the run's start, which the benchmark
// writes there once every waiter has its session open. Each waiter writes
// its waiterLog, and its allocations in the window, to a file of its own.

// openers maps "suite/name" (single/redsync, redlock/fencelock) to the
// driver's open function, given the servers' addresses: how a waiter opens
// its session in any process of the run.
var openers = map[string]func(tb testing.TB, addrs []string) func() session{}

func init() {
	for _, d := range contendedDrivers {
		openers["single/"+d.name] = func(tb testing.TB, addrs []string) func() session { return d.open(tb, addrs[0]) }
	}
}

// A waiterSpec says which implementation the waiters of a contended run
// use, so that a waiter in another process can open it.
type waiterSpec struct {
	suite string // single or redlock
	impl  string // the driver's name
	addrs []string
}

// open connects the implementation to the servers, with clients closed when
// tb ends, and returns what makes sessions sharing them.
func (w waiterSpec) open(tb testing.TB) func() session {
	open, ok := openers[w.suite+"/"+w.impl]
	if !ok {
		tb.Fatalf("no implementation %s in suite %s", w.impl, w.suite)
	}
	return open(tb, w.addrs)
}

// waiterEnv names the file of a waiter process's waiterJob.
const waiterEnv = "FENCELOCK_BENCH_WAITER"

// A waiterJob is what a waiter process is told to do, in JSON.
type waiterJob struct {
	Suite, Impl string
	Addrs       []string
	Key         string
	Board       string // the sharedBoard's file
	Report      string // where the waiterReport goes
	Waiters     int
	Hold, Pause time.Duration
	WaitBound   time.Duration
	Window      time.Duration
}

// A waiterReport is a waiter process's waiterLog, and its allocations in the
// window, in JSON.
type waiterReport struct {
	Sections, Fails    int
	Held               time.Duration
	Waits, Handoffs    []time.Duration
	Err                string
	Allocs, AllocBytes uint64
}

// sharedBoard holds a run's board, and how the run starts, laid out to be
// shared: the waiters of a run with -procs map it from a file; a run whose
// waiters are goroutines keeps it in its own memory.
type sharedBoard struct {
	handoffFrom, overlaps atomic.Int64
	inside, waiting       atomic.Int32
	ready                 atomic.Int32 // waiters with their session open
	base                  atomic.Int64 // the run's start, Unix ns; 0 before
}

// mapBoard maps the sharedBoard file at path into memory; unmap undoes it.
func mapBoard(path string) (sb *sharedBoard, unmap func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(unsafe.Sizeof(sharedBoard{})), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	// A mapping is page-aligned: every field is aligned as in Go memory.
	return (*sharedBoard)(unsafe.Pointer(&mem[0])), func() { _ = syscall.Munmap(mem) }, nil
}

// board returns the waiters' view of sb.
func (sb *sharedBoard) board() *board {
	return &board{inside: &sb.inside, waiting: &sb.waiting, overlaps: &sb.overlaps, handoffFrom: &sb.handoffFrom}
}

// contendProcs is contend with every waiter in a process of its own. It
// fails as soon as one of them fails, and kills the others then.
func contendProcs(tb testing.TB, w waiterSpec, key string, window time.Duration, c contention) *contendResult {
	if *shared {
		tb.Fatal("-shared and -procs: processes cannot share an instance")
	}
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	boardPath := filepath.Join(dir, "board")
	if err := os.WriteFile(boardPath, make([]byte, unsafe.Sizeof(sharedBoard{})), 0o600); err != nil {
		tb.Fatal(err)
	}
	sb, unmap, err := mapBoard(boardPath)
	if err != nil {
		tb.Fatal(err)
	}
	defer unmap()
	sb.handoffFrom.Store(-1)

	type child struct {
		cmd        *exec.Cmd
		alive      io.Closer // its stdin: it exits when this closes (or this process ends)
		reportPath string
		log        bytes.Buffer // its stdout and stderr
		err        error        // how it exited; set before exited is sent
	}
	children := make([]*child, c.waiters)
	exited := make(chan int, c.waiters)
	running := 0
	defer func() {
		for _, ch := range children {
			if ch != nil {
				_ = ch.alive.Close()
				_ = ch.cmd.Process.Kill()
			}
		}
		for ; running > 0; running-- {
			<-exited
		}
	}()
	// A waiter's own bound: its whole run, with a margin for starting up.
	childTimeout := warmup + window + *waitBound + unlockT + time.Minute
	for i := range children {
		ch := &child{reportPath: filepath.Join(dir, fmt.Sprintf("waiter%d.json", i))}
		job, err := json.Marshal(waiterJob{Suite: w.suite, Impl: w.impl, Addrs: w.addrs, Key: key,
			Board: boardPath, Report: ch.reportPath, Waiters: c.waiters, Hold: c.hold, Pause: c.pause,
			WaitBound: *waitBound, Window: window})
		if err != nil {
			tb.Fatal(err)
		}
		jobPath := filepath.Join(dir, fmt.Sprintf("waiter%d.job", i))
		if err := os.WriteFile(jobPath, job, 0o600); err != nil {
			tb.Fatal(err)
		}
		ch.cmd = exec.Command(self, "-test.run=^TestContendWaiter$", "-test.count=1", "-test.v",
			"-test.timeout="+childTimeout.String())
		ch.cmd.Env = append(os.Environ(), waiterEnv+"="+jobPath)
		ch.cmd.Stdout, ch.cmd.Stderr = &ch.log, &ch.log
		if ch.alive, err = ch.cmd.StdinPipe(); err != nil {
			tb.Fatal(err)
		}
		if err := ch.cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		children[i] = ch
		running++
		go func() { ch.err = ch.cmd.Wait(); exited <- i }()
	}
	failed := func(i int) {
		ch := children[i]
		if ch.err != nil {
			tb.Fatalf("waiter %d: %v\n%s", i, ch.err, ch.log.Bytes())
		}
	}

	// Every waiter opens its session, then the run starts.
	for deadline := time.Now().Add(30 * time.Second); int(sb.ready.Load()) < c.waiters; {
		select {
		case i := <-exited:
			running--
			failed(i)
			tb.Fatalf("waiter %d exited before the run\n%s", i, children[i].log.Bytes())
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d of %d waiters ready after 30s", sb.ready.Load(), c.waiters)
		}
	}
	sb.base.Store(time.Now().UnixNano())

	bound := time.After(warmup + window + *waitBound + unlockT + 10*time.Second)
	for running > 0 {
		select {
		case i := <-exited:
			running--
			failed(i)
		case <-bound:
			tb.Fatalf("%d waiters did not stop within %v of the end of the run", running, *waitBound+unlockT+10*time.Second)
		}
	}
	r := &contendResult{window: window, logs: make([]waiterLog, c.waiters)}
	for i, ch := range children {
		raw, err := os.ReadFile(ch.reportPath)
		if err != nil {
			tb.Fatalf("waiter %d: %v\n%s", i, err, ch.log.Bytes())
		}
		var rep waiterReport
		if err := json.Unmarshal(raw, &rep); err != nil {
			tb.Fatalf("waiter %d: %v", i, err)
		}
		if rep.Err != "" {
			tb.Fatalf("waiter %d: %s", i, rep.Err)
		}
		r.logs[i] = waiterLog{sections: rep.Sections, fails: rep.Fails, held: rep.Held, waits: rep.Waits, handoffs: rep.Handoffs}
		r.allocs += rep.Allocs
		r.allocBytes += rep.AllocBytes
	}
	r.overlaps = sb.overlaps.Load()
	return r
}

// TestContendWaiter is one waiter of a contended benchmark whose waiters are
// processes (see contendProcs). It exits when its standard input closes:
// the benchmark that started it has ended.
func TestContendWaiter(t *testing.T) {
	path := os.Getenv(waiterEnv)
	if path == "" {
		t.Skip(waiterEnv + " is not set: this process is not a waiter of a contended benchmark")
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var job waiterJob
	if err := json.Unmarshal(raw, &job); err != nil {
		t.Fatal(err)
	}
	*waitBound = job.WaitBound
	sb, unmap, err := mapBoard(job.Board)
	if err != nil {
		t.Fatal(err)
	}
	defer unmap()
	s := waiterSpec{suite: job.Suite, impl: job.Impl, addrs: job.Addrs}.open(t)()
	sb.ready.Add(1)
	for sb.base.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	start := time.Unix(0, sb.base.Load()) // no monotonic reading: the wall clock, as in every waiter
	since := func() time.Duration { return time.Since(start) }

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var l waiterLog
	done := make(chan struct{})
	c := contention{waiters: job.Waiters, hold: job.Hold, pause: job.Pause}
	go func() { defer close(done); waitLoop(ctx, s, job.Key, c, job.Window, sb.board(), since, &l) }()

	allocs, allocBytes := windowAllocs(since, job.Window)
	stop()
	<-done

	rep := waiterReport{Sections: l.sections, Fails: l.fails, Held: l.held, Waits: l.waits, Handoffs: l.handoffs,
		Allocs: allocs, AllocBytes: allocBytes}
	if l.err != nil {
		rep.Err = l.err.Error()
	}
	out, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(job.Report, out, 0o600); err != nil {
		t.Fatal(err)
	}
}

// noLock is a session that takes no lock: its waiters are all inside at
// once, which a contended run must count as overlaps.
type noLock struct{}

func (noLock) tryLock(context.Context, string) error             { return nil }
func (noLock) lock(context.Context, string, time.Duration) error { return nil }
func (noLock) unlock(context.Context) error                      { return nil }

func init() {
	openers["test/nolock"] = func(testing.TB, []string) func() session { return func() session { return noLock{} } }
}

// TestContend runs waiters of a lock that excludes nobody, as goroutines
// and as processes: the overlaps are counted (as processes, only if they
// share the board: each process has one waiter), and every waiter's log
// comes back.
func TestContend(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, procs := range []bool{false, true} {
		t.Run(fmt.Sprintf("procs=%v", procs), func(t *testing.T) {
			c := contention{waiters: 3, hold: time.Millisecond, procs: procs}
			r := contend(t, waiterSpec{suite: "test", impl: "nolock"}, "k", 200*time.Millisecond, c)
			if r.overlaps == 0 {
				t.Error("3 waiters without a lock, and no overlap counted")
			}
			if len(r.logs) != 3 {
				t.Fatalf("%d logs, want 3", len(r.logs))
			}
			for i, l := range r.logs {
				if l.sections == 0 || len(l.waits) != l.sections || l.held < time.Duration(l.sections)*time.Millisecond {
					t.Errorf("waiter %d: %d sections, %d waits, held %v", i, l.sections, len(l.waits), l.held)
				}
			}
			if r.allocs == 0 {
				t.Error("no allocations reported")
			}
		})
	}
}

// A waiter process whose benchmark has gone (its standard input closed)
// exits, even before its run started.
func TestContendWaiterExitsWithItsBenchmark(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	boardPath := filepath.Join(dir, "board")
	if err := os.WriteFile(boardPath, make([]byte, unsafe.Sizeof(sharedBoard{})), 0o600); err != nil {
		t.Fatal(err)
	}
	sb, unmap, err := mapBoard(boardPath)
	if err != nil {
		t.Fatal(err)
	}
	defer unmap()
	job, err := json.Marshal(waiterJob{Suite: "test", Impl: "nolock", Key: "k", Board: boardPath,
		Report: filepath.Join(dir, "report.json"), Waiters: 1, Window: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	jobPath := filepath.Join(dir, "job")
	if err := os.WriteFile(jobPath, job, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^TestContendWaiter$", "-test.count=1", "-test.timeout=1m")
	cmd.Env = append(os.Environ(), waiterEnv+"="+jobPath)
	alive, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for sb.ready.Load() == 0 { // then it waits for a start that never comes
		select {
		case err := <-exited:
			t.Fatalf("the waiter ended before it was ready: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	_ = alive.Close()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 {
			t.Errorf("the waiter ended with %v, want exit status 3", err)
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		t.Fatal("the waiter still ran 10s after its standard input closed")
	}
}
