// Command driver takes and releases locks with the version of fencelock its
// module is built against, for TestMixedVersions: for -for, each of -workers
// goroutines per name acquires the lock (waiting, fairly for the names in
// -fair), and inside it counts itself in and out of the name's witness
// (mixed:<name>:inside, which must never exceed 1) and offers its fence to
// the name's fenced register (mixed:<name>:fence, which accepts only a
// fence greater than the last). It prints one line: acquired, overlaps,
// stale.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/redis/go-redis/v9"
)

// fenced accepts a fence greater than the register's, atomically.
var fenced = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > cur then
	redis.call('SET', KEYS[1], ARGV[1])
	return 1
end
return 0`)

func main() {
	addr := flag.String("addr", "", "redis-server")
	names := flag.String("names", "", "comma-separated lock names")
	fair := flag.String("fair", "", "comma-separated names waited for with WithFair")
	workers := flag.Int("workers", 2, "goroutines per name")
	dur := flag.Duration("for", 3*time.Second, "how long")
	flag.Parse()
	client := redis.NewClient(&redis.Options{Addr: *addr})
	defer client.Close()
	l, err := fencelock.New(client, &fencelock.Options{TTL: 10 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer l.Close()
	ctx := context.Background()
	var acquired, overlaps, stale, failed atomic.Int64
	end := time.Now().Add(*dur)
	var wg sync.WaitGroup
	for _, name := range strings.Split(*names, ",") {
		opts := []fencelock.Option{fencelock.WithWait(5 * time.Second)}
		if strings.Contains(","+*fair+",", ","+name+",") {
			opts = append(opts, fencelock.WithFair())
		}
		for range *workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) {
					lease, err := l.Acquire(ctx, name, opts...)
					if err != nil {
						failed.Add(1)
						continue
					}
					acquired.Add(1)
					if n, _ := client.Incr(ctx, "mixed:"+name+":inside").Result(); n != 1 {
						overlaps.Add(1)
					}
					if ok, _ := fenced.Run(ctx, client, []string{"mixed:" + name + ":fence"}, lease.Fence()).Int(); ok != 1 {
						stale.Add(1)
					}
					time.Sleep(time.Millisecond)
					client.Decr(ctx, "mixed:"+name+":inside")
					if err := lease.Release(ctx); err != nil {
						failed.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	fmt.Printf("acquired=%d overlaps=%d stale=%d failed=%d\n", acquired.Load(), overlaps.Load(), stale.Load(), failed.Load())
}
