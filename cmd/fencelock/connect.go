package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/keys"
)

const (
	defaultURL     = "redis://127.0.0.1:6379"
	defaultPrefix  = "lock:"
	defaultTimeout = 10 * time.Second
)

// connFlags are the connection flags every command takes.
type connFlags struct {
	url      string
	sentinel string
	master   string
	cluster  string
	db       int
	dbSet    bool
	prefix   string
	timeout  time.Duration
}

func (c *connFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.url, "url", "", "")
	fs.StringVar(&c.sentinel, "sentinel", "", "")
	fs.StringVar(&c.master, "master", "", "")
	fs.StringVar(&c.cluster, "cluster", "", "")
	fs.Func("db", "", func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return fmt.Errorf("want a database number, got %q", s)
		}
		c.db, c.dbSet = n, true
		return nil
	})
	fs.StringVar(&c.prefix, "prefix", defaultPrefix, "")
	fs.DurationVar(&c.timeout, "timeout", defaultTimeout, "")
}

// A session is a connection to the deployment, and a Locker over it.
type session struct {
	client redis.UniversalClient
	locker *fencelock.Locker
	prefix string
	db     int // the database number; its wake-up channels carry "@<db>" unless 0
}

// open connects as the flags say; opts, if not nil, sets the Locker's
// options other than KeyPrefix. Nothing is sent to Redis yet.
func (c *connFlags) open(e *env, cmd string, opts *fencelock.Options) (*session, error) {
	if c.prefix == "" {
		// Options.KeyPrefix "" means the default, "lock:": there is no
		// empty prefix to select.
		return nil, usagef("%s: --prefix is empty; the library's prefix is never empty (default %q)", cmd, defaultPrefix)
	}
	if strings.ContainsAny(c.prefix, "{}") {
		return nil, usagef("%s: --prefix %q contains '{' or '}'", cmd, c.prefix)
	}
	if c.timeout <= 0 {
		return nil, usagef("%s: --timeout %v is not positive", cmd, c.timeout)
	}
	client, db, err := c.client(e, cmd)
	if err != nil {
		return nil, err
	}
	var o fencelock.Options
	if opts != nil {
		o = *opts
	}
	o.KeyPrefix = c.prefix
	l, err := fencelock.New(client, &o)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	return &session{client: client, locker: l, prefix: c.prefix, db: db}, nil
}

func (s *session) close() {
	_ = s.locker.Close()
	_ = s.client.Close()
}

// key returns the lock key of name: KeyPrefix+"{"+name+"}".
func (s *session) key(name string) string { return keys.Lock(s.prefix, name) }

// channel returns the wake-up channel of the lock key: the key, plus
// "@<db>" on a database other than 0 (pub/sub channels are shared by all
// databases), as release.lua publishes it.
func (s *session) channel(key string) string { return keys.Channel(key, s.db) }

// client builds the go-redis client the flags describe, and returns its
// database number.
func (c *connFlags) client(e *env, cmd string) (redis.UniversalClient, int, error) {
	raw, from := c.url, "--url"
	if raw == "" {
		raw, from = e.getenv("REDIS_URL"), "REDIS_URL"
	}
	if raw == "" {
		raw = defaultURL
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
		// url.Parse's error quotes the URL, password included.
		return nil, 0, usagef("%s: %s is not a redis:// or rediss:// URL", cmd, from)
	}
	opts, err := redis.ParseURL(raw)
	if err != nil {
		return nil, 0, usagef("%s: %s: %s", cmd, from, strings.TrimPrefix(err.Error(), "redis: "))
	}
	urlHasDB := strings.Trim(u.Path, "/") != "" || u.Query().Has("db")
	if c.dbSet {
		if urlHasDB && opts.DB != c.db {
			return nil, 0, usagef("%s: --db %d, but %s says database %d", cmd, c.db, from, opts.DB)
		}
		opts.DB = c.db
	}
	// A context's deadline bounds go-redis's own wait for a Redis that
	// stopped answering, not only the library's.
	opts.ContextTimeoutEnabled = true

	switch {
	case c.sentinel != "" && c.cluster != "":
		return nil, 0, usagef("%s: --sentinel and --cluster exclude each other", cmd)
	case c.master != "" && c.sentinel == "":
		return nil, 0, usagef("%s: --master goes with --sentinel", cmd)
	case c.sentinel != "":
		if c.master == "" {
			return nil, 0, usagef("%s: --sentinel needs --master, the name the Sentinels know the master by", cmd)
		}
		addrs, err := splitAddrs(c.sentinel)
		if err != nil {
			return nil, 0, usagef("%s: --sentinel: %v", cmd, err)
		}
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName:            c.master,
			SentinelAddrs:         addrs,
			Username:              opts.Username,
			Password:              opts.Password,
			DB:                    opts.DB,
			Protocol:              opts.Protocol,
			TLSConfig:             anyHost(opts.TLSConfig),
			DialTimeout:           opts.DialTimeout,
			ReadTimeout:           opts.ReadTimeout,
			WriteTimeout:          opts.WriteTimeout,
			MaxRetries:            opts.MaxRetries,
			PoolSize:              opts.PoolSize,
			ContextTimeoutEnabled: true,
		}), opts.DB, nil
	case c.cluster != "":
		if opts.DB != 0 {
			return nil, 0, usagef("%s: a Redis Cluster has database 0 only, not %d", cmd, opts.DB)
		}
		addrs, err := splitAddrs(c.cluster)
		if err != nil {
			return nil, 0, usagef("%s: --cluster: %v", cmd, err)
		}
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 addrs,
			Username:              opts.Username,
			Password:              opts.Password,
			Protocol:              opts.Protocol,
			TLSConfig:             anyHost(opts.TLSConfig),
			DialTimeout:           opts.DialTimeout,
			ReadTimeout:           opts.ReadTimeout,
			WriteTimeout:          opts.WriteTimeout,
			MaxRetries:            opts.MaxRetries,
			PoolSize:              opts.PoolSize,
			ContextTimeoutEnabled: true,
		}), 0, nil
	}
	return redis.NewClient(opts), opts.DB, nil
}

// anyHost returns a copy of a TLS configuration made for the URL's host
// that verifies each server against the host it dials instead: Sentinel
// and Cluster connect to several.
func anyHost(c *tls.Config) *tls.Config {
	if c == nil {
		return nil
	}
	c = c.Clone()
	c.ServerName = ""
	return c
}

// splitAddrs splits "host:port,host:port".
func splitAddrs(s string) ([]string, error) {
	var addrs []string
	for a := range strings.SplitSeq(s, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if host, port, err := net.SplitHostPort(a); err != nil || host == "" || port == "" {
			return nil, fmt.Errorf("%q is not host:port", a)
		}
		addrs = append(addrs, a)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("no address")
	}
	return addrs, nil
}

// withTimeout bounds a one-shot command's Redis calls.
func (c *connFlags) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.timeout)
}
