package fencelock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
	"github.com/fencelock/fencelock/internal/tasks"
)

// Fair waiting ("How fair waiting works" in GUARANTEES.md): a fair Acquire
// joins the lock's line with its first attempt, then waits for a release to
// grant it the lock, keeping its entry alive, until the wait or ctx ends.

// single is one deployment's calls beyond its store, for fair waiting and the kinds.
type single interface {
	store.Store
	// Run runs s, with WAIT for Options.Replicas (*store.ReplicaError); Eval alone.
	Run(ctx context.Context, s *script.Script, eval bool, keys []any, argv ...any) (any, error)
	Eval(ctx context.Context, s *script.Script, keys []any, argv ...any) (any, error)
	// Took is the attempt of k's acquire script, given back if short of replicas.
	Took(ctx context.Context, k store.Lease, reply any, err error, a store.Attempt) store.Attempt
	GiveBack(k store.Lease, what string, ttl time.Duration)                // abandons k in the background
	Listen(key string, wake chan struct{}, h notify.Hearer) *notify.Waiter // nil after Close
	Releases(key string) store.Wakeup                                      // a plain waiter's wake-ups
	ChannelArg(key string, boxed any) any                                  // key's wake-up channel, as a script's argument
	MarkerArg(mode store.Mode, ttl time.Duration) any                      // how long a release in mode keeps a token's marker, in ms
	Subscribers(ctx context.Context, key string) (int, error)              // of key's wake-up channel
}

// A lineLease can wait in its lock's line of fair waiters: a lock's or a permit's.
type lineLease interface {
	store.Lease
	// Queue keeps the token's entry alive or, with leave, takes it out; a grant is for ttl.
	Queue(ctx context.Context, ttl time.Duration, leave bool) (queueReply, error)
}

// A fairLock is the lease of a lock that waits in the lock's line (queue.lua).
type fairLock struct {
	store.Lease
	l     *Locker
	keys  []any // the lock, its line and the line's entries
	owner string
}

// fairLock returns the lease of spec's token, which can wait in line.
func (l *Locker) fairLock(spec store.Spec) lineLease {
	ks := keys.ForLease(l.opts.KeyPrefix, spec.Name, spec.Token)
	return &fairLock{Lease: l.single.Lock(spec), l: l, owner: spec.Owner,
		keys: []any{ks[keys.LockKey], ks[keys.QueueKey], ks[keys.QueueInfoKey]}}
}

func (f *fairLock) Queue(ctx context.Context, ttl time.Duration, leave bool) (queueReply, error) {
	return queue(ctx, f.l.single, script.Queue, f.keys, f.Token(), leave, ttl, f.owner)
}

// queue runs line script s for token, keeping its entry alive or, with leave, taking
// it out: {1, "<fence> <owner>", pttl} granted, {0[, pttl]} waiting, {3} out, {4} first.
func queue(ctx context.Context, d single, s *script.Script, keys []any, token any, leave bool, ttl time.Duration, argv ...any) (queueReply, error) {
	mode := "k"
	if leave {
		mode = "d"
	}
	argv = append([]any{token, mode, store.Millis(store.QueueEntryTTL), store.Millis(ttl)}, argv...)
	reply, err := d.Eval(ctx, s, keys, argv...)
	if err != nil {
		return queueReply{}, err
	}
	arr, _ := reply.([]any)
	r := queueReply{State: queueState(replyFlag(arr)), PTTL: -2}
	ok := len(arr) > 0
	switch r.State {
	case lineGranted:
		ok = len(arr) == 3
		if ok {
			v, _ := arr[1].(string)
			f, _, _ := strings.Cut(v, " ")
			r.Fence, _ = strconv.ParseInt(f, 10, 64)
			pttl, _ := arr[2].(int64)
			r.PTTL = time.Duration(pttl) * time.Millisecond
			ok = r.Fence > 0
		}
	case lineWaiting:
		if len(arr) == 2 {
			pttl, _ := arr[1].(int64)
			r.PTTL = time.Duration(pttl) * time.Millisecond
		}
	}
	if !ok {
		return queueReply{}, store.BadReply(s.Name, reply)
	}
	return r, nil
}

// queueReply is what a fair waiter's keep-alive or departure found.
type queueReply struct {
	State queueState
	Fence int64         // lineGranted
	PTTL  time.Duration // lineGranted, lineWaiting: the lock's PTTL (-2: free, a waiter ahead takes it)
}

// queueState is where a fair waiter stands.
type queueState int8

