// Package fencelock provides Redis distributed locks with a watchdog and
// fencing tokens.
//
//	locker, err := fencelock.New(redisClient, nil) // TTL 30s, renewed every 10s
//	if err != nil {
//		return err
//	}
//	defer locker.Close()
//	err = locker.RunWithLock(ctx, "settlement:"+day, func(ctx context.Context, lease *fencelock.Lease) error {
//		// ctx is cancelled (cause fencelock.ErrLost) if the lock is lost.
//		return settle(ctx, day, lease.Fence()) // UPDATE ... WHERE status = 'pending' AND fence_token < $fence
//	})
//
// A Locker (New; NewRedlock for a quorum of deployments) acquires a named
// lock as a Lease, which extends and releases it only while it is its own;
// RunWithLock runs work under the lease's watchdog. WithWait and WithFair make
// Acquire wait; Semaphore, RWLock and AcquireAll take permits, shared leases
// and several names; Inspect and Check read a lock and the deployment. Errors
// are sentinels, one per thing a caller handles differently. A name in quotes
// is a section of [GUARANTEES.md], which explains each mechanism once.
//
// # Fencing tokens
//
// A Redis lock is an efficiency lock: a process pause longer than the TTL, or
// a failover to a replica that had not received the lock, can let two holders
// act at once. The fencing token (Lease.Fence), strictly increasing per lock
// name, lets the resource refuse a write whose token is not greater than the
// greatest it has accepted ("Fencing tokens"): a stale holder writing after a
// newer one, not one writing first. Work meant to happen once also checks the
// row's state; 0 rows changed means it is done, or a newer holder wrote:
//
//	UPDATE settlements SET status = 'done', fence_token = @fence
//	WHERE settle_date = @date AND status = 'pending' AND fence_token < @fence
//
// # Degraded runs
//
// Options.FailOpen, or WithFailOpen per call, runs the work on a degraded
// lease when Redis is unavailable at acquisition (ErrUnavailable), and on
// nothing else: never on a busy lock, ErrMisconfigured, ErrClosed or an ended
// context. A degraded lease holds no lock and has Fence 0: the work must be
// safe to run twice ("Fail-open and degraded runs").
//
// # Redis clients
//
// A Locker accepts any go-redis v9 UniversalClient (standalone, Sentinel,
// Cluster or Ring) on Redis 6.2 or later. The modules
// github.com/fencelock/fencelock/rueidis (fencerueidis) and .../valkeygo
// (fencevalkey) make the same Locker on rueidis and valkey-go clients
// (NewWith is what they call): their locks are the same locks, so processes
// on different clients exclude each other, share fences and wake each
// other's waiters. Acquire, RunWithLock, Release and Extend return within a
// few milliseconds of their context's end, whatever the client's options
// ("Deadlines and the watchdog"; docs/failures.md).
//
// [GUARANTEES.md]: https://github.com/fencelock/fencelock/blob/main/GUARANTEES.md#how-it-works
package fencelock

// # Architecture
//
// For contributors (not part of the package documentation). Start with the
// core, the plain lease: locker.go (New, Acquire), wait.go (the attempts),
// lease.go (Extend, Release), watchdog.go (renewal and loss), run.go
// (RunWithLock), then internal/store, the seam, and internal/deployment,
// which runs internal/script's acquire.lua, extend.lua and release.lua.
//
//	root (package fencelock): the public API and the lease lifecycle
//	    locker.go lease.go watchdog.go run.go wait.go   the core
//	    redlock.go                                        NewRedlock: a quorum of deployments
//	    fair.go                                           fair waiting: a line, a state machine
//	    semaphore.go rwlock.go multi.go                   the kinds, each a store.Lease of its own over one deployment
//	    check.go acl.go  options.go errors.go observer.go
//	        |
//	        | store.Store, store.Lease (one per token), store.Wakeup
//	        v
//	internal/store       the seam: results, attempts, error classes; no client
//	internal/deployment  one deployment: the lock's scripts through a driver.Client
//	internal/driver      what fencelock needs of a client library: the seam of the adapters
//	internal/redlock     a quorum of deployments: grants, fences, its line
//	internal/goredis     the go-redis Client: commands, WAIT, dials, pub/sub
//	internal/notify      wake-ups: hubs, connections, waiters; no protocol
//	internal/script      the .lua files, the prelude, EVALSHA then EVAL
//	internal/keys        the key layout and the lock's value (also cmd/fencelock's)
//	internal/tasks       tracked goroutines: bounded calls, give-backs
//	internal/deadline    one timer for the contexts of the calls
//	internal/backoff     the retry pause
//
// A client library plugs in at driver.Client (its scripts, WAIT, its
// servers for Check, its pub/sub as a notify.Network): internal/goredis for
// New, the rueidis/ and valkeygo/ modules (fencerueidis, fencevalkey) through
// NewWith. internal/conformance is the suite all three pass.
