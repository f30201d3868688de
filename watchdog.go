package fencelock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// RunWithLock acquires the lock called name, runs work while a watchdog
// renews the lease every RenewInterval (default TTL/3), then releases it.
// Without WithWait it tries once.
//
// work's context is derived from ctx and is cancelled with cause ErrLost
// (see context.Cause) as soon as the lease is no longer certainly held: the
// lock was taken over or deleted, or Redis could not renew it before the
// lease's local Deadline, which comes before the server could grant the lock
// to anyone else. Pass lease.Fence() to the resource the work writes.
//
// RunWithLock returns
//
//   - ErrNotObtained when the lock is busy; work did not run;
//   - ErrUnavailable when Redis could not be reached at acquisition; work did
//     not run (unless Options.FailOpen, when work runs on a degraded lease
//     and its error is returned);
//   - ErrInvalid for a nil work or a bad argument; work did not run;
//   - otherwise work's error, joined with an error matching ErrLost whenever
//     the lease was lost while work ran or was found not held when released,
//     even if work returned nil: mutual exclusion may have been broken.
//
// If work calls lease.Release itself, RunWithLock returns work's error (joined
// with ErrLost only if the lease was lost before that). Otherwise the lock is
// released on a context that is not cancelled with ctx and is bounded by
// Options.ReleaseTimeout, also when work panics (the panic then
// continues) or calls runtime.Goexit. A release that fails because Redis is
// unreachable is logged at Warn level and not returned: the work's outcome
// stands, and the lock expires after its TTL.
func (l *Locker) RunWithLock(ctx context.Context, name string,
	work func(ctx context.Context, lease *Lease) error, opts ...Option) error {
	if work == nil {
		return invalidf("nil work function")
	}
	lease, err := l.Acquire(ctx, name, opts...)
	if err != nil {
		if !l.opts.FailOpen || !errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
			return err
		}
		l.opts.Logger.LogAttrs(ctx, slog.LevelError, "fencelock: redis unavailable, running without the lock (fail-open)",
			slog.String("lock", name), slog.Any("error", err))
		lease := &Lease{locker: l, name: name, degraded: true}
		lease.keys[0], lease.keys[1] = l.keys(name)
		return work(ctx, lease)
	}

	workCtx := lease.KeepAlive(ctx)
	returned := false
	defer func() {
		if !returned { // work panicked or called runtime.Goexit
			_ = lease.Release(ctx)
		}
	}()
	werr := work(workCtx, lease)
	returned = true
	lease.mu.Lock()
	releasedByWork := lease.releasing
	lease.mu.Unlock()
	// The deadline may pass as work returns, before the watchdog's timer
	// has been handled: that counts as lost too.
	overdue := !releasedByWork && !l.clock.Now().Before(lease.Deadline())

	rerr := lease.Release(ctx)
	lost := lease.lostCause()
	switch {
	case lost != nil:
		return errors.Join(werr, lost)
	case releasedByWork:
		return werr
	case overdue:
		return errors.Join(werr, fmt.Errorf("%w: deadline passed before the work returned", ErrLost))
	case errors.Is(rerr, ErrNotHeld):
		return errors.Join(werr, fmt.Errorf("%w: not held when released after the work", ErrLost))
	case rerr != nil:
		l.opts.Logger.LogAttrs(ctx, slog.LevelWarn, "fencelock: release failed, the lock expires after its TTL",
			slog.String("lock", name), slog.Int64("fence", lease.fence), slog.Any("error", rerr))
	}
	return werr
}

// KeepAlive starts the lease's watchdog, if it is not running yet, and returns
// a context derived from ctx that is cancelled with cause ErrLost when the
// lease is lost: the watchdog renews the lock every Options.RenewInterval
// (default TTL/3) and cancels the context when a renewal finds the lock taken
// over or deleted, or when the lease's Deadline passes before a renewal
// succeeded (a local timer: a hung Redis call does not delay it). Failed
// renewals are retried with a short, capped, jittered backoff.
//
// The watchdog follows the caller's own Extend calls: it moves its deadline
// timer with them, and cancels the context at once when one finds the lock no
// longer held.
//
// The watchdog runs until Release, which cancels the returned context (with a
// cause matching ErrNotHeld), stops the watchdog and waits for it to exit.
// Cancelling ctx cancels the returned context but does not stop the watchdog:
// the lock stays held until Release. Call Release exactly when the work is
// done, also on error paths (defer it).
//
// On a lease that is already lost, released or found not held, KeepAlive
// returns a context that is already cancelled with the cause.
func (l *Lease) KeepAlive(ctx context.Context) context.Context {
	workCtx, cancel := context.WithCancelCause(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.lost != nil:
		cancel(l.lost)
		return workCtx
	case l.done || l.releasing:
		cancel(errReleased)
		return workCtx
	}
	l.cancels = append(l.cancels, cancel)
	if l.wd == nil && !l.degraded {
		l.wd = &watchdog{stop: make(chan struct{}), done: make(chan struct{}), moved: make(chan struct{}, 1)}
		go l.watch(l.wd)
	}
	return workCtx
}

// A watchdog is the renewal goroutine of one lease. Its only owner is the
// lease: started once by KeepAlive, stopped by Release (close stop, wait for
// done).
type watchdog struct {
	stop  chan struct{} // closed to ask the goroutine to exit
	done  chan struct{} // closed by the goroutine when it has exited
	moved chan struct{} // buffered; Extend moved the deadline or found the lock not held
}

// stopWatchdog stops the watchdog, if any, and waits for it to exit. It is
// safe to call more than once and concurrently.
func (l *Lease) stopWatchdog() {
	l.mu.Lock()
	wd := l.wd
	if wd != nil {
		select {
		case <-wd.stop:
		default:
			close(wd.stop)
		}
	}
	l.mu.Unlock()
	if wd != nil {
		<-wd.done
	}
}

