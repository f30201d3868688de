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
	// deadlines ends the contexts of the calls that run on their
	// caller's goroutine (see withTimeout).
	deadlines deadlines

	releaseTimeoutMillis any // opts.ReleaseTimeout in ms, boxed once for the scripts' ARGV
	retentionMillis      any // opts.FenceRetention in ms, boxed once
	ownerArg             any // opts.Owner, boxed once
	defaultTTLArg        any // opts.TTL in ms, boxed once
	traits               traits
	fair                 *deployment // where fair waiters wait in line (see fair.go); nil on a Redlock
	rl                   *quorum     // a Redlock's quorum, whose first node keeps its line (see line); nil otherwise
	lineTag              string      // names this Locker's calls in a line, and the channel their turns are announced on

	publishWarned atomic.Bool // a failed wake-up was logged

	closed    chan struct{} // closed by Close: Acquire returns ErrClosed
	closeOnce sync.Once

	dials        atomic.Int64          // dials of the client that succeeded, counted by dialWatch
	dialFailures atomic.Int64          // failed dials of the client, counted by dialWatch
	lastDialErr  atomic.Pointer[error] // the last one's error
}

// New returns a Locker that keeps its locks in client, configured by opts (nil
// means all defaults). It returns an error wrapping ErrInvalid for a nil
// client or an option it cannot honour, and makes no Redis call. It adds a
// hook to client (AddHook) that only records the client's failed dials, so
// that an error can name why Redis could not be reached ("connection
// refused").
func New(client redis.UniversalClient, opts *Options) (*Locker, error) {
	if isNil(client) {
		return nil, invalidf("nil redis client")
	}
	if err := checkClient(client); err != nil {
		return nil, err
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	l := newLocker(o)
	d := newDeployment(l, client)
	l.b, l.fair, l.traits = d, d, traits{deadlines: d.deadlines}
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
		closed:               make(chan struct{}),
		bg:                   tasks{jobs: make(chan job)},
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
		switch {
		case err == nil:
			h.l.dials.Add(1)
		case !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded):
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

// Close ends the Locker's acquisitions and what it runs in the background.
// From then on Acquire and RunWithLock return ErrClosed with no Redis call;
// an Acquire waiting or with an attempt in flight returns ErrClosed at once,
// and what its attempts may have taken is given back in the background, as
// for any Acquire that gives up. Close then closes the subscription
// connection that waiting calls share, and waits for the background work
// for at most Options.ReleaseTimeout (GUARANTEES.md, "Acquire, release and
// the keys"). Leases already held are not touched: their watchdogs go on
// renewing, RunWithLock's work goes on to its end, and Release and Extend
// work as before, so that closing a Locker at shutdown does not break the
// exclusion of work still running. Close does not close the Redis client.
// It always returns nil.
func (l *Locker) Close() error {
	if l == nil || l.b == nil {
		return nil
	}
	l.closeOnce.Do(func() { close(l.closed) })
	by := time.Now().Add(l.opts.ReleaseTimeout + closeGrace)
	l.b.close(by)
	l.bg.close(by)
	return nil
}

// closeGrace is how long Close waits for the background work beyond
// ReleaseTimeout: a clean-up started as Close was called has that long to
// end its last call.
const closeGrace = 100 * time.Millisecond

// isClosed reports whether Close was called.
func (l *Locker) isClosed() bool {
	select {
	case <-l.closed:
		return true
	default:
		return false
	}
}

// closedError is the error of an Acquire of name ended by Close; verdict,
// the last attempt's, is named but not matched.
func closedError(name string, verdict error) error {
	msg := fmt.Sprintf("%s: acquire %q", ErrClosed.Error(), name)
	if verdict != nil {
		msg += " (last attempt: " + verdict.Error() + ")"
	}
	return &opError{msg: msg, errs: []error{ErrClosed}}
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

// callOptions checks a call for the lock called name, and applies opts over
// the Locker's defaults: ErrInvalid for a zero Locker or a bad argument,
// ErrClosed after Close.
func (l *Locker) callOptions(name string, opts []Option) (callOptions, error) {
	if err := l.usable(); err != nil {
		return callOptions{}, err
	}
	co := callOptions{ttl: l.opts.TTL}
	if err := checkName(name); err != nil {
		return co, err
	}
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
	if l.isClosed() {
		return co, closedError(name, nil)
	}
	return co, nil
}

// Acquire takes the lock called name and returns its Lease. Without
// WithWait it tries once; with WithWait(d) it tries again until the lock is
// obtained or d has passed, and retries ErrUnavailable like a busy lock.
//
// It returns ErrNotObtained when another holder has the lock;
// ErrUnavailable, wrapping the cause, when Redis could not be reached, did
// not answer or answered with a transient state; ErrMisconfigured, not
// retried, when Redis refuses the lock's commands; ErrInvalid, with no Redis
// call, for an empty name, a name containing '{' or '}', a TTL out of range,
// or a negative wait; ErrClosed after Close; or an error matching ctx.Err()
// when ctx ended, which also matches ErrNotObtained or ErrUnavailable when
// an earlier attempt found the lock busy or Redis unavailable, and neither
// when no attempt got a verdict. With WithFailOpen(true), an outage returns
// a degraded Lease and a nil error instead. Each attempt waits at most
// Options.AttemptTimeout for its reply. It returns within a few milliseconds
// of ctx's end, an attempt in flight going on in the background; after a failed
// or cancelled Acquire, a clean-up in the background gives back what its
// attempts may have taken (GUARANTEES.md, "Acquire, release and the keys").
// Acquire never returns a lease whose Deadline has passed.
func (l *Locker) Acquire(ctx context.Context, name string, opts ...Option) (*Lease, error) {
	co, err := l.callOptions(name, opts)
	if err != nil {
		return nil, err
	}
	open := co.openSet && co.open // Acquire fails open only when asked to
	got, err := l.acquireObserved(ctx, name, co, open)
	if err != nil && open && outage(ctx, err) {
		return l.degraded(ctx, name, err), nil
	}
	return got, err
}

// acquireObserved is Acquire with its options checked, without failing open
// (the Observer sees the attempts' outcome); open bounds the attempts as a
// fail-open call's (see Options.AttemptTimeout).
func (l *Locker) acquireObserved(ctx context.Context, name string, co callOptions, open bool) (*Lease, error) {
	obs := l.opts.Observer
	if obs == nil {
		return l.acquireWith(ctx, name, co, open, nil)
	}
	ctx = obs.Start(ctx, OpAcquire, name)
	var st acquireStats
	start := l.clock.Now()
	got, err := l.acquireWith(ctx, name, co, open, &st)
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

// acquireWith is acquireObserved without the Observer's Start and End.
func (l *Locker) acquireWith(ctx context.Context, name string, co callOptions, open bool, st *acquireStats) (*Lease, error) {
	l.bg.add() // Close waits for the call, and for the clean-ups it starts when Close ends it
	defer l.bg.finish()
	lease := l.newLease(name, co.ttl)
	if co.owner != "" {
		lease.owner, lease.ownerArg = co.owner, co.owner
	}
	if co.fair && co.wait > 0 {
		return l.acquireFair(ctx, lease, co.wait, open, st)
	}
	return l.acquire(ctx, lease, co.wait, open, st)
}

// outage reports whether err, an Acquire's, is one that a fail-open call
// runs its work degraded on: Redis unavailable, and ctx still running.
func outage(ctx context.Context, err error) bool {
	return errors.Is(err, ErrUnavailable) && ctx.Err() == nil
}

// degraded returns the fail-open stand-in for a lease of name, after an
// Acquire that failed with err, and logs it at Error level.
func (l *Locker) degraded(ctx context.Context, name string, err error) *Lease {
	l.opts.Logger.LogAttrs(ctx, slog.LevelError, "fencelock: redis unavailable, running without the lock (fail-open)",
		slog.String("lock", name), slog.Any("error", err))
	lease := &Lease{locker: l, name: name, degraded: true}
	lease.keys[keyLock], lease.keys[keyCounter] = l.keys(name)
	return lease
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
func (l *Locker) acquire(ctx context.Context, lease *Lease, wait time.Duration, open bool, st *acquireStats) (*Lease, error) {
	log := l.opts.Logger
	callStart := l.clock.Now()
	waitEnd := callStart.Add(wait)
	openEnd := l.openEnd(ctx, open, callStart)
	var (
		bo      = backoff{min: l.opts.MinRetryBackoff, max: l.opts.MaxRetryBackoff}
		verdict error // the last attempt's: busy, or a callError
		seen    busySeen
		unsure  bool    // an attempt's outcome is unknown: it may have taken the lock
		w       *waiter // wake-ups on release, once the lock was found busy
		wokeAt  time.Time
	)
	if wait > 0 && l.rl != nil {
		lease.line = l.lineTag + "." + lease.token // this call's id in the line
	}
	defer func() {
		if w != nil {
			w.leave()
		}
	}()
	giveUp := func() (*Lease, error) {
		if unsure {
			l.abandon(lease) // out of line too
		} else if lease.line != "" {
			l.leaveLine(lease)
		}
		if l.isClosed() {
			return nil, closedError(lease.name, verdict)
		}
		verdict = seen.verdict(verdict, l.clock.Now())
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
		if ctxErr(ctx) != nil || l.isClosed() {
			return giveUp()
		}
		start := l.clock.Now()
		dials := l.dialFailures.Load()
		a, done := l.try(ctx, lease, open)
		if !done {
			// ctx ended, or Close was called, with the attempt in flight
			// or cut short, before Redis gave a verdict: it may have
			// reached Redis. Unless Redis could not even be reached.
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
			verdict = seen.see(&BusyError{Name: lease.name, Owner: a.owner, TTL: a.pttl}, start)
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
		end := waitEnd
		if openEnd.Before(end) && errors.Is(seen.verdict(verdict, now), ErrUnavailable) {
			end = openEnd
		}
		if wait == 0 || !now.Before(end) {
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
			if ln != nil {
				w = l.rl.registerLine(lease.keys[keyLock], "", ln)
			} else {
				w = l.b.register(lease.keys[keyLock], "") // nil after Close, which the wait below hears
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
		sleep := min(bo.next(), end.Sub(now))
		if lined {
			// A release names the next in line; this pause is for a
			// message lost, or one naming an Acquire that is gone.
			m := l.opts.MaxRetryBackoff
			sleep = min(m/2+mathrand.N(m/2+1), end.Sub(now))
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
		case <-l.closed:
			t.Stop()
			return giveUp()
		case <-t.C:
		case <-wake:
			t.Stop()
			wokeAt = l.clock.Now()
			named := w.line != nil && w.line.named.Swap(false)
			if spread := l.rl.wakeSpread(); spread > 0 && !named { // woken by name: alone
				if !l.pause(ctx, mathrand.N(spread+1)) {
					return giveUp()
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
		return start.Add(time.Until(dl) / 2)
	}
	return start.Add(forever)
}

// forever is further off than any lock's TTL or any call's wait.
const forever = 10 * maxTTL

// try runs one attempt of an Acquire for lease, bounded by ctx, by Close,
// and by AttemptTimeout (see Options; open: the call fails open). With done
// false, ctx ended or Close was called before the attempt gave a verdict:
// it may still be in flight, on a goroutine the Locker tracks. An attempt
// that outlived AttemptTimeout alone is a verdict: a *noReplyError, which
// names the cause when a dial failed since dials (the count before it).
func (l *Locker) try(ctx context.Context, lease *Lease, open bool) (a attempt, done bool) {
	timeout, half := l.opts.AttemptTimeout, false
	if dl, ok := ctx.Deadline(); ok && open {
		if left := time.Until(dl) / 2; left < timeout { // real time, as ctx's deadline
			timeout, half = max(left, time.Millisecond), true
		}
	}
	actx, cancel := l.withTimeout(ctx, timeout)
	defer cancel()
	dials, failures := l.dials.Load(), l.dialFailures.Load()
	done = true
	if l.traits.stops || (ctx.Done() == nil && l.traits.deadlines) { // it returns by actx's end by itself
		a = l.b.acquire(actx, lease)
		if a.err != nil && l.isClosed() {
			return a, false
		}
	} else {
		a, done = call(l, actx.Done(), l.closed, func() attempt { return l.b.acquire(actx, lease) }, nil)
	}
	if done && (a.err == nil || (classify(a.err) != classNoVerdict && (ctxErr(actx) == nil || !isTimeout(a.err)))) {
		return a, true
	}
	if ctxErr(ctx) != nil || l.isClosed() {
		return a, false
	}
	e := &noReplyError{timeout: timeout, half: half, cause: l.dialErrorSince(failures)}
	// Dials failed and none succeeded while the attempt ran: on one
	// deployment the server refuses connections, and the attempt's script
	// was not sent (see notSent for the one exception). A quorum's nodes
	// may have had it on connections already open.
	e.unsent = e.cause != nil && l.dials.Load() == dials && !l.traits.stops
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
	msg := "no reply within " + e.timeout.Round(time.Millisecond).String() + " (AttemptTimeout)"
	if e.half {
		msg = "no reply within " + e.timeout.Round(time.Millisecond).String() +
			" (half the time left before the deadline, for fail-open)"
	}
	if e.cause != nil {
		msg += ": " + e.cause.Error()
	}
	return msg
}

func (e *noReplyError) Unwrap() error { return e.cause }

// leaveLine takes a waiting Acquire that gives up out of its Redlock line
// (see line), in the background, so that releases stop naming it, and
// retires its last token there, so that an attempt still on its way does
// not put it back. It tries once: an entry left behind expires by itself.
func (l *Locker) leaveLine(lease *Lease) {
	l.bg.goBackground(func(<-chan struct{}) {
		ctx, cancel := context.WithTimeout(context.Background(), l.opts.ReleaseTimeout)
		defer cancel()
		_ = l.rl.leaveLine(ctx, lease)
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
	return l.withTimeout(ctx, l.opts.ReleaseTimeout)
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
	c := &pending[T]{done: make(chan struct{}), f: f, late: late}
	l.bg.run(c)
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
	f     func() T
	late  func(T)       // nil, or what gets the result once the caller has gone
	res   T             // written before done is closed
	done  chan struct{} // closed when f has returned
	state atomic.Int32  // 0 running, 1 result taken by the caller, 2 caller gone
}

func (c *pending[T]) run() {
	c.res = c.f()
	close(c.done)
	if !c.state.CompareAndSwap(0, 1) && c.late != nil {
		c.late(c.res) // the caller has returned
	}
}

// A job is what a worker of tasks.run runs.
type job interface{ run() }

// tasks tracks the goroutines that outlive the call that started them.
type tasks struct {
	mu     sync.Mutex
	n      int           // guarded by mu; goroutines running
	idle   chan struct{} // guarded by mu; closed when n drops to 0 while close waits
	stop   chan struct{} // guarded by mu; closed by close: clean-ups stop retrying, workers exit
	closed bool          // guarded by mu
	// jobs is made with the Locker, and never changes: the workers that
	// wait for work receive on it (see run).
	jobs   chan job
	idlers atomic.Int32 // workers waiting for work
}

// run runs j on a tracked goroutine: a worker that waits for work, or a
// new one. A worker waits workerIdle for more after each job, unless
// maxIdlers already do, and exits then or at close. A goroutine made for
// each call would grow its stack anew in go-redis's calls, every time:
// runtime.copystack took 14% of the CPU of a loop of acquire+release on
// go-redis's default options, where each of them needs one (see call).
func (t *tasks) run(j job) {
	select {
	case t.jobs <- j: // a worker was waiting
		return
	default:
	}
	t.mu.Lock()
	t.n++
	stop := t.stopLocked()
	t.mu.Unlock()
	go t.work(j, stop)
}

// work runs j, then the jobs it receives, until it waits workerIdle for
// none or stop is closed.
func (t *tasks) work(j job, stop <-chan struct{}) {
	defer t.finish()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		j.run()
		if t.idlers.Add(1) > maxIdlers {
			t.idlers.Add(-1)
			return
		}
		idle.Reset(workerIdle)
		var more bool
		select {
		case j = <-t.jobs:
			more = true
		case <-idle.C:
		case <-stop:
		}
		t.idlers.Add(-1)
		if !more {
			return
		}
	}
}

// How long a worker of tasks.run waits for more work, and how many wait
// at most: a burst of calls leaves no more goroutines behind.
const (
	workerIdle = 250 * time.Millisecond
	maxIdlers  = 16
)

// stopLocked returns the channel that close closes, making it if needed.
func (t *tasks) stopLocked() chan struct{} {
	if t.stop == nil {
		t.stop = make(chan struct{})
		if t.closed {
			close(t.stop)
		}
	}
	return t.stop
}

func (t *tasks) add() {
	t.mu.Lock()
	t.n++
	t.mu.Unlock()
}

func (t *tasks) finish() {
	t.mu.Lock()
	t.n--
	if t.n == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
	t.mu.Unlock()
}

// goBackground runs f on a tracked goroutine; stop is closed by close.
func (t *tasks) goBackground(f func(stop <-chan struct{})) {
	t.mu.Lock()
	t.n++
	stop := t.stopLocked()
	t.mu.Unlock()
	go func() {
		defer t.finish()
		f(stop)
	}()
}

// close tells the clean-ups to stop retrying and waits until no tracked
// goroutine is running, until by at most: a goroutine still running then is
// in a Redis call that go-redis has not given up on, and ends with it.
func (t *tasks) close(by time.Time) {
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		if t.stop != nil {
			close(t.stop)
		}
	}
	if t.n == 0 {
		t.mu.Unlock()
		return
	}
	if t.idle == nil {
		t.idle = make(chan struct{})
	}
	idle := t.idle
	t.mu.Unlock()
	waitUntil(idle, by)
}

// waitUntil waits until done is closed, or until by at most.
func waitUntil(done <-chan struct{}, by time.Time) {
	t := time.NewTimer(time.Until(by))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// pause sleeps for d on the Locker's clock, and reports false when ctx
// ended or Close was called first.
func (l *Locker) pause(ctx context.Context, d time.Duration) bool {
	t := l.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-l.closed:
		return false
	case <-t.C:
		return true
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
