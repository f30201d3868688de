package benchmarks

import (
	"context"
	"errors"
	"flag"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The contended loop of each waiter: acquire (waiting), hold, release, pause.
const (
	warmup  = 250 * time.Millisecond // not measured: dialing, script loading
	unlockT = 5 * time.Second        // bound of one release call
)

// A contention is what the waiters of a contended benchmark do.
type contention struct {
	waiters int           // waiters competing for the lock
	hold    time.Duration // inside the critical section
	pause   time.Duration // after a release, before the next acquire; 0: none
	procs   bool          // each waiter a process of its own (see contendProcs)
}

// contentionFlags is BenchmarkContended's contention: -waiters, -hold,
// -pause, -procs.
func contentionFlags() contention {
	return contention{waiters: *waiters, hold: *holdFor, pause: *pauseFor, procs: *procs}
}

// BenchmarkContended runs -waiters waiters, goroutines each with its own
// clients (as if each were a separate process; -shared gives them one;
// -procs makes them processes), that compete for one lock for a fixed
// duration: acquire with the implementation's waiting strategy, hold 1ms
// (-hold), release, pause 5ms (-pause), again. With 8 waiters the lock is
// nearly always wanted, so throughput is set by how quickly a release
// reaches the next waiter.
//
// It ignores b.N and runs once per implementation; "op" is one critical
// section, so ns/op, B/op and allocs/op are per critical section over the
// measured window, summed over all waiters. Custom metrics:
//
//	cs/s            critical sections entered per second
//	busy            fraction of the window someone was inside; cs/s ÷ busy
//	                is the ceiling a lock with instant hand-offs would reach
//	handoff-p50-ms  end of a critical section while another waiter was
//	handoff-p99-ms  waiting -> the next acquisition (the monotonic clock, or
//	                with -procs the wall clock; the time the lock sat unused
//	                while wanted)
//	wait-p50-ms     start of the acquire call -> lock obtained
//	wait-p99-ms
//	fairness        Jain's index over the waiters' critical-section counts
//	fails           acquisitions that gave up at -waitbound
//	overlaps        times two waiters were inside at once (must be 0)
func BenchmarkContended(b *testing.B) {
	contended(b, contentionFlags())
}

// BenchmarkContendedHandoff is BenchmarkContended in the hand-off-bound
// case: 8 waiters hold the lock 0.1ms (spinning: see holdLock) and try again
// at once after a release (no pause). The lock is always wanted, and the
// time between two critical sections is the hand-off: cs/s is about
// 1 ÷ (hold + mean hand-off), and the mean hand-off is (1 − busy) ÷ cs/s. A
// waiter that releases and tries again at once may win the lock back before
// the others hear of the release (pollers nearly always do: fairness shows
// it). The flags -waiters, -hold and -pause do not apply.
func BenchmarkContendedHandoff(b *testing.B) {
	contended(b, contention{waiters: 8, hold: 100 * time.Microsecond})
}

// BenchmarkContendedHandoff64 is BenchmarkContendedHandoff with 64 waiters:
// the hand-off when every release has 63 goroutines (each with its own
// clients, as if separate processes) waiting for it.
func BenchmarkContendedHandoff64(b *testing.B) {
	contended(b, contention{waiters: 64, hold: 100 * time.Microsecond})
}

// contended runs c against every implementation on one redis-server.
func contended(b *testing.B, c contention) {
	srv := startServer(b)
	for _, d := range selected(b, contendedDrivers) {
		b.Run(d.name, func(b *testing.B) {
			stats := newCmdStats(b, srv)
			w := waiterSpec{suite: "single", impl: d.name, addrs: []string{srv.Addr}}
			r := contend(b, w, d.name+":contended", measuredDuration(), c)
			stats.logPer(b, r.sections(), "critical sections (warm-up and wind-down included)")
			r.report(b)
		})
	}
}

// waiterSessions returns one session per waiter, each from an instance of
// its own made by open (its own clients, as if each waiter were a separate
// process), or all from one instance with -shared.
func waiterSessions(n int, open func() func() session) []session {
	sessions := make([]session, n)
	var newSession func() session
	for i := range sessions {
		if newSession == nil || !*shared {
			newSession = open()
		}
		sessions[i] = newSession()
	}
	return sessions
}

// measuredDuration is -contend, or -benchtime when that is a longer
// duration, so that the framework is satisfied by one run and does not call
// the benchmark again.
func measuredDuration() time.Duration {
	d := *contendFor
	if f := flag.Lookup("test.benchtime"); f != nil {
		if bt, err := time.ParseDuration(f.Value.String()); err == nil && bt > d {
			d = bt
		}
	}
	return d
}

// waiterLog is what one waiter saw inside the measured window. Only its
// waiter writes it, until the waiters have stopped.
type waiterLog struct {
	sections int
	fails    int
	held     time.Duration // inside the critical section
	waits    []time.Duration
	handoffs []time.Duration
	err      error // the first unexpected error; the waiter stopped on it
}

type contendResult struct {
	window     time.Duration
	logs       []waiterLog
	overlaps   int64
	allocs     uint64 // heap allocations in the window, all goroutines (of all waiters' processes)
	allocBytes uint64
}

// contend runs c.waiters waiters of w on key for warmup+window, each as c
// says, then stops them and waits for them (bounded by -waitbound plus a
// margin). The waiters are goroutines of this process, or with c.procs
// processes of their own (see contendProcs).
func contend(tb testing.TB, w waiterSpec, key string, window time.Duration, c contention) *contendResult {
	if c.procs {
		return contendProcs(tb, w, key, window, c)
	}
	sessions := waiterSessions(c.waiters, func() func() session { return w.open(tb) })
	var sb sharedBoard // in this process's memory
	sb.handoffFrom.Store(-1)
	base := time.Now()
	since := func() time.Duration { return time.Since(base) } // monotonic
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	logs := make([]waiterLog, len(sessions))
	var wg sync.WaitGroup
	for i, s := range sessions {
		wg.Go(func() { waitLoop(ctx, s, key, c, window, sb.board(), since, &logs[i]) })
	}

	r := &contendResult{window: window, logs: logs}
	r.allocs, r.allocBytes = windowAllocs(since, window)
	stop()

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(*waitBound + unlockT + 10*time.Second):
		tb.Fatalf("waiters did not stop within %v of the end of the run", *waitBound+unlockT+10*time.Second)
	}
	r.overlaps = sb.overlaps.Load()
	for i, l := range logs {
		if l.err != nil {
			tb.Fatalf("waiter %d: %v", i, l.err)
		}
	}
	return r
}

