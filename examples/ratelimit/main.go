// Command ratelimit shows a fencelock Semaphore keeping the instances of a
// service within a partner API's limit on concurrent requests.
//
// The partner allows 4 concurrent requests from all of a client's
// instances together, and refuses a 5th with 429 Too Many Requests. Four
// instances, each with three workers that send orders to the partner as
// fast as they can, share that limit. With the semaphore, each request is
// made under a permit of locker.Semaphore("partner-api", 4), taken with
// RunWithLock and WithWait: at most four are in flight, and none is
// refused. Then the same instances run with the semaphore turned off, and
// the partner's refusals are counted.
//
// Run it with nothing but Go installed:
//
//	go run ./examples/ratelimit
//
// It starts an embedded miniredis on a loopback port; REDIS_ADDR (host:port
// or redis:// URL) switches to a real Redis. The run uses its own key prefix
// and removes its keys at the end.
//
// The instances are goroutines, each with its own Redis client, Locker and
// HTTP client, as separate processes would have.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/examples/internal/demo"
)

func main() {
	os.Exit(command.Main())
}

// command is the ratelimit command.
var command = demo.Command{
	Name: "ratelimit",
	Run: func(ctx context.Context) error {
		_, err := run(ctx, Config{RedisAddr: os.Getenv("REDIS_ADDR")})
		return err
	},
}

// Config configures one run of the story.
type Config struct {
	RedisAddr string        // REDIS_ADDR; empty starts an embedded miniredis
	Duration  time.Duration // how long each of the two runs lasts; default 1s
	Out       io.Writer     // the timeline; default os.Stdout
}

// The story's fixed parts.
const (
	semName       = "partner-api"
	limit         = 4                     // the partner's concurrent requests, and the semaphore's permits
	workers       = 3                     // per instance
	latency       = 20 * time.Millisecond // how long the partner takes per request
	waitForPermit = 5 * time.Second
)

var instanceNames = []string{"instance-a", "instance-b", "instance-c", "instance-d"}

// RunResult is what one run of the instances did.
type RunResult struct {
	Limited  bool           // with the semaphore
	API      APIStats       // as the partner counted
	Sent     map[string]int // requests sent, by instance
	Refused  map[string]int // requests refused, by instance
	Fences   int            // permits taken (0 without the semaphore)
	MostHeld int            // the most permits held at once, as Semaphore.Inspect saw them
}

// Result is what the story did: the run with the semaphore, then the one
// without.
type Result struct {
	Limited, Unlimited RunResult
	Keys               []string // the semaphore's keys, deleted at the end of the run
}

// run tells the story and returns what happened.
func run(ctx context.Context, cfg Config) (res Result, err error) {
	if cfg.Duration == 0 {
		cfg.Duration = time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second+2*cfg.Duration)
	defer cancel()
	st, err := demo.Start(ctx, cfg.Out, demo.Servers{RedisAddr: cfg.RedisAddr, NoDatabase: true})
	if err != nil {
		return res, err
	}
	defer st.Close(&err)
	tl := st.Timeline
	res.Keys = st.SemaphoreKeys(semName)

	tl.Printf("parent", "redis: %s", st.Redis.Desc)
	tl.Printf("parent", "the partner API allows %d concurrent requests and refuses more with 429; each takes %v", limit, latency)
	tl.Printf("parent", "%d instances with %d workers each send it orders for %v", len(instanceNames), workers, cfg.Duration)

	tl.Printf("parent", "run 1: every request under a permit of the semaphore %q (%d permits, WithWait)", semName, limit)
	if res.Limited, err = runInstances(ctx, cfg, tl, st.Redis.Addr, st.KeyPrefix, true); err != nil {
		return res, err
	}
	summarize(tl, res.Limited)
	tl.Printf("parent", "run 2: the same instances with the semaphore turned off")
	if res.Unlimited, err = runInstances(ctx, cfg, tl, st.Redis.Addr, st.KeyPrefix, false); err != nil {
		return res, err
	}
	summarize(tl, res.Unlimited)
	tl.Printf("parent", "requests refused by the partner: %d with the semaphore, %d without",
		res.Limited.API.Refused, res.Unlimited.API.Refused)
	return res, nil
}

