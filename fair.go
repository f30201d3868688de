package fencelock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/tasks"
)

// queueEntryTTL is how long a fair waiter's queue entry lives without a
// keep-alive: a waiter that crashed is skipped after it. A release within
// it may still hand the lock to a waiter that has just crashed; the lock
// then expires after that waiter's TTL.
const queueEntryTTL = 2 * time.Second

// queueKeepAlive is how often, at most, a fair waiter keeps its entry
// alive; see keepAliveEvery.
const queueKeepAlive = queueEntryTTL / 4

// keepAliveEvery is how often a fair waiter of a lock with ttl asks the
// server: every queueKeepAlive, and at least three times a TTL, so that the
// send time of the last answer "still waiting", from which a grant's
// Deadline counts, is never more than a third of the TTL old.
func keepAliveEvery(ttl time.Duration) time.Duration {
	return min(queueKeepAlive, max(ttl/3, 10*time.Millisecond))
}

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
	fence int64         // queueGranted
	pttl  time.Duration // queueGranted, queueWaiting: the lock's PTTL (-2: free)
}

func (d *deployment) queue(ctx context.Context, lease *Lease, ttl time.Duration, mode string) (queueReply, error) {
	reply, err := evalScript(ctx, d.client, script.Queue, false,
		[]any{lease.keyArgs[keys.LockKey], lease.keyArgs[keys.QueueKey], lease.keyArgs[keys.QueueInfoKey]},
		[]any{lease.tokenArg, mode, queueEntryMillis, d.l.ttlArg(ttl), lease.ownerArg}).Slice()
	if err != nil {
		return queueReply{}, err
	}
	return decodeQueue(reply)
}

// decodeQueue decodes the reply of queue.lua, and of a kind's own line
// (semaphore_queue.lua), which answers alike.
func decodeQueue(reply []any) (queueReply, error) {
	r := queueReply{pttl: -2}
	if len(reply) > 0 {
		r.state, _ = reply[0].(int64)
	}
	ok := len(reply) > 0
	switch r.state {
	case queueGranted:
		ok = len(reply) == 3
		if ok {
			s, _ := reply[1].(string)
			_, r.fence, _ = keys.Parse("x " + s)
			pttl, _ := reply[2].(int64)
			r.pttl = time.Duration(pttl) * time.Millisecond
			ok = r.fence > 0
		}
	case queueWaiting:
		if len(reply) == 2 {
			pttl, _ := reply[1].(int64)
			r.pttl = time.Duration(pttl) * time.Millisecond
		}
	}
	if !ok {
		return queueReply{}, fmt.Errorf("%w from the queue script: %v", errReply, reply)
	}
	return r, nil
}

