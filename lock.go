package fencelock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// A Locker acquires locks in one Redis deployment. It is safe for concurrent
// use; create one per client and share it. The zero Locker is not usable:
// its methods return an error matching ErrInvalid.
type Locker struct {
	b     backend
	opts  Options
	clock Clock
	bg    tasks

	releaseTimeoutMillis any    // opts.ReleaseTimeout in ms, boxed once for the scripts' ARGV
	retentionMillis      any    // opts.FenceRetention in ms, boxed once
	ownerArg             any    // opts.Owner, boxed once
	defaultTTLArg        any    // opts.TTL in ms, boxed once
	lines                bool   // waiting Acquire calls wait in a line (a Redlock's; see line)
	lineTag              string // names this Locker's calls in a line, and the channel their turns are announced on

	publishWarned atomic.Bool // a failed wake-up was logged

	dialFailures atomic.Int64          // failed dials of the client, counted by dialWatch
	lastDialErr  atomic.Pointer[error] // the last one's error
}

// New returns a Locker that keeps its locks in client, configured by opts (nil
// means all defaults). It returns an error wrapping ErrInvalid for a nil
// client or an option it cannot honour, and makes no Redis call.
//
// New adds a hook to client (AddHook) that only records the client's failed
// dials, so that an error can name why Redis could not be reached
// ("connection refused") when go-redis itself reports only that the
// caller's context ended during its retries.
func New(client redis.UniversalClient, opts *Options) (*Locker, error) {
	if isNil(client) {
		return nil, invalidf("nil redis client")
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	l := newLocker(o)
	l.b = newDeployment(l, client)
	return l, nil
}

func newLocker(o Options) *Locker {
	return &Locker{
		opts:                 o,
		clock:                o.Clock,
		releaseTimeoutMillis: ttlMillis(o.ReleaseTimeout),
		retentionMillis:      ttlMillis(o.FenceRetention),
		ownerArg:             o.Owner,
		defaultTTLArg:        ttlMillis(o.TTL),
	}
}

// dialWatch is a go-redis hook that records the client's failed dials and
// changes nothing else. go-redis retries a command whose connection could
// not be made, and when the caller's context ends during those retries it
// returns only the context's error; the Locker's error then names the
// cause ("connection refused") from here.
type dialWatch struct{ l *Locker }

func (h dialWatch) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			h.l.lastDialErr.Store(&err)
			h.l.dialFailures.Add(1)
		}
		return c, err
	}
}

