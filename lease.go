package fencelock

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/store"
	"github.com/fencelock/fencelock/internal/tasks"
)

// A Lease is one acquisition of a lock. Its methods are safe for concurrent
// use, and on a nil *Lease, which holds nothing (a deferred Release is safe).
type Lease struct {
	locker   *Locker
	h        store.Lease // the store's own value for the token: its keys, a quorum's nodes
	name     string
	owner    string
	fence    int64
	acquired time.Time       // when the acquire request was sent
	degraded bool            // fail-open stand-in: no lock is held
	obsCtx   context.Context // the context of the call that took it, for Observer.Notify
	op       tasks.Turn      // held by the one Redis call at a time: Extend, a renewal, Release

	mu          sync.Mutex
	ttl         time.Duration             // guarded by mu; as acquired or last extended
	deadline    time.Time                 // guarded by mu
	floorTTL    time.Duration             // guarded by mu; the shortest TTL an extension of unknown outcome may still set; 0: none
	done        error                     // guarded by mu; why the lock is no longer held; nil while it may be
	lost        error                     // guarded by mu; why the watchdog gave the lease up
	wd          *watchdog                 // guarded by mu; nil until KeepAlive
	releasing   bool                      // guarded by mu; Release was called
	cancels     []context.CancelCauseFunc // guarded by mu; KeepAlive contexts
	keepers     int                       // guarded by mu; KeepAlive calls whose ctx has not ended (RunWithLock's never does)
	keeperStops []func() bool             // guarded by mu; unregister their keeperEnded
}

// Name returns the lock's name as given to Acquire.
func (l *Lease) Name() string {
	if l == nil {
		return ""
	}
	return l.name
}

// Key returns the Redis key that holds the lock: KeyPrefix+"{"+name+"}";
// for a Semaphore's permit, that plus ":sem", its holders.
func (l *Lease) Key() string {
	if l == nil || l.h == nil {
		return ""
	}
	return l.h.Key()
}

// Token returns the random token (a UUID v4) of this acquisition in Redis.
func (l *Lease) Token() string {
	if l == nil || l.degraded {
		return ""
	}
	return l.h.Token()
}

// Fence returns the fencing token issued with this acquisition (the package
// doc's Fencing tokens). A degraded or nil lease's fence is 0.
func (l *Lease) Fence() int64 {
	if l == nil {
		return 0
	}
	return l.fence
}

// Degraded reports whether this is a fail-open stand-in that holds no lock
// (the package doc's Degraded runs).
func (l *Lease) Degraded() bool {
	return l != nil && l.degraded
}

// Deadline returns the local time until which the lock is certainly held,
// barring a process pause, a failover or clock drift beyond its allowance
// ("Deadlines and the watchdog"; for a lock granted to a fair waiter, "How
// fair waiting works"). After Release, or once the lock was found not held,
// it is in the past; a nil lease's is the zero time.
func (l *Lease) Deadline() time.Time {
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Extend resets the lock's TTL to ttl, and so Deadline, if this lease still
// holds it; it never recreates an expired lock. It returns ErrNotHeld when the
// lock is not this lease's (later calls then make no Redis call), or the lease
// was lost (also matching ErrLost) or released; ErrUnavailable or
// ErrMisconfigured; ErrInvalid for a ttl WithTTL rejects; or an error matching
// ctx.Err(). After an unknown outcome, Deadline is the earlier of old and new.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if l == nil || l.locker == nil || l.degraded {
		return ErrNotHeld
	}
	if err := l.locker.opts.checkCallTTL("Extend ttl", ttl); err != nil {
		return err
	}
	if ctxErr(ctx) != nil {
		return ctxEnded(ctx, "extend")
	}
	var ec extendState
	err, done := tasks.Call(l.locker.bg, ctx.Done(), nil, func() error { return l.extend(ctx, ttl, false, &ec) }, nil)
	if !done {
		l.mu.Lock()
		if !ec.sent.IsZero() && !ec.finished { // sent, and no reply yet
			l.unknownOutcomeLocked(ec.sent, ec.ttl)
			l.notifyWatchdogLocked()
		}
		l.mu.Unlock()
		return ctxEnded(ctx, "extend")
	}
	if err != nil && (classify(err) == store.NoVerdict || (ctxErr(ctx) != nil && store.Timeout(err))) {
		return ctxEnded(ctx, "extend") // cut short by ctx: no verdict
	}
	return withCtx(err, ctxErr(ctx))
}

