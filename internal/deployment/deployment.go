// Package deployment is one Redis deployment (a server, a Sentinel-managed
// master, a Cluster, a Ring): the store of a Locker made by New, and each
// node of a Redlock. It runs the lock's scripts (lease.go) through its
// driver.Client, and wakes waiters on releases (releases.go) through internal/notify.
package deployment

import (
	"context"
	"log/slog"
	"time"

	"github.com/fencelock/fencelock/internal/driver"
	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
	"github.com/fencelock/fencelock/internal/tasks"
)

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
	c                                          driver.Client
	cfg                                        Config
	waits                                      *notify.Notifier
	retention, markerMillis, defaultTTL, owner any // the arguments every lease sends, boxed once
}

var _ store.Store = (*Deployment)(nil)

// New returns the deployment of c, making no Redis call.
func New(c driver.Client, cfg Config) *Deployment {
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
