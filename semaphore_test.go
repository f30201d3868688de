package fencelock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/fencelock/fencelock/internal/store"
)

// Tests of Semaphore (issue 26) on real redis-servers: permits, fences,
// expiry, waiting, keys; the property test, the paused holder and Cluster
// are in semaphore_props_test.go.

// semKey returns the semaphore name's key with suffix ("", ":h", ...).
func semKey(name, suffix string) string { return "lock:{" + name + "}:sem" + suffix }

// requireAllExpire checks that every key of name (the lock's and the
// semaphore's, all of the hash tag {name}) has a TTL, and returns them.
func requireAllExpire(t *testing.T, admin redis.UniversalClient, name string) []string {
	t.Helper()
	var keys []string
	iter := admin.Scan(ctx, 0, "lock:{"+name+"}*", 100).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	require.NoError(t, iter.Err())
	for _, k := range keys {
		pttl, err := admin.PTTL(ctx, k).Result()
		require.NoError(t, err)
		assert.Positive(t, pttl, "key %s has no expiry", k)
	}
	return keys
}

func TestSemaphoreAcquireRelease(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	sem := l.Semaphore(name, 2)

	before := time.Now()
	a, err := sem.Acquire(ctx, WithTTL(10*time.Second))
	require.NoError(t, err)
	b, err := sem.Acquire(ctx, WithTTL(20*time.Second), WithOwner("pod-b"))
	require.NoError(t, err)
	assert.Equal(t, name, a.Name())
	assert.Equal(t, semKey(name, ""), a.Key(), "a permit's key is the semaphore's, not the lock's")
	assert.NotEqual(t, a.Token(), b.Token())
	assert.Positive(t, a.Fence())
	assert.Greater(t, b.Fence(), a.Fence())

	_, err = sem.Acquire(ctx)
	var busy *BusyError
	require.ErrorAs(t, err, &busy)
	require.ErrorIs(t, err, ErrNotObtained)
	assert.Equal(t, 2, busy.Holders)
	assert.Equal(t, l.opts.Owner, busy.Owner, "the first permit to expire is a's")
	assertTTLLeft(t, busy.TTL, 10*time.Second, before, "the TTL is the first permit's to expire")
	assert.Contains(t, err.Error(), `all 2 permits of "`+name+`" are held`)

	// The lock of the same name is another thing.
	lock, err := l.Acquire(ctx, name)
	require.NoError(t, err, "the lock of the semaphore's name is free")

	// What Redis holds: the holders by expiry, their fences and owners.
	members, err := e.admin.ZRange(ctx, semKey(name, ""), 0, -1).Result()
	require.NoError(t, err)
	assert.Equal(t, []string{a.Token(), b.Token()}, members)
	v, err := e.admin.HGet(ctx, semKey(name, ":h"), b.Token()).Result()
	require.NoError(t, err)
	assert.Equal(t, strconv.FormatInt(b.Fence(), 10)+" pod-b", v)
	keys := requireAllExpire(t, e.admin, name)
	assert.ElementsMatch(t, []string{"lock:{" + name + "}", "lock:{" + name + "}:fence",
		semKey(name, ""), semKey(name, ":h"), semKey(name, ":fence")}, keys)
	pttl, err := e.admin.PTTL(ctx, semKey(name, "")).Result()
	require.NoError(t, err)
	assertTTLLeft(t, pttl, 20*time.Second, before, "the holders live as long as the last permit")

	info, err := sem.Inspect(ctx)
	require.NoError(t, err)
	assert.Equal(t, name, info.Name)
	assert.Equal(t, 2, info.Permits)
	require.Len(t, info.Holders, 2)
	assert.Equal(t, HolderInfo{Token: a.Token(), Owner: l.opts.Owner, TTL: info.Holders[0].TTL, Fence: a.Fence()}, info.Holders[0])
	assert.Equal(t, "pod-b", info.Holders[1].Owner)
	assertTTLLeft(t, info.Holders[1].TTL, 20*time.Second, before)
	assert.Equal(t, b.Fence(), info.LastFence)
	lockInfo, err := l.Inspect(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, lock.Fence(), lockInfo.Fence, "the lock's Inspect sees the lock only")

	ttl, err := b.TTL(ctx)
	require.NoError(t, err)
	assertTTLLeft(t, ttl, 20*time.Second, before)
	extended := time.Now()
	require.NoError(t, a.Extend(ctx, 30*time.Second))
	ttl, err = a.TTL(ctx)
	require.NoError(t, err)
	assertTTLLeft(t, ttl, 30*time.Second, extended)

	require.NoError(t, a.Release(ctx))
	assert.ErrorIs(t, a.Release(ctx), ErrNotHeld, "second Release")
	assert.ErrorIs(t, a.Extend(ctx, time.Second), ErrNotHeld, "Extend after Release")
	_, err = a.TTL(ctx)
	assert.ErrorIs(t, err, ErrNotHeld, "TTL after Release")
	c, err := sem.Acquire(ctx)
	require.NoError(t, err, "the permit a gave back")
	assert.Greater(t, c.Fence(), lock.Fence(), "c's fence comes after every earlier one of the semaphore")
	assert.Greater(t, c.Fence(), b.Fence())
	requireAllExpire(t, e.admin, name)

	require.NoError(t, b.Release(ctx))
	require.NoError(t, c.Release(ctx))
	require.NoError(t, lock.Release(ctx))
	n, err := e.admin.Exists(ctx, semKey(name, ""), semKey(name, ":h")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "no holder left: the holders and their info are deleted")
	info, err = sem.Inspect(ctx)
	require.NoError(t, err)
	assert.Empty(t, info.Holders)
	assert.Equal(t, 2, info.Permits, "nobody holds one: the Semaphore's own number")
	assert.Equal(t, c.Fence(), info.LastFence)
}