// extend extends the lock once, for Extend or the watchdog (byWatchdog: by
// the lease's TTL), and records the outcome; NoVerdict errors come as they
// are.
func (l *Lease) extend(ctx context.Context, ttl time.Duration, byWatchdog bool, ec *extendState) error {
	if err := l.op.Lock(ctx); err != nil {
		return err
	}
	defer l.op.Unlock()
	l.mu.Lock()
	if err := l.notHeldLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	if byWatchdog {
		ttl = l.ttl
	}
	start := l.locker.clock.Now()
	ec.sent, ec.ttl = start, ttl
	l.mu.Unlock()

	r, err := l.h.Extend(ctx, ttl, byWatchdog)

	l.mu.Lock()
	defer l.mu.Unlock()
	ec.finished = true
	if !byWatchdog {
		defer l.notifyWatchdogLocked() // the deadline may have moved either way
	}
	switch {
	case err != nil:
		class := classify(err)
		if class != store.Misconfigured { // it may have reached Redis
			l.unknownOutcomeLocked(start, ttl)
		}
		if class == store.NoVerdict {
			return err
		}
		return callError(l.name, err)
	case r == store.Done:
		if l.done == nil {
			eff := ttl
			if l.floorTTL > 0 && l.floorTTL < eff {
				eff = l.floorTTL
			}
			l.deadline = start.Add(eff - drift(eff))
			l.ttl = ttl
		}
		return nil
	default:
		l.markDoneLocked(start, notHeld(r))
		return notHeld(r)
	}
}

// unknownOutcomeLocked records an extension to ttl, sent at sent, that may
// yet reach Redis: neither the deadline nor a later extension counts on more.
func (l *Lease) unknownOutcomeLocked(sent time.Time, ttl time.Duration) {
	if d := sent.Add(ttl - drift(ttl)); d.Before(l.deadline) {
		l.deadline = d
	}
	if l.floorTTL == 0 || ttl < l.floorTTL {
		l.floorTTL = ttl
	}
}

// extendState is one extension's progress; guarded by Lease.mu.
type extendState struct {
	sent     time.Time // zero while it waits its turn
	ttl      time.Duration
	finished bool // the reply, or an error, came
}

// notHeldLocked returns why a call must not extend the lock, or nil.
func (l *Lease) notHeldLocked() error {
	switch {
	case l.lost != nil:
		return &opError{msg: ErrNotHeld.Error() + ": " + l.lost.Error(), errs: []error{ErrNotHeld, l.lost}}
	case l.done != nil:
		return l.done
	case l.releasing:
		return errReleased
	}
	return nil
}

// notifyWatchdogLocked tells a running watchdog that the deadline moved or
// the lock is not held.
func (l *Lease) notifyWatchdogLocked() {
	if l.wd == nil {
		return
	}
	select {
	case l.wd.moved <- struct{}{}:
	default:
	}
}

// markDoneLocked records that the lock is no longer held as of at, and why.
func (l *Lease) markDoneLocked(at time.Time, why error) {
	if l.done == nil {
		l.done = why
	}
	if at.Before(l.deadline) {
		l.deadline = at
	}
}

// Release stops the lease's watchdog for good and deletes the lock if this
// lease holds it, within Options.ReleaseTimeout. It returns nil, or ErrNotHeld
// when the lock was not this lease's and on a nil or degraded lease: either
// way the lease is done. After ErrUnavailable (also past ReleaseTimeout, not
// matching context.DeadlineExceeded) or ErrMisconfigured the lock may be held
// until Release is called again or its TTL ends. When ctx ends first, the
// error matches ctx.Err() and the deletion goes on in the background.
func (l *Lease) Release(ctx context.Context) error {
	return l.releaseAfter(ctx, nil)
}

// releaseAfter is Release; should it return before the answer, notHeld (if
// not nil) gets the answer's ErrNotHeld in the background.
func (l *Lease) releaseAfter(ctx context.Context, notHeld func(error)) error {
	if l == nil || l.locker == nil {
		return ErrNotHeld
	}
	if l.locker.opts.Observer == nil {
		return l.releaseOp(ctx, notHeld)
	}
	return l.locker.observeRelease(ctx, l, func(ctx context.Context) error { return l.releaseOp(ctx, notHeld) })
}

// releaseOp is releaseAfter, without the Observer.
func (l *Lease) releaseOp(ctx context.Context, notHeld func(error)) error {
	l.endWork()
	if l.degraded {
		return ErrNotHeld
	}
	if err := l.doneErr(); err != nil {
		return err
	}
	if errors.Is(context.Cause(ctx), errReleased) { // a KeepAlive ctx of its own, which endWork cancelled
		ctx = context.WithoutCancel(ctx)
	}
	rctx, cancel := l.locker.detached(ctx)
	if ctx.Done() == nil && l.locker.traits.Deadlines { // ReleaseTimeout alone bounds it, and the client honours it
		defer cancel()
		return l.release(rctx)
	}
	err, done := tasks.Call(l.locker.bg, ctx.Done(), rctx.Done(), func() error { return l.release(rctx) }, func(err error) {
		cancel()
		l.releasedLate(err, notHeld)
	})
	if done {
		cancel()
		return err
	}
	return l.locker.releaseCutShort(ctx)
}

