// Package deployment is one Redis deployment (a server, a Sentinel-managed
// master, a Cluster, a Ring): the store of a Locker made by New, and each
// node of a Redlock. It runs the lock's scripts (lease.go) through its
// Client, and wakes waiters on releases (releases.go) through internal/notify.
package deployment

import (
	"context"
	"log/slog"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
	"github.com/fencelock/fencelock/internal/tasks"
)

// A Client is a deployment's Redis client: internal/goredis's for go-redis.
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

// Config is what a Deployment needs of the Locker's options.
type Config struct {
	KeyPrefix      string
	TTL            time.Duration // the Locker's default
	Owner          string        // the Locker's default
	ReleaseTimeout time.Duration // how long a released token's marker is kept
	FenceRetention time.Duration
	Logger         *slog.Logger
	Clock          notify.Clock
	Tasks          *tasks.Group // runs the give-backs in the background
	Name           string       // a quorum node's, in errors
}

// A Deployment is one Redis deployment.
type Deployment struct {
	c                                          Client
	cfg                                        Config
	waits                                      *notify.Notifier
	retention, markerMillis, defaultTTL, owner any // the arguments every lease sends, boxed once
}

var _ store.Store = (*Deployment)(nil)

// New returns the deployment of c, making no Redis call.
func New(c Client, cfg Config) *Deployment {
	return &Deployment{c: c, cfg: cfg, waits: notify.New(c.Network(), notify.Options{Logger: cfg.Logger, Clock: cfg.Clock}),
		retention: store.Millis(cfg.FenceRetention), markerMillis: store.Millis(cfg.ReleaseTimeout),
		defaultTTL: store.Millis(cfg.TTL), owner: cfg.Owner}
}

// Traits returns what the Locker needs to know of d.
func (d *Deployment) Traits() store.Traits { return store.Traits{Deadlines: d.c.Deadlines()} }

// Name returns the deployment's name in errors: Config.Name.
func (d *Deployment) Name() string { return d.cfg.Name }

func (d *Deployment) Mark() store.Mark                 { return d.c.Mark() }
func (d *Deployment) Since(m store.Mark) (error, bool) { return d.c.Since(m) }
func (d *Deployment) LastDialError() error             { return d.c.LastDialError() }
func (d *Deployment) Close(by time.Time)               { d.waits.Close(by) }
func (d *Deployment) Notifier() *notify.Notifier       { return d.waits }
func (d *Deployment) Channel(key string) string        { return keys.Channel(key, d.c.DB()) }
func (d *Deployment) Subscribers(ctx context.Context, key string) (int, error) {
	return d.c.Subscribers(ctx, d.Channel(key))
}

// Run and Eval run a script through the Client (see Client).
func (d *Deployment) Run(ctx context.Context, s *script.Script, eval bool, keys []any, argv ...any) (any, error) {
	return d.c.Run(ctx, s, eval, keys, argv)
}

func (d *Deployment) Eval(ctx context.Context, s *script.Script, keys []any, argv ...any) (any, error) {
	return d.c.Eval(ctx, s, keys, argv)
}

// ChannelArg returns the wake-up channel of the lock key key as a script's
// argument: on database 0, boxed.
func (d *Deployment) ChannelArg(key string, boxed any) any {
	if d.c.DB() == 0 {
		return boxed
	}
	return d.Channel(key)
}

// Listen registers a waiter on key's channel (notify.Notifier.Register).
func (d *Deployment) Listen(key string, wake chan struct{}, h notify.Hearer) *notify.Waiter {
	return d.waits.Register(d.Channel(key), wake, h)
}
