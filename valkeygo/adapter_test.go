package fencevalkey_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valkey-io/valkey-go"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/redistest"
	fencevalkey "github.com/fencelock/fencelock/valkeygo"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// valkey-go closes a Cluster node's old connection 5s after the
		// slot map moved off it, whatever the client's Close.
		goleak.IgnoreAnyFunction("github.com/valkey-io/valkey-go.(*clusterClient)._refresh.func2"),
		goleak.IgnoreAnyFunction("github.com/valkey-io/valkey-go.(*clusterClient).redirectOrNew.func1"),
		// A Cluster's client refreshes its slot map after a random delay
		// (up to a second) once a node failed or redirected, also after Close.
		goleak.IgnoreAnyFunction("github.com/valkey-io/valkey-go.(*call).DelayDo.func1"))
}

// newClient returns a valkey-go client of addrs, closed when the test ends.
func newClient(t *testing.T, addrs ...string) valkey.Client {
	t.Helper()
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: addrs, DisableCache: true})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// newLocker returns a Locker on c, closed when the test ends.
func newLocker(t *testing.T, c valkey.Client, opts *fencelock.Options) *fencelock.Locker {
	t.Helper()
	l, err := fencevalkey.New(c, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// goRedisLocker returns a go-redis Locker on the server at addr.
func goRedisLocker(t *testing.T, s *redistest.Server, opts *fencelock.Options) *fencelock.Locker {
	t.Helper()
	l, err := fencelock.New(s.Client(nil), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestAcquireExtendRelease(t *testing.T) {
	s := redistest.Start(t)
	l := newLocker(t, newClient(t, s.Addr), nil)
	ctx := ctxFor(t, 10*time.Second)

	lease, err := l.Acquire(ctx, "job", fencelock.WithTTL(2*time.Second))
	require.NoError(t, err)
	assert.Positive(t, lease.Fence())
	_, err = l.Acquire(ctx, "job")
	require.ErrorIs(t, err, fencelock.ErrNotObtained)
	var busy *fencelock.BusyError
	require.ErrorAs(t, err, &busy)

	require.NoError(t, lease.Extend(ctx, 5*time.Second))
	ttl, err := lease.TTL(ctx)
	require.NoError(t, err)
	assert.Greater(t, ttl, 3*time.Second)

	info, err := l.Inspect(ctx, "job")
	require.NoError(t, err)
	assert.True(t, info.Held)

	require.NoError(t, lease.Release(ctx))
	again, err := l.Acquire(ctx, "job")
	require.NoError(t, err)
	assert.Greater(t, again.Fence(), lease.Fence())
	require.NoError(t, again.Release(ctx))
}

func TestRunWithLock(t *testing.T) {
	s := redistest.Start(t)
	l := newLocker(t, newClient(t, s.Addr), &fencelock.Options{TTL: time.Second})
	ctx := ctxFor(t, 10*time.Second)
	var fence int64
	err := l.RunWithLock(ctx, "run", func(ctx context.Context, lease *fencelock.Lease) error {
		fence = lease.Fence()
		time.Sleep(1500 * time.Millisecond) // past the TTL: the watchdog extends it
		return ctx.Err()
	})
	require.NoError(t, err)
	assert.Positive(t, fence)
	info, err := l.Inspect(ctx, "run")
	require.NoError(t, err)
	assert.False(t, info.Held)
}

// A lock taken through go-redis excludes one through valkey-go, and the
// other way round; fences increase across the clients.
func TestSameLocksAsGoRedis(t *testing.T) {
	s := redistest.Start(t)
	ru := newLocker(t, newClient(t, s.Addr), nil)
	gr := goRedisLocker(t, s, nil)
	ctx := ctxFor(t, 10*time.Second)

	a, err := gr.Acquire(ctx, "shared")
	require.NoError(t, err)
	_, err = ru.Acquire(ctx, "shared")
	require.ErrorIs(t, err, fencelock.ErrNotObtained)
	require.NoError(t, a.Release(ctx))

	b, err := ru.Acquire(ctx, "shared")
	require.NoError(t, err)
	assert.Greater(t, b.Fence(), a.Fence())
	_, err = gr.Acquire(ctx, "shared")
	require.ErrorIs(t, err, fencelock.ErrNotObtained)
	require.NoError(t, b.Release(ctx))

	c, err := gr.Acquire(ctx, "shared")
	require.NoError(t, err)
	assert.Greater(t, c.Fence(), b.Fence())
	require.NoError(t, c.Release(ctx))
}

// wakeOpts poll so rarely that a waiter is only woken in time by a release's
// wake-up, through pub/sub.
var wakeOpts = &fencelock.Options{MinRetryBackoff: 10 * time.Second, MaxRetryBackoff: 10 * time.Second}

// wokenBy checks that a waiter on waiter is woken by holder's release long
// before its next poll.
func wokenBy(t *testing.T, holder, waiter *fencelock.Locker, name string, opts ...fencelock.Option) {
	t.Helper()
	ctx := ctxFor(t, 20*time.Second)
	held, err := holder.Acquire(ctx, name, opts...)
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		lease, err := waiter.Acquire(ctx, name, append([]fencelock.Option{fencelock.WithWait(15 * time.Second)}, opts...)...)
		if err == nil {
			err = lease.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(500 * time.Millisecond) // the waiter tried once, subscribed, and waits
	start := time.Now()
	require.NoError(t, held.Release(ctx))
	select {
	case err := <-got:
		require.NoError(t, err)
		assert.Less(t, time.Since(start), 3*time.Second)
	case <-time.After(8 * time.Second):
		t.Fatal("the waiter was not woken by the release")
	}
}

func TestWokenByGoRedisRelease(t *testing.T) {
	s := redistest.Start(t)
	wokenBy(t, goRedisLocker(t, s, wakeOpts), newLocker(t, newClient(t, s.Addr), wakeOpts), "wake")
}

func TestWakesGoRedisWaiter(t *testing.T) {
	s := redistest.Start(t)
	wokenBy(t, newLocker(t, newClient(t, s.Addr), wakeOpts), goRedisLocker(t, s, wakeOpts), "wake")
}

func TestFairWaiting(t *testing.T) {
	s := redistest.Start(t)
	l := newLocker(t, newClient(t, s.Addr), wakeOpts)
	wokenBy(t, l, l, "fair", fencelock.WithFair())

	// Waiters in line take the lock in their order of arrival.
	ctx := ctxFor(t, 30*time.Second)
	held, err := l.Acquire(ctx, "line", fencelock.WithFair())
	require.NoError(t, err)
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			lease, err := l.Acquire(ctx, "line", fencelock.WithFair(), fencelock.WithWait(20*time.Second))
			if !assert.NoError(t, err) {
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			time.Sleep(50 * time.Millisecond)
			assert.NoError(t, lease.Release(ctx))
		})
		time.Sleep(300 * time.Millisecond) // in line before the next
	}
	require.NoError(t, held.Release(ctx))
	wg.Wait()
	assert.Equal(t, []int{0, 1, 2}, order)
}

func TestReplicas(t *testing.T) {
	s := redistest.Start(t)
	r := redistest.StartReplica(t, s)
	l := newLocker(t, newClient(t, s.Addr), &fencelock.Options{Replicas: 1, ReplicaTimeout: 200 * time.Millisecond})
	ctx := ctxFor(t, 20*time.Second)
	lease, err := l.Acquire(ctx, "replicated")
	require.NoError(t, err)
	require.NoError(t, lease.Extend(ctx, 10*time.Second))
	require.NoError(t, lease.Release(ctx))

	r.Pause()
	defer r.Resume()
	_, err = l.Acquire(ctx, "replicated2")
	require.ErrorIs(t, err, fencelock.ErrUnavailable)
	assert.Contains(t, err.Error(), "replicas")
}

// Every call stops at its context's deadline on a server that does not answer.
func TestDeadline(t *testing.T) {
	s := redistest.Start(t)
	l := newLocker(t, newClient(t, s.Addr), nil)
	ctx := ctxFor(t, 10*time.Second)
	lease, err := l.Acquire(ctx, "warm")
	require.NoError(t, err)
	require.NoError(t, lease.Release(ctx))

	s.Pause()
	defer s.Resume()
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = l.Acquire(short, "paused")
	took := time.Since(start)
	require.Error(t, err)
	assert.Less(t, took, time.Second, "Acquire returned %v after its 300ms deadline: %v", took, err)
	assert.Greater(t, took, 250*time.Millisecond)
}

func TestCheckHealthy(t *testing.T) {
	s := redistest.Start(t)
	l := newLocker(t, newClient(t, s.Addr), nil)
	findings, err := l.Check(ctxFor(t, 20*time.Second))
	require.NoError(t, err)
	for _, f := range findings {
		assert.NotEqual(t, fencelock.SeverityCritical, f.Severity, "%+v", f)
	}
}

func TestNilClient(t *testing.T) {
	_, err := fencevalkey.New(nil, nil)
	require.ErrorIs(t, err, fencelock.ErrInvalid)
	assert.Equal(t, "fencelock: invalid argument: nil valkey-go client", err.Error())

	_, err = fencevalkey.NewRedlock(nil, nil)
	require.ErrorIs(t, err, fencelock.ErrInvalid)
	_, err = fencevalkey.NewRedlock([]valkey.Client{nil}, nil)
	require.ErrorIs(t, err, fencelock.ErrInvalid)
}

func TestSameClientTwice(t *testing.T) {
	s := redistest.Start(t)
	c := newClient(t, s.Addr)
	_, err := fencevalkey.NewRedlock([]valkey.Client{c, c}, nil)
	require.ErrorIs(t, err, fencelock.ErrInvalid)
	assert.Contains(t, err.Error(), "valkey-go clients 0 and 1 are the same client")
}

func TestClosedClient(t *testing.T) {
	s := redistest.Start(t)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{s.Addr}, DisableCache: true})
	require.NoError(t, err)
	l := newLocker(t, c, nil)
	c.Close()
	_, err = l.Acquire(ctxFor(t, 5*time.Second), "closed")
	require.ErrorIs(t, err, fencelock.ErrMisconfigured)
	assert.Contains(t, err.Error(), "valkey-go client is closed")
}

// Redis refusing the lock's commands is ErrMisconfigured, at once, with
// Redis's word and the fix, as on go-redis.
func TestRefusals(t *testing.T) {
	aclUser := func(t *testing.T, rules ...any) valkey.Client {
		t.Helper()
		s := redistest.Start(t)
		_, err := s.Do(append([]any{"ACL", "SETUSER", "app", "on", ">pw"}, rules...)...)
		require.NoError(t, err)
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{s.Addr}, Username: "app", Password: "pw", DisableCache: true})
		require.NoError(t, err)
		t.Cleanup(c.Close)
		return c
	}
	withKey := func(t *testing.T, args ...any) valkey.Client {
		t.Helper()
		s := redistest.Start(t)
		_, err := s.Do(args...)
		require.NoError(t, err)
		return newClient(t, s.Addr)
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, name string) valkey.Client
		code  string // in the message: what Redis said
		fix   string
	}{
		{"WRONGPASS", func(t *testing.T, _ string) valkey.Client {
			// valkey-go authenticates as it dials, so NewClient itself fails
			// with a wrong password: change it under a client that has
			// connected, and end its connections.
			s := redistest.Start(t)
			_, err := s.Do("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all")
			require.NoError(t, err)
			c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{s.Addr}, Username: "app", Password: "pw", DisableCache: true})
			require.NoError(t, err)
			t.Cleanup(c.Close)
			_, err = s.Do("ACL", "SETUSER", "app", "resetpass", ">other")
			require.NoError(t, err)
			_, err = s.Do("CLIENT", "KILL", "USER", "app")
			require.NoError(t, err)
			return c
		}, "WRONGPASS", "Password"},
		{"NOPERM without scripting", func(t *testing.T, _ string) valkey.Client {
			return aclUser(t, "~*", "&*", "+@all", "-@scripting")
		}, "NOPERM", "ACL"},
		{"NOPERM outside the key patterns", func(t *testing.T, _ string) valkey.Client {
			return aclUser(t, "~other:*", "&*", "+@all")
		}, "NOPERM", "ACL"},
		{"WRONGTYPE on the lock key", func(t *testing.T, name string) valkey.Client {
			return withKey(t, "HSET", "lock:{"+name+"}", "a", "b")
		}, "WRONGTYPE", "refusal"},
		{"unknown command", func(t *testing.T, _ string) valkey.Client {
			s := redistest.Start(t, "--rename-command", "evalsha", "", "--rename-command", "eval", "")
			return newClient(t, s.Addr)
		}, "unknown command", "scripting"},
		{"script error", func(t *testing.T, name string) valkey.Client {
			return withKey(t, "SET", "lock:{"+name+"}:fence", "not a number, and a long one")
		}, "not an integer", "refusal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "refused"
			l := newLocker(t, tc.setup(t, name), nil)
			start := time.Now()
			_, err := l.Acquire(ctxFor(t, 10*time.Second), name, fencelock.WithWait(2*time.Second))
			require.ErrorIs(t, err, fencelock.ErrMisconfigured)
			assert.NotErrorIs(t, err, fencelock.ErrUnavailable)
			assert.Less(t, time.Since(start), time.Second, "not retried")
			assert.Contains(t, err.Error(), tc.code)
			if tc.fix != "refusal" {
				assert.Contains(t, err.Error(), tc.fix)
			}
			assert.NotContains(t, err.Error(), "\n")
		})
	}
}

