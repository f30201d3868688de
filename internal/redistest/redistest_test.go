package redistest_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var ctx = context.Background()

func TestStartReplica(t *testing.T) {
	t.Parallel()
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master)
	assert.Equal(t, "slave", replica.Info("replication")["role"])

	_, err := master.Do("SET", "k", "v")
	require.NoError(t, err)
	acked, err := master.Do("WAIT", 1, 5000)
	require.NoError(t, err)
	assert.EqualValues(t, 1, acked, "WAIT counts the replica")
	got, err := replica.Do("GET", "k")
	require.NoError(t, err)
	assert.Equal(t, "v", got)
}

func TestStartClusterN(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := redistest.StartClusterN(t, 3, 1)
	t.Logf("3 masters, 3 replicas settled in %v", time.Since(start).Round(time.Millisecond))

	require.Len(t, c.Masters, 3)
	require.Len(t, c.Replicas, 3)
	assert.Len(t, c.Addrs(), 6)
	assert.Same(t, c.Masters[0], c.MasterOf(0))
	assert.Same(t, c.Masters[1], c.MasterOf(5461))
	assert.Same(t, c.Masters[2], c.MasterOf(16383))
	ids := map[string]bool{}
	for i, rs := range c.Replicas {
		require.Len(t, rs, 1)
		info := rs[0].Info("replication")
		assert.Equal(t, "slave", info["role"])
		assert.Equal(t, "up", info["master_link_status"])
		assert.Equal(t, c.Masters[i].Addr, "127.0.0.1:"+info["master_port"])
		ids[c.NodeID(c.Masters[i])], ids[c.NodeID(rs[0])] = true, true
	}
	assert.Len(t, ids, 6, "node IDs are distinct")

	client := c.Client(nil)
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		require.NoError(t, client.Set(ctx, k, k, 0).Err())
		got, err := client.Get(ctx, k).Result()
		require.NoError(t, err)
		assert.Equal(t, k, got)
	}
}

// The one-node cluster serves every slot from one address.
func TestStartCluster(t *testing.T) {
	t.Parallel()
	s := redistest.StartCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{s.Addr}})
	t.Cleanup(func() { _ = client.Close() })
	_, err := client.Eval(ctx, "return 1", []string{"{a}1", "{a}2"}).Result()
	require.NoError(t, err)
	_, err = client.Eval(ctx, "return 1", []string{"a", "b"}).Result()
	assert.ErrorContains(t, err, "CROSSSLOT")
}

// MigrateSlot moves a slot with its keys, and Redis 7 unsubscribes the
// clients subscribed with SSUBSCRIBE to the slot's shard channels on the
// source and on its replica.
func TestMigrateSlot(t *testing.T) {
	t.Parallel()
	c := redistest.StartClusterN(t, 2, 1)
	client := c.Client(nil)
	const key, channel = "{fencelock}k", "{fencelock}ch"
	slot := int(client.ClusterKeySlot(ctx, key).Val())
	from := c.MasterOf(slot)
	to, fromReplica := c.Masters[0], c.Replicas[1][0]
	if to == from {
		to, fromReplica = c.Masters[1], c.Replicas[0][0]
	}
	require.NoError(t, client.Set(ctx, key, "v", 0).Err())

	var subs []*redis.PubSub // on the source and on its replica
	for _, s := range []*redistest.Server{from, fromReplica} {
		sub := s.Client(nil).SSubscribe(ctx, channel)
		t.Cleanup(func() { _ = sub.Close() })
		msg, err := sub.ReceiveTimeout(ctx, 5*time.Second)
		require.NoError(t, err, s.Addr)
		require.Equal(t, &redis.Subscription{Kind: "ssubscribe", Channel: channel, Count: 1}, msg)
		subs = append(subs, sub)
	}

	start := time.Now()
	c.MigrateSlot(slot, to)
	t.Logf("slot %d moved and settled in %v", slot, time.Since(start).Round(time.Millisecond))
	assert.Same(t, to, c.MasterOf(slot))

	for _, sub := range subs {
		msg, err := sub.ReceiveTimeout(ctx, 5*time.Second)
		require.NoError(t, err)
		assert.Equal(t, &redis.Subscription{Kind: "sunsubscribe", Channel: channel, Count: 0}, msg)
	}

	got, err := to.Do("GET", key)
	require.NoError(t, err)
	assert.Equal(t, "v", got, "the key moved with its slot")
	_, err = from.Do("GET", key)
	assert.ErrorContains(t, err, "MOVED")
	got, err = client.Get(ctx, key).Result()
	require.NoError(t, err)
	assert.Equal(t, "v", got, "the cluster client follows MOVED")
}

