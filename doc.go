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
//		return settle(ctx, day, lease.Fence()) // UPDATE ... WHERE fence_token < $fence
//	})
//
// A Locker acquires a named lock with one round trip and returns a Lease,
// which extends and releases it with compare-the-token scripts, so it never
// deletes or extends another holder's lock. RunWithLock wraps a critical
// section: it acquires, renews the lease every TTL/3 while the work runs,
// cancels the work's context with cause ErrLost as soon as the lock is no
// longer certainly held, and releases. Locker.Inspect reads a lock without
// changing it; Options.Observer reports every call for metrics and traces.
//
// Each mechanism below is explained once in depth: on the entry point it
// names, or in the section of [GUARANTEES.md] named in quotes, a page that
// also reports what a fault-injection suite of real processes measured.
//
// # What a Redis lock cannot promise
//
// A Redis lock is an efficiency lock: it keeps instances from doing the same
// work twice. A process pause (GC, SIGSTOP, a suspended VM) longer than the
// TTL, or a failover to a replica that had not received the lock, can let two
// holders believe they hold it at once; no timer in a paused process can fire.
// When correctness depends on mutual exclusion, pass Lease.Fence to the
// protected resource and have it reject writes with an older fence.
//
// # Errors
//
// Errors fall in classes a caller handles differently, each a sentinel to
// match with errors.Is: ErrNotObtained (busy; a *BusyError says who),
// ErrUnavailable, ErrMisconfigured (the message says what to fix),
// ErrNotHeld, ErrLost, ErrInvalid and ErrClosed; each one's documentation
// says what falls under it, and no error matches two of the first three.
// When the caller's context ends before Redis gave any verdict, the error
// matches ctx.Err() and none of the classes: a shutdown is not "another
// instance is on it". Error messages are one line.
//
// # Fencing tokens
//
// Every successful acquisition gets a fencing token (Lease.Fence), a
// positive int64 issued in the same atomic step that sets the lock, and
// strictly increasing per lock name: on one deployment also after its
// counter expired, as each is floored by the TIME of the Redis server that
// issues it; on a Redlock, counted on from its nodes' counters. Pass it to
// every write the critical section makes, and have the resource refuse a
// write whose token is not greater than the greatest it has accepted:
//
//	UPDATE settlements SET status = 'done', fence_token = @fence
//	WHERE settle_date = @date AND fence_token < @fence
//
// "Fencing tokens" gives the argument and what it rests on; "Acquire,
// release and the keys", the keys the library writes, which all expire and
// share the hash tag {name}.
//
// # Deadlines and waiting
//
// Acquire, RunWithLock, Release and Extend return within a few milliseconds
// of their context's deadline or cancellation, whatever the go-redis
// client's options. The watchdog cancels the work at the lease's local
// Deadline, before Redis could expire the lock unless the local clock runs
// slow by more than the drift allowance ("Deadlines and the watchdog").
//
// WithWait makes Acquire wait for a busy lock, woken by a pub/sub message
// that the release publishes; a lost one costs at most a backoff or the
// holder's TTL, never correctness, and a waiter on a slow link can starve
// ("Waiting"). WithFair waits in line instead: a release hands the lock to
// the first live waiter in the same script, fence and all, and a plain
// Acquire never jumps the line ("How fair waiting works").
//
// # Read-write locks and several names
//
// Locker.RWLock returns a read-write lock: any number of shared leases
// (AcquireShared) or one exclusive lease (Acquire), never both; a writer
// that waits stops new readers, and fences increase across all its leases
// ("Read-write locks"). Locker.AcquireAll takes several names, all or none:
// in one script where they share a deployment or a Cluster slot, else one
// by one in sorted order, so that overlapping calls never wait for each
// other in a circle ("Several names at once").
//
// # Degraded runs
//
// Options.FailOpen, or WithFailOpen per call, runs the work on a degraded
// lease (no lock, Fence 0) on ErrUnavailable alone. What guards a degraded
// run is what makes the work safe to run twice: a unique key, a conditional
// update on the row's own state ("Fail-open and degraded runs").
//
// # Redlock
//
// NewRedlock keeps each lock on N independent deployments and holds it when
// a quorum, N/2+1, granted it within its validity; its fences stay ordered
// without trusting clocks, a minority down or hung is not an outage, and
// waiters wait in line on the first node ("How Redlock works"). "What
// Redlock rests on" tabulates what it rests on and what breaks it.
//
// # Replicas and Redis clients
//
// Options.Replicas makes an acquisition, and each extension, count only
// once that many replicas acknowledged it (WAIT), so that a failover to an
// acknowledging replica keeps the lock; it does not make the failover
// itself safe ("Replicas and failover"). Locker.Check inspects the
// deployment for settings that weaken the lock's guarantees (see Finding).
//
// A Locker accepts any go-redis v9 UniversalClient (standalone, Sentinel,
// Cluster or Ring) on Redis 6.2 or later. Set ContextTimeoutEnabled in the
// client's options: the calls of this package return by the deadline either
// way, but without it go-redis's own goroutine, and its connection, wait for
// ReadTimeout. The watchdog's deadline does not depend on it.
//
// [GUARANTEES.md]: https://github.com/fencelock/fencelock/blob/main/GUARANTEES.md#how-it-works
package fencelock

// Architecture, for contributors (not part of the package documentation):
//
//	API        lock.go (Locker, New, Close, Acquire's plain wait), lease.go (Lease),
//	           watchdog.go (RunWithLock, KeepAlive), inspect.go, check.go, options.go
//	kinds      rwlock.go (RWLock: a kind, rwlock_*.lua), multi.go (AcquireAll, RunWithLocks)
//	waiting    fair.go (fair line), redlock.go's line (Redlock line), wait.go
//	           (pub/sub: one hub goroutine per node, wake-ups to waiters)
//	seam       backend.go: backend (acquire, extend, release, inspect, register,
//	           close) and traits; deployment (one Redis, WAIT for Replicas)
//	quorum     redlock.go: quorum's fan-out, fence phases, split decision
//	scripts    scripts.go (one script type), prelude.lua + one .lua per script
//	errors     errors.go (sentinels, classify, advice), acl.go (the ACL rules)
