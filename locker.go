package fencelock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/internal/deadline"
	"github.com/fencelock/fencelock/internal/deployment"
	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/redlock"
	"github.com/fencelock/fencelock/internal/store"
	"github.com/fencelock/fencelock/internal/tasks"
)

// A Locker acquires locks in one Redis deployment (New), or a quorum of them
// (NewRedlock). It is safe for concurrent use: create one per client and share
// it. A zero Locker's methods return an error matching ErrInvalid.
type Locker struct {
	store  store.Store
	traits store.Traits
	// single is the deployment's own calls, for fair waiting and the kinds
	// that live on one deployment; nil on a Redlock.
	single store.Single
	lock   kind // the lock of a name
	opts   Options
	clock  Clock
	bg     *tasks.Group
	// deadlines ends the contexts of the calls that run on their caller's
	// goroutine.
	deadlines deadline.Heap
	checks    []checkNode // what Check looks at: each deployment's client

	publishWarned atomic.Bool   // a failed wake-up was logged
	closed        chan struct{} // closed by Close: Acquire returns ErrClosed
	closeOnce     sync.Once
}

// New returns a Locker that keeps its locks in client, configured by opts (nil:
// all defaults), making no Redis call; an error wrapping ErrInvalid for a nil
// client or an option it cannot honour. It adds a hook to client that only
// records failed dials, so that an error can name why Redis was unreachable.
func New(client redis.UniversalClient, opts *Options) (*Locker, error) {
	if err := deployment.Usable(client); err != nil {
		return nil, invalidf("%v", err)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	l := newLocker(o)
	d := deployment.New(client, l.deploymentConfig(""))
	l.store, l.traits, l.single = d, d.Traits(), d
	l.lock = kind{lease: d.Lock, queued: d.FairLock}
	l.checks = []checkNode{{client: client, single: d}}
	return l, nil
}

// NewRedlock returns a Locker whose locks are held on a quorum of
// independent Redis deployments, the Redlock algorithm with fences ordered
// without trusting clocks ("How Redlock works"), its leases used as New's. A
// lock is held when len(clients)/2+1 deployments granted it within its
// validity; a minority down or hung is not an outage. Use an odd number (four
// tolerate the loss of one, as three do), none a replica of another or a node
// of the same Cluster, given in the same order in every process: waiters wait
// in line on the first. It returns an error matching ErrInvalid, with no Redis
// call, for no clients or more than 64, a nil client, the same client twice,
// or an option it cannot honour. It adds New's dial hook to every client.
func NewRedlock(clients []redis.UniversalClient, opts *Options) (*Locker, error) {
	if len(clients) == 0 {
		return nil, invalidf("no redis clients")
	}
	if len(clients) > 64 {
		return nil, invalidf("%d redis clients: at most 64", len(clients))
	}
	for i, c := range clients {
		switch err := deployment.Usable(c); {
		case errors.Is(err, deployment.ErrNilClient):
			return nil, invalidf("redis client %d is nil", i)
		case err != nil:
			return nil, invalidf("redis client %d: %v", i, err)
		}
		for j := range i {
			if clients[j] == c {
				return nil, invalidf("redis clients %d and %d are the same client", j, i)
			}
		}
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	l := newLocker(o)
	nodes := make([]*deployment.Deployment, len(clients))
	for i, c := range clients {
		name := "node " + strconv.Itoa(i)
		if rc, ok := c.(*redis.Client); ok {
			name += " (" + rc.Options().Addr + ")"
		}
		nodes[i] = deployment.New(c, l.deploymentConfig(name))
		l.checks = append(l.checks, checkNode{client: c, single: nodes[i], name: name})
	}
	var tag [4]byte
	_, _ = rand.Read(tag[:])
	q := redlock.New(nodes, redlock.Config{KeyPrefix: o.KeyPrefix, Owner: o.Owner, ReleaseTimeout: o.ReleaseTimeout,
		FenceRetention: o.FenceRetention, MinRetryBackoff: o.MinRetryBackoff, MaxRetryBackoff: o.MaxRetryBackoff,
		Clock: o.Clock, Tasks: l.bg, Closed: l.closed, LineTag: hex.EncodeToString(tag[:])})
	l.store, l.traits = q, q.Traits()
	l.lock = kind{lease: q.Lock}
	return l, nil
}

func newLocker(o Options) *Locker {
	final := func(err error) bool { return classify(err) == store.Misconfigured }
	return &Locker{opts: o, clock: o.Clock, closed: make(chan struct{}),
		bg: tasks.New(o.Clock, o.ReleaseTimeout, o.Logger, final)}
}

func (l *Locker) deploymentConfig(name string) deployment.Config {
	o := &l.opts
	return deployment.Config{KeyPrefix: o.KeyPrefix, TTL: o.TTL, Owner: o.Owner, ReleaseTimeout: o.ReleaseTimeout,
		FenceRetention: o.FenceRetention, Replicas: o.Replicas, ReplicaTimeout: o.ReplicaTimeout,
		ReplicaFsync: o.ReplicaFsync, Logger: o.Logger, Clock: o.Clock, Tasks: l.bg, Name: name}
}

// A kind makes the store's leases of one kind: a lock's, a semaphore's
// permits, a read-write lock's shares, several locks taken together.
type kind struct {
	lease  func(store.Spec) store.Lease
	queued func(store.Spec) store.Queued // nil: it cannot wait in line (WithFair)
}

// Close ends the Locker's acquisitions: Acquire and RunWithLock then return
// ErrClosed with no Redis call, as a waiting Acquire, or one with an attempt in
// flight, does at once. Close waits for the background work for at most
// Options.ReleaseTimeout; leases already held go on. It does not close the
// Redis client, and always returns nil.
func (l *Locker) Close() error {
	if l == nil || l.store == nil {
		return nil
	}
	l.closeOnce.Do(func() { close(l.closed) })
	by := l.clock.Now().Add(l.opts.ReleaseTimeout + closeGrace)
	l.store.Close(by)
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

// usable returns an ErrInvalid error for a nil or zero Locker.
func (l *Locker) usable() error {
	if l == nil || l.store == nil {
		return invalidf("Locker not created with New or NewRedlock")
	}
	return nil
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
	co := callOptions{ttl: l.opts.TTL, kind: l.lock}
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
	if co.fair && co.kind.queued == nil {
		return co, invalidf("WithFair on a NewRedlock Locker: a queue kept on a quorum of nodes would need consensus")
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
		return l.degraded(ctx, name, co, err), nil
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

// acquireWith is acquireObserved without the Observer's Start and End: it
// waits in line with WithFair (fair.go), or as wait.go tells.
func (l *Locker) acquireWith(ctx context.Context, name string, co callOptions, open bool, st *acquireStats) (*Lease, error) {
	l.bg.Add() // Close waits for the call, and for the clean-ups it starts when Close ends it
	defer l.bg.Done()
	spec := l.spec(name, co)
	if co.fair && co.wait > 0 {
		q := co.kind.queued(spec)
		a := l.newAcquisition(ctx, l.leaseOf(name, co, q), co.wait, open, st)
		return newFairWait(a, co.kind.queued, spec, q).run()
	}
	return l.newAcquisition(ctx, l.leaseOf(name, co, co.kind.lease(spec)), co.wait, open, st).plain()
}

// spec is the store's spec of a new lease of the call co for name, with a
// fresh token.
func (l *Locker) spec(name string, co callOptions) store.Spec {
	owner := l.opts.Owner
	if co.owner != "" {
		owner = co.owner
	}
	return store.Spec{Name: name, Token: newToken(), TTL: co.ttl, Owner: owner, Fair: co.fair && co.wait > 0}
}

// leaseOf returns a lease of the call co for name, not acquired yet, of
// the store's h.
func (l *Locker) leaseOf(name string, co callOptions, h store.Lease) *Lease {
	owner := l.opts.Owner
	if co.owner != "" {
		owner = co.owner
	}
	return &Lease{locker: l, h: h, name: name, ttl: co.ttl, owner: owner}
}

// newToken returns a version 4 UUID's text, from crypto/rand, which cannot
// fail.
func newToken() []byte {
	var u uuid.UUID
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	const hexDigits = "0123456789abcdef"
	token := make([]byte, 0, 36)
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			token = append(token, '-')
		}
		token = append(token, hexDigits[c>>4], hexDigits[c&0xf])
	}
	return token
}

// outage reports whether err, an Acquire's, is one that a fail-open call
// runs its work degraded on: Redis unavailable, and ctx still running.
func outage(ctx context.Context, err error) bool {
	return errors.Is(err, ErrUnavailable) && ctx.Err() == nil
}

// degraded returns the fail-open stand-in for a lease of name of the call
// co, after an Acquire that failed with err, and logs it at Error level.
func (l *Locker) degraded(ctx context.Context, name string, co callOptions, err error) *Lease {
	l.opts.Logger.LogAttrs(ctx, slog.LevelError, "fencelock: redis unavailable, running without the lock (fail-open)",
		slog.String("lock", name), slog.Any("error", err))
	lease := l.leaseOf(name, co, co.kind.lease(l.spec(name, co)))
	lease.degraded = true
	return lease
}

// abandon makes what the attempts of an Acquire that gave up may have done
// harmless, in the background: it deletes the lock if one of them took it,
// and retires the token, so that an attempt reaching Redis only later does
// not take the lock. See giveBack for how long it tries.
func (l *Locker) abandon(lease *Lease) {
	l.giveBack(lease, "clean-up after a failed acquire", func(ctx context.Context) (bool, error) {
		r, perr, err := lease.h.Release(ctx, store.Abandon, lease.currentTTL())
		if err != nil {
			return false, callError(lease.name, err)
		}
		l.warnPublish(lease.name, perr)
		return r == store.Done, nil
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
// until Redis answers, Redis refuses (ErrMisconfigured), Close is called,
// or the lease's TTL has passed since it started (by then the lock, taken
// or last extended before, has expired by itself). Each try is bounded by
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
// passed even if its timer has not fired yet (a call that honours the
// deadline may return first).
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

// LockInfo is what Locker.Inspect found about a lock.
type LockInfo struct {
	Name      string
	Held      bool
	Owner     string        // the holder's Options.Owner or WithOwner; "" when not held or not stored
	TTL       time.Duration // left on the server; 0 when not held, -1 when the lock has no expiry
	Fence     int64         // the fence of the current holding; 0 when not held
	LastFence int64         // the last fence issued, kept for FenceRetention; 0 if none (Redlock: "How Redlock works")
	Waiters   int           // how many Lockers wait for the lock's release, each counted once
}

// Inspect reads the lock called name, changing nothing; on a Redlock, the
// holding a quorum agree on. It returns ErrInvalid for a bad name, ErrUnavailable
// (on a Redlock, no quorum answered within Options.ReleaseTimeout) or
// ErrMisconfigured, or an error matching ctx.Err().
func (l *Locker) Inspect(ctx context.Context, name string) (LockInfo, error) {
	if err := l.usable(); err != nil {
		return LockInfo{}, err
	}
	if err := checkName(name); err != nil {
		return LockInfo{}, err
	}
	h, err := l.read(ctx, name, fmt.Sprintf("inspect %q", name), func(ctx context.Context) (store.Holding, error) {
		return l.store.Inspect(ctx, name, true)
	})
	if err != nil {
		return LockInfo{}, err
	}
	info := LockInfo{Name: name, LastFence: h.Counter, Waiters: h.Waiters}
	if h.Value != "" {
		_, info.Fence, info.Owner = keys.Parse(h.Value)
		info.Held, info.TTL = true, h.PTTL
	}
	return info, nil
}

// read runs f, a read of the lock called name (what names it in an
// error), bounded by ctx whatever the client's options.
func (l *Locker) read(ctx context.Context, name, what string, f func(ctx context.Context) (store.Holding, error)) (store.Holding, error) {
	type result struct {
		h   store.Holding
		err error
	}
	res, done := tasks.Call(l.bg, ctx.Done(), nil, func() result {
		h, err := f(ctx)
		return result{h, err}
	}, nil)
	switch {
	case !done || (res.err != nil && (classify(res.err) == store.NoVerdict || ctxErr(ctx) != nil)):
		return store.Holding{}, ctxEnded(ctx, what)
	case res.err != nil:
		return store.Holding{}, callError(name, res.err)
	}
	return res.h, nil
}
