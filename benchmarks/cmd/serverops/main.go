// Command serverops runs OPS uncontended cycles (acquire, then release) of
// one kind of lock against the Redis at REDIS_ADDR, for
// ../shared/tools/redis-instructions, which counts redis-server's
// instructions per cycle under callgrind (README.md, "Server
// instructions"):
//
//	../shared/tools/redis-instructions -- go run ./cmd/serverops -kind lock
//
// Kinds: lock, fair (WithFair, WithWait), semaphore (3 permits), rwlock
// (exclusive), shared (RWLock.AcquireShared), all (AcquireAll of 3 names,
// one script), redlock (a quorum of one node: a node's cost), raw (SET NX
// PX and a compare-and-delete script), redislock (bsm/redislock); and the
// prototypes of prototypes.go: empty, nomarker, nocounter.
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
)

func main() {
	kind := flag.String("kind", "lock", "what to acquire and release")
	flag.Parse()
	ops, err := strconv.Atoi(os.Getenv("OPS"))
	if err != nil {
		fail(fmt.Errorf("OPS: %w", err))
	}
	client := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer client.Close()
	cycle, err := cycleOf(*kind, client)
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	for range ops {
		if err := cycle(ctx); err != nil {
			fail(err)
		}
	}
}

// cycleOf returns one acquire+release of kind through client.
func cycleOf(kind string, client *redis.Client) (func(context.Context) error, error) {
	var l *fencelock.Locker
	var err error
	switch kind {
	case "raw":
		return raw(client), nil
	case "empty", "nomarker", "nocounter":
		return prototype(client, kind), nil
	case "redislock":
		rl := redislock.New(client)
		return func(ctx context.Context) error {
			lock, err := rl.Obtain(ctx, "ops", 30*time.Second, nil)
			if err != nil {
				return err
			}
			return lock.Release(ctx)
		}, nil
	case "redlock":
		l, err = fencelock.NewRedlock([]redis.UniversalClient{client}, nil)
	default:
		l, err = fencelock.New(client, nil)
	}
	if err != nil {
		return nil, err
	}
	one := func(acquire func(ctx context.Context, opts ...fencelock.Option) (*fencelock.Lease, error)) func(context.Context) error {
		return func(ctx context.Context) error {
			lease, err := acquire(ctx)
			if err != nil {
				return err
			}
			return lease.Release(ctx)
		}
	}
	switch kind {
	case "lock", "redlock":
		return one(func(ctx context.Context, _ ...fencelock.Option) (*fencelock.Lease, error) {
			return l.Acquire(ctx, "ops")
		}), nil
	case "fair":
		return one(func(ctx context.Context, _ ...fencelock.Option) (*fencelock.Lease, error) {
			return l.Acquire(ctx, "ops", fencelock.WithFair(), fencelock.WithWait(time.Second))
		}), nil
	case "semaphore":
		return one(l.Semaphore("ops", 3).Acquire), nil
	case "rwlock":
		return one(l.RWLock("ops").Acquire), nil
	case "shared":
		return one(l.RWLock("ops").AcquireShared), nil
	case "all":
		return func(ctx context.Context) error {
			leases, err := l.AcquireAll(ctx, []string{"ops-a", "ops-b", "ops-c"})
			if err != nil {
				return err
			}
			for _, lease := range leases {
				if err := lease.Release(ctx); err != nil {
					return err
				}
			}
			return nil
		}, nil
	}
	return nil, fmt.Errorf("no kind %q", kind)
}

// raw is SET NX PX with a random token, and a compare-and-delete script.
func raw(client *redis.Client) func(context.Context) error {
	release := redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)
	return func(ctx context.Context) error {
		token := rand.Text()
		if ok, err := client.SetNX(ctx, "ops", token, 30*time.Second).Result(); err != nil || !ok {
			return fmt.Errorf("raw: set %v %v", ok, err)
		}
		return release.Run(ctx, client, []string{"ops"}, token).Err()
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "serverops:", err)
	os.Exit(1)
}
