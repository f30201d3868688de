package fencelock_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencelock/fencelock"
)

func ExampleRWLock() {
	client, stop := newClient()
	defer stop()
	ctx := context.Background()
	locker, err := fencelock.New(client, nil)
	if err != nil {
		panic(err)
	}
	defer locker.Close()
	catalogue := locker.RWLock("catalogue")

	// Readers share the lock...
	reader, err := catalogue.AcquireShared(ctx)
	if err != nil {
		panic(err)
	}
	other, err := catalogue.AcquireShared(ctx)
	if err != nil {
		panic(err)
	}
	// ...and keep a writer out until they are done.
	_, err = catalogue.Acquire(ctx)
	fmt.Println("writer while read:", errors.Is(err, fencelock.ErrNotObtained))
	_ = reader.Release(ctx)
	_ = other.Release(ctx)

	// The rebuild writes with a fence above every reader's.
	err = catalogue.RunWithLock(ctx, func(ctx context.Context, lease *fencelock.Lease) error {
		fmt.Println("rebuilding, fence above the readers':", lease.Fence() > other.Fence())
		return nil
	})
	fmt.Println("rebuilt:", err == nil)
	// Output:
	// writer while read: true
	// rebuilding, fence above the readers': true
	// rebuilt: true
}

func ExampleLocker_RunWithLocks() {
	client, stop := newClient()
	defer stop()
	ctx := context.Background()
	locker, err := fencelock.New(client, nil)
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	// A transfer locks both accounts, or neither.
	err = locker.RunWithLocks(ctx, []string{"account:alice", "account:bob"}, func(ctx context.Context, leases []*fencelock.Lease) error {
		// In one transaction: fencesql's Guard.Advance for each account
		// with its own lease's fence, in account order, then read the
		// balances and write them (examples/transfer). Balances read
		// before the fences could be a stale holder's, about to change.
		for _, lease := range leases {
			fmt.Println("locked", lease.Name())
		}
		return ctx.Err()
	})
	var busy *fencelock.BusyError
	switch {
	case errors.As(err, &busy):
		fmt.Println(busy.Name, "is busy: nothing was locked")
	case err != nil:
		fmt.Println("failed:", err)
	}
	// Output:
	// locked account:alice
	// locked account:bob
}
