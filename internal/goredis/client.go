// Package goredis is a deployment's go-redis client: its scripts (with WAIT
// on the connection that wrote, wait.go), its dials, and its pub/sub for the
// notifier (pubsub.go). It translates go-redis's own errors at its boundary.
package goredis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"sync/atomic"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/internal/driver"
	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
)

// A Client is one deployment's go-redis client.
type Client struct {
	client  redis.UniversalClient // runs the scripts; may be an AutoPipeliner
	base    redis.UniversalClient // the one behind it: subscriptions, WAIT, its kind
	o       driver.Options
	network *Network

	dials, failures atomic.Int64          // of the client, counted by dialWatch
	lastDialErr     atomic.Pointer[error] // the last failed dial's
}

// ErrNilClient is Usable's error for a nil client.
var ErrNilClient = errors.New("nil redis client")

// Usable returns why New cannot use client: a nil client (ErrNilClient),
// or an AutoPipeliner whose own client it cannot find.
func Usable(client redis.UniversalClient) error {
	if isNil(client) {
		return ErrNilClient
	}
	if ap, ok := client.(*redis.AutoPipeliner); ok && behind(ap) == nil {
		return errors.New("an AutoPipeliner of a go-redis version whose client fencelock cannot find")
	}
	return nil
}

// UsableAll returns why a Redlock cannot use clients: none or more than
// 64, one Usable refuses, or one given twice.
func UsableAll(clients []redis.UniversalClient) error {
	if len(clients) == 0 {
		return errors.New("no redis clients")
	}
	if len(clients) > 64 {
		return fmt.Errorf("%d redis clients: at most 64", len(clients))
	}
	for i, c := range clients {
		switch err := Usable(c); {
		case errors.Is(err, ErrNilClient):
			return fmt.Errorf("redis client %d is nil", i)
		case err != nil:
			return fmt.Errorf("redis client %d: %w", i, err)
		}
		for j := range i {
			if clients[j] == c {
				return fmt.Errorf("redis clients %d and %d are the same client", j, i)
			}
		}
	}
	return nil
}

// New returns the Client of client, which Usable accepts, and adds a hook to
// client that counts its dials (see Since).
func New(client redis.UniversalClient, o driver.Options) *Client {
	base := Base(client)
	c := &Client{client: client, base: base, o: o, network: NewNetwork(base)}
	base.AddHook(dialWatch{c})
	return c
}

// Call sends one command with Process, which an AutoPipeliner batches.
func (c *Client) Call(ctx context.Context, args []any) (any, error) {
	cmd := redis.NewCmd(ctx, args...)
	_ = c.client.Process(ctx, cmd)
	reply, err := cmd.Result()
	return reply, translate(err)
}

// Eval runs s on keys: EVALSHA, then EVAL when the server does not have it.
func (c *Client) Eval(ctx context.Context, s *script.Script, keys, argv []any) (any, error) {
	return script.Run(ctx, c, s, false, keys, argv)
}

// Network returns the client's pub/sub, for a notifier.
func (c *Client) Network() notify.Network { return c.network }

// DB returns the database of the client's connections.
func (c *Client) DB() int {
	switch b := c.base.(type) {
	case *redis.Client:
		return b.Options().DB
	case *redis.Ring:
		return b.Options().DB
	}
	return 0
}

// Deadlines reports whether go-redis stops a call at its context's deadline
// (ContextTimeoutEnabled; never through an AutoPipeliner, whose batches run
// on a context of their own).
func (c *Client) Deadlines() bool {
	switch b := c.client.(type) {
	case *redis.Client:
		return b.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return b.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return b.Options().ContextTimeoutEnabled
	}
	return false
}

// translate gives go-redis's own errors their meaning for a lock (see
// store.ClassOf): a closed client refuses, and neither it nor a pool with no
// connection to give sent anything.
func translate(err error) error {
	switch {
	case err == nil || errors.Is(err, redis.Nil):
		return err
	case errors.Is(err, redis.ErrClosed):
		return &store.Refusal{Msg: "the go-redis client is closed", Err: err, NotSent: true}
	case errors.Is(err, redis.ErrPoolTimeout):
		return &store.NotSent{Err: err}
	}
	return err
}

// dialWatch is a go-redis hook that counts the client's dials: go-redis
// retries a failed dial and returns only the context's error when it ends.
type dialWatch struct{ c *Client }

func (h dialWatch) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		switch {
		case err == nil:
			h.c.dials.Add(1)
		case !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded):
			h.c.lastDialErr.Store(&err)
			h.c.failures.Add(1)
		}
		return conn, err
	}
}

func (dialWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (dialWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Mark returns the counts of the client's dials.
func (c *Client) Mark() store.Mark {
	return store.Mark{Dials: c.dials.Load(), Failures: c.failures.Load()}
}

// Since returns the error of a dial that failed since m, and whether no
// request can have been sent since: no connection is open, no dial succeeded.
func (c *Client) Since(m store.Mark) (cause error, unsent bool) {
	if c.failures.Load() == m.Failures {
		return nil, false
	}
	cause = c.LastDialError()
	s := c.base.PoolStats() // its AutoPipeliner's batches go on the same pools
	n := s.TotalConns
	if s.PipelineStats != nil {
		n += s.PipelineStats.TotalConns
	}
	return cause, cause != nil && n == 0 && c.dials.Load() == m.Dials // read after the pool: a dial meanwhile shows
}

// LastDialError returns the error of the client's last failed dial, or nil.
func (c *Client) LastDialError() error {
	if p := c.lastDialErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Base returns the client behind client when it is an AutoPipeliner, which
// Usable accepted, and client itself otherwise.
func Base(client redis.UniversalClient) redis.UniversalClient {
	if ap, ok := client.(*redis.AutoPipeliner); ok {
		return behind(ap)
	}
	return client
}

// behind returns the client an AutoPipeliner batches for, or nil: go-redis
// keeps it in a field, pipeliner (v9.23), that TestAutoPipelinerClientFound checks.
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
