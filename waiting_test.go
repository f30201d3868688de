package fencelock

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
)

// Regression tests for issue 10, section 2: waiting never delays a return.
// Each starts its own redis-server processes.

// acquired is the outcome of an Acquire run by acquireInBackground.
type acquired struct {
	lease *Lease
	err   error
	at    time.Time // when Acquire returned
}

// acquireInBackground runs l.Acquire(name, opts...) on a goroutine and sends
// its outcome. The Acquire's context is cancelled when the test ends, and the
// test's clean-up waits for the goroutine: register it after the Locker's, so
// that it runs before the Locker is closed.
func acquireInBackground(t *testing.T, l *Locker, name string, opts ...Option) <-chan acquired {
	t.Helper()
	actx, cancel := context.WithCancel(context.Background())
	got := make(chan acquired, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lease, err := l.Acquire(actx, name, opts...)
		got <- acquired{lease: lease, err: err, at: time.Now()}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return got
}

// requireAcquired waits up to d for acquireInBackground's outcome and returns
// its lease.
func requireAcquired(t *testing.T, got <-chan acquired, d time.Duration, msg string) acquired {
	t.Helper()
	select {
	case r := <-got:
		require.NoError(t, r.err, msg)
		return r
	case <-time.After(d):
		t.Fatalf("not acquired within %v: %s", d, msg)
		return acquired{}
	}
}

// shardSubscribers returns how many connections of s subscribe channel with
// SSUBSCRIBE.
func shardSubscribers(t *testing.T, s *redistest.Server, channel string) int64 {
	t.Helper()
	v, err := s.Do("PUBSUB", "SHARDNUMSUB", channel)
	require.NoError(t, err)
	reply, _ := v.([]any)
	require.Len(t, reply, 2, "PUBSUB SHARDNUMSUB reply")
	n, _ := reply[1].(int64)
	return n
}

// shardChannels returns how many shard channels s has subscribers on.
func shardChannels(t *testing.T, s *redistest.Server) int {
	t.Helper()
	v, err := s.Do("PUBSUB", "SHARDCHANNELS")
	require.NoError(t, err)
	reply, _ := v.([]any)
	return len(reply)
}

// pubsubConns returns how many connections of s are in pub/sub mode.
func pubsubConns(t *testing.T, s *redistest.Server) int {
	t.Helper()
	v, err := s.Do("CLIENT", "LIST", "TYPE", "pubsub")
	require.NoError(t, err)
	list, _ := v.(string)
	n := 0
	for line := range strings.Lines(list) {
		if strings.TrimSpace(line) != "" {
			n++
		}
	}
	return n
}

// heapAlloc returns the live heap after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// A waiter's subscription connection is killed and new connections hang
// (a SYN black hole or a DNS stall) while its pooled connection still works:
// Acquire must return as soon as the crashed holder's lock expires, with a
// lease that is still held. Issue 10: granted after 1.0s, returned after
// 5.0s, with a lease whose Deadline had passed 2s earlier and whose key was
// gone (leave() unsubscribed under the hub's mutex while go-redis re-dialled
// under its own).
func TestWaitReturnsPromptlyWhileSubscriptionRedialHangs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	holders := e.locker(t, nil)
	proxy := redistest.StartProxy(t, e.srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr}) // go-redis's defaults: ReadTimeout 3s
	t.Cleanup(func() { _ = client.Close() })
	l, err := New(client, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	t.Cleanup(func() { proxy.HangDials(false) }) // before Close: let the hub's hung dials through

	name := uniqueName(t)
	const holderTTL = 1500 * time.Millisecond
	crashed, err := holders.Acquire(ctx, name, WithTTL(holderTTL)) // never released
	require.NoError(t, err)
	expires := time.Now().Add(holderTTL) // at the latest
	got := acquireInBackground(t, l, name, WithWait(3*time.Second), WithTTL(2*time.Second))
	require.Eventually(t, func() bool { return shardSubscribers(t, e.srv, crashed.Key()) == 1 },
		5*time.Second, time.Millisecond, "the waiter subscribes")

	proxy.HangDials(true)
	require.NoError(t, e.admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Err())
	pttl, err := e.admin.PTTL(ctx, crashed.Key()).Result()
	require.NoError(t, err)
	require.Positive(t, pttl, "set-up too slow: the holder's lock expired before the subscription was killed")

	r := requireAcquired(t, got, 10*time.Second, "the waiter did not get the expired lock")
	late := r.at.Sub(expires)
	t.Logf("Acquire returned %v after the holder's lock expired; lease deadline %v after the return",
		late.Round(time.Millisecond), r.lease.Deadline().Sub(r.at).Round(time.Millisecond))
	assert.Less(t, late, 2*time.Second, "Acquire returned late, waiting on the subscription's re-dial (before the fix: 3.5s here, 4s in the issue)")
	assert.True(t, r.at.Before(r.lease.Deadline()), "Acquire returned a lease whose Deadline had passed")
	val, err := e.admin.Get(ctx, r.lease.Key()).Result()
	require.NoError(t, err, "the returned lease's key is gone")
	assert.True(t, strings.HasPrefix(val, r.lease.Token()), "the returned lease's key holds %q", val)
	require.NoError(t, r.lease.Release(ctx))
}

