// Command fips uses fencelock as a program does, for TestFIPS140Only, which
// runs it with GODEBUG=fips140=only: a lock acquired and released, a lease
// renewed by RunWithLock's watchdog, an Acquire waiting until a release
// wakes it, a semaphore permit, a shared lease of a read-write lock, two
// names at once, Inspect and Check on the first server of -addrs, and a
// Redlock over all of them. It prints "ok" when every step did what it
// should, else the first that did not, and exits 1.
package main

import (
	"context"
	"crypto/fips140"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
)

func main() {
	addrs := flag.String("addrs", "", "comma-separated addresses of redis-servers, three at least")
	prefix := flag.String("prefix", "fips", "the lock names' prefix")
	flag.Parse()
	if err := run(strings.Split(*addrs, ","), *prefix); err != nil {
		fmt.Fprintln(os.Stderr, "fips:", err)
		os.Exit(1)
	}
	fmt.Println("ok")
}

func run(addrs []string, prefix string) error {
	if !fips140.Enforced() {
		return errors.New("not in FIPS 140-only mode: run with GODEBUG=fips140=only")
	}
	if len(addrs) < 3 {
		return fmt.Errorf("-addrs: %d addresses, want 3 at least", len(addrs))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clients := make([]redis.UniversalClient, len(addrs))
	for i, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		clients[i] = c
	}
	for _, step := range []struct {
		name string
		run  func(context.Context, redis.UniversalClient, string) error
	}{
		{"lock", lock},
		{"renewal", renewal},
		{"wait", wait},
		{"semaphore", semaphore},
		{"rwlock", rwlock},
		{"several names", several},
		{"inspect and check", inspectAndCheck},
	} {
		if err := step.run(ctx, clients[0], prefix+":"+step.name); err != nil {
			return fmt.Errorf("%s: %w", step.name, err)
		}
	}
	if err := redlock(ctx, clients, prefix+":redlock"); err != nil {
		return fmt.Errorf("redlock: %w", err)
	}
	return nil
}

// lock acquires name and releases it.
func lock(ctx context.Context, c redis.UniversalClient, name string) error {
	l, err := fencelock.New(c, nil)
	if err != nil {
		return err
	}
	defer l.Close()
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		return err
	}
	if lease.Fence() <= 0 {
		return fmt.Errorf("fence %d, want a positive one", lease.Fence())
	}
	return lease.Release(ctx)
}

