package fencelock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fencelock/fencelock/internal/backoff"
	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/store"
	"github.com/fencelock/fencelock/internal/tasks"
)

// An acquisition is one Acquire call across its attempts: what it learnt,
// and the steps every way of waiting shares. Plain waiting is here, fair
// waiting in fair.go.
type acquisition struct {
	l       *Locker
	ctx     context.Context
	lease   *Lease
	st      *acquireStats // nil without an Observer
	open    bool          // the call fails open: its attempts are bounded by half the time left
	start   time.Time     // on the Locker's clock
	waitEnd time.Time
	openEnd time.Time // when a fail-open call stops waiting out an outage

	verdict error // the last attempt's: busy, or a callError; nil: none yet
	seen    busySeen
	unsure  bool         // an attempt's outcome is unknown: it may have taken the lock
	wake    store.Wakeup // plain waiting's wake-ups; nil without WithWait
	letGo   func()       // fair waiting's give-back (fair.go); nil: plain waiting's, letGoPlain
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
// first: it may have taken the lock; a failed dial meanwhile is the verdict.
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

// failed records at's error as the verdict, and reports whether Redis
// refused the lock's commands: retrying cannot help.
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

// rotate gives the call h, a new token's lease.
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
	if a.unsure { // an earlier attempt may reset the expiry to this TTL after a longer Extend
		lease.floorTTL = lease.ttl
	}
	if log := a.l.opts.Logger; log.Enabled(a.ctx, slog.LevelDebug) {
		log.LogAttrs(a.ctx, slog.LevelDebug, "fencelock: acquired", slog.String("lock", lease.name),
			slog.Int64("fence", fence), slog.Duration("ttl", lease.ttl), slog.Duration("waited", from.Sub(a.start)))
	}
	return lease
}

// letGoPlain is letGo for plain waiting.
func (a *acquisition) letGoPlain() {
	switch {
	case a.wake == nil:
		if a.unsure {
			a.l.abandon(a.lease)
		}
	case a.unsure:
		a.l.abandon(a.lease) // out of a Redlock line too
		a.wake.Leave(nil, false)
	default:
		a.wake.Leave(a.lease.h, false)
	}
}

// giveUp ends the call without the lock, giving back what it may hold: the
// error is the last verdict, with ctx's when ctx ended, or ctx's alone.
func (a *acquisition) giveUp() (*Lease, error) {
	if a.letGo != nil {
		a.letGo()
	} else {
		a.letGoPlain()
	}
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

// plain runs the attempts of an Acquire that is not fair, each followed by
// a pause (the backoff, cut short by a wake-up or the holder's expiry).
func (a *acquisition) plain() (*Lease, error) {
	l := a.l
	if a.waitEnd.After(a.start) {
		a.wake = a.lease.h.Wakeup() // before the first attempt: a Redlock's puts the call in line
	}
	p := &pauses{a: a, bo: backoff.Backoff{Min: l.opts.MinRetryBackoff, Max: l.opts.MaxRetryBackoff}}
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
				if a.wake != nil {
					a.wake.Leave(nil, true)
				}
				return a.complete(at.Fence, start), nil
			}
			a.unsure = true // granted after the lease's deadline: another attempt of the token renews it
			a.verdict = &opError{msg: ErrUnavailable.Error() + ": the reply came after the lease's deadline",
				errs: []error{ErrUnavailable}}
			if l.clock.Now().Before(a.waitEnd) {
				continue
			}
		default:
			a.busy(at, start)
		}
		if at.Retire { // the store gives back what it may hold
			a.rotate(a.lease.h.Next(keys.NewToken()))
		}
		if !p.sleep(at) {
			return a.giveUp()
		}
	}
}

// pauses are the pauses between a plain Acquire's attempts.
type pauses struct {
	a      *acquisition
	bo     backoff.Backoff
	wokeAt time.Time // the wake-up before the coming attempt; zero: none
}

// sleep pauses after the attempt at, and reports false when the call must
// give up: its wait (or a fail-open call's outage) ended, ctx ended, or
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
	ch, sleep := p.a.wake.Next(at, busy, p.bo.Next())
	sleep = min(sleep, end.Sub(now))
	if busy && at.Busy.TTL >= 0 && at.Busy.TTL < sleep {
		sleep = max(at.Busy.TTL, time.Millisecond) // the holder's lock expires first
	}
	t := l.clock.NewTimer(sleep)
	defer t.Stop()
	slept := l.clock.Now()
	p.wokeAt = time.Time{}
	select {
	case <-a.ctx.Done():
		return false
	case <-l.closed:
		return false
	case <-t.C:
	case <-ch:
		p.wokeAt = l.clock.Now()
		if spread := p.a.wake.Woken(); spread > 0 && !l.pause(a.ctx, spread) {
			return false
		}
	}
	if ch != nil {
		select { // wake-ups before this attempt: it sees what they announced
		case <-ch:
			_ = p.a.wake.Woken() // woken all the same, with the attempt next
		default:
		}
	}
	if a.st != nil {
		a.st.waited += l.clock.Now().Sub(slept)
	}
	return true
}

// try runs one attempt for lease, bounded by ctx, Close and AttemptTimeout
// (for a fail-open call, half the time left). With done false, ctx ended or
// Close was called first: it may have taken the lock. An attempt that
// outlived AttemptTimeout alone is a verdict: a *noReplyError.
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
	if done && a.OK && l.isClosed() { // no lease after Close: the caller gives it back
		return a, false
	}
	if done && (a.Err == nil || (classify(a.Err) != store.NoVerdict && (ctxErr(actx) == nil || !store.Timeout(a.Err)))) {
		return a, true
	}
	if ctxErr(ctx) != nil || l.isClosed() {
		return a, false
	}
	cause, unsent := l.store.Since(mark) // a failed dial names the cause; unsent only with no connection at all
	return store.Attempt{Err: &noReplyError{timeout: timeout, half: half, cause: cause, unsent: unsent}}, true
}