func TestSemaphoreAndRWLock(t *testing.T) {
	s := redistest.Start(t)
	l := newLocker(t, newClient(t, s.Addr), nil)
	ctx := ctxFor(t, 10*time.Second)

	sem := l.Semaphore("pool", 2)
	a, err := sem.Acquire(ctx)
	require.NoError(t, err)
	b, err := sem.Acquire(ctx)
	require.NoError(t, err)
	_, err = sem.Acquire(ctx)
	require.ErrorIs(t, err, fencelock.ErrNotObtained)
	info, err := sem.Inspect(ctx)
	require.NoError(t, err)
	assert.Len(t, info.Holders, 2)
	require.NoError(t, a.Release(ctx))
	require.NoError(t, b.Release(ctx))

	rw := l.RWLock("doc")
	r1, err := rw.AcquireShared(ctx)
	require.NoError(t, err)
	r2, err := rw.AcquireShared(ctx)
	require.NoError(t, err)
	_, err = rw.Acquire(ctx)
	require.ErrorIs(t, err, fencelock.ErrNotObtained)
	require.NoError(t, r1.Release(ctx))
	require.NoError(t, r2.Release(ctx))
	w, err := rw.Acquire(ctx)
	require.NoError(t, err)
	_, err = rw.AcquireShared(ctx)
	require.ErrorIs(t, err, fencelock.ErrNotObtained)
	require.NoError(t, w.Release(ctx))
}