// windowAllocs sleeps until the end of the measured window, by since (the
// run's clock), and returns this process's heap allocations and bytes
// allocated within it.
func windowAllocs(since func() time.Duration, window time.Duration) (allocs, bytes uint64) {
	var m0, m1 runtime.MemStats
	time.Sleep(warmup - since())
	runtime.ReadMemStats(&m0)
	time.Sleep(warmup + window - since())
	runtime.ReadMemStats(&m1)
	return m1.Mallocs - m0.Mallocs, m1.TotalAlloc - m0.TotalAlloc
}

// A board is what the waiters of a run share: in this process's memory, or
// with -procs in memory shared by the waiters' processes.
type board struct {
	inside  *atomic.Int32 // waiters inside the critical section
	waiting *atomic.Int32 // waiters inside lock
	// overlaps counts the times a waiter entered the critical section with
	// another inside.
	overlaps *atomic.Int64
	// handoffFrom is since() when the last holder left the critical
	// section while another waiter was waiting, in ns; -1 when nobody was
	// waiting then.
	handoffFrom *atomic.Int64
}

// waitLoop is one waiter of a contended run: acquire, hold, release, pause,
// until ctx ends. It records in l what it saw between warmup and
// warmup+window, by since (the run's clock: the time since its start).
func waitLoop(ctx context.Context, s session, key string, c contention, window time.Duration, bd *board, since func() time.Duration, l *waiterLog) {
	winStart, winEnd := warmup, warmup+window
	capHint := int(window/time.Millisecond)/max(c.waiters, 1) + 64
	l.waits = make([]time.Duration, 0, capHint)
	l.handoffs = make([]time.Duration, 0, capHint)
	var pauseT *time.Timer
	if c.pause > 0 {
		pauseT = time.NewTimer(0)
		defer pauseT.Stop()
	}
	for ctx.Err() == nil {
		t0 := since()
		bd.waiting.Add(1)
		err := s.lock(ctx, key, *waitBound)
		bd.waiting.Add(-1)
		t1 := since()
		inWindow := t1 >= winStart && t1 < winEnd
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return
		case errors.Is(err, errTimeout):
			if inWindow {
				l.fails++
			}
			continue
		default:
			l.err = err
			return
		}

		if bd.inside.Add(1) != 1 {
			bd.overlaps.Add(1)
		}
		if inWindow {
			l.sections++
			l.waits = append(l.waits, t1-t0)
			if from := bd.handoffFrom.Load(); from >= 0 {
				l.handoffs = append(l.handoffs, t1-time.Duration(from))
			}
		}
		holdLock(c.hold)
		bd.inside.Add(-1)
		left := since()
		if inWindow {
			l.held += left - t1
		}
		if bd.waiting.Load() > 0 {
			bd.handoffFrom.Store(int64(left))
		} else {
			bd.handoffFrom.Store(-1)
		}

		uctx, cancel := context.WithTimeout(context.Background(), unlockT)
		err = s.unlock(uctx)
		cancel()
		if err != nil {
			l.err = err
			return
		}
		if pauseT != nil {
			pauseT.Reset(c.pause)
			select {
			case <-ctx.Done():
			case <-pauseT.C:
			}
		}
	}
}

