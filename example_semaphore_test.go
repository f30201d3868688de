package fencelock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock"
)

func ExampleSemaphore_RunWithLock() {
	client, stop := newClient()
	defer stop()
	ctx := context.Background()
	locker, err := fencelock.New(client, nil)
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	// The partner allows 4 concurrent calls across all instances.
	partner := locker.Semaphore("partner-api", 4)
	err = partner.RunWithLock(ctx, func(ctx context.Context, lease *fencelock.Lease) error {
		fmt.Println("calling the partner with a fence:", lease.Fence() > 0)
		return ctx.Err()
	}, fencelock.WithWait(2*time.Second))
	var busy *fencelock.BusyError
	switch {
	case errors.As(err, &busy):
		fmt.Printf("all %d permits held for 2s: try later\n", busy.Holders)
	case err != nil:
		fmt.Println("failed:", err)
	}
	info, err := partner.Inspect(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("holders now:", len(info.Holders), "of", info.Permits)
	// Output:
	// calling the partner with a fence: true
	// holders now: 0 of 4
}
