package fencelock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Fair waiting, as documented in doc.go: a fair waiter joins the lock's
// queue, keeps its entry alive, and a release hands the lock to the first
// live waiter in line (release.lua), which holds it when the grant's
// message arrives.

// queueEntryTTL is how long a fair waiter's queue entry lives without a
// keep-alive: a waiter that crashed is skipped after it. A release within
// it may still hand the lock to a waiter that has just crashed; the lock
// then expires after that waiter's TTL.
const queueEntryTTL = 2 * time.Second

// queueKeepAlive is how often a fair waiter keeps its entry alive.
const queueKeepAlive = queueEntryTTL / 4

var queueEntryMillis any = ttlMillis(queueEntryTTL)

// Queue script modes and replies (queue.lua).
const (
	queueKeep  = "k"
	queueLeave = "d"

	queueWaiting = 0
	queueGranted = 1
	queueGone    = 3
	queueFirst   = 4
)

// queueReply is queue.lua's reply.
type queueReply struct {
	state int64
	fence int64 // queueGranted
}

func (d *deployment) queue(ctx context.Context, lease *Lease, mode string) (queueReply, error) {
	reply, err := evalScript(ctx, d.client, queueScript, false,
		[]any{lease.keyArgs[keyLock], lease.keyArgs[keyQueue], lease.keyArgs[keyQueueInfo]},
		[]any{lease.tokenArg, mode, queueEntryMillis, d.l.ttlArg(lease.ttl), lease.ownerArg}).Slice()
	if err != nil {
		return queueReply{}, err
	}
	r := queueReply{}
	r.state, _ = reply[0].(int64)
	if r.state == queueGranted && len(reply) == 2 {
		s, _ := reply[1].(string)
		_, r.fence, _ = parseValue("x " + s)
	}
	return r, nil
}

func (q *quorum) queue(context.Context, *Lease, string) (queueReply, error) {
	return queueReply{}, invalidf("fair waiting on a Redlock")
}

