// Package fencelock provides Redis distributed locks with a watchdog and
// fencing tokens.
//
// A Locker acquires a named lock with one round trip (SET key token NX PX ttl
// and a fencing token, in one Lua script; a second one, EVAL after NOSCRIPT,
// the first time after the server's script cache was emptied) and returns a
// Lease. The Lease releases and extends the lock with compare-the-token
// scripts, so it never deletes or extends another holder's lock.
//
// RunWithLock wraps a critical section: it acquires, renews the lease every
// TTL/3 while the work runs, cancels the work's context with cause ErrLost as
// soon as the lock is no longer certainly held, and releases.
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
// # Fencing tokens
//
// Every successful acquisition gets a fencing token (Lease.Fence), issued by
// the acquire script in the same atomic step that sets the lock. Pass it to
// every write the critical section makes, and have the resource refuse a
// write whose token is not greater than the greatest it has accepted:
//
//	UPDATE settlements SET status = 'done', fence_token = @fence
//	WHERE settle_date = @date AND fence_token < @fence
//
// A fence is a positive int64 (store it as BIGINT). For each lock name it is
// max(previous fence + 1, server time in microseconds since the Unix epoch),
// kept in the counter key KeyPrefix+"{"+name+"}:fence". The time floor comes
// from the Redis server's TIME, never from a client's clock, so fences stay
// strictly increasing per name even when the counter key is lost (evicted
// under maxmemory, flushed, or missing after a failover to a replica that had
// not received it), provided the clock of the server that issues a fence (after
// a failover, the new master's) is not behind the time at which the previous
// fence of the name was issued. Fences of different names
// are unrelated.
//
// The counter key has no expiry: it costs one small string key per lock name
// ever acquired, 50 to 150 bytes depending on the name's length (MEMORY USAGE
// on Redis 7: 56 bytes for lock:{a}:fence, 88 for
// lock:{settlement:2026-11-30}:fence).
// Deleting the counters of names no longer used is safe, because of the time
// floor.
//
// # Waiting
//
// WithWait makes Acquire wait for a busy lock. Release publishes a wake-up on
// a pub/sub channel named like the lock key, in the same script that deletes
// the lock; a waiting Acquire subscribes to it after its first
// busy attempt and before the next one, so a release in between is not
// missed. It then sleeps until a wake-up, the holder's remaining TTL, a capped
// jittered backoff (Options.MinRetryBackoff, Options.MaxRetryBackoff) or the
// end of the wait, whichever comes first. Wake-ups only make a waiter try
// sooner: a lost one (a crashed holder publishes nothing; a dropped
// subscription connection or a Redis restart loses messages) costs at most
// the backoff or the holder's TTL, never correctness.
//
// All waiters of a Locker share one subscription connection (on Redis
// Cluster, one per contended lock name, on the node that serves it) and the
// one goroutine that reads it. It is opened when the first waiter arrives and
// closed 30 seconds after the last one left, so that a steady stream of waits
// does not reconnect each time; Locker.Close closes it at once. Sharded
// pub/sub (SSUBSCRIBE, SPUBLISH; Redis 7) is used where the server has it,
// classic SUBSCRIBE and PUBLISH elsewhere. Waiters are not queued: when a lock
// is released, all of its waiters wake and one of them wins.
//
// # Deadlines and the watchdog
//
// A Lease's Deadline is the local monotonic time taken before the acquire (or
// last successful extend) request was sent, plus the TTL, minus a drift
// allowance of TTL/100 + 2ms. The watchdog (KeepAlive, RunWithLock) cancels
// the work's context when that deadline passes without a successful renewal,
// which is before Redis could expire the lock and grant it to someone else, as
// long as the local clock does not run slower than the server's by more than
// the allowance.
//
// # Redis clients
//
// A Locker accepts any go-redis v9 UniversalClient: standalone, Sentinel
// (failover), Cluster or Ring, on Redis 6.2 or later (the acquire script uses
// SET ... GET). On Cluster and Ring the waiters' subscriptions are one per
// contended lock name, each on the node that serves the name. The lock key,
// its fence counter and its wake-up channel share the hash tag {name}, so
// every script runs on one Cluster slot.
//
// Set ContextTimeoutEnabled in the client's options so a context's deadline
// also bounds a call to a Redis that stopped answering; otherwise such a call
// waits for the client's ReadTimeout. The watchdog's deadline does not depend
// on it.
package fencelock
