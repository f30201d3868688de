package benchmarks

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/redistest"
	fencerueidis "github.com/fencelock/fencelock/rueidis"
)

// raceEnabled is set by race_test.go under -race.
var raceEnabled bool

// TestAllocsPerCycle holds the line of BenchmarkUncontended's allocs/op:
// an uncontended acquire+release allocates at most 32 times on go-redis's
// default options, 25 with ContextTimeoutEnabled, 20 on a rueidis client
// with default options through fencerueidis (client and library together;
// deterministic, unlike its time).
func TestAllocsPerCycle(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector adds allocations (sync.Pool drops items at random)")
	}
	srv := redistest.Start(t)
	goRedis := func(opts redis.Options) func(t *testing.T) (*fencelock.Locker, error) {
		return func(t *testing.T) (*fencelock.Locker, error) {
			opts.Addr = srv.Addr
			client := redis.NewClient(&opts)
			t.Cleanup(func() { _ = client.Close() })
			return fencelock.New(client, nil)
		}
	}
	for _, c := range []struct {
		name string
		open func(t *testing.T) (*fencelock.Locker, error)
		max  float64
	}{
		{"default options", goRedis(redis.Options{}), 32},
		{"ContextTimeoutEnabled", goRedis(redis.Options{ContextTimeoutEnabled: true}), 25},
		{"rueidis", func(t *testing.T) (*fencelock.Locker, error) {
			client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(client.Close)
			return fencerueidis.New(client, nil)
		}, 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, err := c.open(t)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			ctx := context.Background()
			var failed error
			cycle := func() {
				lease, err := l.Acquire(ctx, "allocs")
				if err == nil {
					err = lease.Release(ctx)
				}
				if err != nil && failed == nil {
					failed = err
				}
			}
			for range 10 { // dials, loads the scripts, starts the workers
				cycle()
			}
			allocs := testing.AllocsPerRun(200, cycle)
			if failed != nil {
				t.Fatal(failed)
			}
			if allocs > c.max {
				t.Errorf("%.1f allocations per acquire+release, more than %v", allocs, c.max)
			}
			t.Logf("%.1f allocations per acquire+release", allocs)
		})
	}
}
