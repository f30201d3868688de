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
// A Locker acquires a named lock with one round trip (SET key NX PX ttl and a
// fencing token, in one Lua script; a second one, EVAL after NOSCRIPT, the
// first time after the server's script cache was emptied) and returns a
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
// The column must be NOT NULL (fence_token < @fence is never true for a
// NULL), and the write must check the rows it changed: 0 rows means a newer
// holder came first.
//
// A fence is a positive int64 (store it as BIGINT). For each lock name, on
// one deployment (New), it is max(previous fence + 1, server time in
// microseconds since the Unix epoch); a Redlock's fences count up by one
// from counters on its nodes (see Redlock below).
// The previous fence is kept in the counter key KeyPrefix+"{"+name+"}:fence"
// for Options.FenceRetention (default 1h) after the name's last acquisition,
// then the key expires: a service locking order:<id> does not grow Redis by a
// key per order for ever.
//
// Fences stay strictly increasing per name, also after the counter expired or
// was lost (evicted, flushed, or missing after a failover to a replica that
// had not received it), because each is floored by the TIME of the Redis
// server that issues it, never by a client's clock. The argument: a fence f
// issued at server time T is at most T plus the number of fences issued
// within the same microsecond, so f <= T in practice (one script takes
// several microseconds). While the counter exists, the next fence is greater
// than f by the counter. Once it has expired, at least FenceRetention has
// passed since f was issued, so the next fence, floored by the server's time
// then, is greater than T, hence than f, unless the server's clock (after a
// failover, the new master's) stepped back by more than FenceRetention in
// between. Choose a retention longer than any step back of your servers'
// clocks you want to survive. Fences of different names are unrelated.
//
// A retry of an acquisition (go-redis resending after a lost reply, or the
// next attempt of a waiting Acquire) finds the lock already held by its token
// and returns the fence issued to that token, which the lock's value keeps:
// "<token> <fence> <owner>" (Options.Owner or WithOwner). When the counter
// is at the largest int64, the acquisition fails with ErrMisconfigured and
// takes no lock: a fence is never issued twice (on a Redlock, when the
// nodes that refuse so leave no quorum).
//
// # Keys
//
// Per lock name, the library writes these keys, all sharing the hash tag
// {name} (so every script runs on one Redis Cluster slot), and all expiring:
//
//   - the lock, KeyPrefix+"{"+name+"}", with the lock's TTL;
//   - the fence counter, the same plus ":fence", for FenceRetention;
//   - a token marker, the same plus ":t:"+token: written by a release and
//     kept for Options.ReleaseTimeout, so that a release resent after a lost
//     reply reports success; and written by the clean-up after an Acquire
//     that gave up, kept for the lock's TTL, so that a late copy of one of its
//     attempts cannot take the lock;
//   - with fair waiters only, the line: the same plus ":q" (a sorted set of
//     their tokens by arrival) and ":qi" (a hash of each one's entry), kept
//     for 2 seconds after the last waiter's last keep-alive; on a Redlock's
//     first node, the same two keys hold its line of waiting Acquire calls
//     (see Redlock), each entry live for max(1s, 4 × MaxRetryBackoff) of
//     its Locker after its call's last attempt, the keys as long as their
//     longest-lived entry.
//
// Because the lock keys expire, a maxmemory policy of volatile-lru,
// volatile-lfu, volatile-random or volatile-ttl evicts them first when Redis
// is full, and allkeys-* may evict them too: the lock is then granted twice,
// and only the fence keeps the data right. Run the lock's Redis with
// maxmemory-policy noeviction.
//
// # Errors
//
// Every error matches at most one of these classes, each handled
// differently: ErrNotObtained (busy: another holder has it), ErrUnavailable
// (Redis unreachable, not answering in time, or answering with a transient
// state: LOADING, BUSY, READONLY, MASTERDOWN, CLUSTERDOWN, TRYAGAIN,
// NOREPLICAS, OOM), ErrMisconfigured (Redis answered and refuses the lock's
// commands: NOAUTH, WRONGPASS, NOPERM, WRONGTYPE, an unknown command, a fence
// counter at its maximum, a closed client; the message says what to fix),
// ErrNotHeld (the lease no longer holds the lock, and why), ErrLost (lost
// while the work ran), ErrInvalid (rejected before any Redis call) and
// ErrClosed (the Locker was closed: no Redis call). When
// the caller's context ends before Redis gave any verdict, the error matches
// ctx.Err() and none of the classes: a shutdown is not "another instance is
// on it". Error messages are one line.
//
// Options.FailOpen runs the work without the lock on ErrUnavailable alone:
// never on ErrMisconfigured (a missing password is not an outage), never on
// ErrNotObtained, never when the caller's context ended. WithFailOpen decides
// it per call, for RunWithLock and for Acquire (which then returns a degraded
// lease and a nil error), so that one Locker serves work that must skip on
// an outage and work that may run. An attempt that gets no reply within
// Options.AttemptTimeout (1s), or, for a fail-open call, within half the time
// left before its deadline, counts as an outage: a fail-open call with a
// deadline runs its work degraded before the deadline, on a hung Redis as on
// one that refuses connections.
//
// # Degraded runs
//
// A degraded lease holds no lock and has no fence (Fence is 0): another
// instance may run the same work at the same time, before, or after, with or
// without the lock. A fence check (fence_token < $fence) rightly refuses its
// writes. What guards a degraded run is what makes the work safe to run
// twice: a unique key (INSERT of the order id's shipment, ON CONFLICT DO
// NOTHING), a conditional update on the row's own state (SET status =
// 'shipped' WHERE status = 'paid'), an idempotency key. Fail open only for
// work with such a guard, and write through it on the degraded path; the
// orders example does (go run ./examples/orders with REDIS_ADDR pointing at
// nothing).
//
// # Deadlines
//
// Acquire, RunWithLock, Release and Extend return within a few milliseconds
// of their context's deadline or cancellation, whatever the go-redis client's
// options (ContextTimeoutEnabled, MaxRetries, ReadTimeout): a Redis call that
// outlives its caller goes on in a goroutine that the Locker owns, bounded,
// and Locker.Close waits for it, up to Options.ReleaseTimeout. Each attempt
// of an Acquire is also bounded by Options.AttemptTimeout (1s). Without a
// deadline, a Release or Extend to a Redis that stopped answering waits for
// go-redis to give up: ReadTimeout (3s by default) for each try, and
// go-redis retries a command that timed out (MaxRetries, 3 by default), so
// about 10s; a Release is bounded by Options.ReleaseTimeout.
//
// A Lease's Deadline is the local monotonic time taken before the acquire (or
// last successful extend) request was sent, plus the TTL, minus a drift
// allowance of TTL/100 + 2ms. The watchdog (KeepAlive, RunWithLock) cancels
// the work's context when that deadline passes without a successful renewal,
// which is before Redis could expire the lock and grant it to someone else, as
// long as the local clock does not run slower than the server's by more than
// the allowance. Acquire never returns a lease whose deadline has passed.
//
// # Waiting
//
// WithWait makes Acquire wait for a busy lock. Release publishes a wake-up on
// a pub/sub channel named like the lock key (plus "@" and the database number
// on a database other than 0, as channels are shared by all databases), in
// the same script that deletes the lock. A waiting Acquire registers after its
// first busy attempt; the subscription is made in the background, and its
// confirmation wakes the waiter for another attempt, so a release in between
// is not missed. It then sleeps until a wake-up, the holder's remaining TTL, a
// capped jittered backoff (Options.MinRetryBackoff, Options.MaxRetryBackoff)
// or the end of the wait, whichever comes first. Wake-ups only make a waiter
// try sooner: a lost one (a crashed holder publishes nothing; a dropped
// subscription connection or a Redis restart loses messages) costs at most
// the backoff or the holder's TTL, never correctness.
//
// All waiters of a Locker share one subscription connection per node: one on
// a single deployment, one per master that serves a waited-on lock on Redis
// Cluster, one per shard on a Ring. Each connection has one goroutine that
// owns it; registering and leaving never wait for Redis. A connection is
// opened when the first waiter arrives and closed 30 seconds after its last
// channel was unsubscribed, so that a steady stream of waits does not
// reconnect each time; Locker.Close closes it at once, and ends the waiting
// calls with ErrClosed. When a Cluster slot
// moves, the server ends its subscriptions, and they are made again on the
// slot's new master. Sharded pub/sub (SSUBSCRIBE, SPUBLISH; Redis 7) is used where the
// server has it, classic SUBSCRIBE and PUBLISH elsewhere. Plain waiters are
// not queued: when a lock is released, all of its waiters wake and one of
// them wins, most often the nearest: a waiter on a slow link can starve.
//
// # Fair waiting
//
// WithFair (with WithWait) makes a waiter wait in line. It subscribes to the
// lock's channel before its first attempt (a subscription confirmed only
// after the attempt was sent costs a keep-alive, see below; so the channel
// stays subscribed for a second after the last fair wait on it ended, and a
// holder that waits in line again right after its work saves that
// keep-alive); the attempt joins the lock's queue, ordered by the server's
// clock. While it waits, the waiter keeps its entry alive every 500ms, or
// every third of its TTL if that is shorter, and an entry not kept alive for
// 2 seconds (its waiter crashed, or was paused) is skipped. A release does not just delete the lock: in the same script it
// sets the lock to the first live waiter's token, with that waiter's TTL and
// owner, issues its fence, and publishes "granted <token> <fence>". The
// waiter holds the lock when the message arrives and returns without another
// round trip, even while a keep-alive of its own is in flight. If the message is lost (the subscription dropped or was not
// yet confirmed, or the holder's ACL cannot publish), the keep-alive the
// waiter sends once its subscription is confirmed, or its next one, finds
// the lock granted to it. A holder that crashed hands nothing over: the
// first waiter asks again when the holder's TTL runs out (each answer
// "still waiting" carries it) and takes the lock.
//
// The lock's TTL starts at the grant, which the waiter does not see. Its
// lease's Deadline counts from the send time of the last request the server
// answered "still waiting" (the first attempt or a keep-alive), which came
// before the grant, normally at most a third of the TTL earlier (more after
// a failed keep-alive, or on a link slower than that: the Deadline is then
// shorter, or the grant renewed before Acquire returns); when a keep-alive
// brings the grant, from its send time plus the TTL left it reports, if that
// is later. A waiter that learns of the grant after that Deadline (a paused
// process) renews the lock before Acquire returns, or, if it has expired
// meanwhile, waits in line again with a new token. With Options.Replicas, a
// grant is renewed with WAIT before Acquire returns (the release that made
// it did not wait for replicas); a grant short of replicas is passed on to
// the next in line and the waiter joins the line again at its end; when
// its wait ends, Acquire returns its last verdict: the replicas'
// ErrUnavailable, or ErrNotObtained if another waiter holds the lock by
// then.
//
// Fairness is among waiters, in the order their first attempts reached the
// server: a caller is in line from then on, not from when it called
// Acquire. A failover that loses the queue's latest writes can leave a
// stale entry, skipped once it is 2 seconds old.
//
// A waiter whose wait ends (WithWait's bound, or its context) leaves the
// line in the background; if the lock was granted to it at that moment, it
// releases it, which hands it to the next in line, so no lock is left with
// nobody until its TTL.
//
// Fair and plain callers of one name mix as follows: a plain Acquire, waiting
// or not, never jumps the line. While fair waiters are in line it finds the
// lock busy (a BusyError whose Owner is "fair waiters in line" when the lock
// is free but promised), and a plain waiter takes the lock only when the
// line is empty and the lock free; it is not woken by grants. A Release of a
// lease taken either way hands the lock to the line. Without WithWait,
// WithFair changes nothing. Fair waiting needs a single deployment or
// Cluster: NewRedlock's Lockers reject WithFair with ErrInvalid.
//
// # Redlock
//
// NewRedlock keeps each lock on N independent Redis deployments (typically
// 5) and holds it when a quorum, N/2+1, granted it within its validity: TTL
// minus the time the grants took minus the drift allowance. The lease is the
// same as New's: Deadline is the request's start + TTL − drift, the watchdog
// renews on every node and needs a quorum, Release goes to every node and
// reports the lease held (nil) only if it still held the lock on a quorum
// (on fewer, another may have held a quorum meanwhile: ErrNotHeld, and
// RunWithLock reports a loss). Calls to the nodes run in parallel, each
// bounded, so that a hung node holds nothing up; a minority down or hung is
// not an outage: ErrUnavailable, and FailOpen, only when fewer than a quorum
// of nodes answer. Once an Extend, Release, Inspect or Lease.TTL is decided
// (a quorum answered, or cannot), the other nodes get about one more round
// trip (twice what the deciding answers took, 5ms to 100ms) and no longer:
// the healthy nodes have applied an Extend or a Release when it returns, and
// a hung minority holds up no call. An attempt returns as soon as a quorum
// granted the lock; the later grants are settled in the background. A renewal puts the lock back on nodes that
// lost it (restarted empty) or never got it, where they are free, while the
// lease still holds a quorum: a lease does not shrink to a bare quorum, and
// a failed minority does not cost it the lock while a quorum of other nodes
// is free. An attempt that got no quorum gives back what it took at once and
// the next attempt uses a new token, so that this clean-up never touches
// what a later attempt was granted; releases and clean-ups retire the token
// on every node, so that a grant still on its way to a slow node cannot take
// the lock after it.
//
// The first node also decides splits. When attempts arrive together (a
// waiter that a release named, and one that just began, say), each node
// grants the lock to whichever comes first, and neither may get a quorum.
// An attempt that got the first node but too few others, and could still
// get a quorum from the nodes that found the lock held, asks those nodes
// again, up to three times, a round-trip time apart and within half its
// validity: the other attempts, which do not have the first node, give
// their nodes back at once, and a release on its way frees its own. Only
// the attempt that holds the first node asks again, so a split ends with
// that attempt holding the lock, or, when the nodes stay held, with no one
// (the first node given back with the rest).
//
// Waiters wait in line on the first node (the first client given to
// NewRedlock: give them in the same order in every process). A waiting
// Acquire's attempt that finds the lock held there joins that node's line,
// or keeps its place in it, in the same script; the attempt that gets the
// lock there, or the lease's release, takes the call out. A release on the
// first node publishes "next" with the first live call in line, on a
// channel of that call's Locker (the lock's channel plus ":n:" and a tag
// the Locker drew, which its calls' ids in line begin with), so that one
// Locker hears it and not every waiting one; and only that call tries: on
// one deployment the first attempt after a release wins atomically, but on
// a quorum every woken waiter's attempt costs a call to every node, and
// waiters woken together split the nodes' votes. A waiter in
// line hears only the first node; it wakes when it is named, when the line
// is empty at a release, when its subscription there is confirmed and no one
// was ahead of it, when its connection there breaks (messages may have been
// lost: every waiter on it tries), when the holder's TTL runs out, or after
// a pause of MaxRetryBackoff/2 to MaxRetryBackoff (a lost message, or a
// named call that is gone), whichever comes first. The line orders wake-ups,
// not grants: any attempt may take a free lock, and a call whose attempt got
// the first node but no quorum is out of line until its next attempt finds
// the lock held there. A call that gives up leaves the line, in the
// background, and so does one whose Locker is closed (it returns ErrClosed); a
// crashed process's entry expires after max(1s, 4 × MaxRetryBackoff), and
// until then each release that names it waits for the others' pauses. When
// the first node does not answer, a waiter is out of line and listens on
// every node, and a release on any node wakes it, as on one deployment.
//
// Fences stay ordered without trusting clocks. Each node keeps a fence
// counter. Every node that grants the lock counts its counter on in the same
// script (one more than it was; the node's TIME in microseconds where it has
// none) and stores the new value with the lock; the fence is the largest
// value of the granting quorum. Where fewer than a quorum of them counted to
// that fence (their counters had drifted apart: a node restarted empty, an
// attempt that got only some nodes), a second round writes it to the
// counters that are behind (max(counter, fence)) and to the lock's value, on
// each node only while the lock is still this lease's there, until a quorum
// has it. Either way a quorum's counters are at least the fence before
// Acquire returns. Any two quorums share a node, so an Acquire that begins
// after another has returned counts on, on that node, from at least the
// other's fence, and gets a greater one. Nodes whose counters agree (the
// usual case: a release reaches every node, and so does the next grant)
// count in step, so fences go up by one and the second round is not needed;
// the acquisition then takes one round trip, as on one deployment.
//
// What it rests on, and what breaks it:
//
//	guarantee                                  rests on                               broken by
//	one holder at a time (efficiency)          the TTL running at the same rate on    a process pause (GC, SIGSTOP), a node
//	                                           the client and the nodes (drift)       restarted empty at once while the lock
//	                                                                                  is held (it grants the lock again),
//	                                                                                  clocks faster than the drift allowance
//	fences ordered with the acquisitions       the nodes keeping their data:          a node of both quorums restarted
//	                                           counters live for FenceRetention       without persistence: its counter starts
//	                                           after the last acquisition             again from its TIME, which orders fences
//	                                                                                  only while its clock is ahead of the
//	                                                                                  lost counter (one TIME, plus one per
//	                                                                                  acquisition since)
//	a paused or cut-off holder's writes        the resource checking the fence        nothing the lock controls
//	rejected
//
// Run the nodes with persistence (appendfsync always), or keep a crashed
// node down for longer than the longest TTL before restarting it empty, as
// the Redlock algorithm asks; and pass the fence to the resource, which is
// what keeps the data right when the lock alone cannot.
//
// # Replicas and failover
//
// With one master and replicas (Sentinel, a managed service, a Cluster),
// replication is asynchronous: a master that acknowledges a lock and dies
// before a replica has it lets the promoted replica grant it again.
// Options.Replicas makes an acquisition, and each extension, wait until that
// many replicas acknowledged it (WAIT, sent after the script in one pipeline
// on the same connection, to the master that serves the key: WAIT counts
// only its own connection's writes). A lock that too few replicas
// acknowledged is given back, and Acquire fails with ErrUnavailable; a
// failover to an acknowledging replica then keeps the lock. An answer that
// wrote nothing stands whatever WAIT says: a busy lock is ErrNotObtained,
// and a lock gone or held by another token is ErrNotHeld on Extend. On a
// Cluster the script and its WAIT follow MOVED and ASK to the slot's
// master, up to ClusterOptions.MaxRedirects. It does not make
// the failover itself safe: a spurious failover, or one that promotes a
// replica that had not acknowledged, can still grant the lock twice, and the
// fence is what keeps the data right then.
//
// Locker.Check inspects the deployment for settings that weaken the lock's
// guarantees (see Finding).
//
// # Redis clients
//
// A Locker accepts any go-redis v9 UniversalClient: standalone, Sentinel
// (failover), Cluster or Ring, on Redis 6.2 or later. The lock key, its
// fence counter, its token markers and its wake-up channel share the hash tag
// {name}, so every script runs on one Cluster slot.
//
// Set ContextTimeoutEnabled in the client's options so that go-redis itself
// stops waiting for a Redis that stopped answering at the context's
// deadline; the calls of this package return by the deadline either way, but
// without it go-redis's own goroutine, and its connection, wait for
// ReadTimeout. The watchdog's deadline does not depend on it.
package fencelock
