package fencelock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/fencelock/fencelock/internal/tasks"
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

// runAll is RunWithLocks, without the Observer's Start and End.
func (l *Locker) runAll(ctx context.Context, names []string,
	work func(ctx context.Context, leases []*Lease) error, opts []Option) error {
	co, err := l.setOptions(names, opts)
	if err != nil {
		return err
	}
	open := co.opens(l.opts.FailOpen)
	leases, err := l.acquireAllObserved(ctx, names, co, open)
	if err != nil {
		if !open || !outage(ctx, err) {
			return err
		}
		return work(ctx, l.degradedAll(ctx, names, co, err))
	}
	// Each lease's context is derived from the one before: the last,
	// work's, ends with the first lease lost, with its cause.
	workCtx := ctx
	for _, lease := range leases {
		if l.opts.Observer != nil {
			lease.obsCtx = ctx // the run's: renewals and a loss are its events
		}
		workCtx = lease.keepAlive(workCtx, true)
	}
	returned := false
	defer func() {
		if !returned { // work panicked or called runtime.Goexit
			l.releaseLeases(ctx, leases, nil)
		}
	}()
	werr := work(workCtx, leases)
	returned = true
	if lost := l.settleAll(ctx, leases); lost != nil {
		return joinErr(werr, lost)
	}
	return werr
}

// releaseLeases releases leases as Release does each, all within one bound:
// ctx and one ReleaseTimeout, whatever their number; the releases that have
// not answered by then go on in the background, one after another, as
// Release's do. errs[i] is leases[i]'s error; notHeld, if not nil, gets a
// lease whose release answered ErrNotHeld only in the background.
func (l *Locker) releaseLeases(ctx context.Context, leases []*Lease, notHeld func(*Lease, error)) (errs []error) {
	errs = make([]error, len(leases))
	if obs := l.opts.Observer; obs != nil {
		defer l.observeReleases(ctx, leases, errs)()
	}
	var todo []*Lease
	var at []int // todo[j] is leases[at[j]]
	for i, lease := range leases {
		lease.endWork()
		switch {
		case lease.degraded:
			errs[i] = ErrNotHeld
		case lease.doneErr() != nil:
			errs[i] = lease.doneErr()
		default:
			todo, at = append(todo, lease), append(at, i)
		}
	}
	if len(todo) == 0 {
		return errs
	}
	rctx, cancel := l.detached(ctx)
	run := func() []error {
		res := make([]error, len(todo))
		for j, lease := range todo {
			res[j] = lease.release(rctx)
		}
		return res
	}
	if ctx.Done() == nil && l.traits.Deadlines { // as in releaseOp
		defer cancel()
		for j, err := range run() {
			errs[at[j]] = err
		}
		return errs
	}
	res, done := tasks.Call(l.bg, ctx.Done(), rctx.Done(), run, func(res []error) {
		cancel()
		for j, err := range res {
			lease := todo[j]
			lease.releasedLate(err, func(err error) {
				if notHeld != nil {
					notHeld(lease, err)
				}
			})
		}
	})
	if done {
		cancel()
		for j, err := range res {
			errs[at[j]] = err
		}
		return errs
	}
	cut := l.releaseCutShort(ctx)
	for _, i := range at {
		errs[i] = cut
	}
	return errs
}

// observeReleases tells the Observer of one OpRelease for each of leases,
// and returns what tells it of their ends, with the errors in errs.
func (l *Locker) observeReleases(ctx context.Context, leases []*Lease, errs []error) (end func()) {
	obs := l.opts.Observer
	ctxs := make([]context.Context, len(leases))
	for i, lease := range leases {
		ctxs[i] = obs.Start(ctx, OpRelease, lease.name)
	}
	start := l.clock.Now()
	return func() {
		now := l.clock.Now()
		for i, lease := range leases {
			e := Event{Op: OpRelease, Name: lease.name, Lease: lease, Outcome: OutcomeOf(errs[i]), Err: errs[i],
				Fence: lease.fence, Duration: now.Sub(start)}
			if errs[i] == nil && lease.lostCause() == nil {
				e.Held = now.Sub(lease.acquired)
			}
			obs.End(ctxs[i], e)
		}
	}
}