const (
	lineWaiting   queueState = 0 // in line, its entry kept alive (after a departure: out of it)
	lineGranted   queueState = 1 // a release handed it the lock (after a departure: release it, to hand it on)
	lineOutOfLine queueState = 3 // its entry expired: join again
	lineFirst     queueState = 4 // the lock is free and it is first in line: take it
)

// replyFlag is the first element of a script's reply, what it says; -1 if none.
func replyFlag(arr []any) int64 {
	if len(arr) == 0 {
		return -1
	}
	flag, _ := arr[0].(int64)
	return flag
}

// keepAliveEvery is how often a fair waiter asks the server: at least thrice a TTL,
// as a grant's Deadline counts from the last "still waiting".
func keepAliveEvery(ttl time.Duration) time.Duration {
	return min(store.QueueEntryTTL/4, max(ttl/3, 10*time.Millisecond))
}

// A fairWait is one fair Acquire's state machine, with one method per event.
type fairWait struct {
	*acquisition
	queued func(store.Spec) lineLease
	spec   store.Spec
	q      lineLease // the current token's
	every  time.Duration
	retry  time.Duration // after an error: not a request per 10ms to a failing Redis

	waiting  time.Time        // before the server last answered "waiting", or before the token existed
	askAt    time.Time        // the next keep-alive's time, counted from the last one's send time
	inflight chan queueResult // the outcome of the keep-alive in flight, if one is
	sent     time.Time        // when it was sent
	askAgain bool             // a wake-up came while it was in flight: ask again once it is answered
	joined   bool             // the line has (or may have) an entry of this token
	// trust: a grant's message is current. Once the token may have been
	// granted unseen and joins again, a message could bring that expired
	// grant: it then only makes the waiter ask the server.
	trust bool
	// short: the last lock taken was short of replicas and given back; the
	// next attempt waits a pause, as a release says nothing of the replicas.
	short      bool
	attemptNow bool
	g          *grantee
	w          *notify.Waiter
}

type queueResult struct {
	r   queueReply
	err error
}

func newFairWait(a *acquisition, queued func(store.Spec) lineLease, spec store.Spec, q lineLease) *fairWait {
	every := keepAliveEvery(a.lease.ttl)
	f := &fairWait{acquisition: a, queued: queued, spec: spec, q: q, every: every, retry: max(every, 100*time.Millisecond),
		waiting: a.start, trust: true, attemptNow: true}
	a.letGo = func() {
		if f.joined || a.unsure {
			a.l.leaveQueue(a.lease, f.q)
		}
	}
	return f
}

// run runs the attempts and waits until it takes the lock or gives up.
func (f *fairWait) run() (*Lease, error) {
	if ctxErr(f.ctx) != nil { // before subscribing: no Redis call
		return nil, ctxEnded(f.ctx, fmt.Sprintf("acquire %q", f.lease.name))
	}
	f.listen()
	defer func() {
		if f.w != nil {
			f.w.Leave()
		}
	}()
	for {
		if f.ended() {
			return f.giveUp()
		}
		if f.attemptNow {
			if got, err, done := f.attempt(); done {
				return got, err
			}
			if f.attemptNow { // obtained, but waits on with a new token
				continue
			}
		}
		if got, err, done := f.wait(); done {
			return got, err
		}
	}
}

func (f *fairWait) quit() (*Lease, error, bool) {
	got, err := f.giveUp()
	return got, err, true
}

// listen registers the current token's grantee on the lock's channel.
func (f *fairWait) listen() {
	f.g = &grantee{token: f.q.Token(), granted: make(chan int64, 1)}
	f.w = f.l.single.Listen(f.q.Key(), nil, f.g)
}

// untilExpiry is when to ask next, from a request's send time: at the
// holder's expiry (pttl), when the first in line takes it, if that comes first.
func (f *fairWait) untilExpiry(pttl time.Duration) time.Duration {
	if pttl >= 0 { // 0: it expires within the millisecond
		return min(f.every, pttl+time.Millisecond)
	}
	return f.every
}

// rotate waits on with a new token (leaving with the old one if leave).
func (f *fairWait) rotate(leave bool) {
	if leave {
		f.l.leaveQueue(f.lease, f.q)
	}
	f.spec.Token = keys.NewToken()
	f.q = f.queued(f.spec)
	f.acquisition.rotate(f.q)
	f.joined, f.waiting, f.attemptNow, f.trust = false, f.l.clock.Now(), true, true
	f.inflight = nil // its outcome is the old token's
	if f.w != nil {
		f.w.Leave()
	}
	f.listen()
}

