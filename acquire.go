package fencelock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fencelock/fencelock/internal/backoff"
	"github.com/fencelock/fencelock/internal/tasks"
)

// An acquisition is one Acquire call across its attempts: what it learnt
// (the verdict, the holder it saw, whether an attempt may have taken the
// lock unseen) and the four steps every kind of waiting shares: try once,
// take a new token, complete the lease, give up. The plain way of waiting
// is acquisition.plain, here; fair waiting is in fair.go.
type acquisition struct {
	l       *Locker
	ctx     context.Context
	lease   *Lease
	st      *acquireStats // nil without an Observer
	open    bool          // the call fails open: its attempts are bounded by half the time left
	start   time.Time     // the call's, on the Locker's clock
	waitEnd time.Time
	openEnd time.Time // when a fail-open call stops waiting out an outage (see openEnd)

	verdict error // the last attempt's: busy, or a callError; nil: none yet
	seen    busySeen
	unsure  bool // an attempt's outcome is unknown: it may have taken the lock

	// letGo gives back, in the background, what the current token may hold
	// or where it waits, when the call gives up; set by the way of waiting.
	letGo func()
}

func (l *Locker) newAcquisition(ctx context.Context, lease *Lease, wait time.Duration, open bool, st *acquireStats) *acquisition {
	start := l.clock.Now()
	return &acquisition{l: l, ctx: ctx, lease: lease, st: st, open: open, start: start,
		waitEnd: start.Add(wait), openEnd: l.openEnd(ctx, open, start)}
}

// ended reports whether the call must stop: ctx ended, or Close was called.
func (a *acquisition) ended() bool {
	return ctxErr(a.ctx) != nil || a.l.isClosed()
}

// try runs one attempt. With done false, ctx ended or Close was called
// before it gave a verdict: it may have taken the lock (a.unsure), unless a
// failed dial shows Redis was not reached, which is then the verdict.
func (a *acquisition) try() (at attempt, done bool) {
	dials := a.l.dialFailures.Load()
	at, done = a.l.try(a.ctx, a.lease, a.open)
	if !done {
		a.unsure = true
		if err := a.l.dialErrorSince(dials); err != nil {
			a.verdict = callError(a.lease.name, err)
		}
	}
	return at, done
}

// failed records at's error as the verdict, and reports whether retrying
// cannot help (Redis refused the lock's commands).
func (a *acquisition) failed(at attempt) (refused bool) {
	a.verdict = callError(a.lease.name, at.err)
	if at.free {
		a.seen = busySeen{} // the holder it saw is gone
	}
	if !notSent(at.err) || at.retire {
		a.unsure = true
	}
	return classify(at.err) == classMisconfigured
}

// busy records at, an answer to the attempt sent at sent, as the verdict.
func (a *acquisition) busy(at attempt, sent time.Time) {
	name := a.lease.name
	if at.name != "" {
		name = at.name
	}
	a.verdict = a.seen.see(&BusyError{Name: name, Owner: at.owner, TTL: at.pttl, Holders: at.holders}, sent)
}

// rotate gives the call a new token, which a clean-up of the old one, or a
// late copy of one of its attempts, cannot touch.
func (a *acquisition) rotate() {
	old := a.lease
	a.lease = a.l.leaseOf(old.kind, old.name, old.ttl)
	a.lease.owner, a.lease.ownerArg, a.lease.line, a.lease.fair = old.owner, old.ownerArg, old.line, old.fair
	a.unsure = false
}

// complete fills in the lease that took the lock with fence: its Deadline
// counts from from.
func (a *acquisition) complete(fence int64, from time.Time) *Lease {
	lease := a.lease
	a.seen = busySeen{} // the holder it saw is gone: the lock is this call's
	lease.fence = fence
	lease.acquired = from
	lease.deadline = from.Add(lease.ttl - drift(lease.ttl))
	if a.unsure {
		// An earlier attempt may still reach Redis and reset the expiry to
		// this TTL after a longer Extend.
		lease.floorTTL = lease.ttl
	}
	if log := a.l.opts.Logger; log.Enabled(a.ctx, slog.LevelDebug) {
		log.LogAttrs(a.ctx, slog.LevelDebug, "fencelock: acquired", slog.String("lock", lease.name),
			slog.Int64("fence", fence), slog.Duration("ttl", lease.ttl), slog.Duration("waited", from.Sub(a.start)))
	}
	return lease
}