func summarize(tl *demo.Timeline, r RunResult) {
	with := "with the semaphore"
	if !r.Limited {
		with = "without the semaphore"
	}
	tl.Printf("parent", "%s: %d requests served, %d refused, at most %d in flight at once",
		with, r.API.Calls, r.API.Refused, r.API.Most)
	for _, name := range instanceNames {
		tl.Printf(name, "sent %d, refused %d", r.Sent[name], r.Refused[name])
	}
}

// instance is one instance of the service.
type instance struct {
	name string
	sem  *fencelock.Semaphore // nil: the semaphore is turned off
	api  *apiClient

	mu      sync.Mutex
	sent    int // guarded by mu
	refused int // guarded by mu
	fences  int // guarded by mu
}

// runInstances runs the instances' workers against a fresh partner API
// for cfg.Duration, with or without the semaphore.
func runInstances(ctx context.Context, cfg Config, tl *demo.Timeline, addr, prefix string, limited bool) (res RunResult, err error) {
	res.Limited = limited
	api, err := startPartnerAPI(limit, latency)
	if err != nil {
		return res, err
	}
	defer api.Close()

	var instances []*instance
	for _, name := range instanceNames {
		in := &instance{name: name, api: newAPIClient(api.URL)}
		defer in.api.close()
		if limited {
			rdb, err := demo.NewRedisClient(ctx, addr)
			if err != nil {
				return res, err
			}
			defer rdb.Close()
			locker, err := fencelock.New(rdb, &fencelock.Options{KeyPrefix: prefix, Owner: name})
			if err != nil {
				return res, err
			}
			defer locker.Close()
			in.sem = locker.Semaphore(semName, limit)
		}
		instances = append(instances, in)
	}

	// While the instances run, watch the semaphore's holders.
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan int, 1)
	go func() {
		most := 0
		defer func() { watched <- most }()
		if !limited {
			return
		}
		for watchCtx.Err() == nil {
			if info, err := instances[0].sem.Inspect(watchCtx); err == nil {
				most = max(most, len(info.Holders))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()

	end := time.Now().Add(cfg.Duration)
	var wg sync.WaitGroup
	errs := make([]error, len(instances)*workers)
	for i, in := range instances {
		for w := range workers {
			wg.Go(func() {
				for time.Now().Before(end) && ctx.Err() == nil {
					if err := in.send(ctx); err != nil {
						errs[i*workers+w] = err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	stopWatch()
	res.MostHeld = <-watched
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	res.API = api.stats()
	res.Sent, res.Refused = make(map[string]int), make(map[string]int)
	for _, in := range instances {
		res.Sent[in.name], res.Refused[in.name] = in.sent, in.refused
		res.Fences += in.fences
	}
	if limited {
		tl.Printf("parent", "the semaphore's holders, as Inspect saw them every 5ms: at most %d at once", res.MostHeld)
	}
	return res, nil
}

// send sends one order to the partner: under a permit with the semaphore,
// at once without it. A refused request is counted, not retried; the
// worker then waits as long as a request takes before its next.
func (in *instance) send(ctx context.Context) error {
	call := func(ctx context.Context) error {
		err := in.api.order(ctx)
		in.mu.Lock()
		in.sent++
		if errors.Is(err, errRefused) {
			in.refused++
		}
		in.mu.Unlock()
		if errors.Is(err, errRefused) {
			time.Sleep(latency)
			return nil
		}
		return err
	}
	if in.sem == nil {
		return call(ctx)
	}
	err := in.sem.RunWithLock(ctx, func(ctx context.Context, lease *fencelock.Lease) error {
		in.mu.Lock()
		in.fences++
		in.mu.Unlock()
		return call(ctx)
	}, fencelock.WithWait(waitForPermit))
	if err != nil {
		return fmt.Errorf("%s: a permit of %q: %w", in.name, semName, err)
	}
	return nil
}
