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
		// lost while the work runs. Pass the fence to every write, and
		// settle a pending day only: a holder that lost the lock and wrote
		// first had the greatest fence then (0 rows: done already).
		//
		//	UPDATE settlements SET status = 'done', fence_token = $1
		//	WHERE settle_date = $2 AND status = 'pending' AND fence_token < $1
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

	locker, err := fencelock.New(client, &fencelock.Options{TTL: 10 * time.Second, Owner: "settlement-pod-1"})
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

	// A second instance finds the lock busy, and who holds it.
	_, err = locker.Acquire(ctx, "nightly-settlement")
	fmt.Println(err)
	// Output:
	// holding lock:{nightly-settlement} fence > 0: true
	// fencelock: not obtained: "nightly-settlement" held by settlement-pod-1 for 10s more
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
	// database reject a write from an older holder after a newer one's.
	// An older holder that writes first is not rejected: the row's state
	// keeps the day from being settled twice.
	//
	//	UPDATE settlements SET status = 'done', fence_token = $1
	//	WHERE settle_date = $2 AND status = 'pending' AND fence_token < $1
	fmt.Println(lease.Fence() > 0)
	// Output: true
}

func ExampleLease_KeepAlive() {
	client, stop := newClient()
	defer stop()
	ctx := context.Background()
	locker, _ := fencelock.New(client, &fencelock.Options{TTL: 10 * time.Second})
	defer locker.Close()

	lease, err := locker.Acquire(ctx, "report:2026-11")
	if err != nil {
		fmt.Println(err)
		return
	}
	// Release when the work is done, also on error paths: it stops the
	// watchdog and deletes the lock.
	defer lease.Release(ctx)

	// The watchdog renews the lease every TTL/3 until Release, or until
	// ctx ends, which releases it; workCtx is cancelled with cause
	// fencelock.ErrLost if the lock is lost.
	workCtx := lease.KeepAlive(ctx)
	select {
	case <-workCtx.Done():
		fmt.Println("lost:", context.Cause(workCtx))
	case <-time.After(50 * time.Millisecond): // the work
		fmt.Println("report written with fence", lease.Fence() > 0)
	}
	// Output: report written with fence true
}

func ExampleLease_Extend() {
	client, stop := newClient()
	defer stop()
	ctx := context.Background()
	locker, _ := fencelock.New(client, &fencelock.Options{TTL: 10 * time.Second})

	lease, err := locker.Acquire(ctx, "import:catalog")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer lease.Release(ctx)

	// The import turns out bigger than expected: hold the lock for longer.
	// Deadline moves to the time the request was sent plus the new TTL,
	// minus the drift allowance.
	before := lease.Deadline()
	if err := lease.Extend(ctx, time.Minute); err != nil {
		fmt.Println("stop importing:", err) // ErrNotHeld: someone else may be importing
		return
	}
	fmt.Println("deadline moved by about 50s:", lease.Deadline().Sub(before).Round(10*time.Second))
	// Output: deadline moved by about 50s: 50s
}

func ExampleOptions_failOpen() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	m.Close() // Redis is down
	ctx := context.Background()

	// Shipping an order is safe to run twice, as the database lets it happen
	// once: rather run it without the lock than not at all while Redis is
	// down. (WithFailOpen(true) decides it for one call instead.)
	locker, _ := fencelock.New(client, &fencelock.Options{FailOpen: true})
	err = locker.RunWithLock(ctx, "order:42", func(ctx context.Context, lease *fencelock.Lease) error {
		if lease.Degraded() {
			// No lock and no fence: Fence is 0, which a fence check
			// (fence_token < $2) refuses. Write through what holds without
			// a lock, the row's own state and a unique key:
			//
			//	UPDATE orders SET status = 'shipped' WHERE id = $1 AND status = 'paid'
			//	INSERT INTO shipments (order_id) VALUES ($1) ON CONFLICT (order_id) DO NOTHING
			fmt.Println("degraded, fence", lease.Fence(), "- ship if the order is still paid")
			return nil
		}
		// Holding the lock: the fenced write.
		//
		//	UPDATE orders SET status = 'shipped', fence_token = $2
		//	WHERE id = $1 AND status = 'paid' AND fence_token < $2
		fmt.Println("fenced, fence", lease.Fence())
		return nil
	})
	// FailOpen opens on ErrUnavailable only: a busy lock, a Redis that
	// refuses the commands (ErrMisconfigured) or an ended ctx still return
	// their error without running the work.
	fmt.Println("err:", err)
	// Output:
	// degraded, fence 0 - ship if the order is still paid
	// err: <nil>
}

func ExampleOptions_onLost() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	ctx := context.Background()

	locker, _ := fencelock.New(client, &fencelock.Options{
		TTL: 300 * time.Millisecond,
		// Called once per lease lost while the watchdog ran, after the work's
		// context was cancelled: count it, alert on it.
		OnLost: func(lease *fencelock.Lease, cause error) {
			fmt.Println("lost", lease.Name(), errors.Is(cause, fencelock.ErrLost))
		},
	})
	err = locker.RunWithLock(ctx, "payout:7", func(ctx context.Context, lease *fencelock.Lease) error {
		m.Del(lease.Key()) // an operator deletes the lock
		<-ctx.Done()       // the next renewal finds it gone
		return ctx.Err()
	})
	fmt.Println(errors.Is(err, fencelock.ErrLost))
	// Output:
	// lost payout:7 true
	// true
}

func ExampleOptions_maxHold() {
	client, stop := newClient()
	defer stop()
	ctx := context.Background()

	// A job that hangs must not keep the lock for ever: renew for at most
	// 200ms (the longest the job may legitimately take), then let the lease
	// run out; its context is cancelled within one TTL.
	locker, _ := fencelock.New(client, &fencelock.Options{TTL: 100 * time.Millisecond, MaxHold: 200 * time.Millisecond})
	err := locker.RunWithLock(ctx, "sync:crm", func(ctx context.Context, lease *fencelock.Lease) error {
		<-ctx.Done() // a hung job
		return nil
	})
	fmt.Println(errors.Is(err, fencelock.ErrLost))
	fmt.Println(err)
	// Output:
	// true
	// fencelock: lease lost: held for MaxHold 200ms, no longer renewed; its deadline passed
}
