package fencelock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/tasks"
)

// A Lease is one acquisition of a lock. Its methods are safe for concurrent
// use, and on a nil *Lease, which holds nothing (a deferred Release is safe).
type Lease struct {
	locker  *Locker
	kind    kind // what the lease holds: a lock, or a semaphore's permit, ...
	name    string
	keys    [keys.N]string // lock, token marker, fence counter, queue, queue entries: the scripts' KEYS
	keyArgs [keys.N]any    // keys, boxed once
	fair    bool           // WithFair
	// line is the id of the waiting Acquire call the lease is an attempt
	// of, in a Redlock line (see line in redlock.go); "" when it does not
	// wait.
	line     string
	token    string
	tokenArg any // token, boxed once for the scripts' ARGV
	owner    string
	ownerArg any // owner, boxed once
	fence    int64
	acquired time.Time // when the acquire request was sent
	degraded bool      // fail-open stand-in: no lock is held
	// obsCtx is the context of the operation that took the lease (Acquire,
	// or RunWithLock), kept for Options.Observer's Notify only.
	obsCtx context.Context

	// held has a bit set for each node of a Redlock quorum that has
	// confirmed holding the lock for this token (granted or extended it).
	held atomic.Uint64

	// op is held by the one Redis call on the lease at a time (Extend, a
	// renewal, Release), so that they reach Redis in the order they were
	// made and each reads the state the previous one left.
	op opLock

	mu        sync.Mutex
	ttl       time.Duration             // guarded by mu; as acquired or last extended
	deadline  time.Time                 // guarded by mu
	floorTTL  time.Duration             // guarded by mu; the shortest TTL an extension of unknown outcome may still set; 0: none
	done      error                     // guarded by mu; why the lock is no longer held; nil while it may be
	lost      error                     // guarded by mu; why the watchdog gave the lease up
	wd        *watchdog                 // guarded by mu; nil until KeepAlive
	releasing bool                      // guarded by mu; Release was called
	cancels   []context.CancelCauseFunc // guarded by mu; KeepAlive contexts
	// keepers counts the KeepAlive calls whose ctx has not ended
	// (RunWithLock's never ends); keeperStops unregister their
	// keeperEnded. Guarded by mu.
	keepers     int
	keeperStops []func() bool
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
	if l == nil {
		return ""
	}
	return l.keys[keys.LockKey]
}

// Token returns the random token (a UUID v4) of this acquisition in Redis.
func (l *Lease) Token() string {
	if l == nil {
		return ""
	}
	return l.token
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
	if err != nil && (classify(err) == classNoVerdict || (ctxErr(ctx) != nil && isTimeout(err))) {
		return ctxEnded(ctx, "extend") // cut short by ctx: no verdict
	}
	return withCtx(err, ctxErr(ctx))
}

// extend runs the extend script once, for the user (Extend) or the
// watchdog (byWatchdog, which extends by the lease's current TTL), and
// records the outcome. A user's Extend tells a running watchdog about its
// outcome (the watchdog handles its own renewals' outcomes). Errors of
// class classNoVerdict are returned as they are.
//
// The watchdog's renewals send EVAL instead of EVALSHA: a renewal must take
// one round trip also on a server whose script cache is empty (after a
// restart or a failover), where EVALSHA would cost a second one (NOSCRIPT,
// then EVAL) and could miss the deadline on a slow link.
func (l *Lease) extend(ctx context.Context, ttl time.Duration, byWatchdog bool, ec *extendState) error {
	if err := l.op.lock(ctx); err != nil {
		return err
	}
	defer l.op.unlock()
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

	code, err := l.kind.extend(ctx, l, ttl, byWatchdog)

	l.mu.Lock()
	defer l.mu.Unlock()
	ec.finished = true
	if !byWatchdog {
		defer l.notifyWatchdogLocked() // the deadline may have moved either way
	}
	switch {
	case err != nil:
		class := classify(err)
		if class != classMisconfigured { // it may have reached Redis
			l.unknownOutcomeLocked(start, ttl)
		}
		if class == classNoVerdict {
			return err
		}
		return callError(l.name, err)
	case code == 1:
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
		why := errGone
		if code == -1 {
			why = errTakenBy
		}
		l.markDoneLocked(start, why)
		return why
	}
}

// unknownOutcomeLocked records that an extension to ttl sent at sent may or
// may not have reached Redis, and may still: the deadline must not claim
// more than it would set, and no later extension may count on more than its
// TTL.
func (l *Lease) unknownOutcomeLocked(sent time.Time, ttl time.Duration) {
	if d := sent.Add(ttl - drift(ttl)); d.Before(l.deadline) {
		l.deadline = d
	}
	if l.floorTTL == 0 || ttl < l.floorTTL {
		l.floorTTL = ttl
	}
}

