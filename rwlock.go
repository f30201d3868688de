package fencelock

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/script"
)

// An RWLock is a read-write lock: shared leases or one exclusive lease, never
// both, fences increasing across all of them, a waiting writer stopping new
// readers ("Read-write locks"). It is safe for concurrent use.
type RWLock struct {
	l    *Locker
	name string
	base string // KeyPrefix+"{"+name+"}:rw", which names its wake-up channel

	writer, readers, intents, counter string
	writerArg, readersArg, intentsArg any // boxed once
}

// RWLock returns the read-write lock called name, without a Redis call; a
// bad name is reported by its methods, with ErrInvalid.
func (l *Locker) RWLock(name string) *RWLock {
	rw := &RWLock{l: l, name: name}
	if l == nil {
		return rw
	}
	rw.base = l.opts.KeyPrefix + "{" + name + "}:rw"
	rw.writer, rw.readers, rw.intents, rw.counter = rw.base+":w", rw.base+":r", rw.base+":i", rw.base+":fence"
	rw.writerArg, rw.readersArg, rw.intentsArg = rw.writer, rw.readers, rw.intents
	return rw
}

// Name returns the lock's name.
func (rw *RWLock) Name() string { return rw.name }

// Acquire takes the lock exclusively, as Locker.Acquire takes a lock, when no
// writer holds it and no reader's share lives; while it waits, no new reader
// enters. It returns Locker.Acquire's errors, cleaning up after one as it
// does, and ErrInvalid on a NewRedlock Locker or with WithFair.
func (rw *RWLock) Acquire(ctx context.Context, opts ...Option) (*Lease, error) {
	opts, err := rw.kind(true, opts)
	if err != nil {
		return nil, err
	}
	return rw.l.Acquire(ctx, rw.name, opts...)
}

// AcquireShared takes a share of the lock, as Locker.Acquire takes a lock,
// when no writer holds or waits for it. It returns Locker.Acquire's errors,
// cleaning up after one as it does, and ErrInvalid on a NewRedlock Locker or
// with WithFair.
func (rw *RWLock) AcquireShared(ctx context.Context, opts ...Option) (*Lease, error) {
	opts, err := rw.kind(false, opts)
	if err != nil {
		return nil, err
	}
	return rw.l.Acquire(ctx, rw.name, opts...)
}

// RunWithLock runs work holding the lock exclusively, taken as Acquire takes
// it, as Locker.RunWithLock does with a lock, with its errors.
func (rw *RWLock) RunWithLock(ctx context.Context, work func(ctx context.Context, lease *Lease) error, opts ...Option) error {
	opts, err := rw.kind(true, opts)
	if err != nil {
		return err
	}
	return rw.l.RunWithLock(ctx, rw.name, work, opts...)
}

// RunWithSharedLock runs work holding a share of the lock, taken as
// AcquireShared takes it, as Locker.RunWithLock does with a lock, with its errors.
func (rw *RWLock) RunWithSharedLock(ctx context.Context, work func(ctx context.Context, lease *Lease) error, opts ...Option) error {
	opts, err := rw.kind(false, opts)
	if err != nil {
		return err
	}
	return rw.l.RunWithLock(ctx, rw.name, work, opts...)
}

// kind returns opts with the kind of one call's lease, or ErrInvalid.
func (rw *RWLock) kind(exclusive bool, opts []Option) ([]Option, error) {
	if err := rw.usable(); err != nil {
		return nil, err
	}
	var co callOptions
	for _, opt := range opts {
		if opt != nil { // Acquire rejects a nil one
			co = opt(co)
		}
	}
	if co.fair {
		return nil, invalidf("WithFair on an RWLock: a waiting writer stops new readers, and readers enter together after it")
	}
	k := &rwKind{rw: rw, d: rw.l.fair, exclusive: exclusive, intent: int64(0)}
	if exclusive && co.wait > 0 {
		k.waits, k.intent = true, ttlMillis(lineEntryTTL(rw.l.opts.MaxRetryBackoff))
	}
	return append(opts[:len(opts):len(opts)], withKind(k)), nil
}