// proxied starts a server and a proxy to it, and returns them with a
// client of the proxy that has sent a PING, has a 200ms read timeout and
// retries as opts says.
func proxied(t *testing.T, opts redis.Options) (*redistest.Server, *redistest.Proxy, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	p := redistest.StartProxy(t, srv.Addr)
	return srv, p, dial(t, p, opts)
}

func dial(t *testing.T, p *redistest.Proxy, opts redis.Options) *redis.Client {
	t.Helper()
	opts.Addr, opts.ReadTimeout = p.Addr, 200*time.Millisecond
	c := redis.NewClient(&opts)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.Ping(ctx).Err())
	return c
}

func TestProxyBlackHole(t *testing.T) {
	t.Parallel()
	srv, p, c := proxied(t, redis.Options{MaxRetries: -1})
	p.SetMode(redistest.BlackHole)
	err := c.Incr(ctx, "k").Err()
	require.ErrorContains(t, err, "timeout")
	got, err := srv.Do("GET", "k")
	require.NoError(t, err)
	require.Nil(t, got, "the request is held in the hole")

	// Healing delivers the held request, though its client has given up.
	p.SetMode(redistest.Pass)
	require.Eventually(t, func() bool {
		got, err := srv.Do("GET", "k")
		return err == nil && got == "1"
	}, 5*time.Second, time.Millisecond)
	require.NoError(t, c.Ping(ctx).Err())
}

func TestProxyReset(t *testing.T) {
	t.Parallel()
	_, p, c := proxied(t, redis.Options{MaxRetries: -1})
	p.SetMode(redistest.Reset)
	assert.Error(t, c.Ping(ctx).Err(), "open connection")
	assert.Error(t, c.Ping(ctx).Err(), "new connection")
	p.SetMode(redistest.Pass)
	assert.NoError(t, c.Ping(ctx).Err())
}

// A dropped reply leaves the command applied: without retries the client
// sees io.EOF, with go-redis's default retries the command runs twice.
func TestProxyDropNextReply(t *testing.T) {
	t.Parallel()
	srv, p, once := proxied(t, redis.Options{MaxRetries: -1})
	retrying := dial(t, p, redis.Options{})

	p.DropNextReply()
	err := once.Incr(ctx, "once").Err()
	require.ErrorIs(t, err, io.EOF)
	got, err := srv.Do("GET", "once")
	require.NoError(t, err)
	assert.Equal(t, "1", got, "applied though the reply was lost")

	p.DropNextReply()
	n, err := retrying.Incr(ctx, "twice").Result()
	require.NoError(t, err)
	assert.EqualValues(t, 2, n, "the retry ran INCR again")

	require.NoError(t, once.Ping(ctx).Err(), "one reply dropped per call")
}

func TestProxyHangDials(t *testing.T) {
	t.Parallel()
	_, p, old := proxied(t, redis.Options{MaxRetries: -1})
	p.HangDials(true)
	fresh := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, ReadTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = fresh.Close() })
	start := time.Now()
	err := fresh.Ping(ctx).Err()
	require.ErrorContains(t, err, "timeout")
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	assert.NoError(t, old.Ping(ctx).Err(), "a relayed connection keeps working")

	p.HangDials(false)
	assert.NoError(t, fresh.Ping(ctx).Err())
}

func TestProxyLatency(t *testing.T) {
	t.Parallel()
	_, p, c := proxied(t, redis.Options{MaxRetries: -1})
	p.SetLatency(40 * time.Millisecond)
	start := time.Now()
	require.NoError(t, c.Ping(ctx).Err())
	assert.GreaterOrEqual(t, time.Since(start), 80*time.Millisecond, "40ms each way")
	p.SetLatency(0)
}
