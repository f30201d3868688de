package fencelock

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Fast unit tests on miniredis, which is faithful for TTLs and lets a test
// fast-forward through them instead of sleeping.

func newMini(t *testing.T) (*miniredis.Miniredis, *Locker) {
	t.Helper()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	l, err := New(c, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return m, l
}

func TestMiniExpiryHandsOver(t *testing.T) {
	m, l := newMini(t)
	old, err := l.Acquire(ctx, "job", WithTTL(time.Minute))
	require.NoError(t, err)
	_, err = l.Acquire(ctx, "job")
	require.ErrorIs(t, err, ErrNotObtained)

	m.FastForward(time.Minute)
	assert.False(t, m.Exists(old.Key()), "the lock expired after its TTL")
	require.ErrorIs(t, old.Extend(ctx, time.Minute), ErrNotHeld, "Extend after expiry")
	assert.False(t, m.Exists(old.Key()), "Extend did not recreate it")

	current, err := l.Acquire(ctx, "job")
	require.NoError(t, err)
	assert.Greater(t, current.Fence(), old.Fence())
	require.ErrorIs(t, old.Release(ctx), ErrNotHeld)
	assert.True(t, m.Exists(current.Key()), "the new holder's lock is left alone")
	require.NoError(t, current.Release(ctx))
}

func TestMiniExtendKeepsItAlive(t *testing.T) {
	m, l := newMini(t)
	lease, err := l.Acquire(ctx, "job", WithTTL(10*time.Second))
	require.NoError(t, err)
	for range 5 {
		m.FastForward(8 * time.Second)
		require.NoError(t, lease.Extend(ctx, 10*time.Second))
	}
	assert.Equal(t, 10*time.Second, m.TTL(lease.Key()))
	require.NoError(t, lease.Release(ctx))
}

// A server without sharded pub/sub (miniredis, Redis 6.2) answers PUBSUB
// SHARDNUMSUB with "unknown subcommand": Inspect counts the waiters with
// PUBSUB NUMSUB instead.
func TestMiniInspectWithoutShardedPubSub(t *testing.T) {
	_, l := newMini(t)
	lease, err := l.Acquire(ctx, "job")
	require.NoError(t, err)
	info, err := l.Inspect(ctx, "job")
	require.NoError(t, err)
	assert.Equal(t, lease.Fence(), info.Fence)
	permit, err := l.Semaphore("job", 2).Acquire(ctx)
	require.NoError(t, err)
	sinfo, err := l.Semaphore("job", 2).Inspect(ctx)
	require.NoError(t, err)
	require.Len(t, sinfo.Holders, 1)
	assert.Equal(t, permit.Fence(), sinfo.Holders[0].Fence)
}