// renewal runs work under RunWithLock until its watchdog has renewed the
// lease once (a renewal sends the script as EVAL).
func renewal(ctx context.Context, c redis.UniversalClient, name string) error {
	renewed := make(chan struct{})
	var once sync.Once
	l, err := fencelock.New(c, &fencelock.Options{TTL: 300 * time.Millisecond, Observer: notify(func(e fencelock.Event) {
		if e.Op == fencelock.OpRenew && e.Err == nil {
			once.Do(func() { close(renewed) })
		}
	})})
	if err != nil {
		return err
	}
	defer l.Close()
	return l.RunWithLock(ctx, name, func(ctx context.Context, _ *fencelock.Lease) error {
		select {
		case <-renewed:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
}

// wait holds name while a second Locker waits for it, then releases it:
// the wake-up, not a retry, gives the waiter the lock (its backoff is
// longer than its wait).
func wait(ctx context.Context, c redis.UniversalClient, name string) error {
	holder, err := fencelock.New(c, &fencelock.Options{Owner: "holder"})
	if err != nil {
		return err
	}
	defer holder.Close()
	woken := make(chan fencelock.Event, 1)
	waiter, err := fencelock.New(c, &fencelock.Options{Owner: "waiter",
		MinRetryBackoff: time.Hour, MaxRetryBackoff: time.Hour,
		Observer: observer{end: func(e fencelock.Event) {
			if e.Op == fencelock.OpAcquire {
				woken <- e
			}
		}}})
	if err != nil {
		return err
	}
	defer waiter.Close()

	held, err := holder.Acquire(ctx, name)
	if err != nil {
		return err
	}
	type result struct {
		lease *fencelock.Lease
		err   error
	}
	got := make(chan result, 1)
	go func() {
		lease, err := waiter.Acquire(ctx, name, fencelock.WithWait(30*time.Second))
		got <- result{lease, err}
	}()
	for {
		info, err := holder.Inspect(ctx, name)
		if err != nil {
			return err
		}
		if info.Waiters == 1 {
			break
		}
		select {
		case r := <-got:
			return fmt.Errorf("the waiter returned before the release: %v", r.err)
		case <-ctx.Done():
			return fmt.Errorf("no waiter subscribed: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := held.Release(ctx); err != nil {
		return err
	}
	r := <-got
	if r.err != nil {
		return r.err
	}
	if e := <-woken; e.Handoff <= 0 {
		return errors.New("the waiter got the lock by a retry, not by the release's wake-up")
	}
	if r.lease.Fence() <= held.Fence() {
		return fmt.Errorf("the waiter's fence %d is not greater than the holder's %d", r.lease.Fence(), held.Fence())
	}
	return r.lease.Release(ctx)
}

// semaphore takes both permits of a semaphore of two, finds a third busy,
// and gives them back.
func semaphore(ctx context.Context, c redis.UniversalClient, name string) error {
	l, err := fencelock.New(c, nil)
	if err != nil {
		return err
	}
	defer l.Close()
	sem := l.Semaphore(name, 2)
	var leases []*fencelock.Lease
	for range 2 {
		lease, err := sem.Acquire(ctx)
		if err != nil {
			return err
		}
		leases = append(leases, lease)
	}
	if _, err := sem.Acquire(ctx); !errors.Is(err, fencelock.ErrNotObtained) {
		return fmt.Errorf("a third permit of two: %v, want ErrNotObtained", err)
	}
	info, err := sem.Inspect(ctx)
	if err != nil {
		return err
	}
	if len(info.Holders) != 2 {
		return fmt.Errorf("%d holders, want 2", len(info.Holders))
	}
	for _, lease := range leases {
		if err := lease.Release(ctx); err != nil {
			return err
		}
	}
	return nil
}

// rwlock takes two shared leases of a read-write lock, and then, once they
// are released, the exclusive one.
func rwlock(ctx context.Context, c redis.UniversalClient, name string) error {
	l, err := fencelock.New(c, nil)
	if err != nil {
		return err
	}
	defer l.Close()
	rw := l.RWLock(name)
	var leases []*fencelock.Lease
	for range 2 {
		lease, err := rw.AcquireShared(ctx)
		if err != nil {
			return err
		}
		leases = append(leases, lease)
	}
	if _, err := rw.Inspect(ctx); err != nil {
		return err
	}
	for _, lease := range leases {
		if err := lease.Release(ctx); err != nil {
			return err
		}
	}
	return rw.RunWithLock(ctx, func(context.Context, *fencelock.Lease) error { return nil })
}

// several acquires two names in one call.
func several(ctx context.Context, c redis.UniversalClient, name string) error {
	l, err := fencelock.New(c, nil)
	if err != nil {
		return err
	}
	defer l.Close()
	leases, err := l.AcquireAll(ctx, []string{name + ":a", name + ":b"})
	if err != nil {
		return err
	}
	for _, lease := range leases {
		if err := lease.Release(ctx); err != nil {
			return err
		}
	}
	return nil
}

// inspectAndCheck inspects a held lock and checks the deployment.
func inspectAndCheck(ctx context.Context, c redis.UniversalClient, name string) error {
	l, err := fencelock.New(c, nil)
	if err != nil {
		return err
	}
	defer l.Close()
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		return err
	}
	info, err := l.Inspect(ctx, name)
	if err != nil {
		return err
	}
	if !info.Held || info.Fence != lease.Fence() {
		return fmt.Errorf("inspect: %+v, want held with fence %d", info, lease.Fence())
	}
	if _, err := l.Check(ctx); err != nil {
		return err
	}
	return lease.Release(ctx)
}

// redlock acquires name on a quorum of clients, finds it busy for a second
// Locker, and releases it.
func redlock(ctx context.Context, clients []redis.UniversalClient, name string) error {
	a, err := fencelock.NewRedlock(clients, nil)
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := fencelock.NewRedlock(clients, nil)
	if err != nil {
		return err
	}
	defer b.Close()
	lease, err := a.Acquire(ctx, name)
	if err != nil {
		return err
	}
	if _, err := b.Acquire(ctx, name); !errors.Is(err, fencelock.ErrNotObtained) {
		return fmt.Errorf("a second Acquire: %v, want ErrNotObtained", err)
	}
	if err := lease.Release(ctx); err != nil {
		return err
	}
	next, err := b.Acquire(ctx, name)
	if err != nil {
		return err
	}
	if next.Fence() <= lease.Fence() {
		return fmt.Errorf("fence %d after the release, not greater than %d", next.Fence(), lease.Fence())
	}
	return next.Release(ctx)
}

// observer calls end for each ended operation.
type observer struct{ end func(fencelock.Event) }

func (observer) Start(ctx context.Context, _ fencelock.Op, _ string) context.Context { return ctx }
func (o observer) End(_ context.Context, e fencelock.Event)                          { o.end(e) }
func (observer) Notify(context.Context, fencelock.Event)                             {}

// notify is an Observer calling f for each renewal and loss.
type notify func(fencelock.Event)

func (notify) Start(ctx context.Context, _ fencelock.Op, _ string) context.Context { return ctx }
func (notify) End(context.Context, fencelock.Event)                                {}
func (f notify) Notify(_ context.Context, e fencelock.Event)                       { f(e) }