// fair runs the attempts of an Acquire with WithFair and WithWait, as
// "How fair waiting works" (GUARANTEES.md) tells: it subscribes first, joins
// the line with its first attempt, then waits for a grant, keeping its entry
// alive (keepAliveEvery, and at the holder's expiry), until the wait or ctx
// ends. A grant's Deadline counts from the send time of the last request the
// server answered "still waiting", or, for a keep-alive that brought the
// grant, from its send time plus the PTTL it read, if that is later.
func (a *acquisition) fair() (*Lease, error) {
	l, ctx := a.l, a.ctx
	if ctxErr(ctx) != nil { // before subscribing: no Redis call
		return nil, ctxEnded(ctx, fmt.Sprintf("acquire %q", a.lease.name))
	}
	a.lease.fair = true
	every := keepAliveEvery(a.lease.ttl)
	retryEvery := max(every, 100*time.Millisecond) // after an error: not a request per 10ms to a failing Redis
	var (
		waiting  = a.start        // before the server last answered "waiting", or before the token existed
		askAt    time.Time        // the next keep-alive's time, counted from the last one's send time
		inflight chan queueResult // the outcome of the keep-alive in flight, if one is
		sent     time.Time        // when it was sent
		askAgain bool             // a wake-up came while it was in flight: ask again once it is answered
		joined   bool             // the queue has (or may have) an entry of this token
		// trust: a grant's message for this token is current. Once the token
		// may have been granted the lock unseen (an attempt of unknown
		// outcome, an entry found gone) and joins the line again, a message
		// could bring that earlier grant, expired since: from then on a
		// message only makes the waiter ask the server with a keep-alive.
		trust = true
		// short: the last lock taken was short of replicas and given back.
		// The next attempt comes after a pause, whatever wakes the waiter
		// meanwhile: a release tells nothing about the replicas, and may
		// be this waiter's own give-back, with the next still under way.
		short      bool
		attemptNow = true
		g          = &grantee{token: a.lease.token, granted: make(chan int64, 1)}
		w          = l.b.register(a.lease.keys[keys.LockKey], g) // nil after Close, which the wait below hears
	)
	defer func() {
		if w != nil {
			w.leave()
		}
	}()
	a.letGo = func() {
		if joined || a.unsure {
			l.leaveQueue(a.lease)
		}
	}
	// untilExpiry is when to ask next, from a request's send time, given the
	// holder's PTTL the server read after it: at its expiry (the lock is then
	// free, and the first in line takes it) if that comes before the next
	// keep-alive. From the send time: a slow link does not stretch the period.
	untilExpiry := func(pttl time.Duration) time.Duration {
		if pttl >= 0 { // 0: it expires within the millisecond
			return min(every, pttl+time.Millisecond)
		}
		return every
	}
	// rotate waits on with a new token (leaving the line with the old one,
	// in the background, if leave), which joins the line afresh: a grant to
	// the old one must not count for the new one.
	rotate := func(leave bool) {
		if leave {
			l.leaveQueue(a.lease)
		}
		a.rotate()
		joined, waiting, attemptNow, trust = false, l.clock.Now(), true, true
		inflight = nil // its outcome is the old token's
		if w != nil {
			w.leave()
		}
		g = &grantee{token: a.lease.token, granted: make(chan int64, 1)}
		w = l.b.register(a.lease.keys[keys.LockKey], g)
	}
	// obtained completes a lease whose lock was taken or granted with
	// fence, its Deadline counting from from, or from bound if later. It
	// returns nil, nil when the waiter waits on with a new token.
	obtained := func(fence int64, from, bound time.Time, granted bool) (*Lease, error) {
		lease := a.complete(fence, from)
		if bound.After(lease.deadline) {
			lease.deadline = bound
		}
		// A grant too long ago to count on is renewed now, from a time
		// known to come before the new expiry; with Replicas, every grant
		// is, so that it counts only once replicas have it (the release
		// that granted it did not WAIT).
		if !l.clock.Now().Before(lease.deadline) || (granted && l.opts.Replicas > 0) {
			err, done := tasks.Call(l.bg, ctx.Done(), l.closed, func() error { return lease.extend(ctx, lease.ttl, false, new(extendState)) }, nil)
			switch {
			case !done: // ctx ended, or Close: the lock may be this waiter's
				joined = true
				return a.giveUp()
			case err == nil:
			case errors.Is(err, ErrNotHeld) && l.clock.Now().Before(a.waitEnd):
				// It expired before this waiter came to it (a pause):
				// wait in line again.
				rotate(a.unsure)
				return nil, nil
			case isReplicaShort(err) && l.clock.Now().Before(a.waitEnd):
				// Granted, but not on enough replicas to survive a
				// failover: pass it on (leaving the line releases it),
				// and join the line again at its end after a pause.
				a.verdict = err
				rotate(true)
				attemptNow, short, askAt = false, true, l.clock.Now().Add(retryEvery)
				return nil, nil
			default:
				a.verdict = err // lease.extend's error reads as Acquire's
				joined = true   // so that giveUp gives the lock back, or passes it on
				return a.giveUp()
			}
		}
		if a.st != nil {
			a.st.waited = l.clock.Now().Sub(a.start)
		}
		return lease, nil
	}

	for {
		if a.ended() {
			return a.giveUp()
		}
		now := l.clock.Now()
		if attemptNow {
			attemptNow, short = false, false
			if w != nil { // a wake-up that came before the attempt tells nothing new
				w.drain()
			}
			at, done := a.try()
			if !done {
				return a.giveUp()
			}
			switch {
			case at.err != nil && at.retire:
				// Taken without enough replicas: the backend gives it
				// back and retires the token (taking the lock took its
				// entry out of the line).
				a.verdict = callError(a.lease.name, at.err)
				if !now.Before(a.waitEnd) {
					return a.giveUp()
				}
				rotate(false)
				attemptNow, short, askAt = false, true, l.clock.Now().Add(retryEvery)
			case at.err != nil:
				refused := a.failed(at)
				askAt = l.clock.Now().Add(retryEvery) // in line or not, not at once
				if refused {
					return a.giveUp()
				}
			case at.ok:
				if got, err := obtained(at.fence, now, time.Time{}, false); got != nil || err != nil {
					return got, err
				}
				continue
			default:
				a.busy(at, now)
				waiting, joined, askAt = now, true, now.Add(untilExpiry(at.pttl))
			}
		}
		end := a.waitEnd
		if !joined && a.openEnd.Before(end) && errors.Is(a.verdict, ErrUnavailable) {
			end = a.openEnd // an outage, for a fail-open call
		}
		if !now.Before(end) {
			return a.giveUp()
		}
		var wake <-chan struct{}
		var granted <-chan int64
		if w != nil {
			wake, granted = w.wake, g.granted
			if short { // not in line: rotate left it
				wake = nil
			}
		}
		now = l.clock.Now()
		due := end
		if inflight == nil {
			if !joined && askAt.Before(now) { // the attempt failed: try again in a while
				askAt = now.Add(retryEvery)
			}
			if askAt.Before(due) {
				due = askAt
			}
		}
		t := l.clock.NewTimer(max(0, due.Sub(now)))
		select {
		case <-ctx.Done():
			t.Stop()
			a.unsure = a.unsure || inflight != nil
			return a.giveUp()
		case <-l.closed:
			t.Stop()
			a.unsure = a.unsure || inflight != nil
			return a.giveUp()
		case fence := <-granted:
			t.Stop()
			if trust {
				if a.st != nil {
					a.st.handoff = 0
				}
				if got, err := obtained(fence, waiting, time.Time{}, true); got != nil || err != nil {
					return got, err
				}
				continue
			}
			askAgain = inflight != nil // not trusted: ask the server
		case <-wake:
			t.Stop()
			askAgain = inflight != nil // its answer may predate what this wake-up is about
		case <-t.C:
			if !l.clock.Now().Before(end) {
				continue // and give up
			}
		case r := <-inflight:
			t.Stop()
			inflight = nil
			switch {
			case r.err != nil && ctxErr(ctx) != nil:
				a.unsure = true
				return a.giveUp()
			case r.err != nil:
				a.verdict = callError(a.lease.name, r.err) // keep waiting: the entry lives on for a while
				askAt = l.clock.Now().Add(retryEvery)
			case r.r.state == queueGranted:
				var bound time.Time
				if r.r.pttl > 0 {
					bound = sent.Add(r.r.pttl - drift(r.r.pttl))
				}
				if got, err := obtained(r.r.fence, waiting, bound, true); got != nil || err != nil {
					return got, err
				}
			case r.r.state == queueWaiting:
				a.verdict = a.seen.see(stillBusy(a.verdict, a.lease.name, r.r.pttl), sent) // in line: not an outage
				waiting, askAt = sent, sent.Add(untilExpiry(r.r.pttl))
				if askAgain {
					askAt = sent
				}
			case r.r.state == queueGone:
				// The entry expired (this waiter was paused, say), or a
				// grant this waiter missed ended: join again.
				attemptNow, trust = true, false
			case r.r.state == queueFirst:
				attemptNow = true // take the free lock
			}
			continue
		}
		if !joined {
			// Not in line: the attempt failed. Try again; if it may have
			// reached Redis, it may have joined the line and been granted
			// the lock meanwhile.
			attemptNow, trust = true, trust && !a.unsure
			continue
		}
		if inflight == nil {
			// Keep the entry alive, and learn of a grant whose message
			// was lost. The keep-alive runs while the waiter goes on
			// waiting: a grant's message that comes meanwhile counts at
			// once, without waiting for its answer.
			sent, askAgain = l.clock.Now(), false
			inflight = l.keepAlive(ctx, a.lease)
		}
	}
}

