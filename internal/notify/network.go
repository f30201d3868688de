package notify

import "context"

// Topology is how a Network spreads channels over its nodes.
type Topology int

const (
	// Single is one node for every channel: a server, a Sentinel-managed master.
	Single Topology = iota
	// Ring is a channel's shard, found by its name.
	Ring
	// Cluster is a channel's slot's master, which may move: a node
	// unreachable for a while has its channels routed again.
	Cluster
)

// A Network is the Redis deployment a Notifier subscribes on, through a
// client library the Notifier does not know.
type Network interface {
	Topology() Topology // never changes
	// Route returns the address of the node that serves channel ("" on Single).
	Route(ctx context.Context, channel string) (node string, err error)
	// Reload has a Cluster read its slot map again in the background, without
	// blocking: the Notifier's mutex is held.
	Reload(ctx context.Context)
	// Open returns a connection to node (from Route, or ""), sharded
	// (SSUBSCRIBE) or classic (SUBSCRIBE), that the first Subscribe dials.
	Open(node string, sharded bool) Conn
}

// A Conn is one subscription connection. Its hub calls Subscribe,
// Unsubscribe and Close from one goroutine, and Receive from another.
type Conn interface {
	// Subscribe sends channel's subscription, confirmed by an event; the
	// first call dials, and returns the dial's error.
	Subscribe(ctx context.Context, channel string) error
	Unsubscribe(ctx context.Context, channel string) error
	// Receive waits for the next event; none comes after Broken or Close.
	Receive(ctx context.Context) Event
	Close() error // ends a Receive under way
}

// EventKind is what an Event tells.
type EventKind int

const (
	// Published is a message published on Channel: Payload.
	Published EventKind = iota
	// Subscribed confirms the subscription of Channel.
	Subscribed
	// Unsubscribed ends the subscription of Channel: a confirmation of
	// Unsubscribe, or the server's (a slot that moved).
	Unsubscribed
	// Refused is an error reply, Err: the connection lives on.
	Refused
	// Broken is the connection's end, Err: it must be closed.
	Broken
)

// An Event is one thing a Conn received.
type Event struct {
	Kind    EventKind
	Channel string
	Payload string
	Err     error
	Unknown bool // Refused as an unknown command (no sharded pub/sub before Redis 7)
}