// sections is the number of critical sections in the measured window.
func (r *contendResult) sections() int {
	n := 0
	for _, l := range r.logs {
		n += l.sections
	}
	return n
}

func (r *contendResult) report(b *testing.B) {
	var (
		sections, fails int
		held            time.Duration
		counts          = make([]float64, len(r.logs))
		waits, handoffs []time.Duration
	)
	for i, l := range r.logs {
		sections += l.sections
		fails += l.fails
		held += l.held
		counts[i] = float64(l.sections)
		waits = append(waits, l.waits...)
		handoffs = append(handoffs, l.handoffs...)
	}
	b.ReportAllocs()
	if sections > 0 {
		b.ReportMetric(float64(r.window.Nanoseconds())/float64(sections), "ns/op")
		b.ReportMetric(float64(r.allocs)/float64(sections), "allocs/op")
		b.ReportMetric(float64(r.allocBytes)/float64(sections), "B/op")
	}
	b.ReportMetric(float64(sections)/r.window.Seconds(), "cs/s")
	b.ReportMetric(held.Seconds()/r.window.Seconds(), "busy")
	b.ReportMetric(ms(percentile(handoffs, 50)), "handoff-p50-ms")
	b.ReportMetric(ms(percentile(handoffs, 99)), "handoff-p99-ms")
	b.ReportMetric(ms(percentile(waits, 50)), "wait-p50-ms")
	b.ReportMetric(ms(percentile(waits, 99)), "wait-p99-ms")
	b.ReportMetric(jain(counts), "fairness")
	b.ReportMetric(float64(fails), "fails")
	b.ReportMetric(float64(r.overlaps), "overlaps")
	if r.overlaps != 0 {
		b.Fatalf("%d times two waiters were inside the critical section at once", r.overlaps)
	}
	if sections == 0 {
		b.Fatalf("no critical section in %v", r.window)
	}
}

// holdLock spends d inside the critical section: asleep from 1ms up, and
// spinning (yielding to the process's other goroutines) below. Go's timers
// end a sleep no sooner than about 1ms after it began when the process has
// nothing else to do (the netpoller waits in milliseconds: time.Sleep(100µs)
// measured 1.08ms on this VM), so a short hold slept would last from 0.1 to
// 1ms depending on how busy the implementation keeps the process.
func holdLock(d time.Duration) {
	if d >= time.Millisecond {
		time.Sleep(d)
		return
	}
	for start := time.Now(); time.Since(start) < d; {
		runtime.Gosched()
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// percentile returns the p-th percentile of ds (nearest rank), or 0 for
// none. It sorts ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	rank := int(p/100*float64(len(ds))+0.999999999) - 1 // ceil(p/100*n) - 1
	return ds[min(max(rank, 0), len(ds)-1)]
}

// jain returns Jain's fairness index (Σx)² / (n·Σx²) of xs: 1 when all are
// equal, 1/n when one has everything. It is 0 for none or all zero.
func jain(xs []float64) float64 {
	var sum, sumSq float64
	for _, x := range xs {
		sum += x
		sumSq += x * x
	}
	if sumSq == 0 {
		return 0
	}
	return sum * sum / (float64(len(xs)) * sumSq)
}
