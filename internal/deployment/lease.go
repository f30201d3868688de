package deployment

import (
	"context"
	"errors"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
)

// A lease is one token's lease of a lock on the deployment, its keys and
// token boxed once for the scripts' arguments (keys.Box).
type lease struct {
	d       *Deployment
	spec    store.Spec
	keys    keys.Lease
	args    [keys.N]any // keys, boxed
	token   string      // a slice of the marker key
	arg     any         // token, boxed
	owner   any         // spec.Owner, boxed
	acquire [6]any      // the acquire script's arguments (a plain attempt's: 4), made once: no slice per call
	release [3]any      // a release's on database 0, as acquire
}

var _ store.Lease = (*lease)(nil)

// Lock returns the lease of spec's token on its lock.
func (d *Deployment) Lock(spec store.Spec) store.Lease { return d.newLease(spec) }

func (d *Deployment) newLease(spec store.Spec) *lease {
	k := &lease{d: d, spec: spec, keys: keys.ForLease(d.cfg.KeyPrefix, spec.Name, spec.Token), owner: d.ownerArg(spec.Owner)}
	marker := k.keys[keys.MarkerKey]
	k.token = marker[len(marker)-len(spec.Token):]
	k.arg = keys.Box(&k.token)
	for i := range k.keys {
		k.args[i] = keys.Box(&k.keys[i])
	}
	k.acquire = [...]any{k.arg, d.ttlArg(spec.TTL), d.retention, k.owner, "1", queueEntryMillis}
	k.release = [...]any{k.arg, d.markerMillis, d.retention}
	return k
}

func (k *lease) Key() string   { return k.keys[keys.LockKey] }
func (k *lease) Token() string { return k.token }

func (k *lease) Next(token []byte) store.Lease {
	spec := k.spec
	spec.Token = token
	return k.d.newLease(spec)
}

func (k *lease) Wakeup() store.Wakeup { return k.d.Releases(k.Key()) }

var queueEntryMillis any = store.Millis(store.QueueEntryTTL) // boxed once

func (k *lease) Acquire(ctx context.Context) store.Attempt {
	d := k.d
	argv := k.acquire[:4:4] // two arguments fewer: each costs the server about a third of a GET
	if k.spec.Fair {
		argv = k.acquire[:]
	}
	reply, err := d.Run(ctx, script.Acquire, false, k.args[:], argv...)
	return d.Took(ctx, k, reply, err, store.AcquireReply("acquire", reply))
}

// Took is the attempt of an acquire script's run for k (a lock's, or a
// kind's), given its reply, error and decoded reply a. A lock taken short
// of replicas (WAIT's error) is given back before the next attempt, which
// would otherwise find it held by the call's last token; in the background
// when Redis does not answer within ctx. Other answers wrote nothing.
func (d *Deployment) Took(ctx context.Context, k store.Lease, reply any, err error, a store.Attempt) store.Attempt {
	if err != nil && reply == nil { // the script did not run, or its reply was lost
		return store.Attempt{Err: err}
	}
	if err != nil && (a.OK || errors.Is(a.Err, store.ErrReply)) {
		if store.ReplicaShort(err) {
			if _, _, rerr := k.Release(ctx, store.Abandon, d.cfg.ReleaseTimeout); rerr != nil {
				d.GiveBack(k, "clean-up after a failed acquire", d.cfg.ReleaseTimeout)
			}
			return store.Attempt{Err: err, Retire: true, Free: true}
		}
		return store.Attempt{Err: err}
	}
	return a
}

// GiveBack abandons k (store.Abandon) in the background, trying for ttl
// at least.
func (d *Deployment) GiveBack(k store.Lease, what string, ttl time.Duration) {
	d.cfg.Tasks.GiveBack(what, k.Key(), ttl, func(ctx context.Context) (bool, error) {
		r, _, err := k.Release(ctx, store.Abandon, ttl)
		return r == store.Done, err
	})
}

func (k *lease) Extend(ctx context.Context, ttl time.Duration, renewal bool) (store.Result, error) {
	reply, err := k.d.Run(ctx, script.Extend, renewal, k.args[keys.LockKey:keys.LockKey+1], k.arg, k.d.ttlArg(ttl))
	return store.ExtendReply("extend", reply, err)
}

func (k *lease) Release(ctx context.Context, mode store.Mode, ttl time.Duration) (store.Result, error, error) {
	d := k.d
	argv := k.release[:] // the common case sends neither mode nor channel: a release on database 0
	if ch := d.ChannelArg(k.keys[keys.LockKey], nil); ch != nil || mode != store.Release {
		argv = []any{k.arg, d.MarkerArg(mode, ttl), d.retention, store.ModeArg(mode)}
		if ch != nil {
			argv = append(argv, ch)
		}
	}
	reply, err := d.Eval(ctx, script.Release, k.args[:], argv...)
	if err != nil {
		return store.Gone, nil, err
	}
	return store.ReleaseReply("release", reply)
}

func (k *lease) Read(ctx context.Context) (store.Holding, error) {
	return k.d.read(ctx, k.args[keys.LockKey], k.args[keys.CounterKey])
}

// MarkerArg is how long, in ms, a release in mode keeps the token's
// marker: ReleaseTimeout; for an abandon, as long as a late attempt's lock
// of ttl would live.
func (d *Deployment) MarkerArg(mode store.Mode, ttl time.Duration) any {
	if mode == store.Release {
		return d.markerMillis
	}
	return store.Millis(max(ttl, d.cfg.ReleaseTimeout))
}

// ttlArg returns ttl in ms, boxed once for the default TTL.
func (d *Deployment) ttlArg(ttl time.Duration) any {
	if ttl == d.cfg.TTL {
		return d.defaultTTL
	}
	return store.Millis(ttl)
}

// ownerArg returns owner boxed, once for the Locker's own.
func (d *Deployment) ownerArg(owner string) any {
	if owner == d.cfg.Owner {
		return d.owner
	}
	return owner
}
