package benchmarks

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/fencelock/fencelock"
	fencerueidis "github.com/fencelock/fencelock/rueidis"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"
)

// ttl is the lock time to live for every implementation, so that none of
// them is favoured by a shorter expiry.
const ttl = 10 * time.Second

// rawPoll is how long the raw baseline sleeps between two attempts at a busy
// lock (raw-1ms: 1ms).
const rawPoll = 10 * time.Millisecond

var (
	// errBusy means tryLock found the lock held by someone else.
	errBusy = errors.New("benchmarks: lock busy")
	// errTimeout means lock gave up because its wait bound passed. The
	// contended benchmark counts these as fails; any other error stops it.
	errTimeout = errors.New("benchmarks: wait bound passed")
	// errNotHeld means unlock found the lock no longer this session's.
	errNotHeld = errors.New("benchmarks: lock not held at release")
)

// A session is one goroutine's handle on a lock implementation. It holds at
// most one lock at a time and is not safe for concurrent use.
type session interface {
	// tryLock makes one attempt at key; it returns errBusy when another
	// holder has it.
	tryLock(ctx context.Context, key string) error
	// lock waits for key with the implementation's own waiting strategy
	// until the lock is obtained, wait has passed (errTimeout) or ctx ends
	// (ctx.Err()).
	lock(ctx context.Context, key string, wait time.Duration) error
	// unlock releases the lock taken by the last successful tryLock or lock.
	unlock(ctx context.Context) error
}

// A driver sets up one implementation.
type driver struct {
	name string
	// open connects to the redis-server at addr (creating the clients the
	// implementation needs, closed by b.Cleanup) and returns a function
	// that makes sessions sharing those clients.
	open func(b testing.TB, addr string) func() session
}

// drivers lists the implementations of the uncontended benchmarks
// (Uncontended, Interleaved, Parallel) in the order they run and are
// reported.
var drivers = []driver{
	{"fencelock", openFencelock},
	{"fencelock-cte", openFencelockCTE},
	{"fencelock-ap", openFencelockAP},
	{"redislock", openRedislock},
	{"redsync", openRedsync},
	{"rueidislock", openRueidislock},
	{"fencelock-rueidis", openFencelockRueidis},
	{"raw", openRaw},
}

// contendedDrivers lists the implementations of the contended benchmarks
// (Contended, ContendedHandoff, ContendedHandoff64): drivers plus three ways
// of waiting that only a contended benchmark tells apart, fencelock's fair
// waiting on go-redis and on rueidis (fencelock-fair,
// fencelock-rueidis-fair) and the raw baseline polling every millisecond
// (raw-1ms). Without a waiter they are fencelock, fencelock-rueidis and raw.
var contendedDrivers = []driver{
	{"fencelock", openFencelock},
	{"fencelock-fair", openFencelockFair},
	{"fencelock-cte", openFencelockCTE},
	{"redislock", openRedislock},
	{"redsync", openRedsync},
	{"rueidislock", openRueidislock},
	{"fencelock-rueidis", openFencelockRueidis},
	{"fencelock-rueidis-fair", openFencelockRueidisFair},
	{"raw", openRaw},
	{"raw-1ms", openRaw1ms},
}

// selected returns the drivers of all that -impls names, in its order, or
// all of them in their order when it is empty. A name of another suite's
// implementation (fencelock-fair in Uncontended) is skipped; b fails on a
// name no suite has.
func selected(b *testing.B, all []driver) []driver {
	if *implList == "" {
		return all
	}
	var ds []driver
	for name := range strings.SplitSeq(*implList, ",") {
		has := func(d driver) bool { return d.name == name }
		if i := slices.IndexFunc(all, has); i >= 0 {
			ds = append(ds, all[i])
		} else if !slices.ContainsFunc(drivers, has) && !slices.ContainsFunc(contendedDrivers, has) {
			b.Fatalf("-impls: no implementation %q", name)
		}
	}
	if len(ds) == 0 {
		b.Skipf("-impls %s: none of this benchmark's implementations", *implList)
	}
	return ds
}