// releasedLate handles the answer of a release whose caller has gone: it
// tries again after ErrUnavailable, hands ErrNotHeld to notHeld, and logs
// any other error.
func (l *Lease) releasedLate(err error, notHeld func(error)) {
	switch {
	case errors.Is(err, ErrUnavailable):
		l.locker.releaseInBackground(l) // the caller has gone: try again
	case errors.Is(err, ErrNotHeld) && notHeld != nil:
		notHeld(err)
	case err != nil && !errors.Is(err, ErrNotHeld):
		l.locker.opts.Logger.LogAttrs(context.Background(), slog.LevelWarn,
			"fencelock: release failed in the background, the lock expires after its TTL",
			slog.String("lock", l.name), slog.Int64("fence", l.fence), slog.Any("error", err))
	}
}

// endWork marks the lease released, cancels its KeepAlive contexts and
// stops its watchdog: what a release does without Redis.
func (l *Lease) endWork() {
	l.mu.Lock()
	l.releasing = true
	l.mu.Unlock()
	l.cancelContexts(errReleased) // the work is over: tell it before waiting
	l.stopWatchdog()
}

// release deletes the lock once, after the call in flight, and records
// the outcome.
func (l *Lease) release(ctx context.Context) error {
	if err := l.op.Lock(ctx); err != nil {
		return l.locker.releaseCutShort(context.Background())
	}
	defer l.op.Unlock()
	if err := l.doneErr(); err != nil {
		return err // a concurrent Release came first
	}
	start := l.locker.clock.Now()
	r, perr, err := l.h.Release(ctx, store.Release, l.currentTTL())
	if err != nil {
		if ctx.Err() != nil {
			return l.locker.releaseCutShort(context.Background())
		}
		return callError(l.name, err)
	}
	l.locker.warnPublish(l.name, perr)
	l.mu.Lock()
	defer l.mu.Unlock()
	err = notHeld(r)
	l.markDoneLocked(start, cmp.Or(err, errReleaseD))
	if log := l.locker.opts.Logger; err == nil && log.Enabled(ctx, slog.LevelDebug) {
		log.LogAttrs(ctx, slog.LevelDebug, "fencelock: released",
			slog.String("lock", l.name), slog.Int64("fence", l.fence),
			slog.Duration("held", l.locker.clock.Now().Sub(l.acquired)))
	}
	return err
}

func (l *Lease) doneErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done
}

// TTL returns how long the server keeps the lock if this lease still holds it
// (-1: no expiry; on a Redlock, the longest a quorum keeps it), changing
// nothing. It returns ErrNotHeld when it does not, and on a nil or degraded
// lease; ErrUnavailable or ErrMisconfigured; or an error matching ctx.Err().
func (l *Lease) TTL(ctx context.Context) (time.Duration, error) {
	if l == nil || l.locker == nil || l.degraded {
		return 0, ErrNotHeld
	}
	h, err := l.locker.read(ctx, l.name, "ttl", l.h.Read)
	if err != nil {
		return 0, err
	}
	token, _, _ := keys.Parse(h.Value)
	switch {
	case h.Value == "":
		return 0, errGone
	case token != l.h.Token():
		return 0, errTakenBy
	}
	return h.PTTL, nil
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

// keepAlive is KeepAlive; pinned (RunWithLock's) renews after ctx ended.
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
		if l.wd == nil {
			l.wd = newWatchdog(l)
			go l.wd.run()
		}
	}
	return workCtx
}

// keeperEnded runs when a KeepAlive call's ctx ends: after the last, it
// stops the watchdog and releases the lease in the background.
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

// stopWatchdog stops the watchdog, if any, and waits for it to exit.
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

// cancelContexts cancels KeepAlive's contexts and unregisters their
// keeperEnded.
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

// lose records that the lease is lost (it is not extended again), cancels
// the work's contexts with cause, and reports it.
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
	l.locker.reportLost(l, cause, deadline)
}

// nextRenewal returns when the next renewal is due, and the time left
// before the deadline: an interval after the request that set the deadline,
// and within a third of the time left (a short lease survives a failed try).
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

// observed returns the context an Observer's Notify gets.
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
