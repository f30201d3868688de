package fencelock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
)

// The examples run on an embedded miniredis; point the client at your Redis.
func newClient() (*redis.Client, func()) {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	return c, func() { c.Close(); m.Close() }
}

func ExampleLocker_RunWithLock() {
	client, stop := newClient()
	defer stop()
	ctx := context.Background()
	locker, err := fencelock.New(client, nil) // TTL 30s, renewed every 10s
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	err = locker.RunWithLock(ctx, "settlement:2026-11-30", func(ctx context.Context, lease *fencelock.Lease) error {
		// ctx is cancelled, with cause fencelock.ErrLost, if the lock is
		// lost while the work runs. Pass the fence to every write:
		//
		//	UPDATE settlements SET status = 'done', fence_token = $1
		//	WHERE settle_date = $2 AND fence_token < $1
		fmt.Println("settling with a fence:", lease.Fence() > 0)
		return ctx.Err()
	})
	switch {
	case errors.Is(err, fencelock.ErrNotObtained):
		fmt.Println("another instance is settling: skip")
	case errors.Is(err, fencelock.ErrLost):
		fmt.Println("lost the lock mid-work: check the data")
	case err != nil:
		fmt.Println("failed:", err)
	default:
		fmt.Println("settled")
	}
	// Output:
	// settling with a fence: true
	// settled
}

func ExampleLocker_Acquire() {
	client, stop := newClient()
	defer stop()
	ctx := context.Background()

	locker, err := fencelock.New(client, &fencelock.Options{TTL: 10 * time.Second})
	if err != nil {
		panic(err)
	}
	lease, err := locker.Acquire(ctx, "nightly-settlement")
	switch {
	case errors.Is(err, fencelock.ErrNotObtained):
		fmt.Println("another instance is settling")
		return
	case err != nil:
		fmt.Println("redis:", err)
		return
	}
	defer lease.Release(ctx)

	fmt.Println("holding", lease.Key(), "fence > 0:", lease.Fence() > 0)

	// A second instance finds the lock busy.
	_, err = locker.Acquire(ctx, "nightly-settlement")
	fmt.Println(err)
	// Output:
	// holding lock:{nightly-settlement} fence > 0: true
	// fencelock: not obtained
}

func ExampleWithWait() {
	client, stop := newClient()
	defer stop()
	ctx := context.Background()
	locker, _ := fencelock.New(client, nil)
	defer locker.Close() // the subscription that waiters share

	first, _ := locker.Acquire(ctx, "order:42")
	go func() {
		time.Sleep(20 * time.Millisecond)
		first.Release(ctx)
	}()

	// Wait up to 5s for the first holder to finish.
	second, err := locker.Acquire(ctx, "order:42", fencelock.WithWait(5*time.Second))
	if err != nil {
		panic(err)
	}
	defer second.Release(ctx)
	fmt.Println("fences increase:", second.Fence() > first.Fence())
	// Output:
	// fences increase: true
}

func ExampleLease_Fence() {
	client, stop := newClient()
	defer stop()
	ctx := context.Background()
	locker, _ := fencelock.New(client, nil)

	lease, _ := locker.Acquire(ctx, "settlement:2026-11-30")
	defer lease.Release(ctx)

	// Pass the fence to every write of the critical section, and let the
	// database reject a write from an older holder:
	//
	//	UPDATE settlements SET status = 'done', fence_token = $1
	//	WHERE settle_date = $2 AND fence_token < $1
	fmt.Println(lease.Fence() > 0)
	// Output: true
}
