// Package store is the seam between a Locker's leases and Redis: what
// every place that keeps locks does, one Redis deployment
// (internal/deployment) or a quorum of them (internal/redlock). It knows no
// Redis client: results are named constants and small structs, and errors
// carry their class (Class).
//
// A Store makes one Lease per token: the store's own value for it (its
// keys, a quorum's per-node state), which acquires, extends, releases and
// reads the lock for that token. A waiting call takes a new token after an
// attempt that may hold the lock unseen (Attempt.Retire): Lease.Next.
package store

import (
	"context"
	"time"
)

// A Store keeps a Locker's locks.
type Store interface {
	// Lock returns the lease of spec's token on the lock called
	// spec.Name, not acquired yet.
	Lock(spec Spec) Lease
	// Inspect reads the lock called name, changing nothing; with waiters,
	// also how many Lockers wait for it.
	Inspect(ctx context.Context, name string, waiters bool) (Holding, error)
	// Mark returns a mark of the store's connections so far, for Since.
	Mark() Mark
	// Since explains an attempt begun at m that got no reply: cause is the
	// error of a connection that failed since m, and unsent reports that
	// the attempt cannot have reached Redis (no connection was open or
	// made since m).
	Since(m Mark) (cause error, unsent bool)
	// Close ends the waiters' subscriptions and waits for the store's
	// goroutines until by at most.
	Close(by time.Time)
}

// A Mark is what Store.Since compares with: counts of connections.
type Mark struct{ Dials, Failures int64 }

// Traits are what a Locker needs to know of its store that no call asks,
// set by the store's constructor.
type Traits struct {
	// Deadlines: the client stops every call at its context's deadline
	// (go-redis's ContextTimeoutEnabled): a call bounded by a deadline
	// alone can run on its caller's goroutine.
	Deadlines bool
	// Stops: Acquire returns as soon as its context ends, whatever the
	// client's options (a quorum's node calls run on goroutines of their
	// own).
	Stops bool
}

// A Spec is what a store needs to know of a lease it makes.
type Spec struct {
	Name  string
	Token []byte // a fresh random token, a UUID's text
	TTL   time.Duration
	Owner string
	// Fair: an attempt that finds the lock busy joins the lock's line of
	// fair waiters.
	Fair bool
}

// A Lease is one token's lease in a store: the store's own per-lease
// value. Its methods are safe for concurrent use; a Locker sends one call
// at a time on it.
type Lease interface {
	// Key returns the key of the lock the lease holds.
	Key() string
	// Token returns the lease's token.
	Token() string
	// Acquire tries once to take the lock for the token and, when it does,
	// to issue its fence.
	Acquire(ctx context.Context) Attempt
	// Extend sets the lock's expiry to ttl if the token holds it; renewal:
	// the watchdog asks, which sends the script as EVAL (one round trip
	// also on a server whose script cache was emptied).
	Extend(ctx context.Context, ttl time.Duration, renewal bool) (Result, error)
	// Release deletes the lock if the token holds it and retires the token
	// (mode), keeping the token's marker for as long as a lease of ttl.
	// perr is the error of a wake-up that could not be published.
	Release(ctx context.Context, mode Mode, ttl time.Duration) (r Result, perr, err error)
	// Read reads the lock as Inspect does, without waiters.
	Read(ctx context.Context) (Holding, error)
	// Next returns the lease of the same call with another token, which
	// nothing of this one's can touch.
	Next(token []byte) Lease
	// Wakeup returns how a waiting call learns, between its attempts,
	// that the lock may be free.
	Wakeup() Wakeup
}

// A Queued lease can wait in its lock's line of fair waiters: a lock's or
// a semaphore permit's on one deployment.
type Queued interface {
	Lease
	// Queue keeps the token's entry in the line alive for QueueEntryTTL,
	// or, with leave, takes it out; a grant is for ttl.
	Queue(ctx context.Context, ttl time.Duration, leave bool) (QueueReply, error)
}

// QueueEntryTTL is how long a fair waiter's entry in line lives without a
// keep-alive: a waiter that crashed is skipped after it.
const QueueEntryTTL = 2 * time.Second

// QueueReply is what a fair waiter's keep-alive or departure found.
type QueueReply struct {
	State QueueState
	Fence int64         // Granted
	PTTL  time.Duration // Granted, Waiting: the lock's PTTL (-2: free, a waiter ahead takes it)
}

// QueueState is where a fair waiter stands.
type QueueState int8

const (
	// Waiting: still in line, its entry kept alive (or, for a departure,
	// out of line).
	Waiting QueueState = 0
	// Granted: a release handed the lock to this token; for a departure,
	// the caller must release it, which hands it on.
	Granted QueueState = 1
	// OutOfLine: the entry is gone (it expired): join again.
	OutOfLine QueueState = 3
	// First: the lock is free and this waiter is first in line: take it.
	First QueueState = 4
)

// Result is what an extension or a release found.
type Result int8

const (
	// Gone: the lock does not exist (it expired or was deleted).
	Gone Result = iota
	// Done: set (Extend), or deleted now or by an earlier try (Release).
	Done
	// Taken: another token holds it.
	Taken
)

// Mode is how Release retires a token.
type Mode string

const (
	// Release a lease: the marker says it was released, so that a release
	// resent after a lost reply reports what the first one did.
	Release Mode = "r"
	// Abandon an Acquire that gave up: the marker also refuses a late copy
	// of the token's attempt, where the lock is not the token's.
	Abandon Mode = "a"
)

// An Attempt is the outcome of one try to acquire.
type Attempt struct {
	OK    bool
	Fence int64
	Busy  Busy // when neither OK nor Err
	Err   error
	// Retire: the try may hold the lock somewhere without having got it
	// (a quorum not reached, too few replicas); the store gives that back
	// in the background and retires the token: the next try needs another.
	Retire bool
	// Free: the try found the lock free and took it, but too few replicas
	// or nodes kept it: a busy answer seen before no longer stands.
	Free bool
}

// Busy is who holds a lock an attempt found busy.
type Busy struct {
	Name  string        // the name found busy, when a lease stands for several; "": its own
	Owner string        // the holder's
	TTL   time.Duration // the holder's; -1: no expiry; -3: free, but fair waiters are served first
	// Holders is how many hold a semaphore's permits when all are taken;
	// 0 for a lock.
	Holders int
}

// Holding is a lock as read.
type Holding struct {
	Value   string        // the lock's value, "<token> <fence> <owner>"; "" when not held
	PTTL    time.Duration // when held; -1: no expiry
	Counter int64         // the fence counter; 0 when none
	Waiters int
}

// A Wakeup is how a waiting Acquire learns, between its attempts, that the
// lock may be free: the lock's releases, or its turn in a line.
type Wakeup interface {
	// Next returns, after the attempt at (busy: the lock was held), what
	// ends the pause before the next attempt early, and how long the pause
	// lasts at most, given the backoff's d.
	Next(at Attempt, busy bool, d time.Duration) (<-chan struct{}, time.Duration)
	// Woken returns how much longer to pause after a wake-up, to spread
	// the waiters one release woke.
	Woken() time.Duration
	// Leave stops the wake-ups; with the lease of a call that gave up
	// holding nothing, it also gives back the place where that lease
	// waits. Unless the call took the lock, a wake-up it got as one of
	// many and did not use goes to the next waiter.
	Leave(gaveUp Lease, took bool)
}