func TestSemaphoreInvalid(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	before := e.hook.calls.Load()
	for _, tc := range []struct {
		sem  *Semaphore
		want string
	}{
		{l.Semaphore("x", 0), "permits 0 is less than 1"},
		{l.Semaphore("x", -3), "permits -3 is less than 1"},
		{l.Semaphore("", 3), "empty lock name"},
		{l.Semaphore("a{b}", 3), "contains '{' or '}'"},
		{(*Locker)(nil).Semaphore("x", 3), "Locker not created"},
		{new(Locker).Semaphore("x", 3), "Locker not created"},
		{nil, "nil Semaphore"},
	} {
		_, err := tc.sem.Acquire(ctx, WithWait(time.Second))
		require.ErrorIs(t, err, ErrInvalid)
		assert.ErrorContains(t, err, tc.want)
		err = tc.sem.RunWithLock(ctx, func(context.Context, *Lease) error { return nil })
		assert.ErrorIs(t, err, ErrInvalid)
		_, err = tc.sem.Inspect(ctx)
		assert.ErrorIs(t, err, ErrInvalid)
	}
	_, err := l.Semaphore("x", 1).Acquire(ctx, WithTTL(time.Microsecond))
	assert.ErrorIs(t, err, ErrInvalid, "the options are checked as a lock's")
	assert.ErrorIs(t, l.Semaphore("x", 1).RunWithLock(ctx, nil), ErrInvalid, "nil work")
	assert.Equal(t, before, e.hook.calls.Load(), "no Redis call")
}

