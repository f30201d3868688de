// Package deployment is one Redis deployment, a server, a Sentinel-managed
// master, a Cluster or a Ring, through one go-redis client: the store of a
// Locker made by New, and each node of a Redlock quorum. It runs the
// lock's scripts (lease.go), with WAIT or WAITAOF for Options.Replicas on
// the connection that wrote (run.go), wakes waiters on releases
// (releases.go) through its pub/sub (pubsub.go), and translates go-redis's
// errors at its boundary.
package deployment

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"reflect"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/notify"
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
	Replicas       int
	ReplicaTimeout time.Duration
	ReplicaFsync   bool
	Logger         *slog.Logger
	Clock          notify.Clock
	// Tasks runs the give-backs in the background.
	Tasks *tasks.Group
	// Name names the deployment in errors, as a node of a quorum; "" for
	// the store of New.
	Name string
}

// A Deployment is one Redis deployment through one go-redis client.
type Deployment struct {
	// client runs the scripts: the client given, which may be an
	// AutoPipeliner (they are sent with Process, which it batches).
	client redis.UniversalClient
	// base is the client given, or the one behind its AutoPipeliner:
	// subscriptions, WAIT and what asks for a kind of client (a Cluster's
	// nodes) go through it.
	base  redis.UniversalClient
	cfg   Config
	waits *notify.Notifier
	db    int // the client's database: wake-up channels tell databases apart
	// deadlines: the client honours context deadlines.
	deadlines bool
	// published: a release published its wake-up, or tried: until then,
	// releases publish with or without subscribers, so that a missing
	// permission shows at the first.
	published atomic.Bool

	dials, failures atomic.Int64          // dials of the client that succeeded and failed (dialWatch)
	lastDialErr     atomic.Pointer[error] // the last failed one's error

	// The arguments every lease sends, boxed once.
	retention, markerMillis, defaultTTL, owner any
}

var _ store.Store = (*Deployment)(nil)

// ErrNilClient is Usable's error for a nil client.
var ErrNilClient = errors.New("nil redis client")

// Usable returns why New cannot use client, or nil: a nil client
// (ErrNilClient), or an AutoPipeliner whose own client it cannot find.
func Usable(client redis.UniversalClient) error {
	if isNil(client) {
		return ErrNilClient
	}
	if ap, ok := client.(*redis.AutoPipeliner); ok && behind(ap) == nil {
		return errors.New("an AutoPipeliner of a go-redis version whose client fencelock cannot find")
	}
	return nil
}

// New returns the deployment of client, which Usable accepts, making no
// Redis call. It adds a hook to client that only counts its dials, so that
// an error can name why Redis was unreachable.
func New(client redis.UniversalClient, cfg Config) *Deployment {
	base := client
	if ap, ok := client.(*redis.AutoPipeliner); ok {
		base = behind(ap)
	}
	d := &Deployment{client: client, base: base, cfg: cfg, db: clientDB(base), deadlines: honoursDeadlines(client),
		retention: store.Millis(cfg.FenceRetention), markerMillis: store.Millis(cfg.ReleaseTimeout),
		defaultTTL: store.Millis(cfg.TTL), owner: cfg.Owner}
	base.AddHook(dialWatch{d})
	d.waits = notify.New(NewPubSub(base), notify.Options{Logger: cfg.Logger, Clock: cfg.Clock})
	return d
}

// Traits returns what the Locker needs to know of d.
func (d *Deployment) Traits() store.Traits { return store.Traits{Deadlines: d.deadlines} }

// Name returns the deployment's name in errors: Config.Name.
func (d *Deployment) Name() string { return d.cfg.Name }

// Close closes the waiters' subscriptions and waits for their goroutines
// until by at most.
func (d *Deployment) Close(by time.Time) { d.waits.Close(by) }

// Notifier returns the notifier of d's wake-up channels.
func (d *Deployment) Notifier() *notify.Notifier { return d.waits }

// Channel returns the wake-up channel of the lock (or base) key key.
func (d *Deployment) Channel(key string) string { return keys.Channel(key, d.db) }

// ChannelArg returns the wake-up channel of the lock key key, boxed: on
// database 0 the key's own boxed argument, boxed.
func (d *Deployment) ChannelArg(key string, boxed any) any {
	if d.db == 0 {
		return boxed
	}
	return d.Channel(key)
}