func TestAcquireAll(t *testing.T) {
	s := redistest.Start(t)
	l := newLocker(t, newClient(t, s.Addr), nil)
	ctx := ctxFor(t, 10*time.Second)
	leases, err := l.AcquireAll(ctx, []string{"a", "b", "c"})
	require.NoError(t, err)
	require.Len(t, leases, 3)
	_, err = l.Acquire(ctx, "b")
	require.ErrorIs(t, err, fencelock.ErrNotObtained)
	err = l.RunWithLocks(ctx, []string{"c", "d"}, func(context.Context, []*fencelock.Lease) error { return nil })
	require.ErrorIs(t, err, fencelock.ErrNotObtained)
	for _, lease := range leases {
		require.NoError(t, lease.Release(ctx))
	}
	require.NoError(t, l.RunWithLocks(ctx, []string{"c", "d"}, func(context.Context, []*fencelock.Lease) error { return nil }))
}

func TestRedlock(t *testing.T) {
	var clients []valkey.Client
	var servers []*redistest.Server
	for range 3 {
		s := redistest.Start(t)
		servers = append(servers, s)
		clients = append(clients, newClient(t, s.Addr))
	}
	l, err := fencevalkey.NewRedlock(clients, wakeOpts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	ctx := ctxFor(t, 20*time.Second)
	lease, err := l.Acquire(ctx, "quorum")
	require.NoError(t, err)
	_, err = l.Acquire(ctx, "quorum")
	require.ErrorIs(t, err, fencelock.ErrNotObtained)
	require.NoError(t, lease.Extend(ctx, 10*time.Second))
	require.NoError(t, lease.Release(ctx))

	// A minority down is not an outage.
	servers[2].Kill()
	lease, err = l.Acquire(ctx, "quorum")
	require.NoError(t, err)
	require.NoError(t, lease.Release(ctx))

	// The same locks as a go-redis Redlock's.
	var gr []redis.UniversalClient
	for _, s := range servers[:2] {
		gr = append(gr, s.Client(nil))
	}
	down := redis.NewClient(&redis.Options{Addr: servers[2].Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = down.Close() })
	gl, err := fencelock.NewRedlock(append(gr, down), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = gl.Close() })
	held, err := gl.Acquire(ctx, "mixed")
	require.NoError(t, err)
	_, err = l.Acquire(ctx, "mixed")
	require.ErrorIs(t, err, fencelock.ErrNotObtained)
	require.NoError(t, held.Release(ctx))
}