// newGoRedis returns a go-redis client with default options, closed when b
// ends. Every go-redis based implementation gets its own.
func newGoRedis(b testing.TB, addr string) *redis.Client {
	return newGoRedisWith(b, &redis.Options{Addr: addr})
}

// newGoRedisWith returns a go-redis client with opts, closed when b ends.
func newGoRedisWith(b testing.TB, opts *redis.Options) *redis.Client {
	c := redis.NewClient(opts)
	b.Cleanup(func() {
		if err := c.Close(); err != nil {
			b.Errorf("close go-redis client: %v", err)
		}
	})
	return c
}

// closeLater registers v's Close method, if it has one, as a cleanup of b.
// fencelock.Locker has none today; if push-based waiting gives it one (to
// stop a subscriber goroutine), the benchmarks call it without a change.
func closeLater(b testing.TB, v any) {
	switch c := v.(type) {
	case interface{ Close() error }:
		b.Cleanup(func() {
			if err := c.Close(); err != nil {
				b.Errorf("close %T: %v", v, err)
			}
		})
	case interface{ Close() }:
		b.Cleanup(c.Close)
	}
}

// fencelock

// openFencelock is fencelock with go-redis's default options: what a user
// gets without setting any.
func openFencelock(b testing.TB, addr string) func() session {
	return openFencelockOn(b, newGoRedis(b, addr))
}

// openFencelockCTE is fencelock over a go-redis client with
// ContextTimeoutEnabled, the one client option fencelock's documentation
// recommends: go-redis then stops a call at its context's deadline itself,
// and fencelock runs Release on the caller's goroutine instead of handing it
// to a goroutine of its own.
func openFencelockCTE(b testing.TB, addr string) func() session {
	return openFencelockOn(b, newGoRedisWith(b, &redis.Options{Addr: addr, ContextTimeoutEnabled: true}))
}

// openFencelockAP is fencelock over the AutoPipeliner of a go-redis client
// with default options (client.AutoPipeline(), EXPERIMENTAL in go-redis):
// the scripts of concurrent calls share pipelines.
func openFencelockAP(b testing.TB, addr string) func() session {
	ap, err := newGoRedis(b, addr).AutoPipeline() // closed with its client
	if err != nil {
		b.Fatal(err)
	}
	return openFencelockOn(b, ap)
}

// openFencelockFair is fencelock with go-redis's default options whose
// waiting Acquire waits in line (WithWait and WithFair): a release hands the
// lock to the first waiter, whose Acquire returns when the grant's message
// arrives. Only the contended benchmarks run it; an Acquire that does not
// wait is fencelock's.
func openFencelockFair(b testing.TB, addr string) func() session {
	newSession := openFencelockOn(b, newGoRedis(b, addr))
	return func() session {
		s := newSession().(*fencelockSession)
		s.fair = true
		return s
	}
}

func openFencelockOn(b testing.TB, client redis.UniversalClient) func() session {
	locker, err := fencelock.New(client, &fencelock.Options{TTL: ttl})
	return openFencelockLocker(b, locker, err)
}

func openFencelockLocker(b testing.TB, locker *fencelock.Locker, err error) func() session {
	if err != nil {
		b.Fatal(err)
	}
	closeLater(b, locker)
	return func() session { return &fencelockSession{locker: locker} }
}

// openFencelockRueidis is fencelock on rueidis (the fencerueidis adapter)
// over a rueidis client with default options, the address aside: what a
// rueidis user gets without setting any (client-side caching and
// auto-pipelining on, as rueidis defaults them; fencelock uses neither
// cache nor DoCache, so the cache costs only the CLIENT TRACKING of the
// dial).
func openFencelockRueidis(b testing.TB, addr string) func() session {
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(client.Close) // after the locker's Close: cleanups run last first
	locker, err := fencerueidis.New(client, &fencelock.Options{TTL: ttl})
	return openFencelockLocker(b, locker, err)
}

// openFencelockRueidisFair is fencelock-rueidis waiting in line (WithWait
// and WithFair), as fencelock-fair is fencelock.
func openFencelockRueidisFair(b testing.TB, addr string) func() session {
	newSession := openFencelockRueidis(b, addr)
	return func() session {
		s := newSession().(*fencelockSession)
		s.fair = true
		return s
	}
}

