package fencelock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/fencelock/fencelock/internal/deadline"
	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/tasks"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// A Locker acquires locks in one Redis deployment (New), or a quorum of them
// (NewRedlock). It is safe for concurrent use: create one per client and share
// it. A zero Locker's methods return an error matching ErrInvalid.
type Locker struct {
	b     backend
	opts  Options
	clock Clock
	bg    *tasks.Group
	// deadlines ends the contexts of the calls that run on their
	// caller's goroutine.
	deadlines deadline.Heap

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

// New returns a Locker that keeps its locks in client, configured by opts (nil:
// all defaults), making no Redis call; an error wrapping ErrInvalid for a nil
// client or an option it cannot honour. It adds a hook to client that only
// records failed dials, so that an error can name why Redis was unreachable.
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
		bg:                   tasks.New(o.Clock, o.ReleaseTimeout, o.Logger, func(err error) bool { return errors.Is(err, ErrMisconfigured) }),
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

// connless reports whether a request of the Locker's client could have
// gone on no connection: on one deployment, the client has none open, and
// no dial succeeded since the count was dials (a connection is counted as
// made before it carries a request). Only on a failed attempt's path: it
// allocates.
func (l *Locker) connless(dials int64) bool {
	d, ok := l.b.(*deployment)
	if !ok {
		return false
	}
	s := d.base.PoolStats() // its AutoPipeliner's batches go on the same pools
	n := s.TotalConns
	if s.PipelineStats != nil {
		n += s.PipelineStats.TotalConns
	}
	return n == 0 && l.dials.Load() == dials // the count after the pool's: a dial meanwhile shows
}

// Close ends the Locker's acquisitions: Acquire and RunWithLock then return
// ErrClosed with no Redis call, as a waiting Acquire, or one with an attempt in
// flight, does at once. Close waits for the background work for at most
// Options.ReleaseTimeout; leases already held go on. It does not close the
// Redis client, and always returns nil.
func (l *Locker) Close() error {
	if l == nil || l.b == nil {
		return nil
	}
	l.closeOnce.Do(func() { close(l.closed) })
	by := l.clock.Now().Add(l.opts.ReleaseTimeout + closeGrace)
	l.b.close(by)
	l.bg.Close(by)
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

// keys returns the lock key and the fence counter key of name.
func (l *Locker) keys(name string) (key, fenceKey string) {
	key = keys.Lock(l.opts.KeyPrefix, name)
	return key, key + keys.Fence
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
		if err := l.opts.checkCallTTL("WithTTL", co.ttl); err != nil {
			return co, err
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

// Acquire takes the lock called name and returns its Lease, trying once or,
// with WithWait(d), until d has passed, also after ErrUnavailable. It returns
// ErrNotObtained, ErrUnavailable, ErrMisconfigured (not retried), ErrInvalid
// with no Redis call for an empty name, one with '{' or '}' or a rejected
// option, ErrClosed after Close, or an error matching ctx.Err() (and the
// ErrNotObtained or ErrUnavailable an earlier attempt found). It fails open
// only with WithFailOpen(true). After an error, a background clean-up gives
// back what its attempts may have taken.
func (l *Locker) Acquire(ctx context.Context, name string, opts ...Option) (*Lease, error) {
	co, err := l.callOptions(name, opts)
	if err != nil {
		return nil, err
	}
	open := co.openSet && co.open // Acquire fails open only when asked to
	got, err := l.acquireObserved(ctx, name, co, open)
	if err != nil && open && outage(ctx, err) {
		return l.degraded(ctx, name, co.kind, err), nil
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
	l.bg.Add() // Close waits for the call, and for the clean-ups it starts when Close ends it
	defer l.bg.Done()
	lease := l.leaseOf(co.kind, name, co.ttl)
	if co.owner != "" {
		lease.owner, lease.ownerArg = co.owner, co.owner
	}
	a := l.newAcquisition(ctx, lease, co.wait, open, st)
	own, woken := lease.kind.(waking)
	switch {
	case co.fair && co.wait > 0:
		return a.fair()
	case woken:
		return a.plain(own.wakeup(lease))
	case co.wait > 0 && l.rl != nil:
		return a.plain(l.rl.wakeup(lease))
	}
	return a.plain(&releases{l: l, key: lease.keys[keys.LockKey]})
}

// outage reports whether err, an Acquire's, is one that a fail-open call
// runs its work degraded on: Redis unavailable, and ctx still running.
func outage(ctx context.Context, err error) bool {
	return errors.Is(err, ErrUnavailable) && ctx.Err() == nil
}

// degraded returns the fail-open stand-in for a lease of name (of k, if
// not nil), after an Acquire that failed with err, and logs it at Error
// level.
func (l *Locker) degraded(ctx context.Context, name string, k kind, err error) *Lease {
	l.opts.Logger.LogAttrs(ctx, slog.LevelError, "fencelock: redis unavailable, running without the lock (fail-open)",
		slog.String("lock", name), slog.Any("error", err))
	lease := &Lease{locker: l, kind: l.b, name: name, degraded: true}
	lease.keys[keys.LockKey], lease.keys[keys.CounterKey] = l.keys(name)
	if k != nil {
		lease.setKind(k)
	}
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

	lease := &Lease{locker: l, kind: l.b, name: name, ttl: ttl, owner: l.opts.Owner, ownerArg: l.ownerArg}
	lease.keys = keys.ForLease(l.opts.KeyPrefix, name, token[:])
	lease.token = lease.keys[keys.MarkerKey][len(lease.keys[keys.MarkerKey])-len(token):]
	lease.tokenArg = boxed(&lease.token)
	for i := range lease.keys {
		lease.keyArgs[i] = boxed(&lease.keys[i])
	}
	return lease
}

// leaseOf returns a new lease of kind k (nil: the lock of the name) for
// name, at the keys of its kind.
func (l *Locker) leaseOf(k kind, name string, ttl time.Duration) *Lease {
	lease := l.newLease(name, ttl)
	if k != nil {
		lease.setKind(k)
	}
	return lease
}

// boxed returns *p as an interface value without copying it: its data word
// points at *p, where boxing a string copies its header to the heap, six
// allocations per lease (its keys and token). *p must not change while the
// value is in use: a kind that gives a lease other keys (setKeys) sets its
// keyArgs with them. *p lives as long as the value does (a Lease's own
// fields). It relies on an interface's layout, its type then its data word,
// which TestBoxed checks.
func boxed(p *string) any {
	var v any = ""
	(*[2]unsafe.Pointer)(unsafe.Pointer(&v))[1] = unsafe.Pointer(p)
	return v
}

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
	l.bg.GiveBack(what, lease.name, lease.currentTTL(), try)
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
	return l.deadlines.WithTimeout(ctx, l.opts.ReleaseTimeout)
}

// ctxErr is ctx.Err(), or context.DeadlineExceeded once ctx's deadline has
// passed even if its timer has not fired yet (a call that honours the deadline
// may return first).
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) { // real time, as ctx's deadline
		return context.DeadlineExceeded
	}
	return nil
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
