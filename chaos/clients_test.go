package chaos

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/valkey-io/valkey-go"

	"github.com/fencelock/fencelock"
	fencerueidis "github.com/fencelock/fencelock/rueidis"
	fencevalkey "github.com/fencelock/fencelock/valkeygo"
)

// The clients a worker can hold its locks through (workerConfig.Client):
// go-redis through fencelock.New and NewRedlock, rueidis through the
// fencerueidis adapter, valkey-go through fencevalkey.
const (
	goRedis  = "go-redis"
	rueidisC = "rueidis"
	valkeyC  = "valkey-go"
)

// rueidisLocker builds the worker's Locker on rueidis clients with the
// settings of its go-redis ones: the dial timeout and the connection's
// read/write timeout (ConnWriteTimeout, which rueidis also uses for its
// PINGs) from IOTimeout, no client-side cache and no CLIENT SETINFO. Each
// client's commands go through the worker's renewHook (see rueidisHooked).
// rueidis dials at construction: an error there fails the worker.
func (w *worker) rueidisLocker(opts *fencelock.Options) (*fencelock.Locker, error) {
	c := w.cfg
	option := func(addrs []string) rueidis.ClientOption {
		return rueidis.ClientOption{
			InitAddress: addrs, DisableCache: true, ClientSetInfo: rueidis.DisableClientSetInfo,
			Dialer: net.Dialer{Timeout: c.IOTimeout}, ConnWriteTimeout: c.IOTimeout,
		}
	}
	var clients []rueidis.Client
	add := func(o rueidis.ClientOption) error {
		cl, err := rueidis.NewClient(o)
		if err != nil {
			return fmt.Errorf("rueidis client of %v: %w", o.InitAddress, err)
		}
		w.closers = append(w.closers, cl.Close)
		clients = append(clients, rueidisHooked{cl, w.hook})
		return nil
	}
	switch {
	case len(c.SentinelAddrs) > 0:
		o := option(c.SentinelAddrs)
		o.Sentinel = rueidis.SentinelOption{MasterSet: c.MasterName, Dialer: net.Dialer{Timeout: c.IOTimeout}}
		if err := add(o); err != nil {
			return nil, err
		}
	case len(c.RedlockAddrs) > 0:
		for _, a := range c.RedlockAddrs {
			if err := add(option([]string{a})); err != nil {
				return nil, err
			}
		}
		return fencerueidis.NewRedlock(clients, opts)
	default:
		if err := add(option([]string{c.Addr})); err != nil {
			return nil, err
		}
	}
	return fencerueidis.New(clients[0], opts)
}

// valkeyLocker is rueidisLocker for valkey-go, a fork of rueidis with the
// same options.
func (w *worker) valkeyLocker(opts *fencelock.Options) (*fencelock.Locker, error) {
	c := w.cfg
	option := func(addrs []string) valkey.ClientOption {
		return valkey.ClientOption{
			InitAddress: addrs, DisableCache: true, ClientSetInfo: valkey.DisableClientSetInfo,
			Dialer: net.Dialer{Timeout: c.IOTimeout}, ConnWriteTimeout: c.IOTimeout,
		}
	}
	var clients []valkey.Client
	add := func(o valkey.ClientOption) error {
		cl, err := valkey.NewClient(o)
		if err != nil {
			return fmt.Errorf("valkey-go client of %v: %w", o.InitAddress, err)
		}
		w.closers = append(w.closers, cl.Close)
		clients = append(clients, valkeyHooked{cl, w.hook})
		return nil
	}
	switch {
	case len(c.SentinelAddrs) > 0:
		o := option(c.SentinelAddrs)
		o.Sentinel = valkey.SentinelOption{MasterSet: c.MasterName, Dialer: net.Dialer{Timeout: c.IOTimeout}}
		if err := add(o); err != nil {
			return nil, err
		}
	case len(c.RedlockAddrs) > 0:
		for _, a := range c.RedlockAddrs {
			if err := add(option([]string{a})); err != nil {
				return nil, err
			}
		}
		return fencevalkey.NewRedlock(clients, opts)
	default:
		if err := add(option([]string{c.Addr})); err != nil {
			return nil, err
		}
	}
	return fencevalkey.New(clients[0], opts)
}

// rueidisHooked is a rueidis client whose Do and DoMulti show their commands
// and replies to the worker's renewHook, as go-redis's hooks do: the
// adapter sends every script (extend, release, grant) through them. Its
// Dedicated connections (pub/sub, Check's MULTI) and Nodes are the
// client's own, unwatched.
type rueidisHooked struct {
	rueidis.Client
	hook *renewHook
}

func (c rueidisHooked) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	end := c.hook.begin(anys(cmd.Commands())) // before Do, which may recycle cmd
	res := c.Client.Do(ctx, cmd)
	if end != nil {
		end(res.ToAny())
	}
	return res
}

func (c rueidisHooked) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	ends := make([]func(any, error), len(multi))
	for i, cmd := range multi {
		ends[i] = c.hook.begin(anys(cmd.Commands()))
	}
	res := c.Client.DoMulti(ctx, multi...)
	for i, end := range ends {
		if end != nil && i < len(res) {
			end(res[i].ToAny())
		}
	}
	return res
}

// valkeyHooked is rueidisHooked for valkey-go.
type valkeyHooked struct {
	valkey.Client
	hook *renewHook
}

func (c valkeyHooked) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	end := c.hook.begin(anys(cmd.Commands()))
	res := c.Client.Do(ctx, cmd)
	if end != nil {
		end(res.ToAny())
	}
	return res
}

func (c valkeyHooked) DoMulti(ctx context.Context, multi ...valkey.Completed) []valkey.ValkeyResult {
	ends := make([]func(any, error), len(multi))
	for i, cmd := range multi {
		ends[i] = c.hook.begin(anys(cmd.Commands()))
	}
	res := c.Client.DoMulti(ctx, multi...)
	for i, end := range ends {
		if end != nil && i < len(res) {
			end(res[i].ToAny())
		}
	}
	return res
}

func anys(s []string) []any {
	a := make([]any, len(s))
	for i, x := range s {
		a[i] = x
	}
	return a
}

// TestRenewHookOnEachClient checks that the worker's renewHook sees the
// renewals of each client's Locker (the "renew after release" column and
// the renewal counts rest on it): a lease held for 2.5×TTL is renewed, and
// the hook counts those renewals and none after the release.
func TestRenewHookOnEachClient(t *testing.T) {
	const ttl = 200 * time.Millisecond
	n := startRedis(t, "redis")
	for _, client := range []string{goRedis, rueidisC, valkeyC} {
		t.Run(client, func(t *testing.T) {
			cfg := defaults(n.addr, ttl)
			cfg.Client = client
			w := &worker{cfg: cfg, hook: newRenewHook()}
			if err := w.setup(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				_ = w.locker.Close()
				for _, c := range w.closers {
					c()
				}
			}()
			var token string
			err := w.locker.RunWithLock(context.Background(), "hook-"+client, func(ctx context.Context, lease *fencelock.Lease) error {
				token = lease.Token()
				if !sleepCtx(ctx, 5*ttl/2) {
					return context.Cause(ctx)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("RunWithLock: %v", err)
			}
			r := w.hook.released(token)
			if r.ok == 0 || r.fail != 0 {
				t.Errorf("the hook counted %d renewals that succeeded and %d that failed, want some and none", r.ok, r.fail)
			}
			if n := w.hook.afterRelease.Load(); n != 0 {
				t.Errorf("the hook counted %d renewals after the release, want 0", n)
			}
		})
	}
}
