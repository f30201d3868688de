package goredis

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
)

// Run runs s on keys as Eval does (EVAL alone when eval is set). With
// Options.Replicas it pipelines WAIT (or WAITAOF) after the script on the
// connection that wrote, and returns the script's reply with WAIT's error or
// a *store.ReplicaError when too few acknowledged: the reply's decoder decides.
func (c *Client) Run(ctx context.Context, s *script.Script, eval bool, keys, argv []any) (any, error) {
	if c.o.Replicas == 0 {
		return script.Run(ctx, c, s, eval, keys, argv)
	}
	cmd, wait, err := c.pipeline(ctx, s, eval, keys, argv)
	if err == nil {
		err = cmd.Err()
	}
	if err != nil {
		return nil, translate(err)
	}
	if err := wait.Err(); err != nil {
		return cmd.Val(), translate(err)
	}
	return cmd.Val(), c.o.Acknowledged(wait.Val())
}

// pipeline sends s and WAIT in one pipeline to the node that serves the first
// key, again with EVAL after NOSCRIPT, and on the node a MOVED or ASK names.
func (c *Client) pipeline(ctx context.Context, s *script.Script, eval bool, keys, argv []any) (cmd, wait *redis.Cmd, err error) {
	key, _ := keys[0].(string)
	node, err := c.node(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	asking := false
	exec := func(eval bool) {
		pipe := node.Pipeline()
		if asking {
			pipe.Do(ctx, "ASKING") // the next command on this connection only
		}
		cmd = pipe.Do(ctx, script.Args(s, eval, keys, argv)...)
		wait = pipe.Do(ctx, c.o.Wait()...)
		_, _ = pipe.Exec(ctx)
	}
	for redirects := 0; ; redirects++ {
		exec(eval)
		if script.IsNoScript(cmd.Err()) {
			exec(true)
		}
		addr, moved := redis.IsMovedError(cmd.Err())
		if a, ask := redis.IsAskError(cmd.Err()); ask {
			addr = a
		} else if !moved {
			return cmd, wait, nil
		}
		cluster, isCluster := c.base.(*redis.ClusterClient)
		if !isCluster {
			return cmd, wait, nil // not a Cluster's client: a refusal, as without Replicas
		}
		if node, err = redirected(ctx, cluster, addr, redirects); err != nil {
			return nil, nil, err
		}
		asking = !moved
	}
}

// node returns the client of the node that serves key, or the base client:
// never an AutoPipeliner, whose batches' writes WAIT would not count.
func (c *Client) node(ctx context.Context, key string) (redis.Cmdable, error) {
	if n, err := shard(ctx, c.base, key); n != nil || err != nil {
		return n, err
	}
	return c.base, nil
}

// shard returns the client of the node that serves key: its slot's master on
// a Cluster (as the client's slot map says), its shard on a Ring; nil else.
func shard(ctx context.Context, client redis.UniversalClient, key string) (*redis.Client, error) {
	switch c := client.(type) {
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, key)
	case *redis.Ring:
		return c.GetShardClientForKey(key)
	}
	return nil, nil
}

// redirected returns the master at addr, named by a MOVED or ASK reply of c,
// after reloading c's slot map. Past ClusterOptions.MaxRedirects, or when addr
// is no master of the map, the slot is moving: an error that is Unavailable,
// not the redirect (a Redis error, which would read as a refusal).
func redirected(ctx context.Context, c *redis.ClusterClient, addr string, redirects int) (redis.Cmdable, error) {
	if redirects >= c.Options().MaxRedirects {
		return nil, fmt.Errorf("the lock's slot is moving: redirected to %s after %d redirects", addr, redirects)
	}
	var master atomic.Pointer[redis.Client]
	err := c.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error { // reloads the slot map first
		if m.Options().Addr == addr {
			master.Store(m)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if m := master.Load(); m != nil {
		return m, nil
	}
	return nil, fmt.Errorf("the lock's slot is moving: redirected to %s, no master in the slot map", addr)
}

// Subscribers returns how many connections subscribe to channel on the node that serves it.
func (c *Client) Subscribers(ctx context.Context, channel string) (int, error) {
	node, err := c.node(ctx, channel)
	if err != nil {
		return 0, translate(err)
	}
	n, err := node.PubSubShardNumSub(ctx, channel).Result()
	if err != nil && store.IsUnknownCommand(err) {
		n, err = node.PubSubNumSub(ctx, channel).Result()
	}
	if err != nil {
		return 0, translate(err)
	}
	return int(n[channel]), nil
}