// A grantee is the hearer of a fair waiter: a grant ("granted <token>
// <fence>", release.lua) goes to its grantee only, which gets the fence; the
// others have nothing to try, the lock being held again. Every other
// message wakes it.
type grantee struct {
	token   string
	granted chan int64 // buffered
}

func (g *grantee) hear(_ *waiter, m message) hearing {
	if m.head != "granted" {
		return wakeAll
	}
	token, f, _ := strings.Cut(m.rest, " ")
	if fence, _ := strconv.ParseInt(f, 10, 64); token == g.token && fence > 0 {
		select {
		case g.granted <- fence:
		default:
		}
	}
	return ignore
}

func (*grantee) lingers(*waiter) bool { return true }

// stillBusy is the verdict of a fair waiter that the server answered "still
// waiting", the lock's PTTL pttl (-2: free, others ahead in line): busy,
// whatever an earlier keep-alive's error said, with the holder named by
// verdict when it was busy.
func stillBusy(verdict error, name string, pttl time.Duration) *BusyError {
	b := &BusyError{Name: name, TTL: pttl}
	var was *BusyError
	if errors.As(verdict, &was) {
		b.Owner, b.Holders = was.Owner, was.Holders
	}
	if pttl < -1 {
		b.TTL, b.Owner = -3, "fair waiters in line"
	}
	return b
}

