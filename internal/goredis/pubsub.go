package goredis

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/store"
)

// A Network is the notify.Network of a go-redis client, a Client, a
// ClusterClient or a Ring: never an AutoPipeliner (give it the one behind).
type Network struct {
	client redis.UniversalClient
	mu     sync.Mutex
	nodes  map[string]*redis.Client // guarded by mu; by address, as Route last found them
}

var _ notify.Network = (*Network)(nil)

// NewNetwork returns the notify.Network of client.
func NewNetwork(client redis.UniversalClient) *Network {
	return &Network{client: client, nodes: make(map[string]*redis.Client)}
}

// Topology reports Cluster for a ClusterClient, Ring for a Ring, else Single.
func (p *Network) Topology() notify.Topology {
	switch p.client.(type) {
	case *redis.ClusterClient:
		return notify.Cluster
	case *redis.Ring:
		return notify.Ring
	}
	return notify.Single
}

// Route returns the address of the node that serves channel (see shard), or
// "" on a single node.
func (p *Network) Route(ctx context.Context, channel string) (string, error) {
	node, err := shard(ctx, p.client, channel)
	if node == nil || err != nil {
		return "", err
	}
	addr := node.Options().Addr
	p.mu.Lock()
	p.nodes[addr] = node
	p.mu.Unlock()
	return addr, nil
}

// Reload has a ClusterClient reload its slot map in the background.
func (p *Network) Reload(ctx context.Context) {
	if c, ok := p.client.(*redis.ClusterClient); ok {
		c.ReloadState(ctx)
	}
}

// Open returns a connection to node through the client Route found for it
// ("": the client itself).
func (p *Network) Open(node string, sharded bool) notify.Conn {
	c := &pubsubConn{sharded: sharded}
	if node == "" {
		c.client = p.client
	} else {
		p.mu.Lock()
		if n := p.nodes[node]; n != nil {
			c.client = n
		}
		p.mu.Unlock()
	}
	return c
}

// pubsubConn is a notify.Conn over a *redis.PubSub, opened by the first
// Subscribe, which notify calls before it starts Receive.
type pubsubConn struct {
	client  redis.UniversalClient // nil: no client for the node
	sharded bool
	ps      *redis.PubSub
}

func (c *pubsubConn) Subscribe(ctx context.Context, channel string) error {
	switch {
	case c.client == nil:
		return errors.New("no client for the node")
	case c.ps == nil && c.sharded:
		c.ps = c.client.SSubscribe(ctx, channel)
		return c.ps.Ping(ctx) // go-redis swallows the error of the connection's dial: PING finds it
	case c.ps == nil:
		c.ps = c.client.Subscribe(ctx, channel)
		return c.ps.Ping(ctx)
	case c.sharded:
		return c.ps.SSubscribe(ctx, channel)
	}
	return c.ps.Subscribe(ctx, channel)
}

func (c *pubsubConn) Unsubscribe(ctx context.Context, channel string) error {
	if c.sharded {
		return c.ps.SUnsubscribe(ctx, channel)
	}
	return c.ps.Unsubscribe(ctx, channel)
}

// Receive returns the next message, confirmation or error, skipping PING's
// replies. Any error but a Redis reply is Broken: go-redis's reconnection
// would subscribe every channel in one command.
func (c *pubsubConn) Receive(ctx context.Context) notify.Event {
	for {
		msg, err := c.ps.Receive(ctx)
		if err != nil {
			var rerr redis.Error
			if errors.As(err, &rerr) {
				return notify.Event{Kind: notify.Refused, Err: err, Unknown: store.IsUnknownCommand(err)}
			}
			return notify.Event{Kind: notify.Broken, Err: err}
		}
		switch m := msg.(type) {
		case *redis.Message:
			return notify.Event{Kind: notify.Published, Channel: m.Channel, Payload: m.Payload}
		case *redis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				return notify.Event{Kind: notify.Subscribed, Channel: m.Channel}
			case "unsubscribe", "sunsubscribe":
				return notify.Event{Kind: notify.Unsubscribed, Channel: m.Channel}
			}
		}
	}
}

func (c *pubsubConn) Close() error {
	if c.ps == nil {
		return nil
	}
	return c.ps.Close()
}
