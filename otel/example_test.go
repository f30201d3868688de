package fencelockotel_test

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/fencelock/fencelock"
	fencelockotel "github.com/fencelock/fencelock/otel"
)

// The Observer reports to the global TracerProvider and MeterProvider, the
// ones the service set up with otel.SetTracerProvider and
// otel.SetMeterProvider.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()

	obs, err := fencelockotel.NewObserver()
	if err != nil {
		panic(err)
	}
	locker, err := fencelock.New(rdb, &fencelock.Options{Observer: obs})
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	// A span fencelock.run, with fencelock.acquire, the work's spans and
	// fencelock.release as its children.
	err = locker.RunWithLock(context.Background(), "settlement", func(ctx context.Context, lease *fencelock.Lease) error {
		return nil // pass ctx to the work's calls: their spans are children of the run's
	})
	if err != nil && !errors.Is(err, fencelock.ErrNotObtained) {
		panic(err)
	}
}

// Providers of its own, and the lock name on the metrics: for a service
// that locks a few fixed names only.
func ExampleWithLockNameAttribute() {
	tp := sdktrace.NewTracerProvider( /* sdktrace.WithBatcher(exporter), ... */ )
	mp := sdkmetric.NewMeterProvider( /* sdkmetric.WithReader(reader), ... */ )
	defer func() { _ = tp.Shutdown(context.Background()) }()
	defer func() { _ = mp.Shutdown(context.Background()) }()

	obs, err := fencelockotel.NewObserver(
		fencelockotel.WithTracerProvider(tp),
		fencelockotel.WithMeterProvider(mp),
		fencelockotel.WithLockNameAttribute(), // "settlement", "nightly-report": never "order:<id>"
	)
	if err != nil {
		panic(err)
	}
	_ = fencelock.Options{Observer: obs}
}
