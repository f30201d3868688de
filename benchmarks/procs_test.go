package benchmarks

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// With -procs (and in BenchmarkRedlockContendedProcs) the waiters of a
// contended benchmark are processes, one each:
// the test binary run again as TestContendWaiter. The waiters are meant to
// be separate pods, and goroutines of one process are coupled by its
// runtime: a holder's 1ms sleep ends when the netpoller next wakes, which
// waits in whole milliseconds and starts its wait again after every network
// event of any other waiter, so the more network traffic the other waiters
// make during a hold, the longer the hold lasts (benchmarks/README.md,
// "Waiters as processes"). In their own processes a hold lasts what it
// lasts alone.
//
// The waiters share a board (see board) in a memory-mapped file, and a
// clock: the wall clock's nanoseconds since the run's start, which the
// parent writes to the board once every waiter has its session open. Each
// waiter writes its waiterLog, and its allocations in the window, to a
// file of its own.

// openers opens a waiter's session in any process of the run: a driver of
// a suite by "suite/name" (single/redsync, redlock/fencelock), given the
// servers' addresses.
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
	Board       string // the memory-mapped file
	Out         string // where the waiterReport goes
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

// The board's layout in its file; each field aligned to 8 bytes.
const (
	offHandoffFrom = 0  // int64
	offOverlaps    = 8  // int64
	offInside      = 16 // int32
	offWaiting     = 20 // int32
	offReady       = 24 // int32: waiters with their session open
	offBase        = 32 // int64: the run's start, Unix ns; 0 before
	boardSize      = 64
)

// mapBoard maps the board file at path into memory; unmap undoes it.
func mapBoard(path string) (bd *board, ready *atomic.Int32, base *atomic.Int64, unmap func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, boardSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	p := unsafe.Pointer(&mem[0])
	bd = &board{
		inside:      (*atomic.Int32)(unsafe.Add(p, offInside)),
		waiting:     (*atomic.Int32)(unsafe.Add(p, offWaiting)),
		overlaps:    (*atomic.Int64)(unsafe.Add(p, offOverlaps)),
		handoffFrom: (*atomic.Int64)(unsafe.Add(p, offHandoffFrom)),
	}
	return bd, (*atomic.Int32)(unsafe.Add(p, offReady)), (*atomic.Int64)(unsafe.Add(p, offBase)),
		func() { _ = syscall.Munmap(mem) }, nil
}

