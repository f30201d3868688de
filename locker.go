package fencelock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/internal/deadline"
	"github.com/fencelock/fencelock/internal/deployment"
	"github.com/fencelock/fencelock/internal/driver"
	"github.com/fencelock/fencelock/internal/goredis"
	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/store"
	"github.com/fencelock/fencelock/internal/tasks"
)

// A Locker acquires locks in one Redis deployment (New), or a quorum of them
// (NewRedlock). It is safe for concurrent use: create one per client and share
// it. A zero Locker's methods return an error matching ErrInvalid.
type Locker struct {
	store  store.Store
	traits store.Traits
	single single // the deployment's own calls, for fair waiting and the kinds; nil on a Redlock
	lock   kind   // the lock of a name
	opts   Options
	clock  Clock
	bg     *tasks.Group
	// deadlines ends the contexts of calls run on their caller's goroutine.
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
	if err := goredis.Usable(client); err != nil {
		return nil, invalidf("%v", err)
	}
	return NewWith(goRedis(client), opts)
}

// A Connector makes a Locker's client of one Redis deployment, given the
// Locker's options as its internal package reads them. fencelock's adapter
// modules make them (fencerueidis for rueidis, fencevalkey for valkey-go);
// its types are internal, so no other package can.
type Connector = func(driver.Options) driver.Client

// NewWith is New for the client connect makes: what the adapter modules
// call. It returns an error wrapping ErrInvalid, with no Redis call, for a
// nil connect or an option it cannot honour.
func NewWith(connect Connector, opts *Options) (*Locker, error) {
	if connect == nil {
		return nil, invalidf("nil connector")
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	l := newLocker(o)
	c := connect(l.clientOptions())
	d := deployment.New(c, l.deploymentConfig(""))
	l.store, l.traits, l.single = d, d.Traits(), d
	l.lock = kind{lease: d.Lock, queued: l.fairLock}
	l.checks = []checkNode{{client: c, single: d}}
	return l, nil
}

// goRedis returns the Connector of a go-redis client, which goredis.Usable accepts.
func goRedis(c redis.UniversalClient) Connector {
	return func(o driver.Options) driver.Client { return goredis.New(c, o) }
}

func newLocker(o Options) *Locker {
	final := func(err error) bool { return classify(err) == store.Misconfigured }
	return &Locker{opts: o, clock: o.Clock, closed: make(chan struct{}),
		bg: tasks.New(o.Clock, o.ReleaseTimeout, o.Logger, final)}
}

func (l *Locker) deploymentConfig(name string) deployment.Config {
	o := &l.opts
	return deployment.Config{KeyPrefix: o.KeyPrefix, TTL: o.TTL, Owner: o.Owner, ReleaseTimeout: o.ReleaseTimeout,
		FenceRetention: o.FenceRetention, Logger: o.Logger, Clock: o.Clock, Tasks: l.bg, Name: name}
}

func (l *Locker) clientOptions() driver.Options {
	return driver.Options{Replicas: l.opts.Replicas, ReplicaTimeout: l.opts.ReplicaTimeout, ReplicaFsync: l.opts.ReplicaFsync}
}

// A kind makes the store's leases of one kind: a lock's, a semaphore's
// permits, a read-write lock's shares, several locks.
type kind struct {
	lease  func(store.Spec) store.Lease
	queued func(store.Spec) lineLease // nil: it cannot wait in line (WithFair)
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
	by := l.clock.Now().Add(l.opts.ReleaseTimeout + 100*time.Millisecond) // a clean-up's last call ends within it
	l.store.Close(by)
	l.bg.Close(by)
	return nil
}

// isClosed reports whether Close was called.
func (l *Locker) isClosed() bool {
	select {
	case <-l.closed:
		return true
	default:
		return false
	}
}

// usable returns an ErrInvalid error for a nil or zero Locker.
func (l *Locker) usable() error {
	if l == nil || l.store == nil {
		return invalidf("Locker not created with New or NewRedlock")
	}
	return nil
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

// acquireWith is Acquire without the Observer and failing open: it waits
// in line with WithFair (fair.go), or as wait.go tells.
func (l *Locker) acquireWith(ctx context.Context, name string, co callOptions, open bool, st *acquireStats) (*Lease, error) {
	l.bg.Add() // Close waits for the call, and for the clean-ups it starts when Close ends it
	defer l.bg.Done()
	spec := l.spec(name, co)
	if co.fair && co.wait > 0 {
		q := co.kind.queued(spec)
		a := l.newAcquisition(ctx, l.leaseOf(spec, q), co.wait, open, st)
		return newFairWait(a, co.kind.queued, spec, q).run()
	}
	return l.newAcquisition(ctx, l.leaseOf(spec, co.kind.lease(spec)), co.wait, open, st).plain()
}

// spec is the store's spec of a new lease of co for name: a fresh token.
func (l *Locker) spec(name string, co callOptions) store.Spec {
	owner := l.opts.Owner
	if co.owner != "" {
		owner = co.owner
	}
	return store.Spec{Name: name, Token: keys.NewToken(), TTL: co.ttl, Owner: owner, Fair: co.fair && co.wait > 0}
}

// leaseOf returns the lease of spec, the store's h, not acquired yet.
func (l *Locker) leaseOf(spec store.Spec, h store.Lease) *Lease {
	return &Lease{locker: l, h: h, name: spec.Name, ttl: spec.TTL, owner: spec.Owner}
}

// abandon makes what the attempts of an Acquire that gave up may have done
// harmless, in the background: it deletes the lock if one took it, and
// retires the token, so that a late attempt does not take it.
func (l *Locker) abandon(lease *Lease) {
	l.bg.GiveBack("clean-up after a failed acquire", lease.name, lease.currentTTL(), func(ctx context.Context) (bool, error) {
		r, perr, err := lease.h.Release(ctx, store.Abandon, lease.currentTTL())
		if err != nil {
			return false, callError(lease.name, err)
		}
		l.warnPublish(lease.name, perr)
		return r == store.Done, nil
	})
}

// releaseInBackground releases a lease in the background: after its work
// was lost, or after a Release whose caller did not wait for the answer.
func (l *Locker) releaseInBackground(lease *Lease) {
	l.bg.GiveBack("release", lease.name, lease.currentTTL(), func(ctx context.Context) (bool, error) {
		err := lease.release(ctx)
		if errors.Is(err, ErrNotHeld) {
			return false, nil
		}
		return err == nil, err
	})
}

// detached returns ctx without its cancellation, bounded by ReleaseTimeout.
func (l *Locker) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Done() != nil {
		ctx = context.WithoutCancel(ctx)
	}
	return l.deadlines.WithTimeout(ctx, l.opts.ReleaseTimeout)
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