// giveUp ends the call without the lock: letGo gives back what it may hold,
// and the error is the last verdict, with ctx's error when ctx ended, or
// ctx's alone when no attempt got a verdict.
func (a *acquisition) giveUp() (*Lease, error) {
	a.letGo()
	l := a.l
	if l.isClosed() {
		return nil, closedError(a.lease.name, a.verdict)
	}
	a.verdict = a.seen.verdict(a.verdict, l.clock.Now())
	ctxE := ctxErr(a.ctx)
	if log := l.opts.Logger; log.Enabled(a.ctx, slog.LevelDebug) {
		log.LogAttrs(a.ctx, slog.LevelDebug, "fencelock: not obtained", slog.String("lock", a.lease.name),
			slog.Bool("fair", a.lease.fair), slog.Duration("waited", l.clock.Now().Sub(a.start)),
			slog.Any("verdict", a.verdict), slog.Any("ctx", ctxE))
	}
	if a.verdict == nil {
		return nil, ctxEnded(a.ctx, fmt.Sprintf("acquire %q", a.lease.name))
	}
	return nil, withCtx(a.verdict, ctxE)
}

// A wakeup is how a waiting plain Acquire learns, between its attempts,
// that the lock may be free: the lock's releases (releases, below), or its
// turn in a Redlock line (lineWakeup, redlock_line.go).
type wakeup interface {
	// next returns, after the attempt at (busy: the lock was held), what
	// ends the pause before the next attempt early, and how long the pause
	// lasts at most, given the backoff's d.
	next(at attempt, busy bool, d time.Duration) (<-chan struct{}, time.Duration)
	// woken returns how much longer to pause after a wake-up, to spread
	// the waiters one release woke.
	woken() time.Duration
	// leave stops the wake-ups; with the lease of a call that gave up
	// holding nothing, it also gives back the place where that lease waits.
	// Unless the call took the lock (took), a wake-up it got as one of many
	// and did not use goes to the next waiter.
	leave(gaveUp *Lease, took bool)
}

// releases wakes a plain waiter on the lock's releases ("Waiting" in
// GUARANTEES.md), from its first attempt that did not take the lock, a failed
// one too (one cut short by AttemptTimeout may have found it busy). A release
// wakes the Locker's earliest plain waiter, which passes the wake-up on if it
// does not use it; a grant to a fair waiter wakes none.
type releases struct {
	l     *Locker
	key   string
	w     *waiter
	taken int // wake-ups taken since the last attempt's answer (a pause's end, the drain after it)
}

func (r *releases) next(_ attempt, busy bool, d time.Duration) (<-chan struct{}, time.Duration) {
	if r.w == nil {
		r.w = r.l.b.register(r.key, r) // nil after Close, which the wait hears
	}
	if r.w == nil {
		return nil, d
	}
	if r.taken > 0 && !busy {
		r.w.passOn()
	}
	r.taken = 0
	return r.w.wake, d
}

func (r *releases) woken() time.Duration { r.taken++; return 0 }

func (r *releases) hear(_ *waiter, m message) hearing {
	switch {
	case m.payload == "":
		return wakeAll
	case m.head == "granted":
		return ignore
	}
	return wakeOne
}

func (r *releases) lingers(*waiter) bool { return false }

func (r *releases) leave(_ *Lease, took bool) {
	if r.w == nil {
		return
	}
	// A call that gives up after a wake-up, or took the lock after two (a
	// semaphore's two permits freed at once), leaves one to the next.
	if r.taken > 1 || r.taken > 0 && !took {
		r.w.passOn()
	}
	r.w.leave()
}

