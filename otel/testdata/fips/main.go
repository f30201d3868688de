// Command fips uses fencelockotel as a program does, for TestFIPS140Only,
// which runs it with GODEBUG=fips140=only: a Locker observed through the
// OpenTelemetry SDK acquires, runs work under a lock and releases, and its
// spans and metrics are recorded. It prints "ok" when every step did what
// it should, else the first that did not, and exits 1.
package main

import (
	"context"
	"crypto/fips140"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fencelock/fencelock"
	fencelockotel "github.com/fencelock/fencelock/otel"
)

func main() {
	addr := flag.String("addr", "", "a redis-server's address")
	name := flag.String("name", "fips", "the lock's name")
	flag.Parse()
	if err := run(*addr, *name); err != nil {
		fmt.Fprintln(os.Stderr, "fips:", err)
		os.Exit(1)
	}
	fmt.Println("ok")
}

func run(addr, name string) error {
	if !fips140.Enforced() {
		return errors.New("not in FIPS 140-only mode: run with GODEBUG=fips140=only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(ctx)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	obs, err := fencelockotel.NewObserver(fencelockotel.WithTracerProvider(tp), fencelockotel.WithMeterProvider(mp))
	if err != nil {
		return err
	}

	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	locker, err := fencelock.New(client, &fencelock.Options{Observer: obs})
	if err != nil {
		return err
	}
	defer locker.Close()
	lease, err := locker.Acquire(ctx, name)
	if err != nil {
		return err
	}
	if err := lease.Release(ctx); err != nil {
		return err
	}
	if err := locker.RunWithLock(ctx, name, func(context.Context, *fencelock.Lease) error { return nil }); err != nil {
		return err
	}

	// acquire, release; run with its acquire and release.
	if n := len(spans.Ended()); n != 5 {
		return fmt.Errorf("%d spans ended, want 5", n)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return err
	}
	if len(rm.ScopeMetrics) == 0 {
		return errors.New("no metrics recorded")
	}
	return nil
}
