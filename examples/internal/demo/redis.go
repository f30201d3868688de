package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Redis is the Redis server an example runs against: an embedded miniredis,
// or the real server REDIS_ADDR names.
type Redis struct {
	// Addr is what clients connect to: the embedded server's loopback
	// host:port, or REDIS_ADDR as given. Pass it to NewRedisClient, also in
	// child processes.
	Addr string
	// Desc describes the server for the timeline, without credentials.
	Desc string

	mini *miniredis.Miniredis // nil for a real server
}

// StartRedis returns the Redis named by addr (REDIS_ADDR), after checking
// that it answers, or starts an embedded miniredis on a free loopback port
// when addr is empty. Close releases it.
func StartRedis(ctx context.Context, addr string) (*Redis, error) {
	if addr == "" {
		m := miniredis.NewMiniRedis()
		// miniredis is built for unit tests and normally lets TTLs run down
		// only when a test fast-forwards them. The examples need a lock to
		// expire by itself while its holder is paused, as on a real server.
		m.ClockTTL(true)
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("start embedded miniredis: %w", err)
		}
		return &Redis{Addr: m.Addr(), Desc: "embedded miniredis at " + m.Addr(), mini: m}, nil
	}
	c, err := NewRedisClient(ctx, addr)
	if err != nil {
		return nil, err
	}
	opts := c.Options()
	_ = c.Close()
	return &Redis{Addr: addr, Desc: fmt.Sprintf("Redis at %s db %d (REDIS_ADDR)", opts.Addr, opts.DB)}, nil
}

// Close stops the embedded server; for a real server it does nothing.
func (r *Redis) Close() {
	if r.mini != nil {
		r.mini.Close()
	}
}

// ErrNoAnswer is matched by the errors of StartRedis, NewRedisClient and
// DeleteKeys when the Redis named could not be reached or did not answer in
// time: an outage, as opposed to a bad address or a refusal.
var ErrNoAnswer = errors.New("does not answer")

// RedisClient returns a client for addr, a host:port or a redis:// or
// rediss:// URL, without contacting the server: for a service that goes on
// when Redis is down. The error says what is wrong with addr.
func RedisClient(addr string) (*redis.Client, error) {
	opts, err := redisOptions(addr)
	if err != nil {
		return nil, err
	}
	return redis.NewClient(opts), nil
}

// NewRedisClient returns a client for addr, as RedisClient does, once the
// server answered a PING. The error says which of the two went wrong; it
// matches ErrNoAnswer when the server could not be reached or did not
// answer in time.
func NewRedisClient(ctx context.Context, addr string) (*redis.Client, error) {
	opts, err := redisOptions(addr)
	if err != nil {
		return nil, err
	}
	pingCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	// Dial once by hand first: for a server that is not there, go-redis
	// would retry its dial many times and log every failure.
	var d net.Dialer
	conn, err := d.DialContext(pingCtx, opts.Network, opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("redis at %s %w: %w", opts.Addr, ErrNoAnswer, err)
	}
	_ = conn.Close()
	c := redis.NewClient(opts)
	if err := c.Ping(pingCtx).Err(); err != nil {
		_ = c.Close()
		var netErr net.Error
		if errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("redis at %s %w: %w", opts.Addr, ErrNoAnswer, err)
		}
		return nil, fmt.Errorf("redis at %s does not answer: %w", opts.Addr, err) // a refusal, such as NOAUTH
	}
	return c, nil
}

// redisOptions parses addr for RedisClient and NewRedisClient.
func redisOptions(addr string) (*redis.Options, error) {
	var opts *redis.Options
	if strings.Contains(addr, "://") {
		var err error
		if opts, err = redis.ParseURL(addr); err != nil {
			// ParseURL's error may quote the URL, password included.
			return nil, fmt.Errorf("REDIS_ADDR is not a valid redis:// URL")
		}
	} else {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("REDIS_ADDR %q: want host:port or a redis:// URL: %w", addr, err)
		}
		opts = &redis.Options{Network: "tcp", Addr: addr}
	}
	// Let a context's deadline bound a call to a Redis that stopped
	// answering (docs/failures.md explains why the library recommends it).
	opts.ContextTimeoutEnabled = true
	return opts, nil
}

// DeleteKeys deletes keys from the Redis at addr, on a context that outlives
// ctx's cancellation, so that an interrupted run against a shared server
// still removes what it created. Errors are returned for the caller to
// report; the keys then stay behind.
func DeleteKeys(ctx context.Context, addr string, keys ...string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
	defer cancel()
	c, err := NewRedisClient(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Del(ctx, keys...).Err()
}