func TestCluster(t *testing.T) {
	cl := redistest.StartClusterN(t, 3, 0)
	c := newClient(t, cl.Addrs()...)
	l := newLocker(t, c, wakeOpts)
	ctx := ctxFor(t, 30*time.Second)

	// Names in different slots, on different masters.
	var leases []*fencelock.Lease
	for i := range 6 {
		lease, err := l.Acquire(ctx, fmt.Sprintf("name-%d", i))
		require.NoError(t, err)
		leases = append(leases, lease)
	}
	for _, lease := range leases {
		require.NoError(t, lease.Release(ctx))
	}

	all, err := l.AcquireAll(ctx, []string{"x", "y", "z"})
	require.NoError(t, err)
	for _, lease := range all {
		require.NoError(t, lease.Release(ctx))
	}

	// A wake-up through sharded pub/sub, from a go-redis Cluster client.
	gl, err := fencelock.New(cl.Client(nil), wakeOpts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = gl.Close() })
	wokenBy(t, gl, l, "cluster-wake")
	wokenBy(t, l, gl, "cluster-wake-2")

	findings, err := l.Check(ctx)
	require.NoError(t, err)
	for _, f := range findings {
		assert.NotEqual(t, fencelock.SeverityCritical, f.Severity, "%+v", f)
	}
}