// plain runs the attempts of an Acquire that is not fair: each attempt
// either takes the lock, or is followed by a pause (the backoff, cut short
// by a wake-up and by the holder's expiry) until the wait ends.
func (a *acquisition) plain(wake wakeup) (*Lease, error) {
	l := a.l
	bo := backoff.Backoff{Min: l.opts.MinRetryBackoff, Max: l.opts.MaxRetryBackoff}
	var wokeAt time.Time
	a.letGo = func() {
		if a.unsure {
			l.abandon(a.lease) // out of a Redlock line too
			wake.leave(nil, false)
		} else {
			wake.leave(a.lease, false)
		}
	}
	for {
		if a.ended() {
			return a.giveUp()
		}
		start := l.clock.Now()
		at, done := a.try()
		if !done {
			return a.giveUp()
		}
		switch {
		case at.err != nil:
			if a.failed(at) {
				return a.giveUp()
			}
		case at.ok:
			if l.clock.Now().Before(start.Add(a.lease.ttl - drift(a.lease.ttl))) {
				if a.st != nil && !wokeAt.IsZero() {
					a.st.handoff = l.clock.Now().Sub(wokeAt)
				}
				wake.leave(nil, true)
				return a.complete(at.fence, start), nil
			}
			// Granted, but the reply came after the lease's deadline.
			// Another attempt with the same token renews it.
			a.unsure = true
			a.verdict = &opError{msg: ErrUnavailable.Error() + ": the reply came after the lease's deadline",
				errs: []error{ErrUnavailable}}
			if l.clock.Now().Before(a.waitEnd) {
				continue
			}
		default:
			a.busy(at, start)
		}
		if at.retire {
			// The try may hold the lock somewhere without having got it;
			// the backend gives that back in the background.
			a.rotate()
		}
		now := l.clock.Now()
		end := a.waitEnd
		if a.openEnd.Before(end) && errors.Is(a.seen.verdict(a.verdict, now), ErrUnavailable) {
			end = a.openEnd
		}
		if !now.Before(end) {
			return a.giveUp()
		}
		busy := errors.Is(a.verdict, ErrNotObtained)
		ch, sleep := wake.next(at, busy, bo.Next())
		sleep = min(sleep, end.Sub(now))
		if busy && at.pttl >= 0 && at.pttl < sleep {
			sleep = max(at.pttl, time.Millisecond) // the holder's lock expires first
		}
		t := l.clock.NewTimer(sleep)
		slept := l.clock.Now()
		wokeAt = time.Time{}
		select {
		case <-a.ctx.Done():
			t.Stop()
			return a.giveUp()
		case <-l.closed:
			t.Stop()
			return a.giveUp()
		case <-t.C:
		case <-ch:
			t.Stop()
			wokeAt = l.clock.Now()
			if spread := wake.woken(); spread > 0 && !l.pause(a.ctx, spread) {
				return a.giveUp()
			}
		}
		if ch != nil {
			select { // wake-ups before this attempt: it sees what they announced
			case <-ch:
				_ = wake.woken() // woken all the same, with the attempt next
			default:
			}
		}
		if a.st != nil {
			a.st.waited += l.clock.Now().Sub(slept)
		}
	}
}