// On a Cluster, waiters on many lock names share one subscription connection
// per node, and the connections close after the linger once the waits end.
// Issue 10: 1000 names waited on at once gave connected_clients:1012, and
// 1000 hubs stayed open 30s after the hand-overs.
func TestClusterWaitersShareOneConnectionPerNode(t *testing.T) {
	t.Parallel()
	c := redistest.StartClusterN(t, 3, 0)
	client := c.Client(nil)
	// Pauses of 30-60s: only wake-ups explain the hand-overs in time.
	l, err := New(client, &Options{MinRetryBackoff: time.Minute, MaxRetryBackoff: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	waitsOf(l).linger = 300 * time.Millisecond

	const names = 1000
	held := make([]*Lease, names)
	for i := range held {
		held[i], err = l.Acquire(ctx, fmt.Sprintf("%s:%d", uniqueName(t), i), WithTTL(5*time.Minute))
		require.NoError(t, err)
	}
	goroutines0, heap0 := runtime.NumGoroutine(), heapAlloc()

	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() }) // before Close
	errs := make([]error, names)
	for i, h := range held {
		wg.Go(func() {
			lease, err := l.Acquire(wctx, h.Name(), WithWait(5*time.Minute))
			if err == nil {
				err = lease.Release(ctx)
			}
			errs[i] = err
		})
	}
	subscribed := func() int {
		n := 0
		for _, m := range c.Masters {
			n += shardChannels(t, m)
		}
		return n
	}
	require.Eventually(t, func() bool { return subscribed() == names }, 30*time.Second, 50*time.Millisecond,
		"every waiter's channel is subscribed")

	conns, clients := 0, 0
	for _, m := range c.Masters {
		conns += pubsubConns(t, m)
		var n int
		_, _ = fmt.Sscan(m.Info("clients")["connected_clients"], &n)
		clients += n
	}
	goroutines1, heap1 := runtime.NumGoroutine(), heapAlloc()
	t.Logf("%d waiters on %d names over 3 masters: %d pub/sub connections, %d connected clients in all",
		names, names, conns, clients)
	t.Logf("goroutines: %d before the waits, %d while waiting (%d besides the %d waiters); "+
		"heap: %d KiB before, %d KiB while waiting (%.1f KiB a waiter)",
		goroutines0, goroutines1, goroutines1-goroutines0-names, names,
		heap0>>10, heap1>>10, (float64(heap1)-float64(heap0))/1024/names)
	assert.LessOrEqual(t, conns, len(c.Masters), "one subscription connection per node, not per lock name")

	start := time.Now()
	for _, h := range held {
		require.NoError(t, h.Release(ctx))
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(25 * time.Second):
		t.Fatal("not every waiter got its lock within 25s of the releases")
	}
	t.Logf("%d hand-overs by wake-up in %v", names, time.Since(start).Round(time.Millisecond))
	for i, err := range errs {
		require.NoError(t, err, "waiter %d", i)
	}

	require.Eventually(t, func() bool { return openHubs(l) == 0 }, 5*time.Second, 10*time.Millisecond,
		"the subscription connections close after the linger")
	require.Eventually(t, func() bool {
		n := 0
		for _, m := range c.Masters {
			n += pubsubConns(t, m)
		}
		return n == 0
	}, 5*time.Second, 10*time.Millisecond, "no pub/sub connection left on the nodes")
	goroutines2, heap2 := runtime.NumGoroutine(), heapAlloc()
	t.Logf("after the hand-overs and the linger: %d goroutines, heap %d KiB", goroutines2, heap2>>10)
}

