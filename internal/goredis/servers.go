package goredis

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/internal/driver"
)

// Pipe sends cmds through the client: see driver.Node.
func (c *Client) Pipe(ctx context.Context, tx bool, cmds ...[]any) []error {
	return pipe(ctx, c.client, tx, cmds)
}

// Addr returns the address of a client of one server, else "".
func (c *Client) Addr() string {
	if rc, ok := c.base.(*redis.Client); ok {
		return rc.Options().Addr
	}
	return ""
}

// Servers returns the client's server, a Cluster's masters or a Ring's shards.
func (c *Client) Servers(ctx context.Context) ([]driver.Server, error) {
	var mu sync.Mutex // the callbacks run concurrently
	var out []driver.Server
	collect := func(_ context.Context, s *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		out = append(out, driver.Server{Addr: s.Options().Addr, Node: server{s}})
		return nil
	}
	var err error
	switch cl := c.base.(type) {
	case *redis.Client:
		return []driver.Server{{Addr: cl.Options().Addr, Node: server{cl}}}, nil
	case *redis.ClusterClient:
		if err = cl.ForEachMaster(ctx, collect); err == nil {
			err = slots(ctx, cl, out)
		}
	case *redis.Ring:
		err = cl.ForEachShard(ctx, collect)
	default:
		return nil, fmt.Errorf("cannot inspect a %T", c.base)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out, translate(err)
}

// slots fills in the slot ranges of a Cluster's masters.
func slots(ctx context.Context, cl *redis.ClusterClient, masters []driver.Server) error {
	//lint:ignore SA1019 CLUSTER SHARDS needs Redis 7.0; fencelock supports 6.2, and go-redis's ClusterClient sends CLUSTER SLOTS itself
	ranges, err := cl.ClusterSlots(ctx).Result()
	for _, r := range ranges {
		for i := range masters {
			if len(r.Nodes) > 0 && r.Nodes[0].Addr == masters[i].Addr {
				masters[i].Slots = append(masters[i].Slots, [2]int{int(r.Start), int(r.End)})
			}
		}
	}
	return err
}

// A server is one server's client, as a driver.Node.
type server struct{ c *redis.Client }

func (s server) Call(ctx context.Context, args []any) (any, error) {
	cmd := redis.NewCmd(ctx, args...)
	_ = s.c.Process(ctx, cmd)
	reply, err := cmd.Result()
	return reply, translate(err)
}

func (s server) Pipe(ctx context.Context, tx bool, cmds ...[]any) []error {
	return pipe(ctx, s.c, tx, cmds)
}

func pipe(ctx context.Context, c redis.UniversalClient, tx bool, cmds [][]any) []error {
	do := make([]*redis.Cmd, len(cmds))
	run := func(p redis.Pipeliner) error {
		for i, args := range cmds {
			do[i] = p.Do(ctx, args...)
		}
		return nil
	}
	var err error
	if tx {
		_, err = c.TxPipelined(ctx, run)
	} else {
		_, err = c.Pipelined(ctx, run)
	}
	errs := make([]error, len(cmds), len(cmds)+1)
	for i, cmd := range do {
		errs[i] = translate(cmd.Err())
	}
	if tx {
		errs = append(errs, translate(err))
	}
	return errs
}
