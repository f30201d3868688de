// Package store is the seam between a Locker's leases and Redis: what one
// deployment (internal/deployment) or a quorum (internal/redlock) does. It
// knows no Redis client. A Store makes one Lease per token, the store's own
// value for it (its keys, a quorum's per-node state).
package store

import (
	"context"
	"time"
)

// A Store keeps a Locker's locks.
type Store interface {
	// Lock returns the lease of spec's token, not acquired yet.
	Lock(spec Spec) Lease
	// Inspect reads the lock called name, changing nothing; with waiters,
	// also how many Lockers wait for it.
	Inspect(ctx context.Context, name string, waiters bool) (Holding, error)
	// Mark and Since explain an attempt begun at Mark() that got no reply:
	// the error of a connection that failed since, and whether it cannot
	// have reached Redis (no connection was open or made since).
	Mark() Mark
	Since(m Mark) (cause error, unsent bool)
	// Close ends the subscriptions and waits for the store's goroutines
	// until by at most.
	Close(by time.Time)
}

// A Mark is counts of connections made and failed.
type Mark struct{ Dials, Failures int64 }

// Traits are what a store's constructor tells of it.
type Traits struct {
	Deadlines bool // every call stops at its context's deadline: one bounded by a deadline alone runs on its caller's goroutine
	Stops     bool // Acquire returns as soon as its context ends, whatever the client's options
}

// A Spec is what a store needs to know of a lease it makes.
type Spec struct {
	Name  string
	Token []byte // fresh and random: a UUID's text
	TTL   time.Duration
	Owner string
	Fair  bool // an attempt that finds the lock busy joins its line of fair waiters
}

// A Lease is one token's lease in a store, sent one call at a time.
type Lease interface {
	Key() string // the lock's
	Token() string
	Acquire(ctx context.Context) Attempt // one try to take the lock and issue its fence
	// Extend sets the lock's expiry to ttl if the token holds it; a
	// renewal is sent as EVAL (one round trip on an emptied script cache).
	Extend(ctx context.Context, ttl time.Duration, renewal bool) (Result, error)
	// Release deletes the lock if the token holds it and retires the
	// token; perr is the error of a wake-up that could not be published.
	Release(ctx context.Context, mode Mode, ttl time.Duration) (r Result, perr, err error)
	Read(ctx context.Context) (Holding, error) // as Inspect, without waiters
	Next(token []byte) Lease                   // the same call's lease with another token
	Wakeup() Wakeup                            // how a waiting call learns the lock may be free
}

// QueueEntryTTL is how long a fair waiter's entry in line lives without a
// keep-alive.
const QueueEntryTTL = 2 * time.Second

// Result is what an extension or a release found.
type Result int8

const (
	Gone  Result = iota // the lock does not exist: expired or deleted
	Done                // set (Extend); deleted, now or by an earlier try (Release)
	Taken               // another token holds it
)

// Mode is how Release retires a token: its marker lets a resent release
// report what the first did; an Abandon's refuses a late attempt.
type Mode string

const (
	Release Mode = "r"
	Abandon Mode = "a"
)

// An Attempt is the outcome of one try to acquire.
type Attempt struct {
	OK    bool
	Fence int64
	Busy  Busy // when neither OK nor Err
	Err   error
	// Retire: the try may hold the lock somewhere without having got it;
	// the store gives that back, and the token is not used again.
	Retire bool
	Free   bool // the lock was free, but too few replicas or nodes kept it
}

// Busy is who holds a lock an attempt found busy.
type Busy struct {
	Name    string        // the name found busy, when a lease stands for several
	Owner   string        // the holder's
	TTL     time.Duration // the holder's; -1: no expiry; -3: free, but fair waiters go first
	Holders int           // how many hold a semaphore's permits; 0 for a lock
}

// Holding is a lock as read.
type Holding struct {
	Value   string        // "<token> <fence> <owner>"; "" when not held
	PTTL    time.Duration // when held; -1: no expiry
	Counter int64         // the fence counter; 0 when none
	Waiters int
}

// A Wakeup is how a waiting Acquire learns, between its attempts, that the
// lock may be free: its releases, or its turn in a line.
type Wakeup interface {
	// Next returns, after the attempt at (busy: the lock was held), what
	// ends the pause before the next attempt, and its longest, given the
	// backoff's d.
	Next(at Attempt, busy bool, d time.Duration) (<-chan struct{}, time.Duration)
	Woken() time.Duration // how much longer to pause after a wake-up, to spread the waiters
	// Leave stops the wake-ups, passing one the call did not use on unless
	// it took the lock; with gaveUp, the lease of a call that gave up
	// holding nothing, it also gives back its place.
	Leave(gaveUp Lease, took bool)
}
