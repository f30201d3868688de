package fencelock

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	mathrand "math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// A Locker acquires locks in one Redis deployment. It is safe for concurrent
// use; create one per client and share it.
type Locker struct {
	client redis.UniversalClient
	opts   Options
	clock  Clock
	waits  *notifier
}

// New returns a Locker that keeps its locks in client, configured by opts (nil
// means all defaults). It returns an error wrapping ErrInvalid for a nil
// client or an option it cannot honour, and makes no Redis call.
func New(client redis.UniversalClient, opts *Options) (*Locker, error) {
	if isNil(client) {
		return nil, invalidf("nil redis client")
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Locker{client: client, opts: o, clock: o.Clock, waits: newNotifier(client)}, nil
}

// Close closes the subscription connection that the Locker's waiting Acquire
// calls share, if one is open, and waits for its goroutine to exit. The
// connection otherwise stays open for 30 seconds after the last wait ends.
// The Locker and its leases keep working after Close, but a later Acquire
// that waits polls instead of being woken by releases. Close does not close
// the Redis client. It always returns nil.
func (l *Locker) Close() error {
	l.waits.close()
	return nil
}

func isNil(c redis.UniversalClient) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// keys returns the lock key and the fence counter key of name. They share the
// hash tag {name}.
func (l *Locker) keys(name string) (key, fenceKey string) {
	fenceKey = l.opts.KeyPrefix + "{" + name + "}:fence"
	return fenceKey[:len(fenceKey)-len(":fence")], fenceKey
}

func checkName(name string) error {
	if name == "" {
		return invalidf("empty lock name")
	}
	if strings.ContainsAny(name, "{}") {
		return invalidf("lock name %q contains '{' or '}'", name)
	}
	return nil
}

// Acquire takes the lock called name and returns its Lease, or an error:
//
//   - ErrNotObtained when another holder has the lock. Without WithWait,
//     Acquire tries once. With WithWait(d) it tries again until the lock is
//     obtained, d has passed or ctx ends; when ctx ended, the error also
//     matches ctx.Err(). Between attempts it sleeps until the holder releases
//     the lock (a pub/sub wake-up), the holder's remaining TTL runs out, or a
//     capped, jittered backoff (Options) ends, whichever comes first.
//   - ErrUnavailable, wrapping the cause, when Redis could not be reached,
//     answered with an error, or never answered before the wait's or ctx's
//     deadline. Without WithWait this is the first attempt's error; with it,
//     failed attempts are retried like busy ones until the wait ends, and the
//     error is returned if the last attempt failed. When ctx ended, the error
//     also matches ctx.Err().
//   - ErrInvalid for an empty name, a name containing '{' or '}', a TTL not
//     longer than its drift allowance, or a negative wait; no Redis call is
//     made then.
//
// All attempts of one call use the same random token, so an attempt whose
// reply was lost in transit (including go-redis's own retries) finds the lock
// already its own and succeeds instead of locking itself out. When Acquire
// gives up after an attempt whose outcome is unknown, it deletes the lock if
// that attempt took it, on a context that is not cancelled and bounded by
// Options.ReleaseTimeout, so no lock is left held after a failed or cancelled
// Acquire (if Redis stays unreachable, the lock expires after its TTL).
func (l *Locker) Acquire(ctx context.Context, name string, opts ...Option) (*Lease, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	co := callOptions{ttl: l.opts.TTL}
	for _, opt := range opts {
		if opt == nil {
			return nil, invalidf("nil Option")
		}
		co = opt(co)
	}
	if co.ttlSet {
		if err := checkTTL("WithTTL", co.ttl); err != nil {
			return nil, err
		}
		if err := checkRenewInterval(l.opts.RenewInterval, co.ttl); err != nil {
			return nil, err
		}
	}
	if co.wait < 0 {
		return nil, invalidf("WithWait %v is negative", co.wait)
	}
	// A version 4 UUID from crypto/rand, which cannot fail.
	var token uuid.UUID
	_, _ = rand.Read(token[:])
	token[6] = token[6]&0x0f | 0x40
	token[8] = token[8]&0x3f | 0x80
	lease := &Lease{
		locker: l,
		name:   name,
		token:  token.String(),
		ttl:    co.ttl,
	}
	lease.keys[0], lease.keys[1] = l.keys(name)
	lease.tokenArg = lease.token

	log := l.opts.Logger
	callStart := l.clock.Now()
	waitCtx := ctx
	if co.wait > 0 {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithTimeout(ctx, co.wait)
		defer cancel()
	}

	var (
		bo      = backoff{min: l.opts.MinRetryBackoff, max: l.opts.MaxRetryBackoff}
		lastErr error   // the last attempt's error, nil if it found the lock busy
		unsure  bool    // an attempt's outcome is unknown: it may hold the lock
		sawBusy bool    // an attempt found the lock held by another token
		w       *waiter // wake-ups on release, once the lock was found busy
		polling bool    // subscribing failed: wait without wake-ups
	)
	defer func() {
		if w != nil {
			w.leave()
		}
	}()
	giveUp := func() error {
		if unsure {
			lease.cleanup(ctx)
		}
		if log.Enabled(ctx, slog.LevelDebug) {
			log.LogAttrs(ctx, slog.LevelDebug, "fencelock: not obtained",
				slog.String("lock", name), slog.Duration("waited", l.clock.Now().Sub(callStart)),
				slog.Any("error", lastErr))
		}
		var err error = ErrNotObtained
		if lastErr != nil {
			err = unavailable(lastErr)
		}
		if cerr := ctxErr(ctx); cerr != nil {
			return errors.Join(err, cerr)
		}
		return err
	}

	for {
		start := l.clock.Now()
		ok, val, err := lease.tryAcquire(waitCtx)
		if err != nil && ctxErr(waitCtx) != nil {
			// The wait or ctx ended during the call: no verdict from
			// Redis. If Redis never gave one and a deadline (not a
			// cancellation) ended it, Redis did not answer in time: that
			// is unavailable, not busy. Otherwise lastErr keeps the
			// previous attempt's.
			unsure = true
			if !sawBusy && !errors.Is(ctxErr(waitCtx), context.Canceled) {
				lastErr = err
			}
			return nil, giveUp()
		}
		if err == nil && !ok {
			sawBusy = true
		}
		lastErr = err
		if err != nil {
			unsure = true
		}
		if ok {
			lease.fence = val
			lease.acquired = start
			lease.deadline = start.Add(lease.ttl - drift(lease.ttl))
			if log.Enabled(ctx, slog.LevelDebug) {
				log.LogAttrs(ctx, slog.LevelDebug, "fencelock: acquired",
					slog.String("lock", name), slog.Int64("fence", val),
					slog.Duration("ttl", lease.ttl), slog.Duration("waited", start.Sub(callStart)))
			}
			return lease, nil
		}
		if co.wait == 0 {
			return nil, giveUp()
		}
		if w == nil && !polling && err == nil {
			// Subscribe before the next attempt, so that a release from
			// now on wakes this waiter.
			if w, err = l.waits.register(waitCtx, lease.keys[0]); err != nil {
				w, polling = nil, true
			}
		}
		var wake <-chan struct{}
		if w != nil {
			wake = w.wake
		}
		sleep := bo.next()
		if pttl := time.Duration(val) * time.Millisecond; lastErr == nil && pttl >= 0 && pttl < sleep {
			// The holder's lock expires before the backoff ends (-1: it
			// has no expiry).
			sleep = max(pttl, time.Millisecond)
		}
		t := l.clock.NewTimer(sleep)
		select {
		case <-waitCtx.Done():
			t.Stop()
			return nil, giveUp()
		case <-t.C:
		case <-wake:
			t.Stop()
		}
	}
}

// detached returns a context with ctx's values but not its cancellation,
// bounded by Options.ReleaseTimeout, for giving a lock back.
func (l *Locker) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Done() != nil {
		ctx = context.WithoutCancel(ctx)
	}
	return context.WithTimeout(ctx, l.opts.ReleaseTimeout)
}

