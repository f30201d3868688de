package benchmarks

import (
	"context"
	"flag"
	"fmt"
	"os"
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
	waitBound = flag.Duration("waitbound", 5*time.Second,
		"longest one acquisition in BenchmarkContended may wait before it counts as a fail")
	parallelism = flag.Int("parallelism", 8,
		"BenchmarkParallel runs parallelism*GOMAXPROCS goroutines")
)

// BenchmarkUncontended takes and releases one lock, which nobody else wants,
// in a loop: the latency and allocations of the acquire and release calls.
// srv-ns/op is the redis-server main thread's CPU time per acquire+release.
func BenchmarkUncontended(b *testing.B) {
	srv := redistest.Start(b)
	for _, d := range drivers {
		newSession := d.open(b, srv.Addr)
		b.Run(d.name, func(b *testing.B) {
			uncontended(b, newSession(), d.name+":uncontended", srv)
		})
	}
}

// uncontended takes and releases key with s in a loop and reports
// srv-ns/op: the CPU time of the servers' main threads, summed, per
// acquire+release.
func uncontended(b *testing.B, s session, key string, servers ...*redistest.Server) {
	ctx := context.Background()
	cycle := func() {
		if err := s.tryLock(ctx, key); err != nil {
			b.Fatalf("lock: %v", err)
		}
		if err := s.unlock(ctx); err != nil {
			b.Fatalf("unlock: %v", err)
		}
	}
	cycle() // dial, load the scripts
	b.ReportAllocs()
	cpu := newServerCPU(b, servers...)
	for b.Loop() {
		cycle()
	}
	cpu.report(b)
}

// BenchmarkParallel takes and releases locks from parallelism*GOMAXPROCS
// goroutines at once, each on its own key, sharing one instance of the
// implementation (one process serving many requests).
func BenchmarkParallel(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	for _, d := range drivers {
		newSession := d.open(b, srv.Addr)
		b.Run(d.name, func(b *testing.B) {
			var ids atomic.Int64
			b.SetParallelism(*parallelism)
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