func TestClusterReplicas(t *testing.T) {
	cl := redistest.StartClusterN(t, 3, 1)
	l := newLocker(t, newClient(t, cl.Addrs()...), &fencelock.Options{Replicas: 1, ReplicaTimeout: 500 * time.Millisecond})
	ctx := ctxFor(t, 30*time.Second)
	for i := range 4 {
		lease, err := l.Acquire(ctx, fmt.Sprintf("r-%d", i))
		require.NoError(t, err)
		require.NoError(t, lease.Extend(ctx, 10*time.Second))
		require.NoError(t, lease.Release(ctx))
	}
}

// After a slot moves, Run with Replicas follows MOVED to the new master, and
// a waiter whose sharded subscription the server ended (sunsubscribe) is
// subscribed again on the new master and woken there.
func TestClusterSlotMoves(t *testing.T) {
	cl := redistest.StartClusterN(t, 3, 1)
	c := newClient(t, cl.Addrs()...)
	l := newLocker(t, c, &fencelock.Options{Replicas: 1, ReplicaTimeout: 500 * time.Millisecond,
		MinRetryBackoff: 10 * time.Second, MaxRetryBackoff: 10 * time.Second})
	ctx := ctxFor(t, 60*time.Second)
	name := "moving"
	slot := keys.Slot(name)

	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	require.NoError(t, lease.Release(ctx))

	// A waiter subscribed on the slot's master.
	held, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctx, name, fencelock.WithWait(30*time.Second))
		if err == nil {
			err = lease.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(500 * time.Millisecond)

	from := cl.MasterOf(slot)
	var to *redistest.Server
	for _, m := range cl.Masters {
		if m != from {
			to = m
			break
		}
	}
	cl.MigrateSlot(slot, to)
	time.Sleep(time.Second) // the waiter's hub subscribes on the new master

	// The holder's release goes to the new master, past MOVED.
	require.NoError(t, held.Release(ctx))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(8 * time.Second):
		t.Fatal("the waiter was not woken after the slot moved")
	}

	lease, err = l.Acquire(ctx, name)
	require.NoError(t, err)
	require.NoError(t, lease.Extend(ctx, 5*time.Second))
	require.NoError(t, lease.Release(ctx))
}

