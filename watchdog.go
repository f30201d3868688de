package fencelock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fencelock/fencelock/internal/backoff"
	"github.com/fencelock/fencelock/internal/store"
)

// A watchdog is the renewal goroutine of one lease ("Deadlines and the
// watchdog"): it renews the lease every RenewInterval, and loses it when its
// deadline passes without a renewal, or Redis says it is not held. Its owner
// is the lease: started once by KeepAlive, stopped by Release (close stop,
// wait for done). Each renewal runs on a goroutine of its own, so that the
// deadline fires on time while a call hangs.
type watchdog struct {
	l     *Lease
	stop  chan struct{} // closed to ask the goroutine to exit
	done  chan struct{} // closed by the goroutine when it has exited
	moved chan struct{} // buffered; Extend moved the deadline or found the lock not held

	renew, deadline *time.Timer // these, only run's goroutine touches
	results         chan error  // the renewal in flight's outcome
	inFlight        bool
	failing         bool // the last renewal failed: renew holds its retry
	cancel          context.CancelFunc
	lastErr         error
	retry           backoff.Backoff
}

func newWatchdog(l *Lease) *watchdog {
	return &watchdog{l: l, stop: make(chan struct{}), done: make(chan struct{}), moved: make(chan struct{}, 1),
		results: make(chan error, 1), cancel: func() {}}
}

// run is the watchdog goroutine: one method per event, each reporting
// whether the watchdog is done.
func (wd *watchdog) run() {
	defer close(wd.done)
	clock := wd.l.locker.clock
	renewIn, remaining := wd.l.nextRenewal()
	wd.renew, wd.deadline = clock.NewTimer(renewIn), clock.NewTimer(remaining)
	defer wd.renew.Stop()
	defer wd.deadline.Stop()
	defer func() { wd.cancel() }()
	for done := false; !done; {
		select {
		case <-wd.stop:
			return
		case <-wd.deadline.C:
			done = wd.deadlineFired()
		case <-wd.moved:
			done = wd.extended()
		case <-wd.renew.C:
			done = wd.renewDue()
		case err := <-wd.results:
			done = wd.renewed(err)
		}
	}
}

// deadlineFired loses the lease, unless an Extend moved its deadline.
func (wd *watchdog) deadlineFired() bool {
	l := wd.l
	if remaining := l.Deadline().Sub(l.locker.clock.Now()); remaining > 0 {
		wd.deadline.Reset(remaining)
		return false
	}
	l.lose(deadlinePassed(wd.lastErr))
	return true
}

// extended handles an Extend, which moved the deadline (perhaps earlier)
// or found the lock not held.
func (wd *watchdog) extended() bool {
	l := wd.l
	l.mu.Lock()
	notHeld := l.done
	l.mu.Unlock()
	if notHeld != nil {
		l.lose(lostBecause(notHeld))
		return true
	}
	renewIn, remaining := l.nextRenewal()
	if remaining <= 0 {
		l.lose(deadlinePassed(wd.lastErr))
		return true
	}
	wd.deadline.Reset(remaining)
	if !wd.inFlight && !wd.failing {
		wd.renew.Reset(renewIn)
	}
	return false
}

// renewDue sends a renewal, bounded by the time left before the deadline,
// unless one is in flight or MaxHold has passed.
func (wd *watchdog) renewDue() bool {
	l := wd.l
	o := &l.locker.opts
	if wd.inFlight {
		return false // its result reschedules
	}
	if o.MaxHold > 0 && l.locker.clock.Now().Sub(l.acquired) >= o.MaxHold {
		wd.lastErr = fmt.Errorf("%w %v, no longer renewed", errMaxHold, o.MaxHold)
		return false // the deadline timer ends it
	}
	remaining := l.Deadline().Sub(l.locker.clock.Now()) // the context's timer is on the system clock
	if remaining <= 0 {
		l.lose(deadlinePassed(wd.lastErr))
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), remaining)
	wd.cancel, wd.inFlight = cancel, true
	l.locker.bg.Add()
	go func() {
		defer l.locker.bg.Done()
		wd.results <- l.extend(ctx, 0, true, new(extendState))
	}()
	return false
}

// renewed handles a renewal's outcome: it schedules the next, loses the
// lease that is not held, or retries a failure with a backoff.
func (wd *watchdog) renewed(err error) bool {
	l := wd.l
	wd.inFlight = false
	wd.cancel()
	if obs := l.locker.opts.Observer; obs != nil && !(errors.Is(err, ErrNotHeld) && l.isReleasing()) {
		obs.Notify(l.observed(), Event{Op: OpRenew, Name: l.name, Lease: l, Outcome: OutcomeOf(err), Err: err, Fence: l.fence})
	}
	switch {
	case err == nil:
		wd.lastErr, wd.failing = nil, false
		wd.retry = backoff.Backoff{}
		renewIn, remaining := l.nextRenewal()
		wd.renew.Reset(renewIn)
		wd.deadline.Reset(remaining)
		return false
	case errors.Is(err, ErrNotHeld):
		if l.isReleasing() {
			return true // Release is stopping the watchdog
		}
		l.lose(lostBecause(err))
		return true
	}
	if classify(err) == store.NoVerdict {
		err = fmt.Errorf("%w: no reply before the deadline", ErrUnavailable)
	}
	wd.lastErr, wd.failing = err, true
	if wd.retry.Min == 0 {
		interval := l.locker.opts.renewInterval(l.currentTTL())
		wd.retry = backoff.Backoff{Min: max(interval/16, time.Millisecond), Max: max(interval/2, time.Millisecond)}
	}
	pause := wd.retry.Next()
	remaining := l.Deadline().Sub(l.locker.clock.Now())
	l.locker.opts.Logger.LogAttrs(context.Background(), slog.LevelWarn, "fencelock: renewal failed",
		slog.String("lock", l.name), slog.Int64("fence", l.fence), slog.Duration("until_deadline", remaining),
		slog.Duration("retry_in", pause), slog.Any("error", err))
	wd.renew.Reset(pause)
	wd.deadline.Reset(remaining) // an unknown outcome may have moved it earlier
	return false
}