func TestSemaphoreOnRedlockIsInvalid(t *testing.T) {
	var clients []redis.UniversalClient
	for range 3 {
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	l, err := NewRedlock(clients, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	_, err = l.Semaphore("x", 3).Acquire(ctx)
	require.ErrorIs(t, err, ErrInvalid)
	assert.ErrorContains(t, err, "up to 4 holders (nodes × permits / quorum) could each win a quorum")
	_, err = l.Semaphore("x", 3).Inspect(ctx)
	assert.ErrorIs(t, err, ErrInvalid)
}

func TestSemaphorePermitsMustAgree(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	held, err := l.Semaphore(name, 3).Acquire(ctx)
	require.NoError(t, err)

	for _, opts := range [][]Option{nil, {WithWait(5 * time.Second)}, {WithWait(5 * time.Second), WithFair()}} {
		start := time.Now()
		_, err = l.Semaphore(name, 5).Acquire(ctx, opts...)
		require.ErrorIs(t, err, ErrMisconfigured)
		assert.NotErrorIs(t, err, ErrNotObtained)
		assert.NotErrorIs(t, err, ErrUnavailable)
		assert.EqualError(t, err, `fencelock: redis refuses the lock's commands: semaphore "`+name+
			`" is held with 3 permits, this Semaphore has 5: give every Semaphore of a name one number (a new one counts once no holder is left)`)
		assert.Less(t, time.Since(start), 2*time.Second, "not retried")
	}
	n, err := e.admin.Exists(ctx, semKey(name, ":q")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the fair caller did not join the line")
	info, err := l.Semaphore(name, 5).Inspect(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, info.Permits, "the holders' number")

	require.NoError(t, held.Release(ctx))
	five, err := l.Semaphore(name, 5).Acquire(ctx)
	require.NoError(t, err, "once no holder is left, a new number is accepted")
	_, err = l.Semaphore(name, 3).Acquire(ctx)
	assert.ErrorIs(t, err, ErrMisconfigured)
	assert.ErrorContains(t, err, "held with 5 permits, this Semaphore has 3")
	require.NoError(t, five.Release(ctx))
}

func TestSemaphorePermitExpires(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	sem := l.Semaphore(name, 1)
	old, err := sem.Acquire(ctx, WithTTL(50*time.Millisecond))
	require.NoError(t, err)
	_, err = sem.Acquire(ctx)
	require.ErrorIs(t, err, ErrNotObtained)
	time.Sleep(100 * time.Millisecond)

	require.ErrorIs(t, old.Extend(ctx, time.Minute), ErrNotHeld, "Extend after expiry")
	assert.ErrorContains(t, old.Extend(ctx, time.Minute), "expired or was deleted")
	next, err := sem.Acquire(ctx, WithTTL(time.Minute))
	require.NoError(t, err, "an expired permit frees itself")
	assert.Greater(t, next.Fence(), old.Fence())
	require.ErrorIs(t, old.Release(ctx), ErrNotHeld, "Release after expiry")
	_, err = old.TTL(ctx)
	require.ErrorIs(t, err, ErrNotHeld)

	// Extend never revives an expired permit, and another's Release never
	// gives back next's.
	old2, err := l.Semaphore(name+"-2", 1).Acquire(ctx, WithTTL(50*time.Millisecond))
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)
	require.ErrorIs(t, old2.Extend(ctx, time.Minute), ErrNotHeld)
	n, err := e.admin.ZCard(ctx, semKey(name+"-2", "")).Result()
	require.NoError(t, err)
	assert.Zero(t, n)
	ttl, err := next.TTL(ctx)
	require.NoError(t, err)
	assert.Greater(t, ttl, 50*time.Second)
	require.NoError(t, next.Release(ctx))
}

func TestSemaphoreReleaseAfterLostReplyIsIdempotent(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr}) // go-redis's defaults: MaxRetries 3
	t.Cleanup(func() { _ = client.Close() })
	l := lockerFor(t, client, nil)
	sem := l.Semaphore(uniqueName(t), 2)

	lease, err := sem.Acquire(ctx)
	require.NoError(t, err)
	proxy.DropNextReply()
	require.NoError(t, lease.Release(ctx), "the resent release finds its own marker")
	info, err := sem.Inspect(ctx)
	require.NoError(t, err)
	assert.Empty(t, info.Holders)
	assert.ErrorIs(t, lease.Release(ctx), ErrNotHeld, "a second Release call: released already")

	// An acquire whose reply was lost: go-redis's resend finds the permit
	// its own, and takes no second one.
	proxy.DropNextReply()
	lease, err = sem.Acquire(ctx)
	require.NoError(t, err)
	info, err = sem.Inspect(ctx)
	require.NoError(t, err)
	require.Len(t, info.Holders, 1, "one permit for one Acquire")
	assert.Equal(t, lease.Fence(), info.Holders[0].Fence)
	require.NoError(t, lease.Release(ctx))
}

func TestSemaphoreCancelledAcquireGivesBack(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	sem := l.Semaphore(name, 1)
	// The acquire reaches Redis and takes the permit, but its reply is lost:
	// the call gives up, and the clean-up gives the permit back.
	e.hook.set(nil, onScript("semaphore_acquire", errReplyLost))
	_, err := sem.Acquire(ctx)
	require.ErrorIs(t, err, errReplyLost)
	e.hook.set(nil, nil)
	require.Eventually(t, func() bool {
		n, err := e.admin.ZCard(ctx, semKey(name, "")).Result()
		return err == nil && n == 0
	}, 5*time.Second, time.Millisecond, "the permit taken unseen is given back")
	got, err := sem.Acquire(ctx)
	require.NoError(t, err)
	requireAllExpire(t, e.admin, name)
	require.NoError(t, got.Release(ctx))
}