// ctxErr is ctx.Err(), or context.DeadlineExceeded once ctx's deadline has
// passed even if its timer has not fired yet (a call that honours the deadline
// may return first).
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// backoff is the per-call retry pause: exponential from min to max, each
// value jittered to between half and all of it.
type backoff struct {
	min, max time.Duration
	cur      time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	half := b.cur / 2
	return half + mathrand.N(b.cur-half+1)
}

// A Lease is one acquisition of a lock. Its methods are safe for concurrent
// use.
type Lease struct {
	locker   *Locker
	name     string
	keys     [2]string // key, fenceKey: the scripts' KEYS
	token    string
	tokenArg any // token, boxed once for the scripts' ARGV
	fence    int64
	acquired time.Time // when the acquire request was sent
	degraded bool      // fail-open stand-in: no lock is held

	extendSem chan struct{} // serializes Extend calls; created lazily under mu

	mu        sync.Mutex
	ttl       time.Duration             // guarded by mu; as acquired or last extended
	deadline  time.Time                 // guarded by mu
	done      bool                      // guarded by mu; released, or found not held
	wd        *watchdog                 // guarded by mu; nil until KeepAlive
	releasing bool                      // guarded by mu; Release was called
	cancels   []context.CancelCauseFunc // guarded by mu; KeepAlive contexts
	lost      error                     // guarded by mu; why the lease was lost
}

