package benchmarks

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/redistest"
)

// Flags of the test binary. Pass them after the package, e.g.
// go test -run '^$' -bench Contended -waiters 16 -contend 5s.
var (
	waiters = flag.Int("waiters", 8,
		"goroutines waiting for the one lock in BenchmarkContended, each with its own clients")
	contendFor = flag.Duration("contend", 3*time.Second,
		"measured duration of BenchmarkContended per implementation (after a warm-up); raised to -benchtime when that is a longer duration")
	shared = flag.Bool("shared", false,
		"BenchmarkContended: the waiters share one instance of each implementation (one process) instead of one each")
	procs = flag.Bool("procs", false,
		"BenchmarkContended and BenchmarkRedlockContended: each waiter is a process of its own (the test binary run again), not a goroutine")
	waitBound = flag.Duration("waitbound", 5*time.Second,
		"longest one acquisition in BenchmarkContended may wait before it counts as a fail")
	parallelism = flag.Int("parallelism", 8,
		"BenchmarkParallel runs parallelism*GOMAXPROCS goroutines")
	holdFor = flag.Duration("hold", time.Millisecond,
		"how long a waiter holds the lock in BenchmarkContended")
	pauseFor = flag.Duration("pause", 5*time.Millisecond,
		"how long a waiter pauses after a release in BenchmarkContended before it tries again")
	warmOps = flag.Int("warmops", 1,
		"BenchmarkUncontended: acquire+release cycles before the measured loop (at least 1: it dials and loads the scripts)")
	opTimeout = flag.Duration("optimeout", 0,
		"BenchmarkUncontended: give every acquire and every release a context with this timeout, as a request's would have; 0: context.Background()")
	cmdStats = flag.Bool("cmdstats", false,
		"BenchmarkUncontended and BenchmarkParallel: log redis-server's INFO commandstats per acquire+release (calls and usec per call of each command); the contended benchmarks: per critical section of the window, the commands of the warm-up and the wind-down included")
	implList = flag.String("impls", "",
		"comma-separated implementations to run, in this order (e.g. raw,fencelock); empty: all, in the order of drivers")
	srvCPU = flag.String("srvcpu", "",
		"pin the redis-servers to this CPU list (taskset -pc) once started, e.g. 0 with the test binary under taskset -c 1: client and server each on a CPU of its own")
)

// BenchmarkUncontended takes and releases one lock, which nobody else wants,
// in a loop: the latency and allocations of the acquire and release calls.
// ns/op is the loop's time per acquire+release (b.Loop: the whole loop
// divided by its iterations); p50-ns/op and mean-ns/op are the median and
// the mean of each acquire+release timed on its own. srv-ns/op is the
// redis-server main thread's CPU time per acquire+release.
func BenchmarkUncontended(b *testing.B) {
	srv := startServer(b)
	for _, d := range selected(b, drivers) {
		newSession := d.open(b, srv.Addr)
		b.Run(d.name, func(b *testing.B) {
			uncontended(b, newSession(), d.name+":uncontended", srv)
		})
	}
}

// startServer starts a redis-server for b and pins it as -srvcpu says.
func startServer(b *testing.B) *redistest.Server {
	srv := redistest.Start(b)
	if *srvCPU != "" {
		pid := strconv.Itoa(srv.Pid())
		if out, err := exec.Command("taskset", "-a", "-pc", *srvCPU, pid).CombinedOutput(); err != nil {
			b.Fatalf("taskset -a -pc %s %s: %v: %s", *srvCPU, pid, err, out)
		}
	}
	return srv
}

// uncontended takes and releases key with s in a loop and reports the
// latency of each acquire+release (p50-ns/op, mean-ns/op) and srv-ns/op:
// the CPU time of the servers' main threads, summed, per acquire+release.
func uncontended(b *testing.B, s session, key string, servers ...*redistest.Server) {
	cycle := newCycle(b, s, key)
	for range max(*warmOps, 1) { // dial, load the scripts
		cycle()
	}
	lat := new(latencies)
	stats := newCmdStats(b, servers...)
	b.ReportAllocs()
	cpu := newServerCPU(b, servers...)
	for b.Loop() {
		t0 := time.Now()
		cycle()
		lat.add(time.Since(t0))
	}
	cpu.report(b)
	lat.report(b, "")
	stats.log(b)
}

