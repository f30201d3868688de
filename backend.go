package fencelock

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// A backend runs the lock's scripts where the locks are kept: one Redis
// deployment (New), or a quorum of independent ones (NewRedlock). Everything
// else of a lease's life (deadlines, the watchdog, waiting, retries, the
// clean-ups in the background) is written once, over these calls.
type backend interface {
	// acquire tries once to take the lock for lease's token and, when it
	// does, to issue its fence.
	acquire(ctx context.Context, lease *Lease) attempt
	// extend sets the lock's expiry to ttl if lease's token holds it;
	// renewal says the watchdog asks (see Lease.extend). It returns 1 when
	// the expiry was set, 0 when the lock does not exist, -1 when another
	// token holds it.
	extend(ctx context.Context, lease *Lease, ttl time.Duration, renewal bool) (int64, error)
	// release deletes the lock if lease's token holds it and retires the
	// token (mode: modeRelease or modeAbandon; see release.lua). It returns
	// 1 when the lock was deleted (now or by an earlier try), 0 when it
	// does not exist, -1 when another token holds it, and in perr the
	// error of a wake-up that could not be published.
	release(ctx context.Context, lease *Lease, mode string) (code int64, perr, err error)
	// register adds a waiter for the releases of the lock at key.
	register(key string) *waiter
	// close closes the waiters' subscriptions and waits for their
	// goroutines.
	close()
}

// attempt is the outcome of one try to acquire.
type attempt struct {
	ok    bool
	fence int64
	pttl  time.Duration // the holder's, when busy; -1: no expiry
	err   error
	// retire: the try may have taken the lock somewhere without getting
	// it (a quorum not reached); its token must be retired at once, and
	// the next try needs a new one.
	retire bool
}

// A deployment is one Redis deployment: a server, a Sentinel-managed
// master, a Cluster or a Ring, through one go-redis client. It is the
// backend of New, and one of the nodes of NewRedlock.
type deployment struct {
	l      *Locker
	client redis.UniversalClient
	waits  *notifier
	dbTag  string // appended to wake-up channels: "" on database 0, "@<db>" on others
	name   string // in errors, for a node of a quorum
}

var _ backend = (*deployment)(nil)

func newDeployment(l *Locker, client redis.UniversalClient) *deployment {
	client.AddHook(dialWatch{l})
	return &deployment{l: l, client: client, waits: newNotifier(client, l.opts.Logger), dbTag: dbTag(client)}
}

// dbTag tells wake-up channels of different databases apart: pub/sub
// channels are shared by all databases of a server.
func dbTag(c redis.UniversalClient) string {
	var db int
	switch c := c.(type) {
	case *redis.Client:
		db = c.Options().DB
	case *redis.Ring:
		db = c.Options().DB
	}
	if db == 0 {
		return ""
	}
	return "@" + strconv.Itoa(db)
}

// channel returns the wake-up channel of the lock key.
func (d *deployment) channel(key string) string {
	if d.dbTag == "" {
		return key
	}
	return key + d.dbTag
}

func (d *deployment) acquire(ctx context.Context, lease *Lease) attempt {
	reply, err := acquireScript.Run(ctx, d.client, lease.keys[:], lease.tokenArg,
		ttlMillis(lease.ttl), d.l.retentionMillis).Result()
	if err != nil {
		return attempt{err: err}
	}
	ok, val, err := decodeAcquire(reply)
	switch {
	case err != nil:
		return attempt{err: err}
	case ok:
		return attempt{ok: true, fence: val}
	}
	return attempt{pttl: time.Duration(val) * time.Millisecond}
}

func (d *deployment) extend(ctx context.Context, lease *Lease, ttl time.Duration, renewal bool) (int64, error) {
	run := extendScript.Run
	if renewal {
		run = extendScript.Eval
	}
	return run(ctx, d.client, lease.keys[:1], lease.tokenArg, ttlMillis(ttl)).Int64()
}

func (d *deployment) release(ctx context.Context, lease *Lease, mode string) (int64, error, error) {
	markerTTL := d.l.releaseTimeoutMillis
	if mode != modeRelease {
		// A late attempt is refused for as long as its lock would live.
		markerTTL = ttlMillis(max(lease.ttl, d.l.opts.ReleaseTimeout))
	}
	reply, err := releaseScript.Run(ctx, d.client, lease.keys[:2], lease.tokenArg,
		d.channel(lease.keys[0]), mode, markerTTL).Result()
	if err != nil {
		return 0, nil, err
	}
	return decodeRelease(reply)
}

func (d *deployment) register(key string) *waiter {
	return d.waits.register(d.channel(key), nil)
}

func (d *deployment) close() { d.waits.close() }
