// Package tasks owns the goroutines that outlive the call that started
// them: a call cut short by its caller's deadline (Call), and the clean-ups
// that go on in the background (Go, GiveBack). Close stops the clean-ups
// and waits for all of them.
package tasks

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/internal/backoff"
)

// Clock is a source of local time, as fencelock.Options.Clock.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) *time.Timer
}

// A Group tracks the goroutines of one Locker. Make it with New.
type Group struct {
	clock Clock
	// For GiveBack: each try's bound, the log, and the errors that end
	// the tries.
	timeout time.Duration
	log     *slog.Logger
	final   func(error) bool

	mu     sync.Mutex
	n      int           // guarded by mu; goroutines running
	idle   chan struct{} // guarded by mu; closed when n drops to 0 while Close waits
	stop   chan struct{} // guarded by mu; closed by Close: clean-ups stop retrying, workers exit
	closed bool          // guarded by mu
	// jobs never changes: the workers that wait for work receive on it
	// (see run).
	jobs   chan job
	idlers atomic.Int32 // workers waiting for work
}

// New returns a Group on clock whose give-backs try each for timeout at
// most, log to log, and stop at an error final reports true for.
func New(clock Clock, timeout time.Duration, log *slog.Logger, final func(error) bool) *Group {
	return &Group{clock: clock, timeout: timeout, log: log, final: final, jobs: make(chan job)}
}

// Add counts a call that Close waits for, until Done.
func (g *Group) Add() {
	g.mu.Lock()
	g.n++
	g.mu.Unlock()
}

// Done ends what Add counted.
func (g *Group) Done() {
	g.mu.Lock()
	g.n--
	if g.n == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
	g.mu.Unlock()
}

// Go runs f on a tracked goroutine; stop is closed by Close.
func (g *Group) Go(f func(stop <-chan struct{})) {
	g.mu.Lock()
	g.n++
	stop := g.stopLocked()
	g.mu.Unlock()
	go func() {
		defer g.Done()
		f(stop)
	}()
}

// stopLocked returns the channel that Close closes, making it if needed.
func (g *Group) stopLocked() chan struct{} {
	if g.stop == nil {
		g.stop = make(chan struct{})
		if g.closed {
			close(g.stop)
		}
	}
	return g.stop
}

// Close tells the clean-ups to stop retrying and waits until no tracked
// goroutine is running, until by at most: a goroutine still running then
// is in a Redis call that the client has not given up on, and ends with it.
func (g *Group) Close(by time.Time) {
	g.mu.Lock()
	if !g.closed {
		g.closed = true
		if g.stop != nil {
			close(g.stop)
		}
	}
	if g.n == 0 {
		g.mu.Unlock()
		return
	}
	if g.idle == nil {
		g.idle = make(chan struct{})
	}
	idle := g.idle
	g.mu.Unlock()
	WaitUntil(g.clock, idle, by)
}

// WaitUntil waits until done is closed, or until by on clock at most.
func WaitUntil(clock Clock, done <-chan struct{}, by time.Time) {
	t := clock.NewTimer(by.Sub(clock.Now()))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// GiveBack runs try, which gives a lock back, on a tracked goroutine until
// it succeeds, fails with an error final reports true for, Close is called,
// or until has passed since it started (by then the lock has expired by
// itself). Each try is bounded by the Group's timeout; the outcome is
// logged, what naming it ("release", ...) and name the lock.
func (g *Group) GiveBack(what, name string, until time.Duration, try func(ctx context.Context) (deleted bool, err error)) {
	bg := context.Background()
	g.Go(func(stop <-chan struct{}) {
		end := g.clock.Now().Add(max(until, g.timeout))
		bo := backoff.Backoff{Min: 10 * time.Millisecond, Max: time.Second}
		for tries := 1; ; tries++ {
			ctx, cancel := context.WithTimeout(bg, g.timeout)
			deleted, err := try(ctx)
			cancel()
			if err == nil {
				g.log.LogAttrs(bg, slog.LevelDebug, "fencelock: "+what+" done in the background",
					slog.String("lock", name), slog.Bool("lock_deleted", deleted), slog.Int("tries", tries))
				return
			}
			if g.final(err) || !g.clock.Now().Before(end) {
				g.log.LogAttrs(bg, slog.LevelWarn, "fencelock: "+what+" failed in the background, the lock expires after its TTL",
					slog.String("lock", name), slog.Int("tries", tries), slog.Any("error", err))
				return
			}
			if tries == 1 {
				g.log.LogAttrs(bg, slog.LevelDebug, "fencelock: "+what+" goes on in the background",
					slog.String("lock", name), slog.Any("error", err))
			}
			t := g.clock.NewTimer(bo.Next())
			select {
			case <-stop:
				t.Stop()
				g.log.LogAttrs(bg, slog.LevelWarn, "fencelock: "+what+" stopped by Close, the lock expires after its TTL",
					slog.String("lock", name), slog.Int("tries", tries), slog.Any("error", err))
				return
			case <-t.C:
			}
		}
	})
}
