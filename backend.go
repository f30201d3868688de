package fencelock

import (
	"context"
	"time"
)

// A kind is what takes, extends and gives back one kind of lease where the
// Locker keeps its locks: the backend itself for a lock; a semaphore's
// permits or a read-write lock's shares bring their own scripts.
type kind interface {
	// acquire tries once to take the lease for its token and, when it
	// does, to issue its fence.
	acquire(ctx context.Context, lease *Lease) attempt
	// extend sets the lease's expiry to ttl if its token holds it; renewal
	// says the watchdog asks (see Lease.extend). It returns 1 when the
	// expiry was set, 0 when the lease does not exist, -1 when another
	// token holds it.
	extend(ctx context.Context, lease *Lease, ttl time.Duration, renewal bool) (int64, error)
	// release deletes the lease if its token holds it and retires the
	// token (mode: modeRelease or modeAbandon; see release.lua). It returns
	// 1 when the lease was deleted (now or by an earlier try), 0 when it
	// does not exist, -1 when another token holds it, and in perr the error
	// of a wake-up that could not be published.
	release(ctx context.Context, lease *Lease, mode string) (code int64, perr, err error)
}

// A keyed kind keeps its leases at keys of its own (a semaphore's permits,
// a read-write lock's shares), sharing the name's hash tag: Lease.setKind
// sets them on each lease of the kind.
type keyed interface {
	kind
	setKeys(lease *Lease)
}

// ownKeys is a keyed kind whose lease key is no string (a semaphore's
// sorted set): a fair waiter waits in its own line (Locker.queue), and
// Lease.TTL asks it.
type ownKeys interface {
	keyed
	queue(ctx context.Context, lease *Lease, ttl time.Duration, mode string) (queueReply, error)
	holding(ctx context.Context, lease *Lease) (holding, error)
}

// A waking kind brings the wake-ups of its waiting Acquire calls, as its
// releases publish them on a channel of its own (see wakeup).
type waking interface {
	kind
	wakeup(lease *Lease) wakeup
}

// setKind makes l a lease of k, with k's own keys if it has them.
func (l *Lease) setKind(k kind) {
	l.kind = k
	if o, ok := k.(keyed); ok {
		o.setKeys(l)
	}
}

// A backend is where the locks are kept: one Redis deployment (New), or a
// quorum of independent ones (NewRedlock). Everything else of a lease's
// life (deadlines, the watchdog, waiting, retries, the clean-ups in the
// background) is written once, over these calls.
type backend interface {
	kind // of a lock
	// inspect reads the lock at key and its fence counter, and with
	// waiters how many subscribe to its channel, changing nothing.
	inspect(ctx context.Context, key, fenceKey string, waiters bool) (holding, error)
	// register adds a waiter for the messages on the channel of the lock at
	// key, which h decides what wakes.
	register(key string, h hearer) *waiter
	// close closes the waiters' subscriptions and waits for their
	// goroutines until by at most.
	close(by time.Time)
}

// traits are what the Locker's acquisitions need to know of its backend
// that no call asks, set by New and NewRedlock.
type traits struct {
	// deadlines: go-redis stops every call at its context's deadline
	// (ContextTimeoutEnabled on every client).
	deadlines bool
	// stops: acquire returns as soon as its context ends, whatever the
	// clients' options (a Redlock's node calls run on goroutines of their
	// own, and it stops reading them then): Acquire then needs no
	// goroutine of its own to return by the context's end.
	stops bool
}

// attempt is the outcome of one try to acquire.
type attempt struct {
	ok    bool
	fence int64
	pttl  time.Duration // the holder's, when busy; -1: no expiry
	owner string        // the holder's, when busy
	name  string        // the name found busy, when a lease stands for several (AcquireAll); "": its own
	err   error
	// retire: the try may have taken the lock somewhere without getting
	// it (a quorum not reached, too few replicas); the backend is giving
	// that back in the background and retiring the token, so the next try
	// needs a new one.
	retire bool
	// free: the try found the lock free and took it, but on too few
	// replicas or nodes to keep it (it is given back): a busy answer seen
	// before no longer stands.
	free bool
	// lined: busy, and the attempt's Acquire is in the line of a Redlock
	// quorum's first node, whose releases name who tries next; ahead is how
	// many are ahead of it there (see line).
	lined bool
	ahead int64

	// holders is how many hold a semaphore's permits, when all are taken;
	// 0 for a lock.
	holders int
}