// usable returns ErrInvalid for an RWLock that cannot be used.
func (rw *RWLock) usable() error {
	if err := rw.l.usable(); err != nil {
		return err
	}
	if rw.l.fair == nil {
		return invalidf("RWLock on a NewRedlock Locker: its readers and waiting writers are kept on one deployment, " +
			"and a quorum would need the Redlock fence phases and line for each")
	}
	return nil
}

// An rwKind is the kind of the leases of one call on an RWLock, shared or
// exclusive: its scripts keep the writer, the readers and the waiting
// writers' intents at keys of their own (rwlock_prelude.lua).
type rwKind struct {
	rw        *RWLock
	d         *deployment
	exclusive bool
	waits     bool // exclusive, with WithWait: it leaves an intent while it waits
	// intent is the intent's TTL in ms when it waits, 0 otherwise: as a
	// Redlock line's entry's (lineEntryTTL), it outlives a pause and the
	// attempt after it.
	intent any
}

var (
	_ keyed  = (*rwKind)(nil)
	_ waking = (*rwKind)(nil)
)

// setKeys puts the lease at the RWLock's keys: the writer's, or a reader's
// own; the others are the RWLock's (see rwlock_prelude.lua).
func (k *rwKind) setKeys(lease *Lease) {
	rw := k.rw
	lease.keys[keys.LockKey] = rw.writer
	if !k.exclusive {
		lease.keys[keys.LockKey] = rw.base + ":r:" + lease.token
	}
	lease.keys[keys.MarkerKey] = rw.base + ":t:" + lease.token
	lease.keys[keys.CounterKey] = rw.counter
	lease.keys[keys.QueueKey] = rw.readers
	lease.keys[keys.QueueInfoKey] = rw.intents
	for i, key := range lease.keys {
		lease.keyArgs[i] = key
	}
}

// The read-write lock's scripts, each declared by the method that runs it,
// run after prelude.lua and rwlock_prelude.lua.

func (k *rwKind) acquire(ctx context.Context, lease *Lease) attempt {
	l := k.d.l
	var reply any
	var err error
	if k.exclusive {
		reply, err = k.d.run(ctx, script.RWWrite, false, lease.keyArgs[:], lease.tokenArg,
			l.ttlArg(lease.ttl), l.retentionMillis, lease.ownerArg, k.intent)
	} else {
		keys := append(lease.keyArgs[:keys.N:keys.N], k.rw.writerArg)
		reply, err = k.d.run(ctx, script.RWRead, false, keys, lease.tokenArg,
			l.ttlArg(lease.ttl), l.retentionMillis, lease.ownerArg)
	}
	// The scripts answer as acquire.lua, but for rwlock_read.lua's -3: free
	// of writers, but one waits.
	a := k.d.attempted(ctx, lease, reply, err, acquireAttempt(reply))
	if a.pttl == -3 {
		a.owner = "writers waiting"
	}
	return a
}

func (k *rwKind) extend(ctx context.Context, lease *Lease, ttl time.Duration, renewal bool) (int64, error) {
	reply, err := k.d.run(ctx, script.RWExtend, renewal, []any{lease.keyArgs[keys.LockKey], k.rw.readersArg, k.rw.writerArg},
		lease.tokenArg, k.d.l.ttlArg(ttl))
	return decodeExtend(script.RWExtend, reply, err)
}

func (k *rwKind) release(ctx context.Context, lease *Lease, mode string) (int64, error, error) {
	keys := []any{lease.keyArgs[keys.LockKey], lease.keyArgs[keys.MarkerKey], k.rw.readersArg, k.rw.intentsArg, k.rw.writerArg}
	return k.d.releaseKind(ctx, script.RWRelease, keys, lease, k.d.channel(k.rw.base), mode)
}

// wakeup wakes a waiting call on every release that may let it in (see
// rwlock_release.lua).
func (k *rwKind) wakeup(*Lease) wakeup {
	return &rwReleases{l: k.d.l, key: k.rw.base, intent: k.waits}
}

