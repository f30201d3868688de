// Command cgloop runs acquire+release cycles of one implementation against
// a redis-server running under valgrind --tool=callgrind, and zeroes and
// dumps the server's counters (callgrind_control) around the measured
// cycles, so that the dump counts the server's instructions for them alone.
// callgrind.sh runs it; see README.md ("Server instructions").
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/bsm/redislock"
	"github.com/fencelock/fencelock"
	"github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("addr", "", "the redis-server")
	pid := flag.String("pid", "", "the pid of its valgrind")
	n := flag.Int("n", 2000, "acquire+release cycles measured (after 20 unmeasured)")
	impl := flag.String("impl", "fencelock", "fencelock, raw or redislock")
	pipe := flag.Bool("ap", false, "fencelock over client.AutoPipeline()")
	split := flag.Bool("split", false, "fencelock: n acquisitions of distinct names, dumped, then their n releases, dumped")
	nodump := flag.Bool("nodump", false, "zero the counters before the cycles, dump nothing after them")
	flag.Parse()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: *addr})
	cg := func(arg string) {
		out, err := exec.Command("callgrind_control", arg, *pid).CombinedOutput()
		if err != nil {
			fmt.Fprintln(os.Stderr, string(out))
			panic(err)
		}
	}
	var cycle func()
	switch *impl {
	default:
		panic("cgloop: no implementation " + *impl)
	case "fencelock":
		var cl redis.UniversalClient = c
		if *pipe {
			ap, err := c.AutoPipeline()
			must(err)
			cl = ap
		}
		l, err := fencelock.New(cl, nil)
		must(err)
		if *split {
			for range 20 {
				lease, err := l.Acquire(ctx, "warm")
				must(err)
				must(lease.Release(ctx))
			}
			leases := make([]*fencelock.Lease, *n)
			cg("-z")
			for i := range leases {
				leases[i], err = l.Acquire(ctx, fmt.Sprint("n", i))
				must(err)
			}
			cg("-d")
			for _, lease := range leases {
				must(lease.Release(ctx))
			}
			cg("-d")
			return
		}
		cycle = func() {
			lease, err := l.Acquire(ctx, "cg")
			must(err)
			must(lease.Release(ctx))
		}
	case "raw":
		rel := redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)
		cycle = func() {
			tok := rand.Text()
			ok, err := c.SetNX(ctx, "cg", tok, 10e9).Result()
			must(err)
			if !ok {
				panic("busy")
			}
			must(rel.Run(ctx, c, []string{"cg"}, tok).Err())
		}
	case "redislock":
		l := redislock.New(c)
		cycle = func() {
			lock, err := l.Obtain(ctx, "cg", 10*time.Second, nil)
			must(err)
			must(lock.Release(ctx))
		}
	}
	for range 20 {
		cycle()
	}
	cg("-z")
	for range *n {
		cycle()
	}
	if !*nodump {
		cg("-d")
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
