package fencelock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Read-write locks, as documented in GUARANTEES.md ("Read-write locks"):
// a lease of an RWLock is an ordinary Lease, acquired through Acquire and
// RunWithLock (withKind) with the kind rwKind, whose scripts keep the
// writer, the readers and the waiting writers' intents at keys of their
// own (rwlock_prelude.lua).

// An RWLock is a read-write lock: any number of shared leases or one
// exclusive lease, never both, each an ordinary Lease, with fences
// increasing across all of them; a writer that waits stops new readers
// (GUARANTEES.md, "Read-write locks"). Its keys are apart from the lock of
// the same name. It is safe for concurrent use; a NewRedlock Locker refuses
// its calls with ErrInvalid.
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

// Acquire takes the lock exclusively, as Locker.Acquire takes a lock, and
// returns its Lease: when no writer holds it and no reader's share lives.
// While it waits (WithWait), no new reader enters. It returns
// Locker.Acquire's errors, and ErrInvalid on a NewRedlock Locker or with
// WithFair.
func (rw *RWLock) Acquire(ctx context.Context, opts ...Option) (*Lease, error) {
	opts, err := rw.kind(true, opts)
	if err != nil {
		return nil, err
	}
	return rw.l.Acquire(ctx, rw.name, opts...)
}

// AcquireShared takes a share of the lock, as Locker.Acquire takes a lock,
// and returns its Lease: when no writer holds the lock and none waits for
// it (its BusyError then has TTL -3 and Owner "writers waiting"). It
// returns Locker.Acquire's errors, and ErrInvalid on a NewRedlock Locker
// or with WithFair.
func (rw *RWLock) AcquireShared(ctx context.Context, opts ...Option) (*Lease, error) {
	opts, err := rw.kind(false, opts)
	if err != nil {
		return nil, err
	}
	return rw.l.Acquire(ctx, rw.name, opts...)
}

// RunWithLock runs work holding the lock exclusively, as
// Locker.RunWithLock runs it holding a lock, with Acquire's waiting.
func (rw *RWLock) RunWithLock(ctx context.Context, work func(ctx context.Context, lease *Lease) error, opts ...Option) error {
	opts, err := rw.kind(true, opts)
	if err != nil {
		return err
	}
	return rw.l.RunWithLock(ctx, rw.name, work, opts...)
}

// RunWithSharedLock runs work holding a share of the lock, as
// Locker.RunWithLock runs it holding a lock, with AcquireShared's waiting.
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
		k.waits, k.intent = true, ttlMillis(intentTTL(rw.l.opts.MaxRetryBackoff))
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

// intentTTL is how long a waiting writer's intent lives after its last
// attempt: as a Redlock line's entry, long enough for the pause between two
// attempts (at most maxBackoff) and the attempt after it.
func intentTTL(maxBackoff time.Duration) time.Duration {
	return lineEntryTTL(maxBackoff)
}

// An rwKind is the kind of the leases of one call on an RWLock: shared, or
// exclusive.
type rwKind struct {
	rw        *RWLock
	d         *deployment
	exclusive bool
	waits     bool // exclusive, with WithWait: it leaves an intent while it waits
	intent    any  // the intent's TTL in ms when it waits; 0 otherwise
}

var (
	_ keyed  = (*rwKind)(nil)
	_ waking = (*rwKind)(nil)
)

var (
	rwReadScript    = newRWScript("rwlock_read")
	rwWriteScript   = newRWScript("rwlock_write")
	rwExtendScript  = newRWScript("rwlock_extend")
	rwReleaseScript = newRWScript("rwlock_release")
	rwInspectScript = newRWScript("rwlock_inspect")
)

// newRWScript reads the script name.lua, after prelude.lua and
// rwlock_prelude.lua, as newScript does with prelude.lua alone.
func newRWScript(name string) *script { return newScript(name, true, "rwlock_prelude") }

// setKeys puts the lease at the RWLock's keys: the writer's, or a reader's
// own; the others are the RWLock's (see rwlock_prelude.lua).
func (k *rwKind) setKeys(lease *Lease) {
	rw := k.rw
	lease.keys[keyLock] = rw.writer
	if !k.exclusive {
		lease.keys[keyLock] = rw.base + ":r:" + lease.token
	}
	lease.keys[keyMarker] = rw.base + ":t:" + lease.token
	lease.keys[keyCounter] = rw.counter
	lease.keys[keyQueue] = rw.readers
	lease.keys[keyQueueInfo] = rw.intents
	for i, key := range lease.keys {
		lease.keyArgs[i] = key
	}
}

func (k *rwKind) acquire(ctx context.Context, lease *Lease) attempt {
	l := k.d.l
	var reply any
	var err error
	if k.exclusive {
		reply, err = k.d.run(ctx, rwWriteScript, false, lease.keyArgs[:], lease.tokenArg,
			l.ttlArg(lease.ttl), l.retentionMillis, lease.ownerArg, k.intent)
	} else {
		keys := append(lease.keyArgs[:len(lease.keyArgs):len(lease.keyArgs)], k.rw.writerArg)
		reply, err = k.d.run(ctx, rwReadScript, false, keys, lease.tokenArg,
			l.ttlArg(lease.ttl), l.retentionMillis, lease.ownerArg)
	}
	if err != nil && reply == nil {
		return attempt{err: err}
	}
	ok, val, owner, derr := decodeAcquire(reply) // the scripts answer as acquire.lua
	switch {
	case err != nil && (ok || errors.Is(derr, errReply)):
		if isReplicaShort(err) { // as deployment.acquire
			l.abandon(lease)
			return attempt{err: err, retire: true}
		}
		return attempt{err: err}
	case derr != nil:
		return attempt{err: derr}
	case ok:
		return attempt{ok: true, fence: val}
	}
	if val == -3 { // free of writers, but one waits
		return attempt{pttl: -3, owner: owner}
	}
	return attempt{pttl: time.Duration(val) * time.Millisecond, owner: owner}
}