// rwReleases wakes a call waiting for a read-write lock as releases
// (acquire.go) wakes one for a lock, but on every message on its channel
// (everyMessage), not one waiter of many: the readers that waited behind a
// writer all try when it leaves, and enter together.
type rwReleases struct {
	l   *Locker
	key string
	w   *waiter
	// intent: the call is a waiting writer's, whose intent is taken out in
	// the background (abandoning its token) when it gives up holding
	// nothing, waking the readers it held back.
	intent bool
}

func (r *rwReleases) next(_ attempt, _ bool, d time.Duration) (<-chan struct{}, time.Duration) {
	if r.w == nil {
		r.w = r.l.b.register(r.key, everyMessage{}) // nil after Close, which the wait hears
	}
	if r.w == nil {
		return nil, d
	}
	return r.w.wake, d
}

func (r *rwReleases) woken() time.Duration { return 0 }

func (r *rwReleases) leave(gaveUp *Lease, _ bool) {
	if r.w != nil {
		r.w.leave()
	}
	if r.intent && gaveUp != nil {
		r.l.abandon(gaveUp)
	}
}

// Inspect reads the lock in one atomic step, changing nothing. It returns
// ErrInvalid for a bad name or a NewRedlock Locker, ErrUnavailable or
// ErrMisconfigured, or an error matching ctx.Err().
func (rw *RWLock) Inspect(ctx context.Context) (RWLockInfo, error) {
	if err := rw.usable(); err != nil {
		return RWLockInfo{}, err
	}
	if err := checkName(rw.name); err != nil {
		return RWLockInfo{}, err
	}
	var info RWLockInfo // set by the read, read only once it returned
	_, err := rw.l.read(ctx, rw.name, fmt.Sprintf("inspect %q", rw.name), func(ctx context.Context) (holding, error) {
		reply, err := evalScript(ctx, rw.l.fair.client, script.RWInspect, false,
			[]any{rw.writerArg, rw.readersArg, rw.intentsArg, rw.counter}, nil).Result()
		if err == nil {
			info, err = decodeRWInspect(reply)
		}
		return holding{}, err
	})
	if err != nil {
		return RWLockInfo{}, err
	}
	info.Name = rw.name
	return info, nil
}

// RWLockInfo is what RWLock.Inspect found.
type RWLockInfo struct {
	Name           string
	Writer         *RWHolder  // the exclusive holder; nil when none
	Readers        []RWHolder // the shared holders, by expiry
	WritersWaiting int        // how many waiting writers' intents live, holding new readers back
	LastFence      int64      // the last fence issued, kept as LockInfo.LastFence is
}

// An RWHolder is one holder of an RWLock.
type RWHolder struct {
	Owner string        // its Options.Owner or WithOwner
	TTL   time.Duration // left on the server
	Fence int64
}

// decodeRWInspect decodes rwlock_inspect.lua's reply.
func decodeRWInspect(reply any) (RWLockInfo, error) {
	var info RWLockInfo
	bad := fmt.Errorf("%w from the rwlock_inspect script: %v", errReply, reply)
	arr, _ := reply.([]any)
	if len(arr) != 5 {
		return info, bad
	}
	writer, ok1 := arr[0].(string)
	pttl, ok2 := arr[1].(int64)
	readers, ok3 := arr[2].([]any)
	waiting, ok4 := arr[3].(int64)
	counter, ok5 := arr[4].(string)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || len(readers)%2 != 0 {
		return info, bad
	}
	if writer != "" {
		_, fence, owner := keys.Parse(writer)
		info.Writer = &RWHolder{Owner: owner, TTL: time.Duration(pttl) * time.Millisecond, Fence: fence}
	}
	for i := 0; i < len(readers); i += 2 {
		value, _ := readers[i].(string)
		left, _ := readers[i+1].(int64)
		_, fence, owner := keys.Parse(value)
		info.Readers = append(info.Readers, RWHolder{Owner: owner, TTL: time.Duration(left) * time.Millisecond, Fence: fence})
	}
	info.WritersWaiting = int(waiting)
	info.LastFence, _ = strconv.ParseInt(counter, 10, 64)
	return info, nil
}