// contendProcs is contend with every waiter in a process of its own.
func contendProcs(b testing.TB, w waiterSpec, key string, window time.Duration, c contention) *contendResult {
	if *shared {
		b.Fatal("-shared and -procs: processes cannot share an instance")
	}
	dir := b.TempDir()
	boardPath := filepath.Join(dir, "board")
	if err := os.WriteFile(boardPath, make([]byte, boardSize), 0o600); err != nil {
		b.Fatal(err)
	}
	bd, ready, base, unmap, err := mapBoard(boardPath)
	if err != nil {
		b.Fatal(err)
	}
	defer unmap()
	bd.handoffFrom.Store(-1)

	type child struct {
		cmd     *exec.Cmd
		out     string
		output  bytes.Buffer
		exited  chan struct{}
		exitErr error
	}
	children := make([]*child, c.waiters)
	defer func() {
		for _, ch := range children {
			if ch != nil && ch.cmd.Process != nil {
				_ = ch.cmd.Process.Kill()
				<-ch.exited
			}
		}
	}()
	for i := range children {
		ch := &child{out: filepath.Join(dir, fmt.Sprintf("waiter%d.json", i)), exited: make(chan struct{})}
		job, err := json.Marshal(waiterJob{Suite: w.suite, Impl: w.impl, Addrs: w.addrs, Key: key,
			Board: boardPath, Out: ch.out, Waiters: c.waiters, Hold: c.hold, Pause: c.pause,
			WaitBound: *waitBound, Window: window})
		if err != nil {
			b.Fatal(err)
		}
		jobPath := filepath.Join(dir, fmt.Sprintf("waiter%d.job", i))
		if err := os.WriteFile(jobPath, job, 0o600); err != nil {
			b.Fatal(err)
		}
		ch.cmd = exec.Command(os.Args[0], "-test.run=^TestContendWaiter$", "-test.count=1", "-test.v")
		ch.cmd.Env = append(os.Environ(), waiterEnv+"="+jobPath)
		ch.cmd.Stdout, ch.cmd.Stderr = &ch.output, &ch.output
		if err := ch.cmd.Start(); err != nil {
			b.Fatal(err)
		}
		go func() { ch.exitErr = ch.cmd.Wait(); close(ch.exited) }()
		children[i] = ch
	}

	// Every waiter opens its session, then the run starts.
	for deadline := time.Now().Add(30 * time.Second); int(ready.Load()) < c.waiters; {
		for i, ch := range children {
			select {
			case <-ch.exited:
				b.Fatalf("waiter %d exited before the run: %v\n%s", i, ch.exitErr, ch.output.Bytes())
			default:
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d waiters ready after 30s", ready.Load(), c.waiters)
		}
		time.Sleep(time.Millisecond)
	}
	base.Store(time.Now().UnixNano())

	r := &contendResult{window: window, logs: make([]waiterLog, c.waiters)}
	bound := time.After(warmup + window + *waitBound + unlockT + 10*time.Second)
	for i, ch := range children {
		select {
		case <-ch.exited:
		case <-bound:
			b.Fatalf("waiter %d did not stop within %v of the end of the run", i, *waitBound+unlockT+10*time.Second)
		}
		if ch.exitErr != nil {
			b.Fatalf("waiter %d: %v\n%s", i, ch.exitErr, ch.output.Bytes())
		}
		raw, err := os.ReadFile(ch.out)
		if err != nil {
			b.Fatalf("waiter %d: %v\n%s", i, err, ch.output.Bytes())
		}
		var rep waiterReport
		if err := json.Unmarshal(raw, &rep); err != nil {
			b.Fatalf("waiter %d: %v", i, err)
		}
		if rep.Err != "" {
			b.Fatalf("waiter %d: %s", i, rep.Err)
		}
		r.logs[i] = waiterLog{sections: rep.Sections, fails: rep.Fails, held: rep.Held, waits: rep.Waits, handoffs: rep.Handoffs}
		r.allocs += rep.Allocs
		r.allocBytes += rep.AllocBytes
	}
	r.overlaps = bd.overlaps.Load()
	return r
}

// TestContendWaiter is one waiter of a contended benchmark run with -procs
// (see contendProcs); it does nothing in any other run.
func TestContendWaiter(t *testing.T) {
	path := os.Getenv(waiterEnv)
	if path == "" {
		t.Skip("a waiter process of a contended benchmark run with -procs")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var job waiterJob
	if err := json.Unmarshal(raw, &job); err != nil {
		t.Fatal(err)
	}
	*waitBound = job.WaitBound
	bd, ready, base, unmap, err := mapBoard(job.Board)
	if err != nil {
		t.Fatal(err)
	}
	defer unmap()
	s := waiterSpec{suite: job.Suite, impl: job.Impl, addrs: job.Addrs}.open(t)()
	ready.Add(1)
	for base.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	start := time.Unix(0, base.Load()) // no monotonic reading: the wall clock, as in every waiter
	since := func() time.Duration { return time.Since(start) }

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var l waiterLog
	done := make(chan struct{})
	c := contention{waiters: job.Waiters, hold: job.Hold, pause: job.Pause}
	go func() { defer close(done); waitLoop(ctx, s, job.Key, c, job.Window, bd, since, &l) }()

	var m0, m1 runtime.MemStats
	time.Sleep(warmup - since())
	runtime.ReadMemStats(&m0)
	time.Sleep(warmup + job.Window - since())
	runtime.ReadMemStats(&m1)
	stop()
	<-done

	rep := waiterReport{Sections: l.sections, Fails: l.fails, Held: l.held, Waits: l.waits, Handoffs: l.handoffs,
		Allocs: m1.Mallocs - m0.Mallocs, AllocBytes: m1.TotalAlloc - m0.TotalAlloc}
	if l.err != nil {
		rep.Err = l.err.Error()
	}
	out, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(job.Out, out, 0o600); err != nil {
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

// TestContendProcs runs waiters as processes: they share the board (a lock
// that excludes nobody shows overlaps; without a shared board each process
// would see only its own waiter inside), and their logs come back.
func TestContendProcs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	c := contention{waiters: 3, hold: time.Millisecond, procs: true}
	r := contendProcs(t, waiterSpec{suite: "test", impl: "nolock"}, "k", 200*time.Millisecond, c)
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
}