// keepAlive sends a fair waiter's keep-alive on a goroutine that the Locker
// tracks, and returns the channel of its outcome. It reads the lease's TTL
// here: once a grant is taken, the lease is its caller's, who may extend it
// while the keep-alive is still in flight.
func (l *Locker) keepAlive(ctx context.Context, lease *Lease) chan queueResult {
	c := make(chan queueResult, 1)
	ttl := lease.ttl
	l.bg.Add()
	go func() {
		defer l.bg.Done()
		r, err := l.queue(ctx, lease, ttl, queueKeep)
		c <- queueResult{r, err}
	}()
	return c
}

// queue keeps a fair waiter's entry alive, or takes it out (mode), in the
// line of the lock, or of the lease's own kind if it has one.
func (l *Locker) queue(ctx context.Context, lease *Lease, ttl time.Duration, mode string) (queueReply, error) {
	if o, ok := lease.kind.(ownKeys); ok {
		return o.queue(ctx, lease, ttl, mode)
	}
	return l.fair.queue(ctx, lease, ttl, mode)
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
//
// It leaves the queue again after the token is retired: a late copy of an
// attempt that arrived between the first leave and the retirement joined
// the queue again (the retirement refuses the later ones), and a release
// may have granted it the lock since, which is given back too.
func (l *Locker) leaveQueue(lease *Lease) {
	ttl := lease.ttl
	l.giveBack(lease, "leaving the fair queue", func(ctx context.Context) (bool, error) {
		var deleted bool
		for pass := range 2 {
			r, err := l.queue(ctx, lease, ttl, queueLeave)
			if err != nil {
				return deleted, callError(lease.name, err)
			}
			if pass == 1 && r.state != queueGranted {
				break // out of line, and retired: nothing more can join
			}
			code, perr, err := lease.runRelease(ctx, modeAbandon)
			if err != nil {
				return deleted, callError(lease.name, err)
			}
			l.warnPublish(lease.name, perr)
			deleted = deleted || code == 1
		}
		return deleted, nil
	})
}