// newCycle returns a function that takes key with s and releases it,
// failing b on an error. With -optimeout each call gets a context with that
// timeout.
func newCycle(b *testing.B, s session, key string) func() {
	bg := context.Background()
	opCtx := func() (context.Context, context.CancelFunc) {
		if *opTimeout > 0 {
			return context.WithTimeout(bg, *opTimeout)
		}
		return bg, func() {}
	}
	return func() {
		ctx, cancel := opCtx()
		err := s.tryLock(ctx, key)
		cancel()
		if err != nil {
			b.Fatalf("lock: %v", err)
		}
		ctx, cancel = opCtx()
		err = s.unlock(ctx)
		cancel()
		if err != nil {
			b.Fatalf("unlock: %v", err)
		}
	}
}

// BenchmarkInterleaved is BenchmarkUncontended with the implementations
// taking turns: each iteration runs one acquire+release of every
// implementation (starting with a different one each time) and times each on
// its own. On a machine whose load changes from second to second, the
// implementations then see the same load, which the one-after-the-other runs
// of BenchmarkUncontended cannot promise; the price is that each runs with
// the caches the others left. It reports, per implementation,
// NAME:p50-ns/op and NAME:mean-ns/op (cmd/table shows them as the group
// Interleaved); ns/op is for one turn of all of them.
func BenchmarkInterleaved(b *testing.B) {
	srv := startServer(b)
	ds := selected(b, drivers)
	cycles := make([]func(), len(ds))
	lats := make([]*latencies, len(ds))
	for i, d := range ds {
		cycles[i] = newCycle(b, d.open(b, srv.Addr)(), d.name+":interleaved")
		for range max(*warmOps, 1) {
			cycles[i]()
		}
		lats[i] = new(latencies)
	}
	b.ReportAllocs()
	first := 0
	for b.Loop() {
		for j := range cycles {
			i := (first + j) % len(cycles)
			t0 := time.Now()
			cycles[i]()
			lats[i].add(time.Since(t0))
		}
		first = (first + 1) % len(cycles)
	}
	for i, d := range ds {
		lats[i].report(b, d.name+":")
	}
}

// BenchmarkParallel takes and releases locks from parallelism*GOMAXPROCS
// goroutines at once, each on its own key, sharing one instance of the
// implementation (one process serving many requests).
func BenchmarkParallel(b *testing.B) {
	srv := startServer(b)
	ctx := context.Background()
	for _, d := range selected(b, drivers) {
		newSession := d.open(b, srv.Addr)
		b.Run(d.name, func(b *testing.B) {
			var ids atomic.Int64
			b.SetParallelism(*parallelism)
			stats := newCmdStats(b, srv)
			b.ReportAllocs()
			cpu := newServerCPU(b, srv)
			b.RunParallel(func(pb *testing.PB) {
				s := newSession()
				key := fmt.Sprintf("%s:parallel:%d", d.name, ids.Add(1))
				for pb.Next() {
					if err := s.tryLock(ctx, key); err != nil {
						b.Errorf("lock %s: %v", key, err)
						return
					}
					if err := s.unlock(ctx); err != nil {
						b.Errorf("unlock %s: %v", key, err)
						return
					}
				}
			})
			cpu.report(b)
			stats.log(b)
		})
	}
}

// serverCPU measures the CPU time of redis-server main threads, which run
// every command and script, from /proc/PID/schedstat (nanoseconds), summed
// over one or more servers.
type serverCPU struct {
	paths []string
	start int64
}

func newServerCPU(b *testing.B, servers ...*redistest.Server) *serverCPU {
	c := &serverCPU{}
	for _, srv := range servers {
		c.paths = append(c.paths, fmt.Sprintf("/proc/%d/schedstat", srv.Pid()))
	}
	start, err := c.read()
	if err != nil {
		b.Logf("no server CPU metric: %v", err)
		return nil
	}
	c.start = start
	return c
}

func (c *serverCPU) read() (int64, error) {
	var sum int64
	for _, path := range c.paths {
		data, err := os.ReadFile(path)
		if err != nil {
			return 0, err
		}
		first, _, _ := strings.Cut(string(data), " ")
		n, err := strconv.ParseInt(first, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		sum += n
	}
	return sum, nil
}

// report adds srv-ns/op: server CPU since newServerCPU, per b.N.
func (c *serverCPU) report(b *testing.B) {
	if c == nil || b.N == 0 {
		return
	}
	end, err := c.read()
	if err != nil {
		b.Logf("no server CPU metric: %v", err)
		return
	}
	b.ReportMetric(float64(end-c.start)/float64(b.N), "srv-ns/op")
}