func TestDecodeSemaphoreAcquire(t *testing.T) {
	s := &Semaphore{name: "x", permits: 3}
	for _, tc := range []struct {
		reply any
		want  store.Attempt
		err   error
	}{
		{[]any{int64(1), "42"}, store.Attempt{OK: true, Fence: 42}, nil},
		{[]any{int64(0), int64(1500), int64(3), "pod"}, store.Attempt{Busy: store.Busy{TTL: 1500 * time.Millisecond, Holders: 3, Owner: "pod"}}, nil},
		{[]any{int64(0), int64(-3), int64(1), ""}, store.Attempt{Busy: store.Busy{TTL: -3, Owner: "fair waiters in line"}}, nil},
		{[]any{int64(2)}, store.Attempt{}, store.ErrRetired},
		{[]any{int64(3), "5"}, store.Attempt{}, ErrMisconfigured},
		{[]any{int64(1), "0"}, store.Attempt{}, store.ErrReply},
		{[]any{int64(0), int64(1)}, store.Attempt{}, store.ErrReply},
		{"OK", store.Attempt{}, store.ErrReply},
		{nil, store.Attempt{}, store.ErrReply},
	} {
		got := s.attemptOf(tc.reply)
		if tc.err != nil {
			assert.ErrorIs(t, got.Err, tc.err, "%v", tc.reply)
			continue
		}
		require.NoError(t, got.Err, "%v", tc.reply)
		assert.Equal(t, tc.want, got, "%v", tc.reply)
	}
	var pe *permitsError
	err := s.attemptOf([]any{int64(3), "5"}).Err
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, permitsError{name: "x", used: 5, want: 3}, *pe)
	assert.Same(t, err, callError("x", err), "callError keeps the message")
	assert.Equal(t, store.Misconfigured, classify(err))
}

func TestSemaphoreBusyErrorMessage(t *testing.T) {
	err := &BusyError{Name: "api", Owner: "pod-2", TTL: 1234 * time.Millisecond, Holders: 4}
	assert.Equal(t, `fencelock: not obtained: all 4 permits of "api" are held, the first by pod-2 for 1.2s more`, err.Error())
	lock := &BusyError{Name: "api", Owner: "pod-2", TTL: 1234 * time.Millisecond}
	assert.Equal(t, `fencelock: not obtained: "api" held by pod-2 for 1.2s more`, lock.Error(), "a lock's message is unchanged")
}

// releasesPublished subscribes to name's semaphore channel and returns the
// messages published on it, read until the returned function is called.
func releasesPublished(t *testing.T, e *env, name string) func() []string {
	t.Helper()
	ps := e.admin.SSubscribe(ctx, semKey(name, ""))
	_, err := ps.Receive(ctx) // the confirmation
	require.NoError(t, err)
	return func() []string {
		var got []string
		for {
			rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			msg, err := ps.ReceiveMessage(rctx)
			cancel()
			if err != nil {
				_ = ps.Close()
				return got
			}
			got = append(got, msg.Payload)
		}
	}
}

func TestSemaphoreReleasePublishesOnlyForWaiters(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	sem := l.Semaphore(name, 1)

	published := releasesPublished(t, e, name)
	a, err := sem.Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, a.Release(ctx))
	assert.Empty(t, published(), "nobody waited: nothing published")

	published = releasesPublished(t, e, name)
	a, err = sem.Acquire(ctx)
	require.NoError(t, err)
	_, err = sem.Acquire(ctx)
	require.ErrorIs(t, err, ErrNotObtained)
	require.NoError(t, a.Release(ctx))
	a, err = sem.Acquire(ctx)
	require.NoError(t, err)
	require.NoError(t, a.Release(ctx))
	assert.Equal(t, []string{"released"}, published(), "one message, for the release after the busy attempt")
}

