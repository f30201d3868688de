// Package driver is what fencelock needs of a Redis client library: a
// Client for each deployment, internal/goredis's for go-redis, and the
// adapter modules' for rueidis and valkey-go. internal/deployment runs the
// lock's scripts through it, internal/notify subscribes through its
// Network, and Check looks at its Servers.
package driver

import (
	"context"
	"time"

	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
)

// A Client is a deployment's Redis client, made with the Locker's Options.
type Client interface {
	// Run runs s (script.Run; EVAL alone with eval), then, when it waits
	// for replicas, WAIT on the connection that wrote: a
	// *store.ReplicaError comes with the reply when too few acknowledged.
	Run(ctx context.Context, s *script.Script, eval bool, keys, argv []any) (any, error)
	Eval(ctx context.Context, s *script.Script, keys, argv []any) (any, error) // Run without WAIT
	Subscribers(ctx context.Context, channel string) (int, error)
	Network() notify.Network // its pub/sub
	DB() int                 // its connections' database: channels are shared by all of a server's
	Deadlines() bool         // every call stops at its context's deadline
	Mark() store.Mark
	Since(m store.Mark) (cause error, unsent bool)
	LastDialError() error // nil when none failed
	Node                  // the client itself: a command goes where its first key lives
	Addr() string         // the server's address; "" for a client of several
	// Servers returns each server that holds locks (a Cluster's or a Ring's
	// masters), sorted by address: what Check looks at.
	Servers(ctx context.Context) ([]Server, error)
}

// A Node sends commands to a server, or through a client that routes them.
// An error reply is an error with a RedisError method.
type Node interface {
	Call(ctx context.Context, args []any) (any, error) // one command
	// Pipe sends cmds on one connection in order, within MULTI and EXEC
	// with tx, and returns each one's error (EXEC's last).
	Pipe(ctx context.Context, tx bool, cmds ...[]any) []error
}

// A Server is one server of a deployment.
type Server struct {
	Addr  string
	Slots [][2]int // a Cluster master's slot ranges, first and last
	Node  Node     // its own connections: no redirect is followed
}

// Options are what a Client needs of the Locker's options.
type Options struct {
	Replicas       int // how many replicas acknowledge a script's writes (WAIT); 0: none
	ReplicaTimeout time.Duration
	ReplicaFsync   bool // WAITAOF
}

// Wait returns the command a Client sends after a script on the connection
// that wrote it: WAIT, or WAITAOF with ReplicaFsync.
func (o Options) Wait() []any {
	if o.ReplicaFsync {
		return []any{"WAITAOF", 1, o.Replicas, store.Millis(o.ReplicaTimeout)}
	}
	return []any{"WAIT", o.Replicas, store.Millis(o.ReplicaTimeout)}
}

// Acknowledged reads Wait's reply: a *store.ReplicaError when too few
// replicas acknowledged, or the master did not fsync.
func (o Options) Acknowledged(reply any) error {
	acked, local := int64(0), int64(1)
	switch v := reply.(type) {
	case int64: // WAIT
		acked = v
	case []any: // WAITAOF: [local, replicas]
		if len(v) == 2 {
			local, _ = v[0].(int64)
			acked, _ = v[1].(int64)
		}
	}
	if acked < int64(o.Replicas) || local < 1 {
		return &store.ReplicaError{Acked: acked, Want: o.Replicas, Local: local, Fsync: o.ReplicaFsync, Timeout: o.ReplicaTimeout}
	}
	return nil
}
