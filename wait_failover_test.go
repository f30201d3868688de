package fencelock

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
)

// A Cluster master crashes and its replica takes over: the waiters on a
// lock of its slots are subscribed again on the new master, a release there
// wakes them, and the dead master's hub ends. Before, that hub redialed the
// dead master forever and its channels were never routed again: the waiter,
// its backoff a minute here, got the lock only at its backoff (34s after the
// release in the run measured).
func TestClusterCrashFailoverResubscribesWaiters(t *testing.T) {
	c := redistest.StartClusterN(t, 3, 1)
	const backstop = time.Minute // the waiter's backoff: what wakes it without pub/sub
	client := c.Client(nil)
	l, err := New(client, &Options{MinRetryBackoff: backstop, MaxRetryBackoff: backstop})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	name := uniqueName(t)
	key, _ := l.keys(name)
	channel := l.b.(*deployment).channel(key)
	v, err := c.Masters[0].Do("CLUSTER", "KEYSLOT", key)
	require.NoError(t, err)
	slot := int(v.(int64))
	from := c.MasterOf(slot)
	var to *redistest.Server // from's replica
	for i, m := range c.Masters {
		if m == from {
			to = c.Replicas[i][0]
		}
	}

	held, err := l.Acquire(ctx, name, WithTTL(2*time.Minute))
	require.NoError(t, err)
	replica := to.Client(nil)
	require.Eventually(t, func() bool { // the lock is on the replica, which will serve it
		pipe := replica.Pipeline() // one connection: READONLY lets the replica serve it
		pipe.Do(ctx, "READONLY")
		n := pipe.Exists(ctx, key)
		_, err := pipe.Exec(ctx)
		return err == nil && n.Val() == 1
	}, 5*time.Second, time.Millisecond)
	got := acquireInBackground(t, l, name, WithWait(2*backstop))
	require.Eventually(t, func() bool { return shardSubscribers(t, from, channel) == 1 }, 5*time.Second, time.Millisecond,
		"the waiter subscribes on the master")

	from.Kill()
	_, err = to.Do("CLUSTER", "FAILOVER", "TAKEOVER")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return c.MasterOf(slot) == to }, 10*time.Second, 10*time.Millisecond,
		"the replica serves the slot")
	require.Eventually(t, func() bool { // so that the release goes there
		client.ReloadState(ctx)
		node, err := client.MasterForKey(ctx, key)
		return err == nil && node.Options().Addr == to.Addr
	}, 10*time.Second, 10*time.Millisecond, "the client learns the new master")

	assert.Eventually(t, func() bool { return shardSubscribers(t, to, channel) == 1 }, 20*time.Second, 10*time.Millisecond,
		"the waiter subscribes on the new master")
	assert.Eventually(t, func() bool {
		n := waitsOf(l)
		n.mu.Lock()
		defer n.mu.Unlock()
		_, ok := n.hubs[from.Addr]
		return !ok
	}, 10*time.Second, 10*time.Millisecond, "the dead master's hub ends, its channel gone")
	released := time.Now()
	require.NoError(t, held.Release(ctx))
	r := requireAcquired(t, got, backstop/4, "the release on the new master did not wake the waiter")
	t.Logf("acquired %v after the release", r.at.Sub(released))
	require.NoError(t, r.lease.Release(ctx))
}
