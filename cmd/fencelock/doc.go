// Fencelock shows and manages the locks that github.com/fencelock/fencelock
// keeps in Redis: who holds them, for how long, with which fence; it
// follows a lock as it changes hands, deletes one whose holder is stuck,
// and checks a deployment's settings against the lock's guarantees.
//
// Install it with
//
//	go install github.com/fencelock/fencelock/cmd/fencelock@latest
//
// Usage:
//
//	fencelock [connection flags] COMMAND [flags] [arguments]
//
// The commands are:
//
//	ls [PATTERN]          the locks held, with owner, TTL left and fence
//	inspect NAME          one lock: owner, TTL left, fence, last fence, waiters
//	watch NAME            every grant, release and expiry, of permits too, as it happens
//	release --force NAME  delete a lock whoever holds it
//	doctor                the deployment's settings, against the lock's guarantees
//	help [COMMAND]        the usage, or a command's
//
// Flags go after the command, before or after its arguments, in any
// order; after "--" every argument is a name. -flag and --flag are the
// same:
//
//	fencelock release --url redis://127.0.0.1:6379 --force --yes settlement:2026-11-29
//
// The connection flags (see Connecting) go before the command too, as
// redis-cli and kubectl users type them; the command's own flags do not:
//
//	fencelock --url redis://127.0.0.1:6379 inspect settlement:2026-11-29
//
// A flag given both before and after the command takes the value after
// it, as a flag given twice takes the last. Any other flag before the
// command is a usage error.
//
// Errors are printed on stderr, on one line that starts with "fencelock: ".
//
// # Connecting
//
// Every command takes these flags, before or after its name:
//
//	--url URL          a redis:// or rediss:// URL (go-redis's ParseURL):
//	                   address, user, password, database, TLS, and go-redis
//	                   options as query parameters (?dial_timeout=1s).
//	                   Default $REDIS_URL, else redis://127.0.0.1:6379.
//	--sentinel ADDRS   Sentinels, host:port,host:port: connect to the master
//	                   they name (go-redis's failover client).
//	--master NAME      the master's name at the Sentinels; with --sentinel
//	                   and only with it.
//	--cluster ADDRS    Redis Cluster nodes, host:port,host:port; one is
//	                   enough, the others are discovered.
//	--db N             the database, when the URL does not say; a URL that
//	                   says another one is a usage error.
//	--prefix PREFIX    the services' Options.KeyPrefix (default "lock:").
//	--timeout D        bound on the command's Redis calls (default 10s; for
//	                   watch, on each read).
//
// The URL says how to talk to Redis, --sentinel and --cluster say where:
// with either, the URL's host is not used, and the URL gives the
// credentials, the database (Sentinel; a Cluster has only database 0),
// TLS (rediss://; each server's certificate is checked against the host
// dialled) and the go-redis options. So the services' REDIS_URL can stay in
// the environment as it is, and
//
//	fencelock ls --cluster 10.0.0.1:6379,10.0.0.2:6379
//
// takes the user, the password and TLS from it.
//
// A database other than 0 changes the locks' wake-up channels (the key
// plus "@<db>", as the library publishes them), so --db must match the
// services' for release to wake their waiters and for watch to see
// releases.
//
// # ls
//
//	fencelock ls [--json] [PATTERN]
//
// Lists the locks held whose name matches PATTERN, a Redis glob (default
// *), sorted by name. Lock keys are found with SCAN ... MATCH
// <prefix>{<PATTERN>} (never KEYS, which blocks the server), on every
// master of a Cluster; the fence counters (<prefix>{<name>}:fence), token
// markers (<prefix>{<name>}:t:<token>) and the lines of fair and Redlock
// waiters (:q, :qi) next to them are not locks and are not listed. Each
// lock is then read with Locker.Inspect. The semaphores
// (fencelock.Semaphore) of matching names that have holders follow, found
// by their holders' keys (<prefix>{<name>}:sem) and read with
// Semaphore.Inspect. Read-write locks (RWLock) are found by their writer
// key (<prefix>{<name>}:rw:w) or readers' index (:rw:r), and read with
// RWLock.Inspect.
//
// On a terminal (stdout is a character device) it prints a table:
//
//	NAME                   OWNER          TTL    FENCE             WAITERS
//	settlement:2026-11-29  pod-2 (pid 7)  28.4s  1764525481123456  1
//
// Otherwise, for cut and awk, one lock a line, tab-separated, without a
// header: name, owner, TTL in milliseconds (-1: no expiry), fence,
// waiters, then one line per holder of a semaphore, the same five fields
// and "semaphore <held>/<permits>". Waiters are counted as
// fencelock.LockInfo's: Lockers subscribed to the lock's releases, a
// Locker whose fair wait ended less than a second ago and a running watch
// included. When no lock matches, it says so on stderr. Read-write locks
// in use follow, one holder a line: the same five fields, the writers
// waiting in place of waiters, and a sixth, shared or exclusive. With
// --json, one document (see JSON). It exits 0 when no
// lock is held too, and 1 when a lock could not be read (after printing
// the others).
//
// # inspect
//
//	fencelock inspect [--json] NAME
//
// Reads the lock without changing it (Locker.Inspect): whether it is held,
// by whom (Options.Owner or WithOwner), for how long more, with which
// fence; the last fence issued for the name, kept for FenceRetention after
// its last acquisition; and how many Lockers wait for it (subscribers of
// its wake-up channel; a running watch counts as one). When the semaphore
// of the name has holders, it shows its permits held of how many, and each
// holder's owner, fence, TTL left and token; when the read-write lock of
// the name is in use, its writer, readers (owner, TTL, fence) and waiting
// writers. It leads with what the name is: the lock when it is held, else
// the semaphore when it has holders, else the read-write lock; the lock of
// the name, not held, comes last, under "lock":
//
//	name        reports
//	semaphore   lock:{reports}:sem
//	permits     3 held of 3
//	holder      pod-1 (pid 4), fence 1764525481123456, 28.4s left, token 3f0c...
//	...
//
//	lock        lock:{reports}
//	held        no
//
// It exits 1 when neither the lock, a permit of the semaphore, nor the
// read-write lock is held, after printing what it found.
//
// # watch
//
//	fencelock watch [--json] [--interval D] [--for D] NAME
//
// Prints each change of the lock NAME, and of the semaphore and the
// read-write lock of the name, as it happens, one line each, until SIGINT
// or SIGTERM (exit 0), or for --for. The lock's:
//
//	held      the state when watch started: held (fence, owner, TTL)
//	free      the state when watch started: free (the last fence)
//	grant     a holder took the free lock
//	hand-off  a holder took the lock within 300ms of a release: a waiter,
//	          woken by the release or retrying within its backoff
//	release   the holder released the lock; "forced": release --force
//	          deleted it
//	expiry    the lock's TTL ran out: its holder neither renewed nor
//	          released it
//
// A semaphore's permits and a read-write lock's holders, one line per
// holder, with kind=semaphore and the permits held after the event of how
// many, or kind=rwlock and the holder's mode (shared or exclusive):
//
//	holding   the state when watch started: a holder (fence, owner, TTL;
//	          a permit's token)
//	taken     a holder took a permit, or the read-write lock
//	freed     the holder gave it back; "forced": release --force --permit
//	          freed it
//	expired   its TTL ran out
//
// When watch starts on a name whose semaphore or read-write lock is held
// and whose lock is not, it prints their holders, not "free".
//
// For people, in logfmt:
//
//	15:04:05.123 grant fence=1764525481123456 owner="pod-2 (pid 7)" ttl=30s
//	15:04:07.002 release fence=1764525481123456 owner="pod-2 (pid 7)"
//	15:04:07.004 hand-off fence=1764525487003817 owner="pod-3 (pid 9)" ttl=30s from_fence=1764525481123456
//	15:04:37.010 expiry fence=1764525487003817 owner="pod-3 (pid 9)"
//	15:05:01.200 taken kind=semaphore permits=3/3 fence=1764525501190311 owner="pod-4" ttl=30s token=3f0c...
//	15:05:02.310 freed kind=semaphore permits=2/3 fence=1764525481923005 owner="pod-1" token=9a1e...
//
// It subscribes to the wake-up channels of the lock, the semaphore and the
// read-write lock (SSUBSCRIBE, or SUBSCRIBE before Redis 7; on a Cluster,
// on the master of the name's slot) to see a release the moment it is
// published, and reads them (Locker.Inspect, Semaphore.Inspect,
// RWLock.Inspect) every --interval (default 50ms) and right after each
// message. A holding is known by its fence, which every grant renews. A
// holding that is gone is a release when a release message came, or when
// it went before its TTL could have run out; an expiry when it went after,
// with no message within 100ms (the message and the read travel on two
// connections). A holding granted and gone between two reads is reported
// from the fence counter, marked "unseen", unless another holder has taken
// the lock by the next read; a shorter --interval narrows that window. A
// permit is known by its token, a read-write lock's holder by its fence: one
// gone before its TTL could have run out is freed, after it expired; a
// semaphore publishes a release only when someone waits, so a freed line
// may come the 100ms a message is waited for late. Messages only make watch
// see sooner: with a subscription refused (an ACL without the channel) it
// says so on stderr and goes on reading. A Redis that stops answering is
// reported once on stderr, and watch goes on trying; only a first read
// that fails ends it (exit 1).
//
// # release
//
//	fencelock release --force [--yes] NAME
//
// Deletes the lock whoever holds it: the operator's override for a holder
// that is stuck. A holder releases its own lock with Lease.Release, so this
// needs --force (without it, a usage error), and deletes only with --yes;
// without --yes it prints what it would delete and exits 1:
//
//	would delete lock "settlement:2026-11-29" held by pod-2 (pid 7), fence 1764525481123456, 28.4s left
//
// The lock's value is read, shown, and deleted by a Lua script of the
// command's own (force_release.lua) only if the lock still holds that
// value, so what is printed is what was deleted; if the lock changed hands
// in between, nothing is deleted and it exits 1: the new holder is not the
// one the operator chose. The script leaves the
// fence counter, so the next holder's fence is greater than the deleted
// one; retires the deleted holder's token (its marker key, as the library
// writes for an Acquire that gave up), so that a late copy of that
// holder's acquire request cannot take the lock again; and publishes the
// wake-up as a release does (payload "forced"), so waiters take the lock
// at once. The deleted holder finds out at its next renewal or Extend
// (ErrNotHeld; RunWithLock cancels its work with cause ErrLost): until
// then it may still be working, which is why the resource must check the
// fence. It exits 1 when the lock is not held.
//
//	fencelock release --force [--yes] --permit TOKEN NAME
//
// Frees instead one holder's permit of the semaphore NAME: the holder whose
// token (shown by inspect) is TOKEN, or starts with it, 8 characters at
// least. The script (force_release_permit.lua) frees it only if the holder
// still holds it as read, retires its token and publishes "forced", as
// above; the holder finds out at its next renewal.
//
// # doctor
//
//	fencelock doctor [--json] [--ttl D] [--replicas N]
//
// Runs Locker.Check: the settings of every server (every master of a
// Cluster) that weaken the lock's guarantees, most severe first, each with
// what was seen, what it means and the fix. --ttl and --replicas are the
// services' Options.TTL and Options.Replicas, which the round-trip and
// replicas checks compare against; without --ttl, the report says that the
// round trip was judged against the library's default TTL, 30s. It takes and releases a test lock,
// "fencelock-check:<random>" (on a Cluster one on each master, whose ACL
// is its own), and deletes its keys. It exits 1 when a finding is critical,
// and when the check did not finish within --timeout, after printing the
// findings made until then.
//
// # JSON
//
// With --json, ls, inspect and doctor print one JSON document, and watch
// one JSON object per line. Fields are only ever added, never renamed or
// removed. TTLs are whole milliseconds, -1 for no expiry. Fences are
// integers below 2^63; today's (microseconds since 1970, about 1.8e15) are
// exact in any JSON parser, doubles included. A lock, in ls and inspect:
//
//	{"name": "settlement:2026-11-29", "key": "lock:{settlement:2026-11-29}",
//	 "held": true, "owner": "pod-2 (pid 7)", "ttl_ms": 28400,
//	 "fence": 1764525481123456, "last_fence": 1764525481123456, "waiters": 1}
//
// A lock not held has "held": false, "owner": "", "ttl_ms": 0, "fence": 0.
// A semaphore: {"name", "key", "permits", "holders": [{"token", "owner",
// "ttl_ms", "fence"}, ...], "last_fence", "waiters"}. A read-write lock:
// {"name", "key" (the prefix of its keys, "lock:{catalogue}:rw"), "writer"
// (null, or {"owner", "ttl_ms", "fence"}), "readers" (a list of those),
// "writers_waiting", "last_fence"}. ls prints {"prefix": "lock:",
// "pattern": "*", "locks": [lock, ...], "semaphores": [semaphore, ...],
// "rwlocks": [rwlock, ...]}; inspect adds "semaphore" and "rwlock" to the
// lock when the semaphore or the read-write lock of its name is in use.
// doctor prints {"complete": true (false when the check did not finish
// within --timeout), "critical": n, "warning": n, "info": n, "findings":
// [{"severity", "check", "node", "seen", "means", "fix"}, ...]} (see
// fencelock.Finding). watch prints, per event, {"time" (RFC 3339, with
// nanoseconds), "event", "name", "fence", "owner", "kind" ("lock",
// "semaphore" or "rwlock")}, and where they apply "ttl_ms" (held, grant,
// hand-off, holding, taken), "last_fence" (free), "from_fence"
// (hand-off), "forced" (release, freed), "unseen" (grant, release, taken,
// freed), "token", "permits_held" and "permits" (a semaphore's), and
// "mode" (a read-write lock's: "shared" or "exclusive").
//
// # Exit status
//
//	0  done
//	1  not found or refused: a lock that is not held (inspect: neither it
//	   nor the read-write lock of the name; release),
//	   release without --yes, a critical doctor finding, Redis unreachable
//	   or refusing (a password, an ACL), --timeout passed
//	2  usage: an unknown command or flag, a flag before the command that
//	   is not a connection flag, a missing or extra argument, a flag's bad
//	   value
package main