// acquireFair is Acquire with WithFair and WithWait: the first attempt
// takes the lock or joins its queue; then the waiter waits for a grant,
// keeping its entry alive, until the wait or ctx ends.
//
// A granted lease's Deadline counts from the send time of the last call the
// server answered "still waiting" (the first attempt, or a keep-alive): the
// grant, and so the lock's TTL, came after the server answered it.
//
// A grant's message is believed only while it cannot be stale: once the
// token may have been granted the lock without this waiter knowing (the
// first attempt's outcome is unknown, or the entry was found gone) and the
// token joins the line again, a message could still bring that earlier
// grant, whose lock has expired since. From then on a message only makes
// the waiter ask with a keep-alive, whose answer is the server's state.
func (l *Locker) acquireFair(ctx context.Context, lease *Lease, wait time.Duration, st *acquireStats) (*Lease, error) {
	lease.fair = true
	callStart := l.clock.Now()
	waitEnd := callStart.Add(wait)
	var (
		verdict    error     // the last verdict: busy, or a callError
		unsure     bool      // an attempt or a keep-alive whose outcome is unknown
		waiting    time.Time // sent before the server last answered "waiting"
		w          *waiter
		joined     bool   // the queue has (or may have) an entry of this token
		trust      = true // a grant message for this token is current
		attemptNow = true
	)
	defer func() {
		if w != nil {
			w.leave()
		}
	}()
	giveUp := func() (*Lease, error) {
		if joined || unsure {
			l.leaveQueue(lease)
		}
		l.opts.Logger.LogAttrs(ctx, slog.LevelDebug, "fencelock: not obtained (fair)",
			slog.String("lock", lease.name), slog.Duration("waited", l.clock.Now().Sub(callStart)),
			slog.Any("verdict", verdict))
		ctxE := ctxErr(ctx)
		if verdict == nil {
			return nil, ctxEnded(ctx, fmt.Sprintf("acquire %q", lease.name))
		}
		return nil, withCtx(verdict, ctxE)
	}
	obtained := func(fence int64, from time.Time) (*Lease, error) {
		lease.fence = fence
		lease.acquired = from
		lease.deadline = from.Add(lease.ttl - drift(lease.ttl))
		if unsure {
			lease.floorTTL = lease.ttl
		}
		if !l.clock.Now().Before(lease.deadline) {
			// Granted, but too long ago to count on: renew it now, from a
			// time known to come before the new expiry.
			err := lease.extend(ctx, lease.ttl, false, new(extendState))
			switch {
			case errors.Is(err, ErrNotHeld) && l.clock.Now().Before(waitEnd):
				// It expired before this waiter came to it (a pause):
				// wait in line again, with a new token. A late copy of
				// an attempt of unknown outcome must not take the lock
				// for the old one.
				if unsure {
					l.leaveQueue(lease)
				}
				next := l.newLease(lease.name, lease.ttl)
				next.owner, next.ownerArg, next.fair = lease.owner, lease.ownerArg, true
				lease, unsure, joined, waiting, attemptNow, trust = next, false, false, time.Time{}, true, true
				if w != nil {
					w.leave()
					w = nil
				}
				return nil, nil
			case err != nil:
				verdict = callError(lease.name, err)
				return giveUp()
			}
		}
		if st != nil {
			st.waited = l.clock.Now().Sub(callStart)
		}
		return lease, nil
	}

	for {
		if ctxErr(ctx) != nil {
			return giveUp()
		}
		now := l.clock.Now()
		if attemptNow {
			attemptNow = false
			a, done := call(l, ctx.Done(), nil, func() attempt { return l.b.acquire(ctx, lease) }, nil)
			if !done || (a.err != nil && (classify(a.err) == classNoVerdict || (ctxErr(ctx) != nil && isTimeout(a.err)))) {
				unsure = true
				return giveUp()
			}
			switch {
			case a.err != nil:
				verdict = callError(lease.name, a.err)
				if !notSent(a.err) {
					unsure = true
				}
				if classify(a.err) == classMisconfigured {
					return giveUp()
				}
			case a.ok:
				if got, err := obtained(a.fence, now); got != nil || err != nil {
					return got, err
				}
				continue
			default:
				verdict = &BusyError{Name: lease.name, Owner: a.owner, TTL: a.pttl}
				waiting, joined = now, true
			}
			if w == nil && joined {
				w = l.b.register(lease.keys[keyLock], lease.token)
			}
		}
		if !now.Before(waitEnd) {
			return giveUp()
		}
		var wake <-chan struct{}
		var granted <-chan int64
		if w != nil {
			wake, granted = w.wake, w.granted
		}
		t := l.clock.NewTimer(min(queueKeepAlive, waitEnd.Sub(now)))
		select {
		case <-ctx.Done():
			t.Stop()
			return giveUp()
		case fence := <-granted:
			t.Stop()
			if trust {
				if st != nil {
					st.handoff = 0
				}
				if got, err := obtained(fence, waiting); got != nil || err != nil {
					return got, err
				}
				continue
			}
		case <-wake:
			t.Stop()
		case <-t.C:
		}
		if !joined {
			// Not in line: the attempt failed. Try again; if it may have
			// reached Redis, it may have joined the line and been granted
			// the lock meanwhile.
			attemptNow, trust = true, trust && !unsure
			continue
		}
		// Keep the entry alive, and learn of a grant whose message was lost.
		sent := l.clock.Now()
		r, done := call(l, ctx.Done(), nil, func() queueResult {
			r, err := l.b.queue(ctx, lease, queueKeep)
			return queueResult{r, err}
		}, nil)
		switch {
		case !done || (r.err != nil && ctxErr(ctx) != nil):
			unsure = true
			return giveUp()
		case r.err != nil:
			verdict = callError(lease.name, r.err) // keep waiting: the entry lives on for a while
		case r.r.state == queueGranted:
			if got, err := obtained(r.r.fence, waiting); got != nil || err != nil {
				return got, err
			}
			continue
		case r.r.state == queueWaiting:
			waiting = sent
		case r.r.state == queueGone:
			// The entry expired (this waiter was paused, say), or a grant
			// this waiter missed ended: join again.
			attemptNow, trust = true, false
		case r.r.state == queueFirst:
			attemptNow = true // take the free lock
		}
	}
}

type queueResult struct {
	r   queueReply
	err error
}

// leaveQueue takes a fair waiter that gave up out of the lock's queue, in the
// background, and gives the lock back if a release granted it meanwhile
// (the release hands it on to the next in line) or an attempt of unknown
// outcome took it; the token is retired, as for any Acquire that gave up.
// See giveBack for how long it tries.
func (l *Locker) leaveQueue(lease *Lease) {
	l.giveBack(lease, "leaving the fair queue", func(ctx context.Context) (bool, error) {
		if _, err := l.b.queue(ctx, lease, queueLeave); err != nil {
			return false, callError(lease.name, err)
		}
		code, perr, err := lease.runRelease(ctx, modeAbandon)
		if err != nil {
			return false, callError(lease.name, err)
		}
		l.warnPublish(lease.name, perr)
		return code == 1, nil
	})
}
