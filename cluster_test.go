package fencelock

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/fencelock/fencelock/internal/script"
)

// On Redis Cluster a script's keys must hash to one slot. The lock key and
// its fence counter share the hash tag {name}, so the same code works.
func TestCluster(t *testing.T) {
	srv := redistest.StartCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}})
	t.Cleanup(func() { _ = client.Close() })
	l, err := New(client, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })

	// Without the shared tag the acquire script is refused: the test can
	// tell.
	_, err = runScript(script.Acquire, ctx, client, []string{"lock:a", "lock:b:fence"}, "t", 1000).Result()
	require.ErrorContains(t, err, "CROSSSLOT")

	var last int64
	for _, name := range []string{"settlement:2026-11-30", "order:42", "a", "b"} {
		lease, err := l.Acquire(ctx, name)
		require.NoError(t, err, name)
		assert.Positive(t, lease.Fence())
		_, err = l.Acquire(ctx, name)
		require.ErrorIs(t, err, ErrNotObtained)
		require.NoError(t, lease.Extend(ctx, time.Minute), name)
		require.NoError(t, lease.Release(ctx), name)
		again, err := l.Acquire(ctx, name)
		require.NoError(t, err)
		assert.Greater(t, again.Fence(), lease.Fence())
		require.NoError(t, again.Release(ctx))
		last = again.Fence()
	}
	assert.Positive(t, last)

	// Waiting: the release script's SPUBLISH on the key's shard wakes a
	// waiter subscribed with SSUBSCRIBE through the cluster client.
	slow, err := New(client, slowPolling)
	require.NoError(t, err)
	t.Cleanup(func() { _ = slow.Close() })
	held, err := slow.Acquire(ctx, "order:7", WithTTL(time.Minute))
	require.NoError(t, err)
	got := waitInBackground(slow, "order:7")
	require.Eventually(t, func() bool {
		chans, err := client.PubSubShardChannels(ctx, "*").Result()
		return err == nil && len(chans) == 1
	}, 5*time.Second, time.Millisecond)
	require.NoError(t, held.Release(ctx))
	requireObtained(t, got, 5*time.Second, "no wake-up on Redis Cluster")
}

// A Ring shards keys and subscriptions by name across servers: waiting works
// for locks on every shard.
func TestRing(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr}})
	t.Cleanup(func() { _ = ring.Close() })
	l, err := New(ring, slowPolling)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })

	var held []*Lease
	var waits []<-chan error
	for _, name := range []string{"order:1", "order:2", "order:3", "order:4", "order:5", "order:6"} {
		lease, err := l.Acquire(ctx, name, WithTTL(time.Minute))
		require.NoError(t, err)
		held = append(held, lease)
		waits = append(waits, waitInBackground(l, name))
	}
	// One subscription connection per shard, not per name.
	require.Eventually(t, func() bool {
		for _, lease := range held {
			if !waitsOf(l).Subscribed(lease.Key()) {
				return false
			}
		}
		return true
	}, 5*time.Second, time.Millisecond)
	assert.Equal(t, 2, openHubs(l), "one subscription connection per shard")
	time.Sleep(20 * time.Millisecond)
	for i, lease := range held {
		require.NoError(t, lease.Release(ctx))
		requireObtained(t, waits[i], 5*time.Second, "no wake-up on a Ring shard for "+lease.Name())
	}
	ka, err := a.Client(nil).DBSize(ctx).Result()
	require.NoError(t, err)
	kb, err := b.Client(nil).DBSize(ctx).Result()
	require.NoError(t, err)
	assert.Positive(t, ka, "locks on shard a")
	assert.Positive(t, kb, "locks on shard b")
}

// With Options.Replicas the scripts and their WAIT are pipelined to the
// master of the lock's slot: a slot that moved (MOVED), or is moving (ASK),
// is followed there, as go-redis follows it for a single command.
func TestClusterReplicasFollowRedirects(t *testing.T) {
	t.Parallel()
	c := redistest.StartClusterN(t, 2, 1)
	l, err := New(c.Client(nil), &Options{Replicas: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	name := uniqueName(t)
	key, _ := l.keys(name)
	slot, err := c.Masters[0].Do("CLUSTER", "KEYSLOT", key)
	require.NoError(t, err)
	from := c.MasterOf(int(slot.(int64)))
	to, toReplica := c.Masters[1], c.Replicas[1][0]
	if from == to {
		to, toReplica = c.Masters[0], c.Replicas[0][0]
	}
	lease, err := l.Acquire(ctx, name) // the client's slot map names from
	require.NoError(t, err)
	require.NoError(t, lease.Release(ctx))

	// MOVED: the slot moved after the client read its map.
	c.MigrateSlot(int(slot.(int64)), to)
	lease, err = l.Acquire(ctx, name)
	require.NoError(t, err, "Acquire follows MOVED")
	pipe := toReplica.Client(nil).Pipeline() // one connection: READONLY lets the replica serve it
	pipe.Do(ctx, "READONLY")
	v := pipe.Get(ctx, key)
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(v.Val(), lease.Token()+" "), "on the new master's replica when Acquire returns")
	_, err = l.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrNotObtained)

	// MOVED again, on Extend: the slot moved back.
	c.MigrateSlot(int(slot.(int64)), from)
	require.NoError(t, lease.Extend(ctx, time.Minute), "Extend follows MOVED")

	// ASK: the slot is migrating to to, and the lock is there already.
	require.NoError(t, to.Client(nil).Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", c.NodeID(from)).Err())
	require.NoError(t, from.Client(nil).Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", c.NodeID(to)).Err())
	_, port, _ := strings.Cut(to.Addr, ":")
	require.NoError(t, from.Client(nil).Do(ctx, "MIGRATE", "127.0.0.1", port, key, 0, 5000).Err())
	require.NoError(t, lease.Extend(ctx, 2*time.Minute), "Extend follows ASK")
	pipe = to.Client(nil).Pipeline() // one connection: ASKING holds for the next command on it
	pipe.Do(ctx, "ASKING")
	pttl := pipe.PTTL(ctx, key)
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)
	assert.Greater(t, pttl.Val(), time.Minute, "extended on the importing master")
}
