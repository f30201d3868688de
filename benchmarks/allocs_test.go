package benchmarks

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/redistest"
)

// raceEnabled is set by race_test.go under -race.
var raceEnabled bool

// TestAllocsPerCycle holds the line of BenchmarkUncontended's allocs/op:
// an uncontended acquire+release allocates at most 32 times on go-redis's
// default options, 25 with ContextTimeoutEnabled (client and library
// together; deterministic, unlike its time).
func TestAllocsPerCycle(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector adds allocations (sync.Pool drops items at random)")
	}
	srv := redistest.Start(t)
	for _, c := range []struct {
		name string
		opts redis.Options
		max  float64
	}{
		{"default options", redis.Options{}, 32},
		{"ContextTimeoutEnabled", redis.Options{ContextTimeoutEnabled: true}, 25},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := c.opts
			opts.Addr = srv.Addr
			client := redis.NewClient(&opts)
			t.Cleanup(func() { _ = client.Close() })
			l, err := fencelock.New(client, nil)
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
