package fencelock

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
)

func TestNilLeaseAndZeroLocker(t *testing.T) {
	// redislock's own examples release a lock that was never obtained:
	//   lock, err := Obtain(...); defer lock.Release(ctx)
	// The same code must not panic here.
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	lease, err := l.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrNotObtained)
	require.Nil(t, lease)

	assert.ErrorIs(t, lease.Release(ctx), ErrNotHeld)
	assert.ErrorIs(t, lease.Extend(ctx, time.Minute), ErrNotHeld)
	assert.Zero(t, lease.Fence())
	assert.True(t, lease.Deadline().IsZero())
	assert.Empty(t, lease.Name())
	assert.Empty(t, lease.Key())
	assert.Empty(t, lease.Token())
	assert.False(t, lease.Degraded())
	kctx := lease.KeepAlive(ctx)
	require.Error(t, kctx.Err(), "a nil lease's KeepAlive context is cancelled")
	assert.ErrorIs(t, context.Cause(kctx), ErrNotHeld)
	require.NoError(t, held.Release(ctx))

	var zero Locker
	_, err = zero.Acquire(ctx, name)
	assert.ErrorIs(t, err, ErrInvalid)
	assert.ErrorIs(t, zero.RunWithLock(ctx, name, func(context.Context, *Lease) error { return nil }), ErrInvalid)
	assert.NoError(t, zero.Close())
	var nilLocker *Locker
	_, err = nilLocker.Acquire(ctx, name)
	assert.ErrorIs(t, err, ErrInvalid)
	assert.NoError(t, nilLocker.Close())
}

func TestReleaseAfterLostReplyIsIdempotent(t *testing.T) {
	// The release's reply is lost after the server applied it; go-redis
	// resends the script on a new connection (MaxRetries), and the resend
	// must report what the first run did: the lock was released.
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr}) // go-redis's defaults: MaxRetries 3
	t.Cleanup(func() { _ = client.Close() })
	l, err := New(client, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	admin := srv.Client(nil)

	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	proxy.DropNextReply()
	require.NoError(t, lease.Release(ctx), "the resent release finds its own marker")
	n, err := admin.Exists(ctx, lease.Key()).Result()
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.ErrorIs(t, lease.Release(ctx), ErrNotHeld, "a second Release call: released already")

	// RunWithLock must not report a loss for a lease that was never lost.
	err = l.RunWithLock(ctx, uniqueName(t)+"-run", func(ctx context.Context, lease *Lease) error {
		proxy.DropNextReply() // the next command is the release after the work (renewals are 10s apart)
		return nil
	})
	require.NoError(t, err, "a release whose reply was lost is not a lost lease")
}

func TestReleaseWithoutPublishPermission(t *testing.T) {
	// An ACL user with the lock keys but no channels (Redis 7's default
	// acl-pubsub-default resetchannels): the delete succeeds, the wake-up
	// cannot be published, and Release must still report success.
	srv := redistest.Start(t)
	_, err := srv.Do("ACL", "SETUSER", "locker", "on", ">pw", "~lock:*", "+@all")
	require.NoError(t, err)
	client := srv.Client(&redis.Options{Username: "locker", Password: "pw"})
	log, logs := testLogger()
	l, err := New(client, &Options{Logger: log})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })

	for i := range 3 {
		lease, err := l.Acquire(ctx, uniqueName(t))
		require.NoError(t, err, "acquisition %d", i)
		require.NoError(t, lease.Release(ctx), "release %d: the lock was deleted", i)
		n, err := srv.Do("EXISTS", lease.Key())
		require.NoError(t, err)
		assert.Equal(t, int64(0), n, "release %d deleted the lock", i)
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "could not publish its wake-up"), "logged once:\n%s", logs)
	assert.Contains(t, logs.String(), "can't publish to the channel")
	assert.NotContains(t, logs.String(), "release failed")
}

func TestNotHeldSaysWhy(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)

	expired, err := l.Acquire(ctx, uniqueName(t)+"-expired", WithTTL(50*time.Millisecond))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		n, err := e.admin.Exists(ctx, expired.Key()).Result()
		return err == nil && n == 0
	}, 5*time.Second, 5*time.Millisecond)
	err = expired.Release(ctx)
	require.ErrorIs(t, err, ErrNotHeld)
	assert.Contains(t, err.Error(), "expired or was deleted")

	taken, err := l.Acquire(ctx, uniqueName(t)+"-taken")
	require.NoError(t, err)
	require.NoError(t, e.admin.Set(ctx, taken.Key(), "another-token 1", time.Minute).Err())
	err = taken.Extend(ctx, time.Minute)
	require.ErrorIs(t, err, ErrNotHeld)
	assert.Contains(t, err.Error(), "held by another holder")
	err = taken.Release(ctx)
	require.ErrorIs(t, err, ErrNotHeld, "the lease is done")
	assert.Contains(t, err.Error(), "held by another holder", "and still says why")
	got, err := e.admin.Get(ctx, taken.Key()).Result()
	require.NoError(t, err)
	assert.Equal(t, "another-token 1", got, "the other holder's lock is left alone")

	released, err := l.Acquire(ctx, uniqueName(t)+"-released")
	require.NoError(t, err)
	require.NoError(t, released.Release(ctx))
	err = released.Release(ctx)
	require.ErrorIs(t, err, ErrNotHeld)
	assert.Contains(t, err.Error(), "released already")
	assert.False(t, errors.Is(err, ErrLost))
}

