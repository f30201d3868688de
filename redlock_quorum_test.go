package fencelock

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
)

// A's lock expires on every node (an admin DEL stands for the expiry), then
// B acquires it, with a larger fence, and releases it. A's Extend, before
// A's local deadline, finds the lock free everywhere: a repair with A's
// fence would store a fence older than the nodes have issued (A's, B's,
// A's again). Every node refuses it, and Extend reports the lock not held.
func TestRedlockRepairNeverStoresAnOlderFence(t *testing.T) {
	e := newRedlockEnv(t, 3, nil)
	la := e.locker(t, nil)
	lb := e.locker(t, nil)
	name := uniqueName(t)
	a, err := la.Acquire(ctx, name, WithTTL(10*time.Second))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return e.holders(t, a.Key(), a.Token()) == 3 },
		time.Second, time.Millisecond, "A holds every node")
	for _, admin := range e.admins {
		require.NoError(t, admin.Del(ctx, a.Key()).Err())
	}
	b, err := lb.Acquire(ctx, name, WithTTL(10*time.Second))
	require.NoError(t, err)
	require.Greater(t, b.Fence(), a.Fence())
	// Acquire returns at a quorum: the third node may not have B's fence
	// yet, and a repair there with A's would not be older than it has seen.
	require.Eventually(t, func() bool { return e.holders(t, b.Key(), b.Token()) == 3 },
		time.Second, time.Millisecond, "B holds every node")
	require.NoError(t, b.Release(ctx))
	require.Eventually(t, func() bool { return e.holders(t, b.Key(), b.Token()) == 0 },
		time.Second, time.Millisecond, "B released every node")

	require.ErrorIs(t, a.Extend(ctx, time.Minute), ErrNotHeld)
	time.Sleep(50 * time.Millisecond) // the detached node calls
	for i, admin := range e.admins {
		v, err := admin.Get(ctx, a.Key()).Result()
		assert.False(t, err == nil && strings.HasPrefix(v, a.Token()+" "), "node %d repaired with A's stale fence: %q", i, v)
	}
}

// Five nodes, the lease held on a bare quorum {2, 3, 4}, nodes 3 and 4
// 30ms away: nodes 0, 1 and 2 answer first, and say nothing of whether a
// quorum holds it. Inspect and TTL wait for the others.
func TestRedlockInspectWaitsForTheSlowHolders(t *testing.T) {
	e := newRedlockEnv(t, 5, nil)
	l := e.slowLocker(t, 30*time.Millisecond, 3, 4)
	name := uniqueName(t)
	before := time.Now()
	lease, err := l.Acquire(ctx, name, WithTTL(10*time.Second))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return e.holders(t, lease.Key(), lease.Token()) == 5 },
		redlockPatience, time.Millisecond, "held on every node")
	for _, admin := range e.admins[:2] {
		require.NoError(t, admin.Del(ctx, lease.Key()).Err())
	}
	info, err := l.Inspect(ctx, name)
	require.NoError(t, err)
	assert.True(t, info.Held, "nodes 2, 3 and 4 hold it")
	assert.Equal(t, lease.Fence(), info.Fence)
	assert.Equal(t, lease.Fence(), info.LastFence)
	ttl, err := lease.TTL(ctx)
	require.NoError(t, err)
	// What the slowest holders kept of the TTL when they were read: the
	// TTL at most, less than the time since before the Acquire at least
	// (and 1ms, PTTL's whole milliseconds).
	assert.LessOrEqual(t, ttl, 10*time.Second)
	assert.GreaterOrEqual(t, ttl, 10*time.Second-time.Since(before)-time.Millisecond)

	// Held on nodes 3 and 4 only: not held, once they answered.
	require.NoError(t, e.admins[2].Del(ctx, lease.Key()).Err())
	info, err = l.Inspect(ctx, name)
	require.NoError(t, err)
	assert.False(t, info.Held, "two nodes of five are not a quorum")
	_ = lease.Release(ctx)
}

// slowLocker returns a Redlock Locker over e's servers, those of slow behind
// a proxy adding latency.
func (e *redlockEnv) slowLocker(t *testing.T, latency time.Duration, slow ...int) *Locker {
	t.Helper()
	clients := slices.Clone(e.clients)
	for _, i := range slow {
		proxy := redistest.StartProxy(t, e.srvs[i].Addr)
		c := redis.NewClient(&redis.Options{Addr: proxy.Addr})
		t.Cleanup(func() { _ = c.Close() })
		require.NoError(t, c.Ping(ctx).Err()) // connected before the latency
		proxy.SetLatency(latency)
		clients[i] = c
	}
	l, err := NewRedlock(clients, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// The lease held on a bare quorum {2, 3, 4}, node 4 hung: the four answers
// cannot say whether a quorum holds the lock. Inspect is unavailable (by
// ReleaseTimeout), not "not held".
func TestRedlockInspectUndecidedIsUnavailable(t *testing.T) {
	e := newRedlockEnv(t, 5, nil)
	l := e.locker(t, &Options{ReleaseTimeout: 200 * time.Millisecond})
	name := uniqueName(t)
	lease, err := l.Acquire(ctx, name, WithTTL(10*time.Second))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return e.holders(t, lease.Key(), lease.Token()) == 5 },
		time.Second, time.Millisecond, "held on every node")
	for _, admin := range e.admins[:2] {
		require.NoError(t, admin.Del(ctx, lease.Key()).Err())
	}
	e.srvs[4].Pause()
	t.Cleanup(e.srvs[4].Resume)
	start := time.Now()
	_, err = l.Inspect(ctx, name)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "4 of 5 nodes answered, too few to know whether a quorum holds the lock")
	assert.Less(t, time.Since(start), time.Second, "bounded by ReleaseTimeout")
	_, err = lease.TTL(ctx)
	require.ErrorIs(t, err, ErrUnavailable)
	e.srvs[4].Resume()
	_ = lease.Release(ctx)
}

// A grant for a lease that reaches a node after the lease's Extend (a resent
// or late first-round request) finds the lock the lease's there: it must not
// shorten the extended expiry back to the attempt's TTL.
func TestRedlockLateGrantNeverShortensTheLock(t *testing.T) {
	e := newRedlockEnv(t, 3, nil)
	l := e.locker(t, nil)
	lease, err := l.Acquire(ctx, uniqueName(t), WithTTL(2*time.Second))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return e.holders(t, lease.Key(), lease.Token()) == 3 },
		time.Second, time.Millisecond, "held on every node")
	require.NoError(t, lease.Extend(ctx, time.Minute))
	require.Eventually(t, func() bool {
		pttl, err := e.admins[2].PTTL(ctx, lease.Key()).Result()
		return err == nil && pttl > 50*time.Second
	}, time.Second, time.Millisecond, "extended on node 2")

	g := lease.h.Acquire(ctx) // a late copy of its attempt, granted again on every node, node 2 among them
	require.NoError(t, g.Err)
	require.True(t, g.OK, "the lease's own lock")
	assert.Equal(t, lease.Fence(), g.Fence)
	pttl, err := e.admins[2].PTTL(ctx, lease.Key()).Result()
	require.NoError(t, err)
	assert.Greater(t, pttl, 50*time.Second, "the late grant kept the extended expiry")
	require.NoError(t, lease.Release(ctx))
}