type fencelockSession struct {
	locker *fencelock.Locker
	lease  *fencelock.Lease
	fair   bool // lock waits in line (WithFair)
}

func (s *fencelockSession) tryLock(ctx context.Context, key string) error {
	lease, err := s.locker.Acquire(ctx, key)
	if errors.Is(err, fencelock.ErrNotObtained) {
		return errBusy
	} else if err != nil {
		return err
	}
	s.lease = lease
	return nil
}

func (s *fencelockSession) lock(ctx context.Context, key string, wait time.Duration) error {
	var (
		lease *fencelock.Lease
		err   error
	)
	if s.fair {
		lease, err = s.locker.Acquire(ctx, key, fencelock.WithWait(wait), fencelock.WithFair())
	} else {
		lease, err = s.locker.Acquire(ctx, key, fencelock.WithWait(wait))
	}
	switch {
	case err == nil:
		s.lease = lease
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, fencelock.ErrNotObtained):
		return errTimeout
	}
	return err
}

func (s *fencelockSession) unlock(ctx context.Context) error {
	lease := s.lease
	s.lease = nil
	return lease.Release(ctx)
}

// bsm/redislock

func openRedislock(b testing.TB, addr string) func() session {
	client := redislock.New(newGoRedis(b, addr))
	return func() session { return &redislockSession{client: client} }
}

type redislockSession struct {
	client *redislock.Client
	held   *redislock.Lock
}

func (s *redislockSession) tryLock(ctx context.Context, key string) error {
	l, err := s.client.Obtain(ctx, key, ttl, nil) // nil options: try once
	if errors.Is(err, redislock.ErrNotObtained) {
		return errBusy
	} else if err != nil {
		return err
	}
	s.held = l
	return nil
}

func (s *redislockSession) lock(ctx context.Context, key string, wait time.Duration) error {
	// Obtain retries until its context ends, so the context carries the
	// bound. LinearBackoff is the retry strategy its README suggests.
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	l, err := s.client.Obtain(wctx, key, ttl, &redislock.Options{
		RetryStrategy: redislock.LinearBackoff(10 * time.Millisecond),
	})
	switch {
	case err == nil:
		s.held = l
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case wctx.Err() != nil, errors.Is(err, redislock.ErrNotObtained):
		return errTimeout
	}
	return err
}

func (s *redislockSession) unlock(ctx context.Context) error {
	l := s.held
	s.held = nil
	err := l.Release(ctx)
	if errors.Is(err, redislock.ErrLockNotHeld) {
		return errNotHeld
	}
	return err
}

// go-redsync/redsync with its go-redis v9 pool

func openRedsync(b testing.TB, addr string) func() session {
	rs := redsync.New(goredis.NewPool(newGoRedis(b, addr)))
	expiry := redsync.WithExpiry(ttl) // default 8s; built once, not per call
	return func() session { return &redsyncSession{rs: rs, expiry: expiry} }
}

type redsyncSession struct {
	rs     *redsync.Redsync
	expiry redsync.Option
	mutex  *redsync.Mutex
}

func (s *redsyncSession) tryLock(ctx context.Context, key string) error {
	m := s.rs.NewMutex(key, s.expiry)
	if err := m.TryLockContext(ctx); err != nil {
		var taken *redsync.ErrTaken
		if errors.As(err, &taken) {
			return errBusy
		}
		return err
	}
	s.mutex = m
	return nil
}

func (s *redsyncSession) lock(ctx context.Context, key string, wait time.Duration) error {
	// Default retry settings: 32 tries, 50-250ms apart. LockContext checks
	// its context between tries, so the bound holds to within one try.
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	m := s.rs.NewMutex(key, s.expiry)
	err := m.LockContext(wctx)
	switch {
	case err == nil:
		s.mutex = m
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	}
	var taken *redsync.ErrTaken
	if wctx.Err() != nil || errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) {
		return errTimeout // out of tries or out of time
	}
	return err
}

func (s *redsyncSession) unlock(ctx context.Context) error {
	m := s.mutex
	s.mutex = nil
	ok, err := m.UnlockContext(ctx)
	if err == nil && !ok {
		return errNotHeld
	}
	return err
}