func TestSemaphoreWaitIsWokenByRelease(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, slowPolling) // the backoff alone would wait 20s
	name := uniqueName(t)
	sem := l.Semaphore(name, 2)
	a, err := sem.Acquire(ctx, WithTTL(time.Minute))
	require.NoError(t, err)
	b, err := sem.Acquire(ctx, WithTTL(time.Minute))
	require.NoError(t, err)

	got := make(chan acquired, 1)
	go func() {
		lease, err := sem.Acquire(ctx, WithWait(time.Minute))
		got <- acquired{lease: lease, err: err}
	}()
	require.Eventually(t, func() bool { return shardSubscribers(t, e.srv, semKey(name, "")) == 1 },
		10*time.Second, time.Millisecond, "the waiter's subscription")
	time.Sleep(50 * time.Millisecond) // its confirmation's attempt found both permits held
	released := time.Now()
	require.NoError(t, b.Release(ctx))
	select {
	case r := <-got:
		require.NoError(t, r.err)
		assert.Less(t, time.Since(released), 5*time.Second, "woken by the release, not the 20s backoff")
		assert.Greater(t, r.lease.Fence(), b.Fence())
		require.NoError(t, r.lease.Release(ctx))
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not woken by the release")
	}
	require.NoError(t, a.Release(ctx))
}

func TestSemaphoreFairGrant(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	sem := l.Semaphore(name, 2)
	a, err := sem.Acquire(ctx, WithTTL(time.Minute))
	require.NoError(t, err)
	b, err := sem.Acquire(ctx, WithTTL(time.Minute))
	require.NoError(t, err)

	// Three fair waiters, in line in this order.
	var waits []<-chan acquired
	var tokens []string
	for i := range 3 {
		waits = append(waits, semAcquireInBackground(t, sem, WithFair(), WithWait(time.Minute), WithTTL(time.Minute),
			WithOwner(fmt.Sprintf("w%d", i))))
		require.Eventually(t, func() bool {
			q, err := e.admin.ZRange(ctx, semKey(name, ":q"), 0, -1).Result()
			require.NoError(t, err)
			tokens = q
			return len(q) == i+1
		}, 10*time.Second, time.Millisecond)
	}
	requireAllExpire(t, e.admin, name)
	// A plain Acquire does not jump the line, fair or not.
	_, err = sem.Acquire(ctx)
	require.ErrorIs(t, err, ErrNotObtained)

	require.NoError(t, a.Release(ctx))
	// The release hands the permit to the first in line, in the same step.
	holders, err := e.admin.ZRange(ctx, semKey(name, ""), 0, -1).Result()
	require.NoError(t, err)
	assert.Contains(t, holders, tokens[0], "granted to the first in line by the release")
	r := <-waits[0]
	require.NoError(t, r.err)
	assert.Equal(t, tokens[0], r.lease.Token())
	assert.Greater(t, r.lease.Fence(), b.Fence())
	ttl, err := r.lease.TTL(ctx)
	require.NoError(t, err)
	assert.Greater(t, ttl, 50*time.Second, "the grant has the waiter's TTL")

	require.NoError(t, b.Release(ctx))
	r1 := <-waits[1]
	require.NoError(t, r1.err)
	assert.Equal(t, tokens[1], r1.lease.Token(), "second in line, second served")
	assert.Greater(t, r1.lease.Fence(), r.lease.Fence())
	info, err := sem.Inspect(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"w0", "w1"}, []string{info.Holders[0].Owner, info.Holders[1].Owner})

	// The third is served when the first gives its permit back.
	require.NoError(t, r.lease.Release(ctx))
	r2 := <-waits[2]
	require.NoError(t, r2.err)
	require.NoError(t, r2.lease.Release(ctx))
	require.NoError(t, r1.lease.Release(ctx))
	requireAllExpire(t, e.admin, name)
}