func (dialWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (dialWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// dialErrorSince returns the last failed dial's error if a dial failed
// since the count was seen.
func (l *Locker) dialErrorSince(seen int64) error {
	if l.dialFailures.Load() == seen {
		return nil
	}
	if p := l.lastDialErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Close stops what the Locker runs in the background, and waits for it: the
// subscription connection that its waiting Acquire calls share (otherwise
// closed 30 seconds after the last wait), and the clean-ups that outlived
// the calls that started them (a release whose caller's context ended first,
// the clean-up after an Acquire that gave up). A clean-up whose Redis call is
// in flight is waited for, bounded by Options.ReleaseTimeout; one waiting to
// try again is not retried (a lock it was for expires after its TTL).
//
// The Locker and its leases keep working after Close, but an Acquire that
// waits polls instead of being woken by releases: a later one, and one
// waiting when Close is called, which is woken to try at once. On a
// Redlock such a call leaves the line it waited in, or that its first
// attempt joined (its turn would no longer reach it), in the background of
// the call itself: Close does not wait for Acquire calls in progress. Close
// does not close the Redis client. It always returns nil.
func (l *Locker) Close() error {
	if l == nil || l.b == nil {
		return nil
	}
	l.b.close()
	l.bg.close()
	return nil
}

// ttlArg returns ttl in milliseconds for a script's ARGV, boxed once for
// the default TTL.
func (l *Locker) ttlArg(ttl time.Duration) any {
	if ttl == l.opts.TTL {
		return l.defaultTTLArg
	}
	return ttlMillis(ttl)
}

// usable returns an ErrInvalid error for a nil or zero Locker.
func (l *Locker) usable() error {
	if l == nil || l.b == nil {
		return invalidf("Locker not created with New or NewRedlock")
	}
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

// callOptions applies opts over the Locker's defaults and checks them.
func (l *Locker) callOptions(opts []Option) (callOptions, error) {
	co := callOptions{ttl: l.opts.TTL}
	for _, opt := range opts {
		if opt == nil {
			return co, invalidf("nil Option")
		}
		co = opt(co)
	}
	if co.ttlSet {
		if err := checkTTL("WithTTL", co.ttl); err != nil {
			return co, err
		}
		if err := checkRenewInterval(l.opts.RenewInterval, co.ttl); err != nil {
			return co, err
		}
		if l.opts.Replicas > 0 {
			if err := checkReplicaTimeout(l.opts.ReplicaTimeout, co.ttl, "WithTTL"); err != nil {
				return co, err
			}
		}
	}
	if co.wait < 0 {
		return co, invalidf("WithWait %v is negative", co.wait)
	}
	if co.ownerSet {
		if err := checkOwner("WithOwner", co.owner); err != nil {
			return co, err
		}
	}
	if co.fair {
		if _, ok := l.b.(*quorum); ok {
			return co, invalidf("WithFair on a NewRedlock Locker: a queue kept on a quorum of nodes would need consensus")
		}
	}
	return co, nil
}

// Acquire takes the lock called name and returns its Lease, or an error:
//
//   - ErrNotObtained when another holder has the lock. Without WithWait,
//     Acquire tries once. With WithWait(d) it tries again until the lock is
//     obtained or d has passed; between attempts it sleeps until the holder
//     releases the lock (a pub/sub wake-up), the holder's remaining TTL runs
//     out, or a capped, jittered backoff (Options) ends, whichever comes
//     first.
//   - ErrUnavailable, wrapping the cause, when Redis could not be reached,
//     did not answer, or answered with a transient state. With WithWait,
//     such attempts are retried like busy ones until d has passed.
//   - ErrMisconfigured when Redis refuses the lock's commands (a password,
//     an ACL, a key of another type); it is not retried.
//   - an error matching ctx.Err() when ctx ended. It also matches
//     ErrNotObtained or ErrUnavailable when an earlier attempt found the lock
//     busy or Redis unavailable, and neither when no attempt got a verdict
//     (ctx ended before or during the first one).
//   - ErrInvalid for an empty name, a name containing '{' or '}', a TTL out
//     of range, or a negative wait; no Redis call is made then.
//
// Acquire returns within a few milliseconds of ctx's deadline or
// cancellation, whatever the go-redis client's options: an attempt in
// flight then goes on in the background. WithWait bounds the waiting
// between attempts, not an attempt in flight.
//
// All attempts of one call use the same random token, so an attempt whose
// reply was lost in transit (including go-redis's own retries) finds the lock
// already its own and succeeds instead of locking itself out. When Acquire
// gives up after an attempt whose outcome is unknown, a clean-up in the
// background (see Close) deletes the lock if that attempt took it, and
// retires the token so that the attempt, if it reaches Redis only later,
// does not take the lock; no lock is left held after a failed or cancelled
// Acquire once Redis answers again (if Redis never does within the lock's
// TTL, the lock expires). An attempt that provably never reached Redis (the
// connection was refused) needs no clean-up.
//
// Acquire never returns a lease whose Deadline has passed.
func (l *Locker) Acquire(ctx context.Context, name string, opts ...Option) (*Lease, error) {
	if err := l.usable(); err != nil {
		return nil, err
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	co, err := l.callOptions(opts)
	if err != nil {
		return nil, err
	}
	lease := l.newLease(name, co.ttl)
	if co.owner != "" {
		lease.owner, lease.ownerArg = co.owner, co.owner
	}
	run := l.acquire
	if co.fair && co.wait > 0 {
		run = l.acquireFair
	}
	obs := l.opts.Observer
	if obs == nil {
		return run(ctx, lease, co.wait, nil)
	}
	ctx = obs.Start(ctx, OpAcquire, name)
	var st acquireStats
	start := l.clock.Now()
	got, err := run(ctx, lease, co.wait, &st)
	e := Event{Op: OpAcquire, Name: name, Lease: got, Outcome: OutcomeOf(err), Err: err,
		Duration: l.clock.Now().Sub(start), Waited: st.waited, Handoff: st.handoff}
	if got != nil {
		e.Fence = got.fence
		if got.obsCtx == nil {
			got.obsCtx = ctx
		}
	}
	obs.End(ctx, e)
	return got, err
}

// acquireStats is what an Observer learns of an Acquire.
type acquireStats struct {
	waited  time.Duration // asleep between attempts
	handoff time.Duration // from the wake-up before the winning attempt to the grant
}

// newLease returns a lease for name with a fresh random token, not yet
// acquired. Its three keys and the token share one allocation.
func (l *Locker) newLease(name string, ttl time.Duration) *Lease {
	// A version 4 UUID from crypto/rand, which cannot fail.
	var u uuid.UUID
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	var token [36]byte
	hexUUID(&token, &u)

	// One string holds them all: P{name}:fence P{name}:qi P{name}:t:<token>,
	// each key a slice of it (P{name} and P{name}:q are prefixes).
	prefix := len(l.opts.KeyPrefix) + len(name) + 2
	var b strings.Builder
	b.Grow(3*prefix + len(":fence") + len(":qi") + len(":t:") + len(token))
	for _, s := range [...]string{l.opts.KeyPrefix, "{", name, "}", ":fence",
		l.opts.KeyPrefix, "{", name, "}", ":qi", l.opts.KeyPrefix, "{", name, "}", ":t:"} {
		b.WriteString(s)
	}
	b.Write(token[:])
	s := b.String()
	lease := &Lease{locker: l, name: name, ttl: ttl, owner: l.opts.Owner, ownerArg: l.ownerArg}
	qi := prefix + len(":fence")       // where P{name}:qi starts
	marker := qi + prefix + len(":qi") // where P{name}:t:<token> starts
	lease.keys[keyLock] = s[:prefix]
	lease.keys[keyMarker] = s[marker:]
	lease.keys[keyCounter] = s[:qi]
	lease.keys[keyQueue] = s[qi : qi+prefix+len(":q")]
	lease.keys[keyQueueInfo] = s[qi:marker]
	lease.token = s[len(s)-len(token):]
	lease.tokenArg = lease.token
	for i, k := range lease.keys {
		lease.keyArgs[i] = k
	}
	return lease
}

// A lease's keys, in the order the scripts take them.
const (
	keyLock      = iota // P{name}
	keyMarker           // P{name}:t:<token>
	keyCounter          // P{name}:fence
	keyQueue            // P{name}:q
	keyQueueInfo        // P{name}:qi
	nKeys
)

// hexUUID writes u in its canonical text form.
func hexUUID(dst *[36]byte, u *uuid.UUID) {
	const hex = "0123456789abcdef"
	j := 0
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			dst[j] = '-'
			j++
		}
		dst[j], dst[j+1] = hex[c>>4], hex[c&0xf]
		j += 2
	}
}

// acquire runs Acquire's attempts for lease.
func (l *Locker) acquire(ctx context.Context, lease *Lease, wait time.Duration, st *acquireStats) (*Lease, error) {
	log := l.opts.Logger
	callStart := l.clock.Now()
	waitEnd := callStart.Add(wait)
	var (
		bo      = backoff{min: l.opts.MinRetryBackoff, max: l.opts.MaxRetryBackoff}
		verdict error   // the last attempt's: busy, or a callError
		unsure  bool    // an attempt's outcome is unknown: it may have taken the lock
		w       *waiter // wake-ups on release, once the lock was found busy
		wokeAt  time.Time
	)
	if wait > 0 && l.lines {
		lease.line = l.lineTag + "." + lease.token // this call's id in the line
	}
	defer func() {
		if w != nil {
			w.leave()
		}
	}()
	// leaveClosed takes the call out of its Redlock line once its Locker is
	// closed: no turn would reach it. It polls out of line from then on,
	// with a new token (leaving retires the last one there).
	leaveClosed := func() {
		if unsure {
			l.abandon(lease) // out of line too
		} else {
			l.leaveLine(lease)
		}
		unsure = false
		next := l.newLease(lease.name, lease.ttl)
		next.owner, next.ownerArg = lease.owner, lease.ownerArg
		lease = next
	}
	giveUp := func() (*Lease, error) {
		if unsure {
			l.abandon(lease) // out of line too
		} else if lease.line != "" {
			l.leaveLine(lease)
		}
		ctxE := ctxErr(ctx)
		if log.Enabled(ctx, slog.LevelDebug) {
			log.LogAttrs(ctx, slog.LevelDebug, "fencelock: not obtained",
				slog.String("lock", lease.name), slog.Duration("waited", l.clock.Now().Sub(callStart)),
				slog.Any("verdict", verdict), slog.Any("ctx", ctxE))
		}
		if verdict == nil {
			return nil, ctxEnded(ctx, fmt.Sprintf("acquire %q", lease.name))
		}
		if ctxE != nil {
			return nil, withCtx(verdict, ctxE)
		}
		return nil, verdict
	}

	for {
		if ctxErr(ctx) != nil {
			return giveUp()
		}
		if w != nil && lease.line != "" && w.stopped() {
			w.leave()
			w = nil
			leaveClosed()
		}
		start := l.clock.Now()
		dials := l.dialFailures.Load()
		var a attempt
		done := true
		if ctx.Done() == nil || l.b.acquireStops() { // nothing to return early for, or it does
			a = l.b.acquire(ctx, lease)
		} else {
			a, done = call(l, ctx.Done(), nil, func() attempt { return l.b.acquire(ctx, lease) }, nil)
		}
		if !done || (a.err != nil && (classify(a.err) == classNoVerdict || (ctxErr(ctx) != nil && isTimeout(a.err)))) {
			// ctx ended with the attempt in flight or cut short, before
			// Redis gave a verdict: it may have reached Redis. Unless
			// Redis could not even be reached.
			unsure = true
			if err := l.dialErrorSince(dials); err != nil {
				verdict = callError(lease.name, err)
			}
			return giveUp()
		}
		switch {
		case a.err != nil:
			verdict = callError(lease.name, a.err)
			if !notSent(a.err) || a.retire {
				unsure = true
			}
			if classify(a.err) == classMisconfigured {
				return giveUp() // refused: retrying does not help
			}
		case a.ok:
			deadline := start.Add(lease.ttl - drift(lease.ttl))
			if l.clock.Now().Before(deadline) {
				lease.fence = a.fence
				lease.acquired = start
				lease.deadline = deadline
				if unsure {
					// An earlier attempt may still reach Redis and reset
					// the expiry to this TTL after a longer Extend.
					lease.floorTTL = lease.ttl
				}
				if st != nil && !wokeAt.IsZero() {
					st.handoff = l.clock.Now().Sub(wokeAt)
				}
				if log.Enabled(ctx, slog.LevelDebug) {
					log.LogAttrs(ctx, slog.LevelDebug, "fencelock: acquired",
						slog.String("lock", lease.name), slog.Int64("fence", a.fence),
						slog.Duration("ttl", lease.ttl), slog.Duration("waited", start.Sub(callStart)))
				}
				return lease, nil
			}
			// Granted, but the reply came after the lease's deadline.
			// Another attempt with the same token renews it.
			unsure = true
			verdict = &opError{msg: ErrUnavailable.Error() + ": the reply came after the lease's deadline",
				errs: []error{ErrUnavailable}}
			if wait > 0 && l.clock.Now().Before(waitEnd) {
				continue
			}
		default:
			verdict = &BusyError{Name: lease.name, Owner: a.owner, TTL: a.pttl}
		}
		if a.retire {
			// The try may hold the lock somewhere without having got it;
			// the backend gives that back in the background. Try again
			// with a new token, which that clean-up cannot touch.
			next := l.newLease(lease.name, lease.ttl)
			next.owner, next.ownerArg, next.line = lease.owner, lease.ownerArg, lease.line
			lease = next
			unsure = false
		}
		now := l.clock.Now()
		if wait == 0 || !now.Before(waitEnd) {
			return giveUp()
		}
		busy := errors.Is(verdict, ErrNotObtained)
		if w == nil && busy {
			// Wake-ups from now on: the subscription is made in the
			// background, and its confirmation wakes w for another try, so
			// that a release before it is not missed. On a Redlock whose
			// first node found the lock busy, the call is in that node's
			// line, and waits to be named there (see line).
			var ln *line
			if a.lined {
				ln = &line{id: lease.line}
				ln.in.Store(true) // before its subscription's confirmation
				ln.first.Store(a.ahead == 0)
			}
			w = l.b.register(lease.keys[keyLock], "", ln)
			if w == nil && lease.line != "" { // closed: this call's first busy attempt joined the line
				leaveClosed()
			}
		}
		var wake <-chan struct{}
		lined := a.lined && w != nil && w.line != nil
		if w != nil {
			wake = w.wake
			if w.line != nil {
				w.line.in.Store(lined)
				w.line.first.Store(lined && a.ahead == 0)
				if !lined {
					w.line.widen(w)
				}
			}
		}
		sleep := min(bo.next(), waitEnd.Sub(now))
		if lined {
			// A release names the next in line; this pause is for a
			// message lost, or one naming an Acquire that is gone.
			m := l.opts.MaxRetryBackoff
			sleep = min(m/2+mathrand.N(m/2+1), waitEnd.Sub(now))
		}
		if busy && a.pttl >= 0 && a.pttl < sleep {
			sleep = max(a.pttl, time.Millisecond) // the holder's lock expires first
		}
		t := l.clock.NewTimer(sleep)
		slept := l.clock.Now()
		wokeAt = time.Time{}
		select {
		case <-ctx.Done():
			t.Stop()
			return giveUp()
		case <-t.C:
		case <-wake:
			t.Stop()
			wokeAt = l.clock.Now()
			named := w.line != nil && w.line.named.Swap(false)
			if spread := l.b.wakeSpread(); spread > 0 && !named { // woken by name: alone
				t := l.clock.NewTimer(mathrand.N(spread + 1))
				select {
				case <-ctx.Done():
					t.Stop()
					return giveUp()
				case <-t.C:
				}
			}
		}
		if wake != nil {
			select { // wake-ups before this attempt: it sees what they announced
			case <-wake:
			default:
			}
		}
		if st != nil {
			st.waited += l.clock.Now().Sub(slept)
		}
	}
}

// leaveLine takes a waiting Acquire that gives up out of its Redlock line
// (see line), in the background, so that releases stop naming it, and
// retires its last token there, so that an attempt still on its way does
// not put it back. It tries once: an entry left behind expires by itself.
func (l *Locker) leaveLine(lease *Lease) {
	l.bg.goBackground(func(<-chan struct{}) {
		ctx, cancel := context.WithTimeout(context.Background(), l.opts.ReleaseTimeout)
		defer cancel()
		_ = l.b.leaveLine(ctx, lease)
	})
}

// abandon makes what the attempts of an Acquire that gave up may have done
// harmless, in the background: it deletes the lock if one of them took it,
// and retires the token, so that an attempt reaching Redis only later does
// not take the lock. See giveBack for how long it tries.
func (l *Locker) abandon(lease *Lease) {
	l.giveBack(lease, "clean-up after a failed acquire", func(ctx context.Context) (bool, error) {
		code, perr, err := lease.runRelease(ctx, modeAbandon)
		if err != nil {
			return false, callError(lease.name, err)
		}
		l.warnPublish(lease.name, perr)
		return code == 1, nil
	})
}

// releaseInBackground gives a lease's lock back in the background: after
// its work was lost (RunWithLock), or after a Release whose caller did not
// wait for Redis to answer. See giveBack for how long it tries.
func (l *Locker) releaseInBackground(lease *Lease) {
	l.giveBack(lease, "release", func(ctx context.Context) (bool, error) {
		err := lease.release(ctx)
		if errors.Is(err, ErrNotHeld) {
			return false, nil
		}
		return err == nil, err
	})
}

// giveBack runs try, which deletes a lock, on a goroutine of the Locker
// until Redis answers, Redis refuses (ErrMisconfigured), Close is called, or
// the lease's TTL has passed since it started (by then the lock, taken or
// last extended before, has expired by itself). Each try is bounded by
// ReleaseTimeout. A try sent to a hung server runs there when the server
// resumes, even after the client gave up on it.
func (l *Locker) giveBack(lease *Lease, what string, try func(ctx context.Context) (deleted bool, err error)) {
	log := l.opts.Logger
	bg := context.Background()
	l.bg.goBackground(func(stop <-chan struct{}) {
		end := l.clock.Now().Add(max(lease.currentTTL(), l.opts.ReleaseTimeout))
		bo := backoff{min: 10 * time.Millisecond, max: time.Second}
		for tries := 1; ; tries++ {
			ctx, cancel := context.WithTimeout(bg, l.opts.ReleaseTimeout)
			deleted, err := try(ctx)
			cancel()
			if err == nil {
				log.LogAttrs(bg, slog.LevelDebug, "fencelock: "+what+" done in the background",
					slog.String("lock", lease.name), slog.Bool("lock_deleted", deleted), slog.Int("tries", tries))
				return
			}
			if errors.Is(err, ErrMisconfigured) || !l.clock.Now().Before(end) {
				log.LogAttrs(bg, slog.LevelWarn, "fencelock: "+what+" failed in the background, the lock expires after its TTL",
					slog.String("lock", lease.name), slog.Int("tries", tries), slog.Any("error", err))
				return
			}
			if tries == 1 {
				log.LogAttrs(bg, slog.LevelDebug, "fencelock: "+what+" goes on in the background",
					slog.String("lock", lease.name), slog.Any("error", err))
			}
			t := l.clock.NewTimer(bo.next())
			select {
			case <-stop:
				t.Stop()
				log.LogAttrs(bg, slog.LevelWarn, "fencelock: "+what+" stopped by Close, the lock expires after its TTL",
					slog.String("lock", lease.name), slog.Int("tries", tries), slog.Any("error", err))
				return
			case <-t.C:
			}
		}
	})
}

// warnPublish logs, once per Locker, that a release could not publish its
// wake-up.
func (l *Locker) warnPublish(name string, perr error) {
	if perr == nil || !l.publishWarned.CompareAndSwap(false, true) {
		return
	}
	l.opts.Logger.LogAttrs(context.Background(), slog.LevelWarn,
		"fencelock: a release could not publish its wake-up (logged once): waiters fall back to the holder's TTL and backoff",
		slog.String("lock", name), slog.Any("error", perr))
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

// call runs f and returns its result with done true, or returns done false
// as soon as stop1 or stop2 is closed: f then runs to its end on a goroutine
// that the Locker tracks (see Close), and late, if not nil, gets its result
// there. With two nil channels f runs on the caller's goroutine.
//
// This is how every call returns by its caller's deadline whatever the
// go-redis client's options: without ContextTimeoutEnabled, go-redis waits
// for ReadTimeout on a hung connection, and it retries a command that timed
// out (MaxRetries).
func call[T any](l *Locker, stop1, stop2 <-chan struct{}, f func() T, late func(T)) (res T, done bool) {
	if stop1 == nil && stop2 == nil {
		return f(), true
	}
	c := &pending[T]{done: make(chan struct{})}
	l.bg.add()
	go func() {
		defer l.bg.finish()
		c.res = f()
		close(c.done)
		if !c.state.CompareAndSwap(0, 1) && late != nil {
			late(c.res) // the caller has returned
		}
	}()
	select {
	case <-c.done:
		return c.res, true
	case <-stop1:
	case <-stop2:
	}
	// A call that honours the context (go-redis's dial loop, a client with
	// ContextTimeoutEnabled) returns at once, often with the cause of its
	// failure ("connection refused"): give it a moment.
	t := time.NewTimer(callGrace)
	select {
	case <-c.done:
	case <-t.C:
	}
	t.Stop()
	if !c.state.CompareAndSwap(0, 2) { // finished meanwhile
		<-c.done
		return c.res, true
	}
	return res, false
}

// callGrace is how long a call whose caller's context has ended still waits
// for its result.
const callGrace = 5 * time.Millisecond

// pending is a call's result in transit.
type pending[T any] struct {
	res   T             // written before done is closed
	done  chan struct{} // closed when f has returned
	state atomic.Int32  // 0 running, 1 result taken by the caller, 2 caller gone
}

// tasks tracks the goroutines that outlive the call that started them.
type tasks struct {
	mu     sync.Mutex
	cond   sync.Cond     // signalled when n drops to 0; L is &mu
	n      int           // guarded by mu; goroutines running
	stop   chan struct{} // guarded by mu; closed by close: clean-ups stop retrying
	closed bool          // guarded by mu
}

func (t *tasks) add() {
	t.mu.Lock()
	t.n++
	t.mu.Unlock()
}

func (t *tasks) finish() {
	t.mu.Lock()
	t.n--
	if t.n == 0 && t.cond.L != nil {
		t.cond.Broadcast()
	}
	t.mu.Unlock()
}

// goBackground runs f on a tracked goroutine; stop is closed by close.
func (t *tasks) goBackground(f func(stop <-chan struct{})) {
	t.mu.Lock()
	t.n++
	if t.stop == nil {
		t.stop = make(chan struct{})
		if t.closed {
			close(t.stop)
		}
	}
	stop := t.stop
	t.mu.Unlock()
	go func() {
		defer t.finish()
		f(stop)
	}()
}

// close tells the clean-ups to stop retrying and waits until no tracked
// goroutine is running.
func (t *tasks) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed {
		t.closed = true
		if t.stop != nil {
			close(t.stop)
		}
	}
	if t.cond.L == nil {
		t.cond.L = &t.mu
	}
	for t.n > 0 {
		t.cond.Wait()
	}
}

// backoff is the per-call retry pause: exponential from min to max, each
// value jittered to between half and all of it.
type backoff struct {
	min, max time.Duration
	cur      time.Duration
}

func (b *backoff) next() time.Duration {
	switch {
	case b.cur == 0:
		b.cur = b.min
	case b.cur > b.max/2:
		b.cur = b.max
	default:
		b.cur *= 2
	}
	half := b.cur / 2
	return half + mathrand.N(b.cur-half+1)
}
