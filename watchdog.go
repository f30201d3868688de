package fencelock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/fencelock/fencelock/internal/backoff"
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

// errAborted is the error of an OpRun whose work panicked or called
// runtime.Goexit; the panic goes on to RunWithLock's caller.
var errAborted = errors.New("fencelock: the work panicked or called runtime.Goexit")

// observeRun runs run, the body of a RunWithLock or RunWithLocks, between
// the Observer's Start and End of one OpRun called name (several names
// joined with commas); the End names the lease run stores in *lease, if any.
// The End comes also when run panics or calls runtime.Goexit.
func (l *Locker) observeRun(ctx context.Context, name string, run func(ctx context.Context, lease **Lease) error) error {
	obs := l.opts.Observer
	ctx = obs.Start(ctx, OpRun, name)
	start := l.clock.Now()
	var lease *Lease
	err := errAborted // unless run returns
	defer func() {
		e := Event{Op: OpRun, Name: name, Lease: lease, Outcome: OutcomeOf(err), Err: err, Duration: l.clock.Now().Sub(start)}
		if lease != nil {
			e.Fence = lease.fence
		}
		obs.End(ctx, e)
	}()
	err = run(ctx, &lease)
	return err
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
		return work(ctx, l.degraded(ctx, name, co.kind, err))
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

// settle ends the hold of a lease whose work has returned: it releases the
// lease, or, when it was lost, gives it back in the background, and returns
// the loss (matching ErrLost: while the work ran, or found by the release),
// or nil. A loss found by a release that went on in the background is
// reported from there, not returned. If the work released the lease itself,
// only a loss before that counts.
func (l *Locker) settle(ctx context.Context, lease *Lease) error {
	byWork := lease.isReleasing()
	if lost := l.lostByNow(lease, byWork); lost != nil {
		return lost
	}
	// Bounded by ctx, as every call is: if ctx ends first, the release goes
	// on in the background, and a loss it finds is reported from there.
	rerr := lease.releaseAfter(ctx, func(rerr error) { l.lateLoss(lease, byWork, rerr) })
	return l.settled(ctx, lease, byWork, rerr)
}

// settleAll is settle for several leases, released within one bound (see
// releaseLeases); it returns their losses joined.
func (l *Locker) settleAll(ctx context.Context, leases []*Lease) error {
	byWork := make(map[*Lease]bool, len(leases))
	lost := make([]error, len(leases))
	var rel []*Lease
	for i, lease := range leases {
		byWork[lease] = lease.isReleasing()
		if lost[i] = l.lostByNow(lease, byWork[lease]); lost[i] == nil {
			rel = append(rel, lease)
		}
	}
	rerrs := l.releaseLeases(ctx, rel, func(lease *Lease, rerr error) { l.lateLoss(lease, byWork[lease], rerr) })
	var all error
	j := 0
	for i, lease := range leases {
		if lost[i] == nil {
			lost[i] = l.settled(ctx, lease, byWork[lease], rerrs[j])
			j++
		}
		if lost[i] != nil {
			all = joinErr(all, lost[i])
		}
	}
	return all
}

// lostByNow returns the loss of a lease whose work has returned (byWork:
// the work released it), found before its release: the watchdog's, or a
// deadline that passed as the work returned. A lost lease the work did not
// release is given back in the background.
func (l *Locker) lostByNow(lease *Lease, byWork bool) error {
	lost := lease.lostCause()
	if lost == nil && !byWork && !l.clock.Now().Before(lease.Deadline()) {
		// The deadline passed as work returned, before the watchdog's
		// timer was handled: that counts as lost too.
		lease.lose(fmt.Errorf("%w: deadline passed before the work returned", ErrLost))
		lost = lease.lostCause()
	}
	if lost != nil && !byWork {
		// The watchdog has called OnLost when RunWithLock returns; the
		// release, which may wait for Redis, goes on without it.
		lease.endWork()
		l.releaseInBackground(lease)
	}
	return lost
}

// lateLoss reports a loss found only in the background by the release
// after the work (rerr, matching ErrNotHeld), unless the work released the
// lease itself or the watchdog reported it.
func (l *Locker) lateLoss(lease *Lease, byWork bool, rerr error) {
	if !byWork && lease.lostCause() == nil {
		lease.reportLost(lostAtRelease(rerr), lease.Deadline())
	}
}

// settled returns the loss, if any, that rerr, the answer of the release
// after the work, tells of.
func (l *Locker) settled(ctx context.Context, lease *Lease, byWork bool, rerr error) error {
	switch {
	case byWork:
		return nil
	case errors.Is(rerr, ErrNotHeld):
		if lost := lease.lostCause(); lost != nil {
			// A renewal found it not held as the release began, and the
			// watchdog reported it: Release stopped the watchdog, which
			// reports no more, before it returned.
			return lost
		}
		// Lost while the work ran, between two renewals.
		lost := lostAtRelease(rerr)
		lease.reportLost(lost, lease.Deadline())
		return lost
	case rerr != nil && ctxErr(ctx) != nil && errors.Is(rerr, ctxErr(ctx)):
		// Gone on in the background, which reports a loss or logs a
		// failure itself.
	case rerr != nil:
		l.opts.Logger.LogAttrs(ctx, slog.LevelWarn, "fencelock: release failed, the lock expires after its TTL",
			slog.String("lock", lease.name), slog.Int64("fence", lease.fence), slog.Any("error", rerr))
	}
	return nil
}

// lostAtRelease is the loss of a lease found not held (rerr) by the
// release after the work.
func lostAtRelease(rerr error) error {
	return &opError{msg: ErrLost.Error() + ": not held when released after the work: " + rerr.Error(),
		errs: []error{ErrLost, rerr}}
}

// joinErr joins the work's error and a loss on one line; both match.
func joinErr(werr, lost error) error {
	if werr == nil {
		return lost
	}
	return &opError{msg: werr.Error() + "; " + lost.Error(), errs: []error{werr, lost}}
}

// KeepAlive starts the lease's watchdog, if not running yet, and returns a
// context derived from ctx, cancelled with cause ErrLost when the lease is
// lost ("Deadlines and the watchdog"). It renews until Release (defer it; the
// cause then matches ErrNotHeld), or until every KeepAlive call's ctx ended:
// the lease is then released in the background, and a later Release returns
// ErrNotHeld. On a nil lease, or one no longer held, the context is already
// cancelled with the cause.
func (l *Lease) KeepAlive(ctx context.Context) context.Context {
	return l.keepAlive(ctx, false)
}

// keepAlive is KeepAlive; pinned (RunWithLock, which releases after its
// work returns) keeps the lease renewed after ctx ended.
func (l *Lease) keepAlive(ctx context.Context, pinned bool) context.Context {
	workCtx, cancel := context.WithCancelCause(ctx)
	if l == nil || l.locker == nil {
		cancel(ErrNotHeld)
		return workCtx
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil || l.done != nil || l.releasing {
		cancel(cmp.Or(l.lost, l.done, errReleased))
		return workCtx
	}
	l.cancels = append(l.cancels, cancel)
	if !l.degraded {
		l.keepers++
		if !pinned && ctx.Done() != nil {
			l.keeperStops = append(l.keeperStops, context.AfterFunc(ctx, l.keeperEnded))
		}
	}
	if l.wd == nil && !l.degraded {
		l.wd = &watchdog{stop: make(chan struct{}), done: make(chan struct{}), moved: make(chan struct{}, 1)}
		go l.watch(l.wd)
	}
	return workCtx
}

// keeperEnded runs, on a goroutine of its own, when the ctx of a KeepAlive
// call ends: after the last one, it stops the watchdog and releases the
// lease in the background.
func (l *Lease) keeperEnded() {
	l.mu.Lock()
	l.keepers--
	end := l.keepers == 0 && !l.releasing && l.done == nil
	if end {
		l.releasing = true // no KeepAlive starts the watchdog again
	}
	l.mu.Unlock()
	if end {
		l.endWork()
		l.locker.releaseInBackground(l)
	}
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

// cancelContexts cancels the contexts KeepAlive returned, and unregisters
// the calls of keeperEnded that their ctx's end would make.
func (l *Lease) cancelContexts(cause error) {
	l.mu.Lock()
	cancels, stops := l.cancels, l.keeperStops
	l.cancels, l.keeperStops = nil, nil
	l.mu.Unlock()
	for _, cancel := range cancels {
		cancel(cause)
	}
	for _, stop := range stops {
		stop()
	}
}

func (l *Lease) lostCause() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// lose records that the lease is lost, cancels the work contexts with cause,
// logs it and calls OnLost. A lost lease is not extended again.
func (l *Lease) lose(cause error) {
	l.mu.Lock()
	if l.lost != nil || l.releasing {
		l.mu.Unlock()
		return
	}
	l.lost = cause
	deadline := l.deadline
	l.mu.Unlock()
	l.cancelContexts(cause)
	l.reportLost(cause, deadline)
}

// reportLost tells the Observer, the log and OnLost that the lease was lost.
func (l *Lease) reportLost(cause error, deadline time.Time) {
	now := l.locker.clock.Now()
	if obs := l.locker.opts.Observer; obs != nil {
		obs.Notify(l.observed(), Event{Op: OpLost, Name: l.name, Lease: l, Outcome: OutcomeLost, Err: cause,
			Fence: l.fence, Held: now.Sub(l.acquired)})
	}
	l.locker.opts.Logger.LogAttrs(context.Background(), slog.LevelError, "fencelock: lease lost",
		slog.String("lock", l.name), slog.Int64("fence", l.fence),
		slog.Duration("held", now.Sub(l.acquired)), slog.Duration("until_deadline", deadline.Sub(now)),
		slog.Any("cause", cause))
	if f := l.locker.opts.OnLost; f != nil {
		f(l, cause)
	}
}

// nextRenewal returns how long from now the next renewal is due, and how
// long until the deadline: a renewal is due an interval after the start of
// the request that set the deadline, and no later than a third of the time
// that is left, so a lease whose time is short (a late KeepAlive, a
// shortened TTL) is renewed soon enough to survive a failed try.
func (l *Lease) nextRenewal() (renewIn, remaining time.Duration) {
	l.mu.Lock()
	ttl, deadline := l.ttl, l.deadline
	l.mu.Unlock()
	now := l.locker.clock.Now()
	remaining = deadline.Sub(now)
	base := deadline.Add(-(ttl - drift(ttl))) // when that request was sent
	renewIn = min(base.Add(l.locker.opts.renewInterval(ttl)).Sub(now), remaining/3)
	return max(renewIn, 0), remaining
}

// watch is the watchdog goroutine. Each renewal is a call of its own on a
// goroutine of the Locker (see Close), so that the local deadline timer fires
// on time even while a call hangs, and so that Release does not wait for a
// renewal in flight; watch reads its result, or drops it once stopped.
func (l *Lease) watch(wd *watchdog) {
	defer close(wd.done)
	clock := l.locker.clock
	o := &l.locker.opts
	renewIn, remaining := l.nextRenewal()
	renewTimer := clock.NewTimer(renewIn)
	defer renewTimer.Stop()
	deadlineTimer := clock.NewTimer(remaining)
	defer deadlineTimer.Stop()

	var (
		results     = make(chan error, 1)
		inFlight    bool
		failing     bool               // the last renewal failed: renewTimer holds its retry
		cancelRenew context.CancelFunc = func() {}
		lastErr     error
		retry       backoff.Backoff
	)
	defer func() { cancelRenew() }()
	schedule := func() {
		renewIn, remaining := l.nextRenewal()
		renewTimer.Reset(renewIn)
		deadlineTimer.Reset(remaining)
	}

	for {
		select {
		case <-wd.stop:
			return

		case <-deadlineTimer.C:
			if remaining := l.Deadline().Sub(clock.Now()); remaining > 0 { // moved by an Extend since the timer was set
				deadlineTimer.Reset(remaining)
				continue
			}
			l.lose(deadlinePassed(lastErr))
			return

		case <-wd.moved:
			// A user's Extend moved the deadline (perhaps earlier) or
			// found the lock not held.
			l.mu.Lock()
			notHeld := l.done
			l.mu.Unlock()
			if notHeld != nil {
				l.lose(lostBecause(notHeld))
				return
			}
			renewIn, remaining := l.nextRenewal()
			if remaining <= 0 {
				l.lose(deadlinePassed(lastErr))
				return
			}
			deadlineTimer.Reset(remaining)
			if !inFlight && !failing {
				renewTimer.Reset(renewIn)
			}

		case <-renewTimer.C:
			if inFlight {
				continue // its result reschedules
			}
			if o.MaxHold > 0 && clock.Now().Sub(l.acquired) >= o.MaxHold {
				lastErr = fmt.Errorf("%w %v, no longer renewed", errMaxHold, o.MaxHold)
				continue // the deadline timer ends it
			}
			// The deadline is on the lease's clock; the context's timer
			// runs on the system clock, so hand it the time that is left.
			remaining := l.Deadline().Sub(clock.Now())
			if remaining <= 0 {
				l.lose(deadlinePassed(lastErr))
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), remaining)
			cancelRenew = cancel
			inFlight = true
			l.locker.bg.Add()
			go func() {
				defer l.locker.bg.Done()
				results <- l.extend(ctx, 0, true, new(extendState))
			}()

		case err := <-results:
			inFlight = false
			cancelRenew()
			if obs := o.Observer; obs != nil && !(errors.Is(err, ErrNotHeld) && l.isReleasing()) {
				obs.Notify(l.observed(), Event{Op: OpRenew, Name: l.name, Lease: l, Outcome: OutcomeOf(err),
					Err: err, Fence: l.fence})
			}
			switch {
			case err == nil:
				lastErr, failing = nil, false
				retry = backoff.Backoff{}
				schedule()
			case errors.Is(err, ErrNotHeld):
				if l.isReleasing() {
					return // Release is stopping the watchdog
				}
				l.lose(lostBecause(err))
				return
			default:
				if classify(err) == classNoVerdict {
					err = fmt.Errorf("%w: no reply before the deadline", ErrUnavailable)
				}
				lastErr, failing = err, true
				if retry.Min == 0 {
					interval := o.renewInterval(l.currentTTL())
					retry = backoff.Backoff{Min: max(interval/16, time.Millisecond), Max: max(interval/2, time.Millisecond)}
				}
				pause := retry.Next()
				remaining := l.Deadline().Sub(clock.Now())
				l.locker.opts.Logger.LogAttrs(context.Background(), slog.LevelWarn, "fencelock: renewal failed",
					slog.String("lock", l.name), slog.Int64("fence", l.fence),
					slog.Duration("until_deadline", remaining),
					slog.Duration("retry_in", pause), slog.Any("error", err))
				renewTimer.Reset(pause)
				deadlineTimer.Reset(remaining) // an unknown outcome may have moved it earlier
			}
		}
	}
}

// observed returns the context an Observer's Notify gets for this lease.
func (l *Lease) observed() context.Context {
	if l.obsCtx != nil {
		return l.obsCtx
	}
	return context.Background()
}

func (l *Lease) isReleasing() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.releasing
}

func (l *Lease) currentTTL() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

// errMaxHold starts the cause of a lease no longer renewed after MaxHold.
var errMaxHold = errors.New("held for MaxHold")

// lostBecause is the cause of a lease lost because Redis said it is not
// held. It matches ErrLost only: the lease was held, then lost.
func lostBecause(notHeld error) error {
	return &opError{msg: ErrLost.Error() + ": " + strings.TrimPrefix(notHeld.Error(), "fencelock: "),
		errs: []error{ErrLost}}
}

// deadlinePassed is the cause of a lease lost at its local deadline, wrapping
// the last renewal error if there was one.
func deadlinePassed(lastErr error) error {
	if errors.Is(lastErr, errMaxHold) {
		return fmt.Errorf("%w: %w; its deadline passed", ErrLost, lastErr)
	}
	if lastErr != nil {
		return fmt.Errorf("%w: deadline passed before a renewal succeeded: %w", ErrLost, lastErr)
	}
	return fmt.Errorf("%w: deadline passed before a renewal succeeded", ErrLost)
}