// Listen registers a waiter on the channel of key, woken (on wake if not
// nil) as h decides; nil after Close.
func (d *Deployment) Listen(key string, wake chan struct{}, h notify.Hearer) *notify.Waiter {
	return d.waits.Register(d.Channel(key), wake, h)
}

// Together reports whether one script can take the locks of all of names:
// on one server (or Sentinel's master), or when they hash to one Cluster
// slot; a Ring chooses its shards by a hash of its own.
func (d *Deployment) Together(names []string) bool {
	switch d.base.(type) {
	case *redis.ClusterClient:
		slot := keySlot(names[0])
		for _, name := range names[1:] {
			if keySlot(name) != slot {
				return false
			}
		}
		return true
	case *redis.Ring:
		return len(names) == 1
	}
	return true
}

// keySlot is the Cluster slot of the keys whose hash tag is tag: CRC16
// (XMODEM) modulo 16384.
func keySlot(tag string) int {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) & 16383
}

// dialWatch is a go-redis hook that counts the client's dials and changes
// nothing else. go-redis retries a command whose connection could not be
// made, and when the caller's context ends during those retries it
// returns only the context's error; Since then names the cause
// ("connection refused") from here.
type dialWatch struct{ d *Deployment }

func (h dialWatch) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		switch {
		case err == nil:
			h.d.dials.Add(1)
		case !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded):
			h.d.lastDialErr.Store(&err)
			h.d.failures.Add(1)
		}
		return c, err
	}
}

func (dialWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (dialWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Mark returns the counts of the client's dials.
func (d *Deployment) Mark() store.Mark {
	return store.Mark{Dials: d.dials.Load(), Failures: d.failures.Load()}
}

// Since returns the error of a dial that failed since m, and whether a
// request could have gone on no connection since m: the client has none
// open, and no dial succeeded since (a connection is counted as made
// before it carries a request). It allocates: only on a failed attempt's
// path.
func (d *Deployment) Since(m store.Mark) (cause error, unsent bool) {
	if d.failures.Load() == m.Failures {
		return nil, false
	}
	if p := d.lastDialErr.Load(); p != nil {
		cause = *p
	}
	s := d.base.PoolStats() // its AutoPipeliner's batches go on the same pools
	n := s.TotalConns
	if s.PipelineStats != nil {
		n += s.PipelineStats.TotalConns
	}
	return cause, cause != nil && n == 0 && d.dials.Load() == m.Dials // the count after the pool's: a dial meanwhile shows
}

// LastDialError returns the error of the client's last failed dial, or
// nil.
func (d *Deployment) LastDialError() error {
	if p := d.lastDialErr.Load(); p != nil {
		return *p
	}
	return nil
}

// behind returns the client an AutoPipeliner batches for, or nil. go-redis
// keeps it in an unexported field (v9.23: pipeliner), and the deployment
// needs it for what an AutoPipeliner does not batch or does not tell: its
// database, subscriptions, WAIT, a Cluster's nodes.
// TestAutoPipelinerClientFound fails when go-redis renames the field.
func behind(ap *redis.AutoPipeliner) redis.UniversalClient {
	f := reflect.ValueOf(ap).Elem().FieldByName("pipeliner")
	if !f.IsValid() || f.Kind() != reflect.Interface || f.IsNil() {
		return nil
	}
	f = reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem() // readable, as unexported fields are not
	c, _ := f.Interface().(redis.UniversalClient)
	if isNil(c) {
		return nil
	}
	return c
}

func isNil(c redis.UniversalClient) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// honoursDeadlines reports whether go-redis stops a call of c at its
// context's deadline (ContextTimeoutEnabled). An AutoPipeliner runs its
// batches on a context of its own, whatever its client's options: a call
// it has queued honours no deadline.
func honoursDeadlines(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// clientDB is the database of c's connections: pub/sub channels are
// shared by all databases of a server.
func clientDB(c redis.UniversalClient) int {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().DB
	case *redis.Ring:
		return c.Options().DB
	}
	return 0
}

// Base returns the client behind client when it is an AutoPipeliner, which
// Usable accepted: the one that serves subscriptions and knows the
// servers; client itself otherwise.
func Base(client redis.UniversalClient) redis.UniversalClient {
	if ap, ok := client.(*redis.AutoPipeliner); ok {
		return behind(ap)
	}
	return client
}
