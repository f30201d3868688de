// Package store is the seam between a Locker's leases and Redis: what every
// place that keeps locks does, one deployment (internal/deployment) or a
// quorum of them (internal/redlock). It knows no Redis client; errors carry
// their class (Class). A Store makes one Lease per token, the store's own
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
	// Mark returns the counts of the store's connections, for Since.
	Mark() Mark
	// Since explains an attempt begun at m that got no reply: the error
	// of a connection that failed since, and whether it cannot have
	// reached Redis (no connection was open or made since).
	Since(m Mark) (cause error, unsent bool)
	// Close ends the waiters' subscriptions and waits for the store's
	// goroutines until by at most.
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

// A Lease is one token's lease in a store. A Locker sends one call at a
// time on it.
type Lease interface {
	Key() string // the lock's
	Token() string
	// Acquire tries once to take the lock for the token and issue its
	// fence.
	Acquire(ctx context.Context) Attempt
	// Extend sets the lock's expiry to ttl if the token holds it; a
	// renewal is sent as EVAL (one round trip on an emptied script cache).
	Extend(ctx context.Context, ttl time.Duration, renewal bool) (Result, error)
	// Release deletes the lock if the token holds it and retires the
	// token; perr is the error of a wake-up that could not be published.
	Release(ctx context.Context, mode Mode, ttl time.Duration) (r Result, perr, err error)
	// Read reads the lock as Inspect does, without waiters.
	Read(ctx context.Context) (Holding, error)
	// Next returns the lease of the same call with another token.
	Next(token []byte) Lease
	// Wakeup returns how a waiting call learns that the lock may be free.
	Wakeup() Wakeup
}

// QueueEntryTTL is how long a fair waiter's entry in line lives without a
// keep-alive: a waiter that crashed is skipped after it.
const QueueEntryTTL = 2 * time.Second

// Result is what an extension or a release found.
type Result int8

const (
	Gone  Result = iota // the lock does not exist: expired or deleted
	Done                // set (Extend); deleted, now or by an earlier try (Release)
	Taken               // another token holds it
)

// Mode is how Release retires a token: its marker lets a resent release
// report what the first did, and an Abandon's refuses a late copy of the
// token's attempt.
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
	// the store gives that back and retires the token.
	Retire bool
	// Free: it found the lock free, but too few replicas or nodes kept it.
	Free bool
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
	// Woken returns how much longer to pause after a wake-up, to spread
	// the waiters one release woke.
	Woken() time.Duration
	// Leave stops the wake-ups; with gaveUp, the lease of a call that gave
	// up holding nothing, it also gives back its place. A wake-up the call
	// did not use goes to the next waiter unless it took the lock.
	Leave(gaveUp Lease, took bool)
}