// extendState is what one extension has done so far, for its caller that
// stops waiting for it; guarded by Lease.mu.
type extendState struct {
	sent     time.Time // when the request was sent; zero while it waits its turn
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
// the lease was found not held.
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

// releaseAfter is Release; when it returns before the release's answer (ctx
// ended, or ReleaseTimeout passed), notHeld, if not nil, is called on the
// background goroutine with the release's ErrNotHeld, should its first
// answer find the lock no longer this lease's.
func (l *Lease) releaseAfter(ctx context.Context, notHeld func(error)) error {
	if l == nil || l.locker == nil {
		return ErrNotHeld
	}
	obs := l.locker.opts.Observer
	if obs == nil {
		return l.releaseOp(ctx, notHeld)
	}
	ctx = obs.Start(ctx, OpRelease, l.name)
	start := l.locker.clock.Now()
	err := l.releaseOp(ctx, notHeld)
	now := l.locker.clock.Now()
	e := Event{Op: OpRelease, Name: l.name, Lease: l, Outcome: OutcomeOf(err), Err: err,
		Fence: l.fence, Duration: now.Sub(start)}
	if err == nil && l.lostCause() == nil {
		e.Held = now.Sub(l.acquired)
	}
	obs.End(ctx, e)
	return err
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
	if errors.Is(context.Cause(ctx), errReleased) {
		// ctx is one of this lease's KeepAlive contexts, which Release
		// has just cancelled (work releasing its own lease).
		ctx = context.WithoutCancel(ctx)
	}
	rctx, cancel := l.locker.detached(ctx)
	if ctx.Done() == nil && l.locker.traits.deadlines {
		// Only ReleaseTimeout bounds the call, and go-redis honours it.
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

// releasedLate handles err, the answer of a release whose caller has
// returned without it: it tries again in the background after
// ErrUnavailable, hands ErrNotHeld to notHeld (if not nil), and logs any
// other error.
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

// releaseCutShort is the error of a release that returned before Redis
// answered: ctx ended, or ReleaseTimeout passed.
func (l *Locker) releaseCutShort(ctx context.Context) error {
	if ctxErr(ctx) != nil {
		return ctxEnded(ctx, "release (it goes on in the background)")
	}
	return &opError{msg: fmt.Sprintf("%s: no reply within ReleaseTimeout %v", ErrUnavailable.Error(), l.opts.ReleaseTimeout),
		errs: []error{ErrUnavailable}}
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
	if ctx.Done() == nil && l.traits.deadlines { // as in releaseOp
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

// endWork marks the lease released, cancels its KeepAlive contexts and stops
// its watchdog: the first half of a release, which never waits for Redis.
func (l *Lease) endWork() {
	l.mu.Lock()
	l.releasing = true
	l.mu.Unlock()
	l.cancelContexts(errReleased) // the work is over: tell it before waiting
	l.stopWatchdog()
}

func (l *Lease) releaseTimedOut() error {
	return l.locker.releaseCutShort(context.Background())
}

// release runs the release script once, after the call in flight on the
// lease, and records the outcome.
func (l *Lease) release(ctx context.Context) error {
	if err := l.op.lock(ctx); err != nil {
		return l.releaseTimedOut()
	}
	defer l.op.unlock()
	if err := l.doneErr(); err != nil {
		return err // a concurrent Release came first
	}
	start := l.locker.clock.Now()
	code, perr, err := l.runRelease(ctx, modeRelease)
	if err != nil {
		if ctx.Err() != nil {
			return l.releaseTimedOut()
		}
		return callError(l.name, err)
	}
	l.locker.warnPublish(l.name, perr)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch code {
	case 1:
		l.markDoneLocked(start, errReleaseD)
		if log := l.locker.opts.Logger; log.Enabled(ctx, slog.LevelDebug) {
			log.LogAttrs(ctx, slog.LevelDebug, "fencelock: released",
				slog.String("lock", l.name), slog.Int64("fence", l.fence),
				slog.Duration("held", l.locker.clock.Now().Sub(l.acquired)))
		}
		return nil
	case -1:
		l.markDoneLocked(start, errTakenBy)
		return errTakenBy
	default:
		l.markDoneLocked(start, errGone)
		return errGone
	}
}

// Release script modes (release.lua, redlock_release.lua).
const (
	modeRelease = "r"
	modeAbandon = "a"
)

// modeArg returns mode boxed for a script's ARGV from its constant: boxing
// the variable would allocate, once per release.
func modeArg(mode string) any {
	if mode == modeRelease {
		return modeRelease
	}
	return modeAbandon
}

// runRelease runs the release script in mode; perr is set when the lock was
// deleted but the wake-up could not be published.
func (l *Lease) runRelease(ctx context.Context, mode string) (code int64, perr, err error) {
	return l.kind.release(ctx, l, mode)
}

func (l *Lease) doneErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done
}

// opLock is a lock whose waiting ends with a context. Its channel is made
// only when a call has to wait, so an uncontended lease allocates none.
type opLock struct {
	mu   sync.Mutex
	held bool          // guarded by mu
	free chan struct{} // guarded by mu; closed at unlock when a call waits, nil otherwise
}

func (o *opLock) lock(ctx context.Context) error {
	for {
		o.mu.Lock()
		if !o.held {
			o.held = true
			o.mu.Unlock()
			return nil
		}
		if o.free == nil {
			o.free = make(chan struct{})
		}
		free := o.free
		o.mu.Unlock()
		select {
		case <-free:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (o *opLock) unlock() {
	o.mu.Lock()
	o.held = false
	if o.free != nil {
		close(o.free)
		o.free = nil
	}
	o.mu.Unlock()
}