// semAcquireInBackground is acquireInBackground for a semaphore.
func semAcquireInBackground(t *testing.T, sem *Semaphore, opts ...Option) <-chan acquired {
	t.Helper()
	actx, cancel := context.WithCancel(context.Background())
	got := make(chan acquired, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lease, err := sem.Acquire(actx, opts...)
		got <- acquired{lease: lease, err: err, at: time.Now()}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return got
}

func TestSemaphoreRunWithLock(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	sem := l.Semaphore(name, 2)

	// Renewed while the work runs, past its TTL.
	err := sem.RunWithLock(ctx, func(ctx context.Context, lease *Lease) error {
		time.Sleep(400 * time.Millisecond)
		ttl, err := lease.TTL(ctx)
		require.NoError(t, err)
		assert.Positive(t, ttl)
		return ctx.Err()
	}, WithTTL(150*time.Millisecond))
	require.NoError(t, err)
	info, err := sem.Inspect(ctx)
	require.NoError(t, err)
	assert.Empty(t, info.Holders, "given back after the work")

	// A permit taken away (an operator's forced release): the work's ctx
	// is cancelled with ErrLost at the next renewal.
	err = sem.RunWithLock(ctx, func(ctx context.Context, lease *Lease) error {
		require.NoError(t, e.admin.ZRem(ctx, semKey(name, ""), lease.Token()).Err())
		select {
		case <-ctx.Done():
			assert.ErrorIs(t, context.Cause(ctx), ErrLost)
			return nil
		case <-time.After(5 * time.Second):
			return errors.New("not cancelled")
		}
	}, WithTTL(150*time.Millisecond))
	require.ErrorIs(t, err, ErrLost)
}

func TestSemaphoreDegraded(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerFor(t, c, nil)
	var key string
	err := l.Semaphore("x", 2).RunWithLock(ctx, func(ctx context.Context, lease *Lease) error {
		assert.True(t, lease.Degraded())
		assert.Zero(t, lease.Fence())
		key = lease.Key()
		return nil
	}, WithFailOpen(true))
	require.NoError(t, err)
	assert.Equal(t, "lock:{x}:sem", key, "a degraded permit's key is the semaphore's")
	assert.True(t, strings.HasPrefix(key, "lock:{x}"))
}

// Two plain waiters of one Locker, both permits held: each release wakes
// one of them (a Locker's release wakes its earliest plain waiter), the
// second release too, although no attempt came between the two releases.
func TestSemaphoreEachReleaseWakesAWaiter(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, slowPolling) // the backoff alone would wait 20s
	name := uniqueName(t)
	sem := l.Semaphore(name, 2)
	a, err := sem.Acquire(ctx, WithTTL(time.Minute))
	require.NoError(t, err)
	b, err := sem.Acquire(ctx, WithTTL(time.Minute))
	require.NoError(t, err)
	w1 := semAcquireInBackground(t, sem, WithWait(time.Minute), WithTTL(time.Minute))
	w2 := semAcquireInBackground(t, sem, WithWait(time.Minute), WithTTL(time.Minute))
	require.Eventually(t, func() bool { return shardSubscribers(t, e.srv, semKey(name, "")) == 1 },
		10*time.Second, time.Millisecond, "the waiters' subscription")
	time.Sleep(100 * time.Millisecond) // both tried again on its confirmation, and found both permits held

	var got []*Lease
	for _, held := range []*Lease{a, b} {
		require.NoError(t, held.Release(ctx))
		select {
		case r := <-w1:
			require.NoError(t, r.err)
			got = append(got, r.lease)
		case r := <-w2:
			require.NoError(t, r.err)
			got = append(got, r.lease)
		case <-time.After(10 * time.Second):
			t.Fatalf("release %d woke no waiter", len(got)+1)
		}
	}
	for _, lease := range got {
		require.NoError(t, lease.Release(ctx))
	}
}

// TestSemaphoreShortWindowKeepsLongerWait: a busy attempt of a Locker that
// polls often does not cut short the wake-up window of a waiter that polls
// rarely (each busy attempt once set 'w' to its own window).
func TestSemaphoreShortWindowKeepsLongerWait(t *testing.T) {
	e := newEnv(t, nil)
	name := uniqueName(t)
	holder, err := e.locker(t, nil).Semaphore(name, 1).Acquire(ctx, WithTTL(time.Minute))
	require.NoError(t, err)

	slow := e.locker(t, slowPolling).Semaphore(name, 1) // the backoff alone would wait 20s
	got := semAcquireInBackground(t, slow, WithWait(time.Minute))
	require.Eventually(t, func() bool { return shardSubscribers(t, e.srv, semKey(name, "")) == 1 },
		10*time.Second, time.Millisecond, "the waiter's subscription")
	time.Sleep(50 * time.Millisecond) // its confirmation's attempt found the permit held

	// A default Locker's try-once attempt: its window is about a second.
	_, err = e.locker(t, nil).Semaphore(name, 1).Acquire(ctx)
	require.ErrorIs(t, err, ErrNotObtained)
	time.Sleep(1500 * time.Millisecond) // past that window, within the waiter's

	released := time.Now()
	require.NoError(t, holder.Release(ctx))
	select {
	case r := <-got:
		require.NoError(t, r.err)
		assert.Less(t, r.at.Sub(released), 5*time.Second, "woken by the release, not the 20s backoff")
		require.NoError(t, r.lease.Release(ctx))
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not woken by the release")
	}
}