// attempt tries to take the lock, which joins the line when it is busy.
func (f *fairWait) attempt() (*Lease, error, bool) {
	f.attemptNow, f.short = false, false
	if f.w != nil { // a wake-up that came before the attempt tells nothing new
		f.w.Drain()
	}
	now := f.l.clock.Now()
	at, done := f.try()
	if !done {
		return f.quit()
	}
	switch {
	case at.Err != nil && at.Retire: // short of replicas: given back, the token retired
		f.verdict = callError(f.lease.name, at.Err)
		if at.Free {
			f.seen = busySeen{}
		}
		if !now.Before(f.waitEnd) {
			return f.quit()
		}
		f.rotate(false)
		f.attemptNow, f.short, f.askAt = false, true, f.l.clock.Now().Add(f.retry)
	case at.Err != nil:
		refused := f.failed(at)
		f.askAt = f.l.clock.Now().Add(f.retry) // in line or not, not at once
		if refused {
			return f.quit()
		}
	case at.OK:
		return f.obtained(at.Fence, now, time.Time{}, false)
	default:
		f.busy(at, now)
		f.waiting, f.joined, f.askAt = now, true, now.Add(f.untilExpiry(at.Busy.TTL))
	}
	return nil, nil, false
}

// wait waits for the next event: the end, a grant, a wake-up, a keep-alive due or answered.
func (f *fairWait) wait() (*Lease, error, bool) {
	l := f.l
	end := f.waitEnd
	if !f.joined && f.openEnd.Before(end) && errors.Is(f.verdict, ErrUnavailable) {
		end = f.openEnd // an outage, for a fail-open call
	}
	now := l.clock.Now()
	if !now.Before(end) {
		return f.quit()
	}
	var wake <-chan struct{}
	var granted <-chan int64
	if f.w != nil {
		wake, granted = f.w.C(), f.g.granted
		if f.short { // not in line: rotate left it
			wake = nil
		}
	}
	due := end
	if f.inflight == nil {
		if !f.joined && f.askAt.Before(now) { // the attempt failed: try again in a while
			f.askAt = now.Add(f.retry)
		}
		if f.askAt.Before(due) {
			due = f.askAt
		}
	}
	t := l.clock.NewTimer(max(0, due.Sub(now)))
	defer t.Stop()
	select {
	case <-f.ctx.Done():
		f.unsure = f.unsure || f.inflight != nil
		return f.quit()
	case <-l.closed:
		f.unsure = f.unsure || f.inflight != nil
		return f.quit()
	case fence := <-granted:
		return f.grantHeard(fence)
	case <-wake:
		f.askAgain = f.inflight != nil // its answer may predate what this wake-up is about
	case <-t.C:
		if !l.clock.Now().Before(end) {
			return nil, nil, false // and give up
		}
	case r := <-f.inflight:
		return f.answered(r)
	}
	f.next()
	return nil, nil, false
}

// grantHeard takes a grant's message if current, else asks the server.
func (f *fairWait) grantHeard(fence int64) (*Lease, error, bool) {
	if !f.trust {
		f.askAgain = f.inflight != nil
		f.next()
		return nil, nil, false
	}
	if f.st != nil {
		f.st.handoff = 0
	}
	return f.obtained(fence, f.waiting, time.Time{}, true)
}

// next follows a wake-up or the timer: an attempt when not in line, else a keep-alive.
func (f *fairWait) next() {
	if !f.joined {
		// The attempt failed; if it reached Redis, it may have been granted the lock.
		f.attemptNow, f.trust = true, f.trust && !f.unsure
		return
	}
	if f.inflight == nil {
		// It runs while the waiter waits on: a grant's message counts at once.
		f.sent, f.askAgain = f.l.clock.Now(), false
		f.inflight = f.l.keepAlive(f.ctx, f.q, f.lease.ttl)
	}
}