func (k *rwKind) extend(ctx context.Context, lease *Lease, ttl time.Duration, renewal bool) (int64, error) {
	reply, err := k.d.run(ctx, rwExtendScript, renewal, []any{lease.keyArgs[keyLock], k.rw.readersArg, k.rw.writerArg},
		lease.tokenArg, k.d.l.ttlArg(ttl))
	if err != nil && reply == nil {
		return 0, err
	}
	code, ok := reply.(int64)
	switch { // as deployment.extend
	case err != nil && (!ok || code == 1):
		return 0, err
	case !ok:
		return 0, fmt.Errorf("%w from the rwlock_extend script: %v", errReply, reply)
	}
	return code, nil
}

func (k *rwKind) release(ctx context.Context, lease *Lease, mode string) (int64, error, error) {
	markerTTL := k.d.l.releaseTimeoutMillis
	if mode != modeRelease {
		markerTTL = k.d.abandonMarkerMillis(lease)
	}
	reply, err := evalScript(ctx, k.d.client, rwReleaseScript, false,
		[]any{lease.keyArgs[keyLock], lease.keyArgs[keyMarker], k.rw.readersArg, k.rw.intentsArg, k.rw.writerArg},
		[]any{lease.tokenArg, k.d.channel(k.rw.base), mode, markerTTL}).Result()
	if err != nil {
		return 0, nil, err
	}
	return decodeRelease(reply)
}

// wakeup wakes a waiting call on every release that may let it in (see
// rwlock_release.lua); a waiting writer that gives up takes its intent out.
func (k *rwKind) wakeup(*Lease) wakeup {
	r := &rwReleases{l: k.d.l, key: k.rw.base}
	if k.waits {
		return &intentReleases{rwReleases: r}
	}
	return r
}

// rwReleases wakes a call waiting for a read-write lock on every message on
// its channel (everyMessage), not one waiter of many as a lock's releases
// do: the readers that waited behind a writer all try when it leaves, and
// enter together. It registers after the call's first attempt that did not
// get in; the registration's confirmation wakes it for another try, so
// that a release before it is not missed.
type rwReleases struct {
	l   *Locker
	key string
	w   *waiter
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

func (r *rwReleases) leave(*Lease, bool) {
	if r.w != nil {
		r.w.leave()
	}
}

// intentReleases are a waiting writer's wake-ups: as rwReleases, and, when
// the writer gives up holding nothing, its intent is taken out in the
// background (abandoning its token, as after an attempt of unknown
// outcome), which wakes the readers it held back.
type intentReleases struct {
	*rwReleases
}

func (w *intentReleases) leave(gaveUp *Lease, took bool) {
	w.rwReleases.leave(gaveUp, took)
	if gaveUp != nil {
		w.l.abandon(gaveUp)
	}
}

// RWLockInfo is what RWLock.Inspect found.
type RWLockInfo struct {
	Name    string
	Writer  *RWHolder  // the exclusive holder; nil when none
	Readers []RWHolder // the shared holders, by expiry
	// WritersWaiting is how many waiting writers' intents live: while one
	// does, no new reader enters.
	WritersWaiting int
	// LastFence is the last fence issued for the RWLock, kept for
	// FenceRetention after its last acquisition; 0 when none is kept.
	LastFence int64
}

// An RWHolder is one holder of an RWLock.
type RWHolder struct {
	Owner string        // its Options.Owner or WithOwner
	TTL   time.Duration // left on the server
	Fence int64
}

// Inspect reads the lock without changing it: its writer, its readers and
// the writers waiting, in one atomic step. It returns ErrInvalid for a bad
// name or a NewRedlock Locker, ErrUnavailable or ErrMisconfigured when
// Redis could not answer, or an error matching ctx.Err() when ctx ended
// first.
func (rw *RWLock) Inspect(ctx context.Context) (RWLockInfo, error) {
	if err := rw.usable(); err != nil {
		return RWLockInfo{}, err
	}
	if err := checkName(rw.name); err != nil {
		return RWLockInfo{}, err
	}
	type result struct {
		info RWLockInfo
		err  error
	}
	d := rw.l.fair
	res, done := call(rw.l, ctx.Done(), nil, func() result {
		reply, err := evalScript(ctx, d.client, rwInspectScript, false,
			[]any{rw.writerArg, rw.readersArg, rw.intentsArg, rw.counter}, nil).Result()
		if err != nil {
			return result{err: err}
		}
		info, err := decodeRWInspect(reply)
		return result{info, err}
	}, nil)
	switch {
	case !done || (res.err != nil && (classify(res.err) == classNoVerdict || ctxErr(ctx) != nil)):
		return RWLockInfo{}, ctxEnded(ctx, fmt.Sprintf("inspect %q", rw.name))
	case res.err != nil:
		return RWLockInfo{}, callError(rw.name, res.err)
	}
	res.info.Name = rw.name
	return res.info, nil
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
		_, fence, owner := parseValue(writer)
		info.Writer = &RWHolder{Owner: owner, TTL: time.Duration(pttl) * time.Millisecond, Fence: fence}
	}
	for i := 0; i < len(readers); i += 2 {
		value, _ := readers[i].(string)
		left, _ := readers[i+1].(int64)
		_, fence, owner := parseValue(value)
		info.Readers = append(info.Readers, RWHolder{Owner: owner, TTL: time.Duration(left) * time.Millisecond, Fence: fence})
	}
	info.WritersWaiting = int(waiting)
	info.LastFence, _ = strconv.ParseInt(counter, 10, 64)
	return info, nil
}