// redis/rueidis/rueidislock

func openRueidislock(b testing.TB, addr string) func() session {
	// The settings its README recommends for a single Redis >= 7.0.5 node.
	locker, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption:   rueidis.ClientOption{InitAddress: []string{addr}},
		KeyMajority:    1,
		NoLoopTracking: true,
		KeyValidity:    ttl,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(locker.Close)
	return func() session { return &rueidislockSession{locker: locker} }
}

type rueidislockSession struct {
	locker  rueidislock.Locker
	release context.CancelFunc // releases the lock and waits for the delete
	cancel  context.CancelFunc // frees the context the lock was taken on
}

func (s *rueidislockSession) tryLock(ctx context.Context, key string) error {
	_, release, err := s.locker.TryWithContext(ctx, key)
	if errors.Is(err, rueidislock.ErrNotLocked) {
		return errBusy
	} else if err != nil {
		return err
	}
	s.release, s.cancel = release, func() {}
	return nil
}

// lock bounds the wait without giving the context a deadline: rueidislock
// would shorten the key's validity to the deadline and release the lock
// when the context ends, so the wait context is cancelled from outside (by
// a timer or by ctx) only while the call waits.
func (s *rueidislockSession) lock(ctx context.Context, key string, wait time.Duration) error {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	timer := time.AfterFunc(wait, cancel)
	stop := context.AfterFunc(ctx, cancel)
	_, release, err := s.locker.WithContext(wctx, key)
	timedOut, ended := !timer.Stop(), !stop()
	if err == nil && (timedOut || ended) {
		release() // the lock's context was cancelled: it is being released
		err = wctx.Err()
	}
	switch {
	case err == nil:
		s.release, s.cancel = release, cancel
		return nil
	case ended:
		cancel()
		return ctx.Err()
	case timedOut:
		cancel()
		return errTimeout
	}
	cancel()
	return err
}

func (s *rueidislockSession) unlock(context.Context) error {
	s.release()
	s.cancel()
	s.release, s.cancel = nil, nil
	return nil
}

// raw: SET NX with a TTL, then a compare-and-delete script

var (
	//go:embed raw_release.lua
	rawReleaseLua    string
	rawReleaseScript = redis.NewScript(rawReleaseLua)
)

func openRaw(b testing.TB, addr string) func() session {
	return openRawPolling(b, addr, rawPoll)
}

// openRaw1ms is raw polling every millisecond instead of every 10: the
// fastest a poller hands off, for as many requests to Redis per waiter.
func openRaw1ms(b testing.TB, addr string) func() session {
	return openRawPolling(b, addr, time.Millisecond)
}

func openRawPolling(b testing.TB, addr string, poll time.Duration) func() session {
	client := newGoRedis(b, addr)
	return func() session { return &rawSession{client: client, poll: poll} }
}

type rawSession struct {
	client     *redis.Client
	poll       time.Duration // pause between two attempts at a busy lock
	key, token string
}

func (s *rawSession) tryLock(ctx context.Context, key string) error {
	token := rand.Text() // 128 random bits, like the other implementations' tokens
	ok, err := s.client.SetNX(ctx, key, token, ttl).Result()
	if err != nil {
		return err
	} else if !ok {
		return errBusy
	}
	s.key, s.token = key, token
	return nil
}

// lock polls with a fixed pause, the simplest waiting strategy.
func (s *rawSession) lock(ctx context.Context, key string, wait time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var t *time.Timer
	for {
		err := s.tryLock(wctx, key)
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case wctx.Err() != nil:
			return errTimeout
		case !errors.Is(err, errBusy):
			return err
		}
		if t == nil {
			t = time.NewTimer(s.poll)
			defer t.Stop()
		} else {
			t.Reset(s.poll)
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return errTimeout
		case <-t.C:
		}
	}
}

func (s *rawSession) unlock(ctx context.Context) error {
	n, err := rawReleaseScript.Run(ctx, s.client, []string{s.key}, s.token).Int64()
	if err != nil {
		return err
	} else if n == 0 {
		return fmt.Errorf("%w: %s", errNotHeld, s.key)
	}
	return nil
}
