package fencelock

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
)

// An RWLock is a read-write lock: shared leases or one exclusive lease, never
// both, fences increasing across all of them, a waiting writer stopping new
// readers ("Read-write locks"). It is safe for concurrent use.
type RWLock struct {
	l                                 *Locker
	name                              string
	base                              string // KeyPrefix+"{"+name+"}:rw", which names its wake-up channel
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
	rw.base = keys.Lock(l.opts.KeyPrefix, name) + keys.RW
	rw.writer, rw.readers, rw.intents, rw.counter = rw.base+":w", rw.base+":r", rw.base+":i", rw.base+keys.Fence
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

// AcquireShared takes a share of the lock when no writer holds or waits for
// it, as Acquire takes the lock, with its errors.
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

// RunWithSharedLock runs work holding a share, taken as AcquireShared takes
// it, as Locker.RunWithLock does with a lock, with its errors.
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
	share := rwShare{rw: rw, exclusive: exclusive, intent: int64(0)}
	if exclusive && co.wait > 0 { // the intent outlives a pause and the attempt after it
		share.waits, share.intent = true, store.Millis(max(time.Second, 4*rw.l.opts.MaxRetryBackoff))
	}
	k := kind{lease: func(spec store.Spec) store.Lease { return share.lease(spec) }}
	return append(opts[:len(opts):len(opts)], withKind(k)), nil
}

func (rw *RWLock) usable() error {
	if err := rw.l.usable(); err != nil {
		return err
	}
	if rw.l.single == nil {
		return invalidf("RWLock on a NewRedlock Locker: its readers and waiting writers are kept on one deployment, " +
			"and a quorum would need the Redlock fence phases and line for each")
	}
	return nil
}

// An rwShare is one RWLock call's kind of lease (rwlock_prelude.lua).
type rwShare struct {
	rw        *RWLock
	exclusive bool
	waits     bool // exclusive, with WithWait: it leaves an intent while it waits
	intent    any  // the intent's TTL in ms when it waits, 0 otherwise
}

// An rwLease is the store lease of one token's share, on the writer's key or its own.
type rwLease struct {
	rwShare
	spec store.Spec
	key  string
	args [keys.N]any // its key, marker, counter, readers, intents
	arg  any         // token, boxed
}

var _ store.Lease = (*rwLease)(nil)

func (s rwShare) lease(spec store.Spec) *rwLease {
	rw := s.rw
	k := &rwLease{rwShare: s, spec: spec, key: rw.writer, arg: string(spec.Token)}
	if !s.exclusive {
		k.key = rw.base + ":r:" + string(spec.Token)
	}
	k.args = [keys.N]any{k.key, rw.base + keys.Marker + string(spec.Token), rw.counter, rw.readersArg, rw.intentsArg}
	return k
}

func (k *rwLease) Key() string   { return k.key }
func (k *rwLease) Token() string { return string(k.spec.Token) }
func (k *rwLease) Next(token []byte) store.Lease {
	spec := k.spec
	spec.Token = token
	return k.lease(spec)
}

func (k *rwLease) Acquire(ctx context.Context) store.Attempt {
	d, l := k.rw.l.single, k.rw.l
	ttl, retention := store.Millis(k.spec.TTL), store.Millis(l.opts.FenceRetention)
	var reply any
	var err error
	if k.exclusive {
		reply, err = d.Run(ctx, script.RWWrite, false, k.args[:], k.arg, ttl, retention, k.spec.Owner, k.intent)
	} else {
		keys := append(k.args[:keys.N:keys.N], k.rw.writerArg)
		reply, err = d.Run(ctx, script.RWRead, false, keys, k.arg, ttl, retention, k.spec.Owner)
	}
	a := d.Took(ctx, k, reply, err, store.AcquireReply("rwlock", reply))
	if a.Busy.TTL == -3 { // rwlock_read.lua: free of writers, but one waits
		a.Busy.Owner = "writers waiting"
	}
	return a
}

func (k *rwLease) Extend(ctx context.Context, ttl time.Duration, renewal bool) (store.Result, error) {
	reply, err := k.rw.l.single.Run(ctx, script.RWExtend, renewal, []any{k.args[keys.LockKey], k.rw.readersArg, k.rw.writerArg},
		k.arg, store.Millis(ttl))
	return store.ExtendReply("rwlock_extend", reply, err)
}

func (k *rwLease) Release(ctx context.Context, mode store.Mode, ttl time.Duration) (store.Result, error, error) {
	d := k.rw.l.single
	reply, err := d.Eval(ctx, script.RWRelease, []any{k.args[keys.LockKey], k.args[keys.MarkerKey], k.rw.readersArg, k.rw.intentsArg, k.rw.writerArg},
		k.arg, d.ChannelArg(k.rw.base, k.rw.base), store.ModeArg(mode), d.MarkerArg(mode, ttl))
	if err != nil {
		return store.Gone, nil, err
	}
	return store.ReleaseReply("rwlock_release", reply)
}

// Read reads the share as Inspect reads a lock.
func (k *rwLease) Read(ctx context.Context) (store.Holding, error) {
	reply, err := k.rw.l.single.Eval(ctx, script.Inspect, []any{k.key, k.rw.counter})
	if err != nil {
		return store.Holding{}, err
	}
	return store.InspectReply(reply)
}

// Wakeup wakes every waiting call on each message: the readers behind a writer all enter.
func (k *rwLease) Wakeup() store.Wakeup { return &rwReleases{share: k.rwShare, ttl: k.spec.TTL} }

type rwReleases struct {
	share rwShare
	ttl   time.Duration // the call's leases'
	w     *notify.Waiter
}

func (r *rwReleases) Next(_ store.Attempt, _ bool, d time.Duration) (<-chan struct{}, time.Duration) {
	if r.w == nil {
		r.w = r.share.rw.l.single.Listen(r.share.rw.base, nil, notify.EveryMessage{}) // nil after Close, which the wait hears
	}
	if r.w == nil {
		return nil, d
	}
	return r.w.C(), d
}

func (r *rwReleases) Woken() time.Duration { return 0 }

// Leave also abandons a waiting writer's intent, waking the readers it held back.
func (r *rwReleases) Leave(gaveUp store.Lease, _ bool) {
	if r.w != nil {
		r.w.Leave()
	}
	if r.share.waits && gaveUp != nil {
		r.share.rw.l.single.GiveBack(gaveUp, "clean-up after a failed acquire", r.ttl)
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
	var info RWLockInfo // read only once the read returned
	_, err := rw.l.read(ctx, rw.name, fmt.Sprintf("inspect %q", rw.name), func(ctx context.Context) (store.Holding, error) {
		reply, err := rw.l.single.Eval(ctx, script.RWInspect, []any{rw.writerArg, rw.readersArg, rw.intentsArg, rw.counter})
		if err == nil {
			info, err = decodeRWInspect(reply)
		}
		return store.Holding{}, err
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
	bad := store.BadReply("rwlock_inspect", reply)
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
