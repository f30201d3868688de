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
// Cluster or Ring) on Redis 6.2 or later. Acquire, RunWithLock, Release and
// Extend return within a few milliseconds of their context's end, whatever
// the client's options ("Deadlines and the watchdog"; docs/failures.md).
//
// [GUARANTEES.md]: https://github.com/fencelock/fencelock/blob/main/GUARANTEES.md#how-it-works
package fencelock

// Architecture, for contributors (not part of the package documentation):
//
//	API        lock.go (Locker, New, Close, Acquire; the background work it owns),
//	           lease.go (Lease), watchdog.go (RunWithLock, KeepAlive), inspect.go,
//	           check.go, options.go, observer.go
//	kinds      semaphore.go (Semaphore: a kind with semaphore_*.lua), rwlock.go
//	           (RWLock: a kind with rwlock_*.lua), multi.go (AcquireAll,
//	           RunWithLocks: a set kind with multi_acquire.lua, or sorted Acquires)
//	waiting    acquire.go (one acquisition: try, rotate, complete, give up; plain
//	           waiting), fair.go (fair line), redlock_line.go (Redlock line),
//	           wait.go (pub/sub: one hub goroutine per node, messages to hearers)
//	seam       backend.go: kind (acquire, extend, release; keyed, ownKeys and
//	           waking when its leases have keys or wake-ups of their own),
//	           backend (a lock's kind, and inspect, register, close), traits
//	stores     deployment.go (one Redis: its script calls, Cluster routing, WAIT
//	           for Replicas); redlock.go (quorum: fan-out, fence phases, splits)
//	scripts    scripts.go (one script type), prelude.lua + one .lua per script,
//	           scripts_hashes.go (their SHA-1s, written by go generate)
//	errors     errors.go (sentinels, classify, advice), acl.go (the ACL rules)