// try runs one attempt of an Acquire for lease, bounded by ctx, by Close,
// and by AttemptTimeout (see Options; open: the call fails open). With done
// false, ctx ended or Close was called before the attempt gave a verdict:
// it may still be in flight, on a goroutine the Locker tracks, or have
// taken the lock as Close was called. An attempt that outlived
// AttemptTimeout alone is a verdict: a *noReplyError, which names the cause
// when a dial failed while it ran.
func (l *Locker) try(ctx context.Context, lease *Lease, open bool) (a attempt, done bool) {
	timeout, half := l.opts.AttemptTimeout, false
	if dl, ok := ctx.Deadline(); ok && open {
		if left := time.Until(dl) / 2; left < timeout { // real time, as ctx's deadline
			timeout, half = max(left, time.Millisecond), true
		}
	}
	actx, cancel := l.deadlines.WithTimeout(ctx, timeout)
	defer cancel()
	dials, failures := l.dials.Load(), l.dialFailures.Load()
	done = true
	if l.traits.stops || (ctx.Done() == nil && l.traits.deadlines) { // it returns by actx's end by itself
		a = lease.kind.acquire(actx, lease)
		if a.err != nil && l.isClosed() {
			return a, false
		}
	} else {
		a, done = tasks.Call(l.bg, actx.Done(), l.closed, func() attempt { return lease.kind.acquire(actx, lease) }, nil)
	}
	if done && a.ok && l.isClosed() {
		// Close was called while it ran (on the caller's goroutine, or
		// within call's grace): no lease after Close; the caller gives
		// back the lock it took, as one it may have taken.
		return a, false
	}
	if done && (a.err == nil || (classify(a.err) != classNoVerdict && (ctxErr(actx) == nil || !isTimeout(a.err)))) {
		return a, true
	}
	if ctxErr(ctx) != nil || l.isClosed() {
		return a, false
	}
	e := &noReplyError{timeout: timeout, half: half, cause: l.dialErrorSince(failures)}
	// A failed dial of the client is no evidence about this attempt's own
	// request, which may have gone on a connection already open while
	// another call failed to dial. It was not sent only when it had no
	// connection to go on: the client has none, and none was made while
	// the attempt ran (see notSent for the one exception). A quorum's nodes
	// may have had it on connections already open.
	e.unsent = e.cause != nil && !l.traits.stops && l.connless(dials)
	return attempt{err: e}, true
}

// A noReplyError is an attempt that got no reply within its bound. It
// matches the failed dial that explains it, when dials failed meanwhile.
type noReplyError struct {
	timeout time.Duration
	half    bool // the bound was half the time left before a fail-open call's deadline
	cause   error
	unsent  bool // the script was provably not sent (see notSent)
}

func (e *noReplyError) Error() string {
	bound := "AttemptTimeout"
	if e.half {
		bound = "half the time left before the deadline, for fail-open"
	}
	msg := "no reply within " + e.timeout.Round(time.Millisecond).String() + " (" + bound + ")"
	if e.cause != nil {
		msg += ": " + e.cause.Error()
	}
	return msg
}

func (e *noReplyError) Unwrap() error { return e.cause }

// busySeen is the last busy answer of an Acquire, and until when, at least,
// the holder it named holds the lock: an outage after it is no reason to
// fail open while that lasts.
type busySeen struct {
	err   *BusyError
	until time.Time
}

// see records busy, an answer to the attempt sent at sent, and returns it.
func (b *busySeen) see(busy *BusyError, sent time.Time) error {
	b.err, b.until = busy, sent.Add(max(busy.TTL, 0))
	if busy.TTL == -1 { // no expiry
		b.until = sent.Add(forever)
	}
	return busy
}

// verdict is v, or the busy answer when v is an outage that came while the
// holder it named still held the lock.
func (b *busySeen) verdict(v error, now time.Time) error {
	if b.err != nil && now.Before(b.until) && errors.Is(v, ErrUnavailable) {
		return b.err
	}
	return v
}

// openEnd is when a fail-open call (open) that began at start, on the
// Locker's clock, stops waiting for an outage to end: half the time before
// ctx's deadline, so that its work runs degraded before it. It is the far
// future for other calls.
func (l *Locker) openEnd(ctx context.Context, open bool, start time.Time) time.Time {
	if dl, ok := ctx.Deadline(); ok && open {
		return start.Add(time.Until(dl) / 2) // real time, as ctx's deadline
	}
	return start.Add(forever)
}

// forever is further off than any lock's TTL or any call's wait.
const forever = 10 * maxTTL
