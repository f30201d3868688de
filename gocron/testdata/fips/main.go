// Command fips uses fencegocron as a program does, for TestFIPS140Only,
// which runs it with GODEBUG=fips140=only: a gocron scheduler with the
// Locker runs a job once under its lock, and the job's task gets the run's
// lease. It prints "ok" when every step did what it should, else the first
// that did not, and exits 1.
package main

import (
	"context"
	"crypto/fips140"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	fencegocron "github.com/fencelock/fencelock/gocron"
)

func main() {
	addr := flag.String("addr", "", "a redis-server's address")
	name := flag.String("name", "fips", "the job's name, and its lock's")
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
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	fl, err := fencelock.New(client, nil)
	if err != nil {
		return err
	}
	defer fl.Close()
	locker := fencegocron.NewLocker(fl)
	defer locker.Close()
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		return err
	}
	defer func() { _ = s.Shutdown() }() // before locker.Close

	ran := make(chan int64, 1)
	_, err = s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
		locker.Task(func(_ context.Context, lease *fencelock.Lease) error {
			ran <- lease.Fence()
			return nil
		}),
		gocron.WithName(name))
	if err != nil {
		return err
	}
	s.Start()
	select {
	case fence := <-ran:
		if fence <= 0 {
			return fmt.Errorf("the job's lease has fence %d, want a positive one", fence)
		}
	case <-ctx.Done():
		return fmt.Errorf("the job did not run: %w", ctx.Err())
	}
	return s.Shutdown()
}