// Inspect counts the waiters subscribed to a lock's channel (PUBSUB
// SHARDNUMSUB on its node).
func TestInspectWaiters(t *testing.T) {
	cl := redistest.StartClusterN(t, 3, 0)
	l := newLocker(t, newClient(t, cl.Addrs()...), wakeOpts)
	ctx := ctxFor(t, 20*time.Second)
	held, err := l.Acquire(ctx, "watched")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lease, err := l.Acquire(ctx, "watched", fencelock.WithWait(10*time.Second))
		if assert.NoError(t, err) {
			assert.NoError(t, lease.Release(ctx))
		}
	}()
	require.Eventually(t, func() bool {
		info, err := l.Inspect(ctx, "watched")
		return err == nil && info.Waiters == 1
	}, 5*time.Second, 50*time.Millisecond)
	require.NoError(t, held.Release(ctx))
	<-done
}

func TestSentinel(t *testing.T) {
	m := redistest.Start(t)
	redistest.StartReplica(t, m)
	sentinel := redistest.StartSentinel(t, m, 1)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{sentinel.Addr},
		Sentinel: valkey.SentinelOption{MasterSet: "fl"}, DisableCache: true})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	l := newLocker(t, c, &fencelock.Options{Replicas: 1, MinRetryBackoff: 10 * time.Second, MaxRetryBackoff: 10 * time.Second})
	ctx := ctxFor(t, 20*time.Second)
	lease, err := l.Acquire(ctx, "sentinel")
	require.NoError(t, err)
	require.NoError(t, lease.Release(ctx))
	wokenBy(t, goRedisLocker(t, m, wakeOpts), l, "sentinel-wake")
	findings, err := l.Check(ctx)
	require.NoError(t, err)
	for _, f := range findings {
		assert.NotEqual(t, fencelock.SeverityCritical, f.Severity, "%+v", f)
	}
}

// A subscription connection the server ends is opened again: the waiter is
// still woken by a release.
func TestSubscriptionReopened(t *testing.T) {
	s := redistest.Start(t)
	l := newLocker(t, newClient(t, s.Addr), wakeOpts)
	gr := goRedisLocker(t, s, nil)
	ctx := ctxFor(t, 30*time.Second)
	held, err := gr.Acquire(ctx, "reopened")
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctx, "reopened", fencelock.WithWait(25*time.Second))
		if err == nil {
			err = lease.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(500 * time.Millisecond)
	_, err = s.Do("CLIENT", "KILL", "TYPE", "pubsub")
	require.NoError(t, err)
	time.Sleep(time.Second) // the hub subscribes again
	start := time.Now()
	require.NoError(t, held.Release(ctx))
	select {
	case err := <-got:
		require.NoError(t, err)
		assert.Less(t, time.Since(start), 3*time.Second)
	case <-time.After(8 * time.Second):
		t.Fatal("the waiter was not woken after its subscription broke")
	}
}

