package fencelock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fencelock/fencelock/internal/backoff"
	"github.com/fencelock/fencelock/internal/store"
	"github.com/fencelock/fencelock/internal/tasks"
)

// An acquisition is one Acquire call across its attempts: what it learnt
// (the verdict, the holder it saw, whether an attempt may have taken the
// lock unseen) and the steps every way of waiting shares: try once, take a
// new token, complete the lease, give up. Plain waiting is acquisition.plain,
// here: attempts, with pauses cut short by the store's wake-ups; fair
// waiting is in fair.go.
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

// acquireStats is what an Observer learns of an Acquire.
type acquireStats struct {
	waited  time.Duration // asleep between attempts
	handoff time.Duration // from the wake-up before the winning attempt to the grant
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
func (a *acquisition) try() (at store.Attempt, done bool) {
	mark := a.l.store.Mark()
	at, done = a.l.try(a.ctx, a.lease, a.open)
	if !done {
		a.unsure = true
		if cause, _ := a.l.store.Since(mark); cause != nil {
			a.verdict = callError(a.lease.name, cause)
		}
	}
	return at, done
}

// failed records at's error as the verdict, and reports whether retrying
// cannot help (Redis refused the lock's commands).
func (a *acquisition) failed(at store.Attempt) (refused bool) {
	a.verdict = callError(a.lease.name, at.Err)
	if at.Free {
		a.seen = busySeen{} // the holder it saw is gone
	}
	if !store.Unsent(at.Err) || at.Retire {
		a.unsure = true
	}
	return classify(at.Err) == store.Misconfigured
}

// busy records at, an answer to the attempt sent at sent, as the verdict.
func (a *acquisition) busy(at store.Attempt, sent time.Time) {
	b := at.Busy
	name := a.lease.name
	if b.Name != "" {
		name = b.Name
	}
	a.verdict = a.seen.see(&BusyError{Name: name, Owner: b.Owner, TTL: b.TTL, Holders: b.Holders}, sent)
}

// rotate gives the call a new token from h, which a clean-up of the old
// one, or a late copy of one of its attempts, cannot touch.
func (a *acquisition) rotate(h store.Lease) {
	old := a.lease
	a.lease = &Lease{locker: a.l, h: h, name: old.name, ttl: old.ttl, owner: old.owner}
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
			slog.Duration("waited", l.clock.Now().Sub(a.start)), slog.Any("verdict", a.verdict), slog.Any("ctx", ctxE))
	}
	if a.verdict == nil {
		return nil, ctxEnded(a.ctx, fmt.Sprintf("acquire %q", a.lease.name))
	}
	return nil, withCtx(a.verdict, ctxE)
}

