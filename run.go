package fencelock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
)

// RunWithLock acquires the lock called name as Acquire does, runs work under
// the lease's watchdog, its ctx cancelled with cause ErrLost if the lease is
// lost, and releases it when work returns, panics or calls runtime.Goexit. It
// returns Acquire's error without running work, unless it failed open;
// ErrInvalid for a nil work; else work's error, joined with one matching
// ErrLost if the lease was lost while work ran or found not held at release
// (also when work returned nil; if ctx ended before the release answered,
// the release goes on in the background, and only OnLost, the Logger and
// the Observer hear of such a loss). Pass lease.Fence() to what work
// writes: only the resource's check of it protects the data once a lease is
// lost.
func (l *Locker) RunWithLock(ctx context.Context, name string,
	work func(ctx context.Context, lease *Lease) error, opts ...Option) error {
	if err := l.usable(); err != nil {
		return err
	}
	if work == nil {
		return invalidf("nil work function")
	}
	if l.opts.Observer == nil { // without observeRun's closures
		return l.run(ctx, name, work, opts)
	}
	return l.observeRun(ctx, name, func(ctx context.Context, lease **Lease) error {
		return l.run(ctx, name, func(ctx context.Context, got *Lease) error {
			*lease = got
			return work(ctx, got)
		}, opts)
	})
}

// run is RunWithLock, without the Observer's Start and End.
func (l *Locker) run(ctx context.Context, name string,
	work func(ctx context.Context, lease *Lease) error, opts []Option) error {
	co, err := l.callOptions(name, opts)
	if err != nil {
		return err
	}
	open := co.opens(l.opts.FailOpen)
	lease, err := l.acquireObserved(ctx, name, co, open)
	if lease != nil && l.opts.Observer != nil {
		lease.obsCtx = ctx // the run's: renewals and a loss are its events
	}
	if err != nil {
		if !open || !outage(ctx, err) {
			return err
		}
		return work(ctx, l.degraded(ctx, name, co, err))
	}

	workCtx := lease.keepAlive(ctx, true) // renewed until work returns, also after ctx ended
	returned := false
	defer func() {
		if !returned { // work panicked or called runtime.Goexit
			_ = lease.Release(ctx)
		}
	}()
	werr := work(workCtx, lease)
	returned = true
	if lost := l.settle(ctx, lease); lost != nil {
		return joinErr(werr, lost)
	}
	return werr
}

// settle releases a lease whose work has returned (in the background once
// lost) and returns the loss, matching ErrLost, found while the work ran or
// by the release, or nil. A release that goes on in the background reports
// its loss from there; after the work released the lease, only a loss
// before counts.
func (l *Locker) settle(ctx context.Context, lease *Lease) error {
	byWork := lease.isReleasing()
	if lost := l.lostByNow(lease, byWork); lost != nil {
		return lost
	}
	rerr := lease.releaseAfter(ctx, func(rerr error) { l.lateLoss(lease, byWork, rerr) })
	return l.settled(ctx, lease, byWork, rerr)
}

// lostByNow returns the loss found before the release (the watchdog's, or
// a deadline that passed as the work returned), giving a lost lease the
// work did not release (byWork) back in the background.
func (l *Locker) lostByNow(lease *Lease, byWork bool) error {
	lost := lease.lostCause()
	if lost == nil && !byWork && !l.clock.Now().Before(lease.Deadline()) {
		// before the watchdog's timer was handled: lost too
		lease.lose(fmt.Errorf("%w: deadline passed before the work returned", ErrLost))
		lost = lease.lostCause()
	}
	if lost != nil && !byWork {
		lease.endWork() // the watchdog has reported it; the release goes on without the caller
		l.releaseInBackground(lease)
	}
	return lost
}

// lateLoss reports a loss the release after the work found in the
// background, unless the work released the lease or the watchdog reported it.
func (l *Locker) lateLoss(lease *Lease, byWork bool, rerr error) {
	if !byWork && lease.lostCause() == nil {
		l.reportLost(lease, lostAtRelease(rerr), lease.Deadline())
	}
}

// settled returns the loss, if any, rerr (the release's answer) tells of.
func (l *Locker) settled(ctx context.Context, lease *Lease, byWork bool, rerr error) error {
	switch {
	case byWork:
		return nil
	case errors.Is(rerr, ErrNotHeld):
		if lost := lease.lostCause(); lost != nil {
			return lost // a renewal found it as the release began, and the watchdog reported it
		}
		lost := lostAtRelease(rerr) // lost between two renewals
		l.reportLost(lease, lost, lease.Deadline())
		return lost
	case rerr != nil && ctxErr(ctx) != nil && errors.Is(rerr, ctxErr(ctx)): // gone on in the background
	case rerr != nil:
		l.opts.Logger.LogAttrs(ctx, slog.LevelWarn, "fencelock: release failed, the lock expires after its TTL",
			slog.String("lock", lease.name), slog.Int64("fence", lease.fence), slog.Any("error", rerr))
	}
	return nil
}

// RunWithLocks runs work holding the locks called names, taken as AcquireAll
// takes them, renewed and released as RunWithLock does one; work's context is
// cancelled with cause ErrLost as soon as any lease is lost. It returns
// RunWithLock's errors, AcquireAll's instead of Acquire's, with one matching
// ErrLost for each lease lost.
func (l *Locker) RunWithLocks(ctx context.Context, names []string,
	work func(ctx context.Context, leases []*Lease) error, opts ...Option) error {
	if err := l.usable(); err != nil {
		return err
	}
	if work == nil {
		return invalidf("nil work function")
	}
	if l.opts.Observer == nil { // without observeRun's closure and the joined names
		return l.runAll(ctx, names, work, opts)
	}
	return l.observeRun(ctx, strings.Join(names, ","), func(ctx context.Context, _ **Lease) error {
		return l.runAll(ctx, names, work, opts)
	})
}