// Name returns the lock's name as given to Acquire.
func (l *Lease) Name() string { return l.name }

// Key returns the Redis key that holds the lock: KeyPrefix+"{"+name+"}".
func (l *Lease) Key() string { return l.keys[0] }

// Token returns the random token (a UUID v4) that identifies this acquisition
// in Redis.
func (l *Lease) Token() string { return l.token }

// Fence returns the fencing token issued with this acquisition. Fences are
// strictly increasing across all acquisitions of the same name; see the
// package documentation for their format. A degraded lease's fence is 0.
func (l *Lease) Fence() int64 { return l.fence }

// Degraded reports whether this is a fail-open stand-in (Options.FailOpen):
// RunWithLock could not reach Redis and ran the work without a lock.
func (l *Lease) Degraded() bool { return l.degraded }

// Deadline returns the local time until which the lock is certainly held,
// barring a process pause or a failover: the monotonic time taken before the
// acquire (or last successful extend) request was sent, plus the TTL, minus a
// drift allowance of TTL/100 + 2ms. After Release, or once Extend or Release
// found the lock not held, it returns a time that has passed.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

func (l *Lease) tryAcquire(ctx context.Context) (ok bool, value int64, err error) {
	reply, err := acquireScript.Run(ctx, l.locker.client,
		l.keys[:], l.tokenArg, ttlMillis(l.ttl)).Result()
	if err != nil {
		return false, 0, err
	}
	return decodeAcquire(reply)
}

// cleanup deletes the lock if this lease's token holds it, after an attempt
// whose outcome is unknown. Best effort: if it fails, the lock expires.
func (l *Lease) cleanup(ctx context.Context) {
	ctx, cancel := l.locker.detached(ctx)
	defer cancel()
	_ = releaseScript.Run(ctx, l.locker.client, l.keys[:1], l.tokenArg).Err()
}

// Extend resets the lock's time to live to ttl, if this lease still holds it,
// and moves Deadline to the time before the request plus ttl minus drift. It
// never recreates a lock that has expired. Concurrent calls are serialized.
//
// It returns ErrNotHeld when the lock is no longer this lease's (the lease is
// then done: later calls return ErrNotHeld without a Redis call);
// ErrUnavailable when Redis could not be reached, in which case the TTL may or
// may not have been set and Deadline becomes the earlier of its old value and
// the one this call would have set; ErrInvalid for a ttl not longer than its
// drift allowance, or for one not longer than Options.RenewInterval plus its
// drift allowance when RenewInterval is set; or ctx.Err() when ctx ended
// before the call was sent (while waiting for another Extend).
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	return l.extend(ctx, ttl, false)
}

