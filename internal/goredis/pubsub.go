package goredis

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/internal/notify"
)

// A Network is the notify.Network of a go-redis client: a *redis.Client (a
// server, a Sentinel-managed master), a *redis.ClusterClient or a
// *redis.Ring, never an AutoPipeliner (give it the client behind one).
type Network struct {
	client redis.UniversalClient
	topo   notify.Topology

	mu    sync.Mutex
	nodes map[string]*redis.Client // guarded by mu; by address, as Route last found them
}

var _ notify.Network = (*Network)(nil)

// NewNetwork returns the notify.Network of client.
func NewNetwork(client redis.UniversalClient) *Network {
	p := &Network{client: client, nodes: make(map[string]*redis.Client)}
	switch client.(type) {
	case *redis.ClusterClient:
		p.topo = notify.Cluster
	case *redis.Ring:
		p.topo = notify.Ring
	}
	return p
}

// Topology reports Cluster for a ClusterClient, Ring for a Ring, Single
// for the others.
func (p *Network) Topology() notify.Topology { return p.topo }

// Route returns the address of the node that serves channel: the master of
// its slot on a Cluster, its shard on a Ring; "" for the others.
func (p *Network) Route(ctx context.Context, channel string) (string, error) {
	var node *redis.Client
	var err error
	switch c := p.client.(type) {
	case *redis.ClusterClient:
		node, err = c.MasterForKey(ctx, channel)
	case *redis.Ring:
		node, err = c.GetShardClientForKey(channel)
	default:
		return "", nil
	}
	if err != nil {
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

// Open returns a connection to node, through the client Route found for
// it ("": the client itself).
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

// subscriber opens subscription connections.
type subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// pubsubConn is a notify.Conn over a *redis.PubSub, opened by the first
// Subscribe. Receive may run beside the other calls: ps is set before
// notify starts reading.
type pubsubConn struct {
	client  subscriber // nil: no client for the node
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

// Receive returns the next message, confirmation or error; it skips PING's
// replies. A Redis error reply is Refused; any other error is Broken, as
// go-redis's reconnection would subscribe every channel in one command.
func (c *pubsubConn) Receive(ctx context.Context) notify.Event {
	for {
		msg, err := c.ps.Receive(ctx)
		if err != nil {
			var rerr redis.Error
			if errors.As(err, &rerr) {
				return notify.Event{Kind: notify.Refused, Err: err, Unknown: IsUnknownCommand(err)}
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

// IsUnknownCommand reports whether err is Redis refusing a command or a
// subcommand it does not know (sharded pub/sub before Redis 7).
func IsUnknownCommand(err error) bool {
	msg := strings.ToLower(err.Error())
	// PUBSUB SHARDNUMSUB before Redis 7: "ERR Unknown subcommand ..."
	return strings.Contains(msg, "unknown command") || strings.Contains(msg, "unknown subcommand")
}
