package fencelock

import (
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRetriedAcquireReturnsItsOwnFence(t *testing.T) {
	// A retry after a lost reply returns the fence issued to its token,
	// kept in the lock's value, not the counter's current value (which
	// another acquisition, or anything else, may have moved).
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	h := l.store.Lock(store.Spec{Name: uniqueName(t), Token: keys.NewToken(), TTL: time.Minute, Owner: l.opts.Owner})
	first := h.Acquire(ctx)
	require.NoError(t, first.Err)
	require.True(t, first.OK)
	counter := h.Key() + keys.Fence
	require.NoError(t, e.admin.Set(ctx, counter, "9000000000000000000", 0).Err())
	again := h.Acquire(ctx)
	require.NoError(t, again.Err)
	require.True(t, again.OK)
	assert.Equal(t, first.Fence, again.Fence, "the fence issued to this token")
	got, err := e.admin.Get(ctx, counter).Result()
	require.NoError(t, err)
	assert.Equal(t, "9000000000000000000", got, "a retry issues no new fence")
}

func TestFenceOverflowIsAnErrorNotADuplicate(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	_, fenceKey := l.keys(name)

	require.NoError(t, e.admin.Set(ctx, fenceKey, math.MaxInt64-1, 0).Err())
	last, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, int64(math.MaxInt64), last.Fence(), "the last fence there is")
	require.NoError(t, last.Release(ctx))

	for range 2 {
		_, err = l.Acquire(ctx, name)
		require.ErrorIs(t, err, ErrMisconfigured, "no fence left to issue")
		assert.NotErrorIs(t, err, ErrUnavailable)
		assert.Contains(t, err.Error(), "maximum")
		n, err := e.admin.Exists(ctx, last.Key()).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "no lock is taken without a fence")
		got, err := e.admin.Get(ctx, fenceKey).Result()
		require.NoError(t, err)
		assert.Equal(t, strconv.FormatInt(math.MaxInt64, 10), got, "the counter is unchanged")
	}
}

func TestFencesIncreaseAfterTheCounterExpired(t *testing.T) {
	// The counter is kept for FenceRetention after the name's last
	// acquisition; fences issued after it expired are still greater,
	// because each is floored by the server's clock.
	e := newEnv(t, nil)
	const retention = 100 * time.Millisecond
	l := e.locker(t, &Options{FenceRetention: retention})
	name := uniqueName(t)
	_, fenceKey := l.keys(name)
	var last int64
	for i := range 3 {
		before := time.Now()
		lease, err := l.Acquire(ctx, name)
		require.NoError(t, err)
		assert.Greater(t, lease.Fence(), last, "acquisition %d", i)
		last = lease.Fence()
		pttl, err := e.admin.PTTL(ctx, fenceKey).Result()
		require.NoError(t, err)
		if pttl == -2*time.Nanosecond { // no such key: go-redis's -2
			// Already expired: only once the retention has passed since
			// the acquisition (a busy machine read it 100ms late).
			assert.GreaterOrEqual(t, time.Since(before), retention, "the counter gone before its retention passed")
		} else {
			assert.Positive(t, pttl, "the counter expires")
			assert.LessOrEqual(t, pttl, retention)
		}
		require.NoError(t, lease.Release(ctx))
		require.Eventually(t, func() bool {
			n, err := e.admin.Exists(ctx, fenceKey).Result()
			return err == nil && n == 0
		}, 5*time.Second, 5*time.Millisecond, "the counter expired")
	}
}