// extend is Extend. A user's Extend tells a running watchdog about its outcome
// (the watchdog handles its own renewals' outcomes). The watchdog's renewals
// send EVAL instead of EVALSHA: a renewal must take one round trip also on a
// server whose script cache is empty (after a restart or a failover), where
// EVALSHA would cost a second one (NOSCRIPT, then EVAL) and could miss the
// deadline on a slow link.
func (l *Lease) extend(ctx context.Context, ttl time.Duration, byWatchdog bool) error {
	if err := checkTTL("Extend ttl", ttl); err != nil {
		return err
	}
	if err := checkRenewInterval(l.locker.opts.RenewInterval, ttl); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sem := l.sem()
	select {
	case sem <- struct{}{}:
		defer func() { <-sem }()
	case <-ctx.Done():
		return ctx.Err()
	}
	if l.degraded || l.isDone() {
		return ErrNotHeld
	}
	start := l.locker.clock.Now()
	run := extendScript.Run
	if byWatchdog {
		run = extendScript.Eval
	}
	n, err := run(ctx, l.locker.client, l.keys[:1], l.tokenArg, ttlMillis(ttl)).Int64()
	newDeadline := start.Add(ttl - drift(ttl))

	l.mu.Lock()
	defer l.mu.Unlock()
	if !byWatchdog {
		defer l.notifyWatchdogLocked() // the deadline may have moved either way
	}
	switch {
	case err != nil:
		if newDeadline.Before(l.deadline) {
			l.deadline = newDeadline
		}
		return unavailable(err)
	case n == 0:
		l.markDoneLocked(start)
		return ErrNotHeld
	default:
		if !l.done {
			l.deadline = newDeadline
			l.ttl = ttl
		}
		return nil
	}
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

func (l *Lease) sem() chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.extendSem == nil {
		l.extendSem = make(chan struct{}, 1)
	}
	return l.extendSem
}

func (l *Lease) isDone() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done
}

// markDoneLocked records that the lock is no longer held as of at.
func (l *Lease) markDoneLocked(at time.Time) {
	l.done = true
	if at.Before(l.deadline) {
		l.deadline = at
	}
}

// Release cancels the contexts KeepAlive returned, stops the lease's watchdog,
// if KeepAlive started one, and waits for it to exit, so no renewal is sent
// after Release. It then deletes the lock if this lease still holds it,
// leaving another holder's lock alone. It runs on a context that keeps ctx's
// values but not its cancellation, bounded by Options.ReleaseTimeout, so that
// a cancelled request still gives its lock back.
//
// It returns nil when the lock was deleted; ErrNotHeld when it was no longer
// this lease's (expired, taken over, or released already); in both cases the
// lease is done. It returns ErrUnavailable when Redis could not be reached:
// the lock may still be held, Release may be called again, and if it is not
// the lock expires after its TTL. In every case the watchdog is stopped for
// good and later KeepAlive calls return a cancelled context. A renewal that is
// in flight when Release is called is waited for, for at most the client's
// ReadTimeout (or the context deadline, with ContextTimeoutEnabled).
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	l.releasing = true
	l.mu.Unlock()
	l.cancelContexts(errReleased) // the work is over: tell it before waiting
	l.stopWatchdog()
	if l.degraded || l.isDone() {
		return ErrNotHeld
	}
	rctx, cancel := l.locker.detached(ctx)
	defer cancel()
	start := l.locker.clock.Now()
	n, err := releaseScript.Run(rctx, l.locker.client, l.keys[:1], l.tokenArg).Int64()
	if err != nil {
		return unavailable(err)
	}
	l.mu.Lock()
	l.markDoneLocked(start)
	l.mu.Unlock()
	if n == 0 {
		return ErrNotHeld
	}
	if log := l.locker.opts.Logger; log.Enabled(ctx, slog.LevelDebug) {
		log.LogAttrs(ctx, slog.LevelDebug, "fencelock: released",
			slog.String("lock", l.name), slog.Int64("fence", l.fence),
			slog.Duration("held", l.locker.clock.Now().Sub(l.acquired)))
	}
	return nil
}