func (f *fairWait) answered(r queueResult) (*Lease, error, bool) {
	f.inflight = nil
	switch {
	case r.err != nil && ctxErr(f.ctx) != nil:
		f.unsure = true
		return f.quit()
	case r.err != nil:
		f.verdict = callError(f.lease.name, r.err) // keep waiting: the entry lives on for a while
		f.askAt = f.l.clock.Now().Add(f.retry)
	case r.r.State == lineGranted:
		var bound time.Time
		if r.r.PTTL > 0 {
			bound = f.sent.Add(r.r.PTTL - drift(r.r.PTTL))
		}
		return f.obtained(r.r.Fence, f.waiting, bound, true)
	case r.r.State == lineWaiting:
		f.verdict = f.seen.see(stillBusy(f.verdict, f.lease.name, r.r.PTTL), f.sent) // in line: not an outage
		f.waiting, f.askAt = f.sent, f.sent.Add(f.untilExpiry(r.r.PTTL))
		if f.askAgain {
			f.askAt = f.sent
		}
	case r.r.State == lineOutOfLine: // its entry expired, or a grant it missed ended
		f.attemptNow, f.trust = true, false
	case r.r.State == lineFirst:
		f.attemptNow = true // take the free lock
	}
	return nil, nil, false
}

// obtained completes a lease taken or granted with fence, its Deadline
// counting from from, or from bound if later. A grant too old to count on,
// or any grant with Replicas (its release did not WAIT), is renewed first.
func (f *fairWait) obtained(fence int64, from, bound time.Time, granted bool) (*Lease, error, bool) {
	l := f.l
	lease := f.complete(fence, from)
	if bound.After(lease.deadline) {
		lease.deadline = bound
	}
	if !l.clock.Now().Before(lease.deadline) || (granted && l.opts.Replicas > 0) {
		err, done := tasks.Call(l.bg, f.ctx.Done(), l.closed, func() error { return lease.extend(f.ctx, lease.ttl, false, new(extendState)) }, nil)
		switch {
		case !done: // ctx ended, or Close: the lock may be this waiter's
			f.joined = true
			return f.quit()
		case err == nil:
		case errors.Is(err, ErrNotHeld) && l.clock.Now().Before(f.waitEnd): // expired before it came to it
			f.rotate(f.unsure)
			return nil, nil, false
		case store.ReplicaShort(err) && l.clock.Now().Before(f.waitEnd):
			// Short of replicas: pass it on, and join again after a pause.
			f.verdict = err
			f.rotate(true)
			f.attemptNow, f.short, f.askAt = false, true, l.clock.Now().Add(f.retry)
			return nil, nil, false
		default:
			f.verdict = err // lease.extend's error reads as Acquire's
			f.joined = true // so that giveUp gives the lock back, or passes it on
			return f.quit()
		}
	}
	if f.st != nil {
		f.st.waited = l.clock.Now().Sub(f.start)
	}
	return lease, nil, true
}

// A grantee hears its own grant ("granted <token> <fence>"); all but grants wake it.
type grantee struct {
	token   string
	granted chan int64 // buffered
}

func (g *grantee) Hear(m notify.Message) notify.Hearing {
	if m.Head != "granted" {
		return notify.WakeAll
	}
	token, fence, _ := strings.Cut(m.Rest, " ")
	if n, _ := strconv.ParseInt(fence, 10, 64); token == g.token && n > 0 {
		select {
		case g.granted <- n:
		default:
		}
	}
	return notify.Ignore
}

func (*grantee) Lingers() bool { return true }

// stillBusy is the verdict on "still waiting" (pttl -2: free, others ahead).
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

// keepAlive sends q's keep-alive on a tracked goroutine, to the channel returned.
func (l *Locker) keepAlive(ctx context.Context, q lineLease, ttl time.Duration) chan queueResult {
	c := make(chan queueResult, 1)
	l.bg.Add()
	go func() {
		defer l.bg.Done()
		r, err := q.Queue(ctx, ttl, false)
		c <- queueResult{r, err}
	}()
	return c
}

// leaveQueue takes a waiter that gave up out of line in the background, giving back
// a lock granted or taken meanwhile, and retires the token. It leaves twice: a late
// attempt may have joined again between the first leave and the retirement.
func (l *Locker) leaveQueue(lease *Lease, q lineLease) {
	ttl := lease.ttl
	l.bg.GiveBack("leaving the fair queue", lease.name, lease.currentTTL(), func(ctx context.Context) (bool, error) {
		var deleted bool
		for pass := range 2 {
			r, err := q.Queue(ctx, ttl, true)
			if err != nil {
				return deleted, callError(lease.name, err)
			}
			if pass == 1 && r.State != lineGranted {
				break // out of line, and retired: nothing more can join
			}
			res, perr, err := q.Release(ctx, store.Abandon, ttl)
			if err != nil {
				return deleted, callError(lease.name, err)
			}
			l.warnPublish(lease.name, perr)
			deleted = deleted || res == store.Done
		}
		return deleted, nil
	})
}