// TestSemaphoreGrantKeepsPlainWaitersWindow: a release that frees the last
// permit and grants it to a fair waiter keeps the plain waiters' wake-up
// window, so the fair holder's release wakes them (the info hash, 'w'
// with it, was dropped with the last holder and rebuilt for the grant).
func TestSemaphoreGrantKeepsPlainWaitersWindow(t *testing.T) {
	e := newEnv(t, nil)
	name := uniqueName(t)
	holder, err := e.locker(t, nil).Semaphore(name, 1).Acquire(ctx, WithTTL(time.Minute))
	require.NoError(t, err)

	plain := e.locker(t, slowPolling).Semaphore(name, 1) // the backoff alone would wait 20s
	gotPlain := semAcquireInBackground(t, plain, WithWait(time.Minute))
	require.Eventually(t, func() bool { return shardSubscribers(t, e.srv, semKey(name, "")) == 1 },
		10*time.Second, time.Millisecond, "the plain waiter's subscription")
	time.Sleep(50 * time.Millisecond) // its confirmation's attempt found the permit held

	fair := e.locker(t, nil).Semaphore(name, 1)
	gotFair := semAcquireInBackground(t, fair, WithFair(), WithWait(time.Minute), WithTTL(time.Minute))
	require.Eventually(t, func() bool {
		n, err := e.admin.ZCard(ctx, semKey(name, ":q")).Result()
		require.NoError(t, err)
		return n == 1
	}, 10*time.Second, time.Millisecond, "the fair waiter in line")

	require.NoError(t, holder.Release(ctx)) // granted to the fair waiter
	r := <-gotFair
	require.NoError(t, r.err)
	released := time.Now()
	require.NoError(t, r.lease.Release(ctx))
	select {
	case p := <-gotPlain:
		require.NoError(t, p.err)
		assert.Less(t, p.at.Sub(released), 5*time.Second, "woken by the fair holder's release, not the 20s backoff")
		require.NoError(t, p.lease.Release(ctx))
	case <-time.After(10 * time.Second):
		t.Fatal("the plain waiter was not woken by the fair holder's release")
	}
	requireAllExpire(t, e.admin, name)
}

// TestSemaphoreBehindTheLineGetsAWindow: a plain caller told that a permit
// is free but fair waiters are in line first (-3), with no holder, asks the
// next releases to wake it as a busy one does.
func TestSemaphoreBehindTheLineGetsAWindow(t *testing.T) {
	e := newEnv(t, nil)
	name := uniqueName(t)
	// A fair waiter in line (its entry written as semaphore_acquire.lua's
	// join writes one: "<expiry ms> <ttl> <permits> <owner>"), no holder.
	now, err := e.admin.Time(ctx).Result()
	require.NoError(t, err)
	nowMs := now.UnixMilli()
	require.NoError(t, e.admin.ZAdd(ctx, semKey(name, ":q"), redis.Z{Score: float64(nowMs), Member: "ahead"}).Err())
	require.NoError(t, e.admin.HSet(ctx, semKey(name, ":qi"), "ahead", fmt.Sprintf("%d 60000 1 x", nowMs+60000)).Err())
	for _, k := range []string{":q", ":qi"} {
		require.NoError(t, e.admin.PExpire(ctx, semKey(name, k), time.Minute).Err())
	}

	plain := e.locker(t, slowPolling).Semaphore(name, 1) // the backoff alone would wait 20s
	got := semAcquireInBackground(t, plain, WithWait(time.Minute))
	require.Eventually(t, func() bool { return shardSubscribers(t, e.srv, semKey(name, "")) == 1 },
		10*time.Second, time.Millisecond, "the waiter's subscription")
	time.Sleep(50 * time.Millisecond) // its confirmation's attempt found the line ahead
	requireAllExpire(t, e.admin, name)

	// The waiter ahead takes its permit and gives it back (here: it leaves
	// the line, and another caller takes and releases the permit).
	require.NoError(t, e.admin.Del(ctx, semKey(name, ":q"), semKey(name, ":qi")).Err())
	other, err := e.locker(t, nil).Semaphore(name, 1).Acquire(ctx)
	require.NoError(t, err)
	released := time.Now()
	require.NoError(t, other.Release(ctx))
	select {
	case r := <-got:
		require.NoError(t, r.err)
		assert.Less(t, r.at.Sub(released), 5*time.Second, "woken by the release, not the 20s backoff")
		require.NoError(t, r.lease.Release(ctx))
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not woken by the release")
	}
}
