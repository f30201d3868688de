package benchmarks

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
)

// The read-write lock's and AcquireAll's benchmarks interleave what they
// compare, as BenchmarkInterleaved does: each iteration runs one
// acquire+release of every variant, starting with a different one each
// time, and times each on its own, so that all of them see the same load.
// Each variant's mean is reported as NAME-ns/op, and that of its acquire
// alone as NAME-acq-ns/op; ns/op is for one turn of all of them.

// BenchmarkRWLock takes and releases an RWLock nobody else wants: shared
// (AcquireShared) and exclusive (Acquire), against a plain lock's Acquire.
func BenchmarkRWLock(b *testing.B) {
	l := kindsLocker(b)
	rw := l.RWLock("bench:rwlock")
	interleave(b, []variant{
		{"lock", func(ctx context.Context) ([]*fencelock.Lease, error) { return one(l.Acquire(ctx, "bench:lock")) }},
		{"exclusive", func(ctx context.Context) ([]*fencelock.Lease, error) { return one(rw.Acquire(ctx)) }},
		{"shared", func(ctx context.Context) ([]*fencelock.Lease, error) { return one(rw.AcquireShared(ctx)) }},
	})
}

// BenchmarkAcquireAll takes n names and releases them: with one AcquireAll
// (one script), against n Acquire calls one after the other. Both release
// the n leases one by one.
func BenchmarkAcquireAll(b *testing.B) {
	l := kindsLocker(b)
	for _, n := range []int{2, 10} {
		names := make([]string, n)
		for i := range names {
			names[i] = "bench:account:" + strconv.Itoa(i)
		}
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			interleave(b, []variant{
				{"single", func(ctx context.Context) ([]*fencelock.Lease, error) {
					leases := make([]*fencelock.Lease, 0, n)
					for _, name := range names {
						lease, err := l.Acquire(ctx, name)
						if err != nil {
							return nil, err
						}
						leases = append(leases, lease)
					}
					return leases, nil
				}},
				{"all", func(ctx context.Context) ([]*fencelock.Lease, error) { return l.AcquireAll(ctx, names) }},
			})
		})
	}
}

func kindsLocker(b *testing.B) *fencelock.Locker {
	srv := startServer(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	b.Cleanup(func() { _ = client.Close() })
	l, err := fencelock.New(client, &fencelock.Options{TTL: ttl})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	return l
}

// A variant is one way to take the leases that a benchmark compares.
type variant struct {
	name    string
	acquire func(context.Context) ([]*fencelock.Lease, error)
}

func one(lease *fencelock.Lease, err error) ([]*fencelock.Lease, error) {
	return []*fencelock.Lease{lease}, err
}

// interleave runs the variants' acquire+release cycles in turns and
// reports each one's mean as NAME-ns/op.
func interleave(b *testing.B, vs []variant) {
	ctx := context.Background()
	cycle := func(v variant) (acq, all time.Duration) {
		t0 := time.Now()
		leases, err := v.acquire(ctx)
		if err != nil {
			b.Fatalf("%s: %v", v.name, err)
		}
		acq = time.Since(t0)
		for _, lease := range leases {
			if err := lease.Release(ctx); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
		}
		return acq, time.Since(t0)
	}
	for _, v := range vs { // dial, load the scripts
		cycle(v)
	}
	acquired := make([]time.Duration, len(vs))
	total := make([]time.Duration, len(vs))
	turns := 0
	for b.Loop() {
		for i := range vs {
			j := (turns + i) % len(vs)
			acq, all := cycle(vs[j])
			acquired[j] += acq
			total[j] += all
		}
		turns++
	}
	for i, v := range vs {
		b.ReportMetric(float64(total[i].Nanoseconds())/float64(turns), v.name+"-ns/op")
		b.ReportMetric(float64(acquired[i].Nanoseconds())/float64(turns), v.name+"-acq-ns/op")
	}
}
