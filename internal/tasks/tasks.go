// Package tasks owns the goroutines that outlive the call that started them:
// a call cut short by its caller's deadline (Call: every call returns by its
// deadline whatever the Redis client's options), and the clean-ups that go on
// in the background (Go, GiveBack). Close stops them and waits for them all.
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
	clock   Clock
	timeout time.Duration // bounds each try of GiveBack
	log     *slog.Logger
	final   func(error) bool // true for an error that ends GiveBack's tries

	mu     sync.Mutex
	n      int           // guarded by mu; goroutines running
	idle   chan struct{} // guarded by mu; closed when n drops to 0 while Close waits
	closed bool          // guarded by mu
	stop   chan struct{} // closed by Close: clean-ups stop retrying, workers exit
	jobs   chan job      // idle workers receive on it
	idlers atomic.Int32  // workers waiting for work
}

// New returns a Group on clock whose give-backs try each for timeout at
// most, log to log, and stop at an error final reports true for.
func New(clock Clock, timeout time.Duration, log *slog.Logger, final func(error) bool) *Group {
	return &Group{clock: clock, timeout: timeout, log: log, final: final,
		stop: make(chan struct{}), jobs: make(chan job)}
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
	defer g.mu.Unlock()
	if g.n--; g.n == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// Go runs f on a tracked goroutine; stop is closed by Close.
func (g *Group) Go(f func(stop <-chan struct{})) {
	g.Add()
	go func() {
		defer g.Done()
		f(g.stop)
	}()
}

// Close stops the clean-ups' retries and waits, until by at most, for every
// tracked goroutine to end: one still running then ends with its Redis call.
func (g *Group) Close(by time.Time) {
	g.mu.Lock()
	if !g.closed {
		g.closed = true
		close(g.stop)
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
	waitAtMost(g.clock, idle, by.Sub(g.clock.Now()))
}

// waitAtMost waits until done is closed, or for d on clock at most.
func waitAtMost(clock Clock, done <-chan struct{}, d time.Duration) {
	t := clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// GiveBack retries try, which gives the lock name back, on a tracked goroutine
// until it succeeds, fails with an error final reports true for, Close is
// called, or until has passed (the lock has expired); each try is bounded by
// the Group's timeout and the outcome is logged as what ("release", ...).
func (g *Group) GiveBack(what, name string, until time.Duration, try func(ctx context.Context) (deleted bool, err error)) {
	bg := context.Background()
	log := func(level slog.Level, msg string, attrs ...slog.Attr) {
		g.log.LogAttrs(bg, level, "fencelock: "+what+msg, append([]slog.Attr{slog.String("lock", name)}, attrs...)...)
	}
	g.Go(func(stop <-chan struct{}) {
		end := g.clock.Now().Add(max(until, g.timeout))
		bo := backoff.Backoff{Min: 10 * time.Millisecond, Max: time.Second}
		for tries := 1; ; tries++ {
			ctx, cancel := context.WithTimeout(bg, g.timeout)
			deleted, err := try(ctx)
			cancel()
			switch {
			case err == nil:
				log(slog.LevelDebug, " done in the background", slog.Bool("lock_deleted", deleted), slog.Int("tries", tries))
				return
			case g.final(err) || !g.clock.Now().Before(end):
				log(slog.LevelWarn, " failed in the background, the lock expires after its TTL", slog.Int("tries", tries), slog.Any("error", err))
				return
			case tries == 1:
				log(slog.LevelDebug, " goes on in the background", slog.Any("error", err))
			}
			t := g.clock.NewTimer(bo.Next())
			select {
			case <-stop:
				t.Stop()
				log(slog.LevelWarn, " stopped by Close, the lock expires after its TTL", slog.Int("tries", tries), slog.Any("error", err))
				return
			case <-t.C:
			}
		}
	})
}