func TestInspectAndLeaseTTL(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, &Options{Owner: "pod-2 (pid 7)"})
	name := uniqueName(t)

	info, err := l.Inspect(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, LockInfo{Name: name}, info, "nothing held, no fence kept")

	acquired := time.Now()
	lease, err := l.Acquire(ctx, name, WithTTL(10*time.Second))
	require.NoError(t, err)
	before := e.hook.calls.Load()
	info, err = l.Inspect(ctx, name)
	require.NoError(t, err)
	assert.True(t, info.Held)
	assert.Equal(t, "pod-2 (pid 7)", info.Owner)
	assert.Equal(t, lease.Fence(), info.Fence)
	assert.Equal(t, lease.Fence(), info.LastFence)
	assertTTLLeft(t, info.TTL, 10*time.Second, acquired)
	ttl, err := lease.TTL(ctx)
	require.NoError(t, err)
	assertTTLLeft(t, ttl, 10*time.Second, acquired)
	pttl := e.admin.PTTL(ctx, lease.Key()).Val()
	assert.LessOrEqual(t, pttl, ttl, "no side effect: the TTL was not reset")
	assert.Equal(t, before+3, e.hook.calls.Load(), "reads only: the inspect script and PUBSUB; the inspect script")

	// A waiter shows up as one waiting Locker, however many calls wait.
	other := e.locker(t, &Options{Owner: "pod-3"})
	got1, got2 := waitInBackground(other, name), waitInBackground(other, name)
	require.Eventually(t, func() bool {
		info, err := l.Inspect(ctx, name)
		return err == nil && info.Waiters == 1
	}, 5*time.Second, time.Millisecond)

	// Held by another, with another owner and a greater fence.
	require.NoError(t, lease.Release(ctx))
	requireObtained(t, got1, 5*time.Second, "first waiter")
	requireObtained(t, got2, 5*time.Second, "second waiter")
	next, err := other.Acquire(ctx, name)
	require.NoError(t, err)
	info, err = l.Inspect(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, "pod-3", info.Owner)
	assert.Equal(t, next.Fence(), info.Fence)
	assert.Greater(t, info.Fence, lease.Fence())
	_, err = lease.TTL(ctx)
	require.ErrorIs(t, err, ErrNotHeld)
	assert.Contains(t, err.Error(), "held by another holder")
	require.NoError(t, next.Release(ctx))
	_, err = next.TTL(ctx)
	require.ErrorIs(t, err, ErrNotHeld)
	assert.Contains(t, err.Error(), "expired or was deleted")

	_, err = (*Lease)(nil).TTL(ctx)
	assert.ErrorIs(t, err, ErrNotHeld)
	_, err = l.Inspect(ctx, "a{b}")
	assert.ErrorIs(t, err, ErrInvalid)
}

func TestOwnerOptions(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct {
		name  string
		owner string
		msg   string
	}{
		{"too long", strings.Repeat("x", 201), "longer than 200 bytes"},
		{"newline", "pod\n2", "not printable"},
		{"invalid UTF-8", "pod\xff", "UTF-8"},
	} {
		_, err := New(e.client, &Options{Owner: tc.owner})
		require.ErrorIs(t, err, ErrInvalid, tc.name)
		assert.Contains(t, err.Error(), tc.msg)
		l := e.locker(t, nil)
		_, err = l.Acquire(ctx, "x", WithOwner(tc.owner))
		require.ErrorIs(t, err, ErrInvalid, tc.name)
	}
	l := e.locker(t, nil)
	_, err := l.Acquire(ctx, "x", WithOwner(""))
	require.ErrorIs(t, err, ErrInvalid, "an empty WithOwner")
	assert.Zero(t, e.hook.calls.Load(), "no Redis call")
	host, _ := os.Hostname()
	assert.Equal(t, host+" (pid "+strconv.Itoa(os.Getpid())+")", l.opts.Owner, "the default")
}