// A slot migration ends a shard subscription with a server-sent
// sunsubscribe: the waiter must subscribe again on the slot's new owner and
// still be woken by the release, also by one that comes before the new
// subscription.
func TestClusterSlotMigrationResubscribes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		resubscribe bool // release only once the new owner has the subscription
	}{
		{"release after resubscription", true},
		{"release at once", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := redistest.StartClusterN(t, 2, 0)
			client := c.Client(nil)
			l, err := New(client, slowPolling)
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close() })

			held, err := l.Acquire(ctx, uniqueName(t), WithTTL(time.Minute))
			require.NoError(t, err)
			v, err := c.Masters[0].Do("CLUSTER", "KEYSLOT", held.Key())
			require.NoError(t, err)
			slot := int(v.(int64))
			from, to := c.MasterOf(slot), c.Masters[0]
			if from == to {
				to = c.Masters[1]
			}
			got := acquireInBackground(t, l, held.Name(), WithWait(time.Minute))
			require.Eventually(t, func() bool { return shardSubscribers(t, from, held.Key()) == 1 },
				5*time.Second, time.Millisecond, "the waiter subscribes on the slot's owner")

			c.MigrateSlot(slot, to)
			migrated := time.Now()
			assert.Zero(t, shardSubscribers(t, from, held.Key()), "the old owner ended the subscription")
			if tc.resubscribe {
				assert.Eventually(t, func() bool { return shardSubscribers(t, to, held.Key()) == 1 },
					time.Second, 5*time.Millisecond, "the waiter subscribes again on the slot's new owner within a second")
				t.Logf("subscribed on the new owner %v after the migration", time.Since(migrated).Round(time.Millisecond))
			}

			released := time.Now()
			require.NoError(t, held.Release(ctx))
			r := requireAcquired(t, got, 5*time.Second, "the waiter was not woken after its slot moved (backoff 10-20s)")
			t.Logf("acquired %v after the release", r.at.Sub(released).Round(time.Millisecond))
			require.NoError(t, r.lease.Release(ctx))
		})
	}
}

// Pub/sub channels are shared by all databases of a server: a release on
// database 1 must not wake a waiter on database 0 for a lock of the same
// name, while a release on database 0 does.
func TestWakeUpsStayInTheirDatabase(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		hook := &faultHook{}
		waiter := srv.Client(nil)
		waiter.AddHook(hook)
		checkWakeUpsStayInTheirDatabase(t, waiter, hook, srv.Client(nil), srv.Client(&redis.Options{DB: 1}),
			func() bool { return pubsubConns(t, srv) == 1 })
	})
	t.Run("miniredis", func(t *testing.T) {
		// No sharded pub/sub: the classic PUBLISH fallback.
		t.Parallel()
		m, _ := newMini(t)
		client := func(db int) *redis.Client {
			c := redis.NewClient(&redis.Options{Addr: m.Addr(), DB: db})
			t.Cleanup(func() { _ = c.Close() })
			return c
		}
		hook := &faultHook{}
		waiter := client(0)
		waiter.AddHook(hook)
		checkWakeUpsStayInTheirDatabase(t, waiter, hook, client(0), client(1),
			func() bool { return len(m.PubSubChannels("*")) == 1 })
	})
}

// checkWakeUpsStayInTheirDatabase waits through waiter (database 0, with
// hook) for a lock held on database 0 through holder0, releases the lock
// of the same name held on database 1 through holder1, and checks that the
// waiter did not try again; then releases the lock on database 0 and checks
// that the waiter gets it. subscribed reports that the waiter's channel is
// subscribed.
func checkWakeUpsStayInTheirDatabase(t *testing.T, waiter *redis.Client, hook *faultHook,
	holder0, holder1 *redis.Client, subscribed func() bool) {
	t.Helper()
	newLocker := func(c *redis.Client, opts *Options) *Locker {
		l, err := New(c, opts)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	l0, h0, h1 := newLocker(waiter, slowPolling), newLocker(holder0, nil), newLocker(holder1, nil)
	name := uniqueName(t)
	held0, err := h0.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	held1, err := h1.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err, "the same name on database 1 is another lock")

	var attempts atomic.Int64
	hook.set(nil, func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "acquire" {
			attempts.Add(1)
		}
		return nil
	})
	got := acquireInBackground(t, l0, name, WithWait(time.Minute))
	// One busy attempt, the subscription, one more attempt on its
	// confirmation; then the waiter sleeps for 10-20s.
	require.Eventually(t, func() bool { return subscribed() && attempts.Load() >= 2 },
		5*time.Second, time.Millisecond, "the waiter subscribes")
	time.Sleep(100 * time.Millisecond)
	before := attempts.Load()

	require.NoError(t, held1.Release(ctx))
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, before, attempts.Load(), "a release on database 1 woke the waiter on database 0")

	released := time.Now()
	require.NoError(t, held0.Release(ctx))
	r := requireAcquired(t, got, 5*time.Second, "a release on database 0 did not wake its waiter (backoff 10-20s)")
	t.Logf("acquired %v after the release on database 0", r.at.Sub(released).Round(time.Millisecond))
	require.NoError(t, r.lease.Release(ctx))
}