// plain runs the attempts of an Acquire that is not fair: each attempt
// either takes the lock, or is followed by a pause (the backoff, cut short
// by the store's wake-ups and by the holder's expiry) until the wait ends.
func (a *acquisition) plain() (*Lease, error) {
	l := a.l
	var wake store.Wakeup
	if a.waitEnd.After(a.start) {
		wake = a.lease.h.Wakeup() // before the first attempt: a Redlock's puts the call in line
	}
	p := &pauses{a: a, wake: wake, bo: backoff.Backoff{Min: l.opts.MinRetryBackoff, Max: l.opts.MaxRetryBackoff}}
	a.letGo = func() {
		switch {
		case wake == nil:
			if a.unsure {
				l.abandon(a.lease)
			}
		case a.unsure:
			l.abandon(a.lease) // out of a Redlock line too
			wake.Leave(nil, false)
		default:
			wake.Leave(a.lease.h, false)
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
		case at.Err != nil:
			if a.failed(at) {
				return a.giveUp()
			}
		case at.OK:
			if l.clock.Now().Before(start.Add(a.lease.ttl - drift(a.lease.ttl))) {
				if a.st != nil && !p.wokeAt.IsZero() {
					a.st.handoff = l.clock.Now().Sub(p.wokeAt)
				}
				if wake != nil {
					wake.Leave(nil, true)
				}
				return a.complete(at.Fence, start), nil
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
		if at.Retire {
			// The try may hold the lock somewhere without having got it;
			// the store gives that back in the background.
			a.rotate(a.lease.h.Next(newToken()))
		}
		if !p.sleep(at) {
			return a.giveUp()
		}
	}
}

// pauses are the pauses between a plain Acquire's attempts.
type pauses struct {
	a      *acquisition
	wake   store.Wakeup // nil when the call does not wait
	bo     backoff.Backoff
	wokeAt time.Time // the wake-up before the coming attempt; zero: none
}

// sleep pauses after the attempt at, and reports false when the call must
// give up: its wait (or a fail-open call's outage) has ended, ctx ended or
// Close was called.
func (p *pauses) sleep(at store.Attempt) bool {
	a, l := p.a, p.a.l
	now := l.clock.Now()
	end := a.waitEnd
	if a.openEnd.Before(end) && errors.Is(a.seen.verdict(a.verdict, now), ErrUnavailable) {
		end = a.openEnd
	}
	if !now.Before(end) {
		return false
	}
	busy := errors.Is(a.verdict, ErrNotObtained)
	ch, sleep := p.wake.Next(at, busy, p.bo.Next())
	sleep = min(sleep, end.Sub(now))
	if busy && at.Busy.TTL >= 0 && at.Busy.TTL < sleep {
		sleep = max(at.Busy.TTL, time.Millisecond) // the holder's lock expires first
	}
	t := l.clock.NewTimer(sleep)
	slept := l.clock.Now()
	p.wokeAt = time.Time{}
	select {
	case <-a.ctx.Done():
		t.Stop()
		return false
	case <-l.closed:
		t.Stop()
		return false
	case <-t.C:
	case <-ch:
		t.Stop()
		p.wokeAt = l.clock.Now()
		if spread := p.wake.Woken(); spread > 0 && !l.pause(a.ctx, spread) {
			return false
		}
	}
	if ch != nil {
		select { // wake-ups before this attempt: it sees what they announced
		case <-ch:
			_ = p.wake.Woken() // woken all the same, with the attempt next
		default:
		}
	}
	if a.st != nil {
		a.st.waited += l.clock.Now().Sub(slept)
	}
	return true
}

// try runs one attempt of an Acquire for lease, bounded by ctx, by Close,
// and by AttemptTimeout (see Options; open: the call fails open). With done
// false, ctx ended or Close was called before the attempt gave a verdict:
// it may still be in flight, on a goroutine the Locker tracks, or have
// taken the lock as Close was called. An attempt that outlived
// AttemptTimeout alone is a verdict: a *noReplyError, which names the cause
// when a dial failed while it ran.
func (l *Locker) try(ctx context.Context, lease *Lease, open bool) (a store.Attempt, done bool) {
	timeout, half := l.opts.AttemptTimeout, false
	if dl, ok := ctx.Deadline(); ok && open {
		if left := time.Until(dl) / 2; left < timeout { // real time, as ctx's deadline
			timeout, half = max(left, time.Millisecond), true
		}
	}
	actx, cancel := l.deadlines.WithTimeout(ctx, timeout)
	defer cancel()
	mark := l.store.Mark()
	done = true
	if l.traits.Stops || (ctx.Done() == nil && l.traits.Deadlines) { // it returns by actx's end by itself
		a = lease.h.Acquire(actx)
		if a.Err != nil && l.isClosed() {
			return a, false
		}
	} else {
		a, done = tasks.Call(l.bg, actx.Done(), l.closed, func() store.Attempt { return lease.h.Acquire(actx) }, nil)
	}
	if done && a.OK && l.isClosed() {
		// Close was called while it ran (on the caller's goroutine, or
		// within call's grace): no lease after Close; the caller gives
		// back the lock it took, as one it may have taken.
		return a, false
	}
	if done && (a.Err == nil || (classify(a.Err) != store.NoVerdict && (ctxErr(actx) == nil || !store.Timeout(a.Err)))) {
		return a, true
	}
	if ctxErr(ctx) != nil || l.isClosed() {
		return a, false
	}
	// A failed dial of the client is no evidence about this attempt's own
	// request, which may have gone on a connection already open while
	// another call failed to dial: it was not sent only when it had no
	// connection to go on (see Store.Since).
	cause, unsent := l.store.Since(mark)
	return store.Attempt{Err: &noReplyError{timeout: timeout, half: half, cause: cause, unsent: unsent}}, true
}

// A noReplyError is an attempt that got no reply within its bound. It
// matches the failed dial that explains it, when dials failed meanwhile.
type noReplyError struct {
	timeout time.Duration
	half    bool // the bound was half the time left before the deadline, for fail-open
	cause   error
	unsent  bool // the script was provably not sent
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

// Unsent reports whether the attempt was provably not sent.
func (e *noReplyError) Unsent() bool { return e.unsent }

// busySeen is the last busy answer of an Acquire, and until when, at least,
// the holder it named holds the lock: an outage after it is no reason to
// fail open while that lasts. An attempt that finds the lock free ends it.
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