// cancelContexts cancels the contexts KeepAlive returned.
func (l *Lease) cancelContexts(cause error) {
	l.mu.Lock()
	cancels := l.cancels
	l.cancels = nil
	l.mu.Unlock()
	for _, cancel := range cancels {
		cancel(cause)
	}
}

func (l *Lease) lostCause() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// lose records that the lease is lost, cancels the work contexts with cause,
// logs it and calls OnLost.
func (l *Lease) lose(cause error) {
	l.mu.Lock()
	if l.lost != nil {
		l.mu.Unlock()
		return
	}
	l.lost = cause
	deadline := l.deadline
	l.mu.Unlock()
	l.cancelContexts(cause)

	now := l.locker.clock.Now()
	l.locker.opts.Logger.LogAttrs(context.Background(), slog.LevelError, "fencelock: lease lost",
		slog.String("lock", l.name), slog.Int64("fence", l.fence),
		slog.Duration("held", now.Sub(l.acquired)), slog.Duration("before_deadline", deadline.Sub(now)),
		slog.Any("cause", cause))
	if f := l.locker.opts.OnLost; f != nil {
		f(l, cause)
	}
}

// watch is the watchdog goroutine. It renews the lease every interval; one
// renewal call at a time runs on a helper goroutine that watch waits for
// before it exits, so that the local deadline timer fires on time even while
// a call hangs.
func (l *Lease) watch(wd *watchdog) {
	defer close(wd.done)

	l.mu.Lock()
	ttl := l.ttl
	l.mu.Unlock()
	o := &l.locker.opts
	interval := o.renewInterval(ttl)
	retry := backoff{min: max(interval/16, time.Millisecond), max: max(interval/2, time.Millisecond)}

	renewTimer := l.locker.clock.NewTimer(interval)
	defer renewTimer.Stop()
	deadlineTimer := l.locker.clock.NewTimer(l.Deadline().Sub(l.locker.clock.Now()))
	defer deadlineTimer.Stop()

	var (
		results     = make(chan error, 1)
		inFlight    bool
		cancelRenew context.CancelFunc = func() {}
		renewStart  time.Time          // when the renewal in flight, or the last one, was sent
		lastErr     error
	)
	defer func() {
		cancelRenew()
		if inFlight {
			<-results
		}
	}()

	for {
		select {
		case <-wd.stop:
			return

		case <-deadlineTimer.C:
			remaining := l.Deadline().Sub(l.locker.clock.Now())
			if remaining > 0 { // moved by an Extend since the timer was set
				deadlineTimer.Reset(remaining)
				continue
			}
			l.lose(deadlinePassed(lastErr))
			return

		case <-wd.moved:
			// A user's Extend moved the deadline (perhaps earlier) or
			// found the lock not held.
			if l.isDone() {
				l.lose(fmt.Errorf("%w: taken over or deleted", ErrLost))
				return
			}
			remaining := l.Deadline().Sub(l.locker.clock.Now())
			if remaining <= 0 {
				l.lose(deadlinePassed(lastErr))
				return
			}
			deadlineTimer.Reset(remaining)
			if !inFlight {
				l.mu.Lock()
				interval = o.renewInterval(l.ttl) // the TTL may have changed
				l.mu.Unlock()
				renewTimer.Reset(min(interval, remaining/3))
			}

		case <-renewTimer.C:
			if inFlight {
				continue // the reply reschedules
			}
			if o.MaxHold > 0 && l.locker.clock.Now().Sub(l.acquired) >= o.MaxHold {
				lastErr = fmt.Errorf("held for MaxHold %v, no longer renewed", o.MaxHold)
				continue // the deadline timer ends it
			}
			l.mu.Lock()
			ttl := l.ttl // as last extended, by the watchdog or the user
			l.mu.Unlock()
			// The deadline is on the lease's clock; the context's timer
			// runs on the system clock, so hand it the time that is left.
			renewStart = l.locker.clock.Now()
			remaining := l.Deadline().Sub(renewStart)
			if remaining <= 0 {
				l.lose(deadlinePassed(lastErr))
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), remaining)
			cancelRenew = cancel
			inFlight = true
			go func() { results <- l.extend(ctx, ttl, true) }()

		case err := <-results:
			inFlight = false
			cancelRenew()
			switch {
			case err == nil:
				lastErr = nil
				retry = backoff{min: retry.min, max: retry.max}
				// Every interval from the previous renewal's start, so a
				// slow round trip does not stretch the period.
				renewTimer.Reset(max(interval-l.locker.clock.Now().Sub(renewStart), 0))
				deadlineTimer.Reset(l.Deadline().Sub(l.locker.clock.Now()))
			case errors.Is(err, ErrNotHeld):
				l.lose(fmt.Errorf("%w: taken over or deleted", ErrLost))
				return
			default:
				lastErr = err
				pause := retry.next()
				l.locker.opts.Logger.LogAttrs(context.Background(), slog.LevelWarn, "fencelock: renewal failed",
					slog.String("lock", l.name), slog.Int64("fence", l.fence),
					slog.Duration("until_deadline", l.Deadline().Sub(l.locker.clock.Now())),
					slog.Duration("retry_in", pause), slog.Any("error", err))
				renewTimer.Reset(pause)
			}
		}
	}
}

// deadlinePassed is the cause of a lease lost at its local deadline, wrapping
// the last renewal error if there was one.
func deadlinePassed(lastErr error) error {
	if lastErr != nil {
		return fmt.Errorf("%w: deadline passed before a renewal succeeded: %w", ErrLost, lastErr)
	}
	return fmt.Errorf("%w: deadline passed before a renewal succeeded", ErrLost)
}
