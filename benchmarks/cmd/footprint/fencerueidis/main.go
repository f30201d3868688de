// Command fencerueidis is the smallest use of fencelock on rueidis: one
// lock taken and released through fencerueidis, with no go-redis client.
// README.md ("fencelock on rueidis") measures what of go-redis its binary
// carries, against ../rueidis, the same on a bare rueidis client.
package main

import (
	"context"
	"time"

	"github.com/redis/rueidis"

	"github.com/fencelock/fencelock"
	fencerueidis "github.com/fencelock/fencelock/rueidis"
)

func main() {
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"localhost:6379"}})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	locker, err := fencerueidis.New(client, &fencelock.Options{TTL: 10 * time.Second})
	if err != nil {
		panic(err)
	}
	defer locker.Close()
	ctx := context.Background()
	lease, err := locker.Acquire(ctx, "job", fencelock.WithWait(time.Second))
	if err != nil {
		panic(err)
	}
	println(lease.Fence())
	if err := lease.Release(ctx); err != nil {
		panic(err)
	}
}