func TestManyNamesLeaveNothingBehind(t *testing.T) {
	// 100 000 distinct names acquired and released (as a service locking
	// order:<id> does): once the retention has passed, every key the library
	// wrote is gone and Redis's memory is back at its baseline. Under the
	// race detector, a fifth of them (scaleLocks): 100 000 took two
	// minutes of the package's ten on a loaded machine.
	if testing.Short() {
		t.Skip("100 000 acquisitions; skipped with -short")
	}
	names := int64(scaleLocks(100_000))
	e := newEnv(t, nil)
	const retention = 3 * time.Second
	l := e.locker(t, &Options{FenceRetention: retention, ReleaseTimeout: time.Second})
	// The memory the data takes: used_memory without the connections'
	// buffers, which are sized by the traffic of the moment.
	memory := func() int64 {
		t.Helper()
		info := e.srv.Info("memory")
		n, err := strconv.ParseInt(info["used_memory"], 10, 64)
		require.NoError(t, err)
		clients, err := strconv.ParseInt(info["mem_clients_normal"], 10, 64)
		require.NoError(t, err)
		return n - clients
	}
	const workers = 16
	run := func(prefix string, names int64) {
		t.Helper()
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for range workers {
			wg.Go(func() {
				for i := next.Add(1); i <= names; i = next.Add(1) {
					lease, err := l.Acquire(ctx, prefix+strconv.FormatInt(i, 10))
					if err == nil {
						err = lease.Release(ctx)
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	drained := func() bool { return e.admin.DBSize(ctx).Val() == 0 }

	// The baseline: the same connections, the scripts cached, nothing left.
	run("warm-up:", 10*workers)
	require.Eventually(t, drained, 30*time.Second, 50*time.Millisecond)
	before := memory()

	start := time.Now()
	run("order:", names)
	elapsed := time.Since(start)
	peakKeys, peak := e.admin.DBSize(ctx).Val(), memory()
	require.Eventually(t, drained, 30*time.Second, 50*time.Millisecond, "every key expires after the retention")
	after := memory()
	t.Logf("%d names acquired and released in %v; right after: %d keys (those of the last %v), memory (used_memory less client buffers) %d bytes; "+
		"before: %d bytes; once expired: %d bytes", names, elapsed.Round(time.Millisecond), peakKeys, retention, peak, before, after)
	assert.Less(t, after-before, int64(256<<10), "memory back at its baseline (within 256 KiB)")
}

// TestResendNeverShortensALease: a request of a lease's token that comes
// again after an Extend to a longer TTL (a late copy of its acquire, or a
// retry whose first copy was applied) leaves the longer expiry: it made
// the lease's server expiry earlier than its deadline.
func TestResendNeverShortensALease(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	const short = 2 * time.Second
	resend := func(t *testing.T, lease *Lease) {
		t.Helper()
		a := lease.h.Acquire(ctx) // as the first copy was sent, with its TTL
		require.NoError(t, a.Err)
		require.True(t, a.OK, "the token holds it")
	}
	check := func(t *testing.T, lease *Lease) {
		t.Helper()
		require.NoError(t, lease.Extend(ctx, time.Minute))
		resend(t, lease)
		ttl, err := lease.TTL(ctx)
		require.NoError(t, err)
		assert.Greater(t, ttl, 50*time.Second, "the server's expiry after the resend")
		require.NoError(t, lease.Release(ctx))
	}
	t.Run("lock", func(t *testing.T) {
		lease, err := l.Acquire(ctx, uniqueName(t), WithTTL(short))
		require.NoError(t, err)
		check(t, lease)
	})
	t.Run("semaphore", func(t *testing.T) {
		lease, err := l.Semaphore(uniqueName(t), 2).Acquire(ctx, WithTTL(short))
		require.NoError(t, err)
		check(t, lease)
	})
	t.Run("shared", func(t *testing.T) {
		lease, err := l.RWLock(uniqueName(t)).AcquireShared(ctx, WithTTL(short))
		require.NoError(t, err)
		check(t, lease)
	})
	t.Run("exclusive", func(t *testing.T) {
		lease, err := l.RWLock(uniqueName(t)).Acquire(ctx, WithTTL(short))
		require.NoError(t, err)
		check(t, lease)
	})
	t.Run("all", func(t *testing.T) {
		names := []string{uniqueName(t) + "-a", uniqueName(t) + "-b"}
		leases, err := l.AcquireAll(ctx, names, WithTTL(short))
		require.NoError(t, err)
		for _, lease := range leases {
			require.NoError(t, lease.Extend(ctx, time.Minute))
		}
		// The set's script again, for the same tokens, with the first TTL.
		var ks []any
		argv := []any{store.Millis(short), store.Millis(l.opts.FenceRetention), l.opts.Owner}
		for _, lease := range leases {
			for _, k := range keys.ForLease(l.opts.KeyPrefix, lease.Name(), []byte(lease.Token())) {
				ks = append(ks, k)
			}
			argv = append(argv, lease.Token())
		}
		_, err = l.single.Run(ctx, script.MultiAcquire, false, ks, argv...)
		require.NoError(t, err)
		for _, lease := range leases {
			ttl, err := lease.TTL(ctx)
			require.NoError(t, err)
			assert.Greater(t, ttl, 50*time.Second, "%s's expiry after the resend", lease.Name())
			require.NoError(t, lease.Release(ctx))
		}
	})
}
