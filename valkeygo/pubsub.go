// This module is a port of the rueidis adapter (../rueidis), of which
// valkey-go is a fork with the same API under other names (package valkey,
// ValkeyError, ValkeyMessage, ...). The duplication is deliberate: each
// module builds on its own client alone. A fix to one belongs in the other.

package fencevalkey

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/store"
)

// A network is the notify.Network of a client: a Cluster's channels go to
// their slot's master (the slot map's), every other deployment's to its one
// server (a Sentinel's: the master the client now uses).
type network struct{ c *client }

var _ notify.Network = (*network)(nil)

func (n *network) Topology() notify.Topology {
	if n.c.cluster {
		return notify.Cluster
	}
	return notify.Single
}

// Route returns the address of the master that serves channel's slot, or ""
// on a single node.
func (n *network) Route(ctx context.Context, channel string) (string, error) {
	if !n.c.cluster {
		return "", nil
	}
	return n.c.slots.master(ctx, keys.Slot(channel))
}

// Reload reads the Cluster's slot map again in the background.
func (n *network) Reload(context.Context) {
	if n.c.cluster {
		n.c.slots.reload()
	}
}

// Open returns a subscription connection to node ("": the client's server),
// a dedicated connection of that node's client that the first Subscribe takes.
func (n *network) Open(node string, sharded bool) notify.Conn {
	c := &pubsubConn{sharded: sharded, signal: make(chan struct{}, 1), closed: make(chan struct{})}
	if node == "" {
		c.client = n.c.c
	} else {
		c.client = n.c.c.Nodes()[node] // nil: Subscribe fails, and the hub routes again
	}
	return c
}

// subscribeTimeout bounds a Subscribe with no deadline of its own: valkey-go
// returns from SUBSCRIBE once the server confirmed it, which a server that
// does not answer never does.
const subscribeTimeout = 5 * time.Second

// errConnClosed is the Broken event's error after Close.
var errConnClosed = errors.New("the subscription connection is closed")

// pubsubConn is a notify.Conn over a dedicated connection of a valkey-go
// client, whose pub/sub hooks queue the events that Receive returns. valkey-go
// calls the hooks on its reading goroutine, before SUBSCRIBE returns: they
// never block.
type pubsubConn struct {
	client  valkey.Client // nil: no client for the node
	sharded bool

	d       valkey.DedicatedClient // from the first Subscribe; only the hub's goroutine touches it
	release func()
	watched chan struct{} // closed when watch returns

	mu      sync.Mutex
	queue   []notify.Event // guarded by mu
	broken  bool           // guarded by mu: a Broken event was queued, none comes after it
	signal  chan struct{}  // buffered: an event was queued
	closed  chan struct{}
	closeMu sync.Once
}

func (c *pubsubConn) Subscribe(ctx context.Context, channel string) error {
	if c.client == nil {
		return errors.New("no valkey-go client for the node")
	}
	if c.d == nil {
		c.d, c.release = c.client.Dedicate()
		errs := c.d.SetPubSubHooks(valkey.PubSubHooks{OnMessage: c.message, OnSubscription: c.subscription})
		c.watched = make(chan struct{})
		go c.watch(errs)
	}
	cmd := c.d.B().Subscribe().Channel(channel).Build()
	if c.sharded {
		cmd = c.d.B().Ssubscribe().Channel(channel).Build()
	}
	return c.send(ctx, cmd)
}

func (c *pubsubConn) Unsubscribe(ctx context.Context, channel string) error {
	if c.d == nil {
		return nil
	}
	cmd := c.d.B().Unsubscribe().Channel(channel).Build()
	if c.sharded {
		cmd = c.d.B().Sunsubscribe().Channel(channel).Build()
	}
	return c.send(ctx, cmd)
}

// send sends a (un)subscription: an error reply is a Refused event (MOVED,
// NOPERM, an unknown command before Redis 7), the connection living on.
func (c *pubsubConn) send(ctx context.Context, cmd valkey.Completed) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, subscribeTimeout)
		defer cancel()
	}
	err := c.d.Do(ctx, cmd).Error()
	if re, ok := valkey.IsValkeyErr(err); ok {
		rerr := newRedisError(re)
		c.push(notify.Event{Kind: notify.Refused, Err: rerr, Unknown: store.IsUnknownCommand(rerr)})
		return nil
	}
	return translate(err)
}

func (c *pubsubConn) message(m valkey.PubSubMessage) {
	c.push(notify.Event{Kind: notify.Published, Channel: m.Channel, Payload: m.Message})
}

func (c *pubsubConn) subscription(s valkey.PubSubSubscription) {
	switch s.Kind {
	case "subscribe", "ssubscribe":
		c.push(notify.Event{Kind: notify.Subscribed, Channel: s.Channel})
	case "unsubscribe", "sunsubscribe":
		c.push(notify.Event{Kind: notify.Unsubscribed, Channel: s.Channel})
	}
}

// watch queues Broken when the connection ends: valkey-go sends its error
// (if any) on errs, then closes it.
func (c *pubsubConn) watch(errs <-chan error) {
	defer close(c.watched)
	var last error
	for err := range errs {
		last = err
	}
	if last == nil || errors.Is(last, valkey.ErrClosing) {
		last = errConnClosed
	}
	c.push(notify.Event{Kind: notify.Broken, Err: translate(last)})
}

func (c *pubsubConn) push(e notify.Event) {
	c.mu.Lock()
	if !c.broken {
		c.queue = append(c.queue, e)
		c.broken = e.Kind == notify.Broken
	}
	c.mu.Unlock()
	select {
	case c.signal <- struct{}{}:
	default:
	}
}

// Receive returns the next event: Broken once the connection ended or was closed.
func (c *pubsubConn) Receive(ctx context.Context) notify.Event {
	for {
		c.mu.Lock()
		if len(c.queue) > 0 {
			e := c.queue[0]
			c.queue[0] = notify.Event{}
			c.queue = c.queue[1:]
			c.mu.Unlock()
			return e
		}
		c.mu.Unlock()
		select {
		case <-c.signal:
		case <-c.closed:
			return notify.Event{Kind: notify.Broken, Err: errConnClosed}
		case <-ctx.Done():
			return notify.Event{Kind: notify.Broken, Err: ctx.Err()}
		}
	}
}

// Close closes the dedicated connection (never given back to the pool with
// its subscriptions) and ends a Receive under way.
func (c *pubsubConn) Close() error {
	c.closeMu.Do(func() {
		close(c.closed)
		if c.d != nil {
			c.d.Close()
			c.release()
			<-c.watched
		}
	})
	return nil
}