// Check reports what the ACL refuses, with the rule to grant.
func TestCheckNoPerm(t *testing.T) {
	s := redistest.Start(t)
	_, err := s.Do("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-@scripting")
	require.NoError(t, err)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{s.Addr}, Username: "app", Password: "pw", DisableCache: true})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	l := newLocker(t, c, nil)
	findings, err := l.Check(ctxFor(t, 20*time.Second))
	require.NoError(t, err)
	var critical []fencelock.Finding
	for _, f := range findings {
		if f.Severity == fencelock.SeverityCritical {
			critical = append(critical, f)
		}
	}
	require.NotEmpty(t, critical, "%+v", findings)
	assert.Contains(t, fmt.Sprintf("%+v", critical), "NOPERM")
}

// A server that is down is ErrUnavailable (with valkey-go's error: EOF on the
// connection that broke, then the dial's).
func TestServerDown(t *testing.T) {
	s := redistest.Start(t)
	l := newLocker(t, newClient(t, s.Addr), nil)
	s.Kill()
	_, err := l.Acquire(ctxFor(t, 5*time.Second), "down")
	require.ErrorIs(t, err, fencelock.ErrUnavailable)
}

func TestClosedClusterClient(t *testing.T) {
	cl := redistest.StartClusterN(t, 3, 0)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: cl.Addrs(), DisableCache: true})
	require.NoError(t, err)
	l := newLocker(t, c, &fencelock.Options{Replicas: 1})
	c.Close()
	_, err = l.Acquire(ctxFor(t, 5*time.Second), "closed")
	require.ErrorIs(t, err, fencelock.ErrMisconfigured)
	assert.Contains(t, err.Error(), "valkey-go client is closed")
}

// Where the server has no sharded pub/sub (as before Redis 7), waiters
// subscribe with SUBSCRIBE and are woken by PUBLISH.
func TestClassicPubSub(t *testing.T) {
	s := redistest.Start(t, "--rename-command", "ssubscribe", "", "--rename-command", "spublish", "")
	l := newLocker(t, newClient(t, s.Addr), wakeOpts)
	wokenBy(t, l, l, "classic")
	wokenBy(t, goRedisLocker(t, s, wakeOpts), l, "classic-2")
}

// A client on RESP2 (its pub/sub on a connection of its own) works the same.
func TestRESP2(t *testing.T) {
	s := redistest.Start(t)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{s.Addr}, AlwaysRESP2: true, DisableCache: true})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	l := newLocker(t, c, wakeOpts)
	wokenBy(t, goRedisLocker(t, s, wakeOpts), l, "resp2")
	findings, err := l.Check(ctxFor(t, 20*time.Second))
	require.NoError(t, err)
	for _, f := range findings {
		assert.NotEqual(t, fencelock.SeverityCritical, f.Severity, "%+v", f)
	}
}

// A release on a connection the server closed while it was idle (a
// failover, a restart, CLIENT KILL) is sent again on a new one: valkey-go
// finds such a connection dead only by the EOF of the next command on it,
// and resends no write. Without the resend the release failed and the lock
// waited out its TTL (the chaos suite's S3 on valkey-go).
func TestReleaseAfterIdleConnectionClosed(t *testing.T) {
	s := redistest.Start(t)
	l := newLocker(t, newClient(t, s.Addr), nil)
	ctx := ctxFor(t, 10*time.Second)
	for _, name := range []string{"a", "b", "c"} {
		lease, err := l.Acquire(ctx, name, fencelock.WithTTL(time.Minute))
		require.NoError(t, err)
		_, err = s.Do("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
		require.NoError(t, err)
		require.NoError(t, lease.Release(ctx), "a release on a connection the server closed")
		info, err := l.Inspect(ctx, name)
		require.NoError(t, err)
		assert.False(t, info.Held, name)
	}
}
