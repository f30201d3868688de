package fencelock

// Issue 34, bug 1: releasing several leases is bounded once, by the call's
// context and one ReleaseTimeout, whatever their number.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
)

// manyNames returns n lock names unique to the test.
func manyNames(t *testing.T, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%04d", uniqueName(t), i)
	}
	return names
}

// TestRunWithLocksReleaseBoundOnce: with Redis hung (SIGSTOP) while the
// work of a RunWithLocks over 400 names runs, the call returns when its
// context ends, not one release grace per name later (2.2-2.7s late before).
func TestRunWithLocksReleaseBoundOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range clientOptionCases[:3] {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := tc.opts
			e := newEnv(t, &opts)
			l := e.locker(t, nil)
			t.Cleanup(e.srv.Resume) // before the Locker's Close
			c, cancel := context.WithCancel(context.Background())
			defer cancel()
			var cancelled time.Time
			err := l.RunWithLocks(c, manyNames(t, 400), func(ctx context.Context, leases []*Lease) error {
				e.srv.Pause()
				cancelled = time.Now()
				cancel()
				return nil
			})
			returned := time.Since(cancelled)
			require.NoError(t, err, "the work returned nil; the releases go on in the background")
			assert.Less(t, returned, deadlineSlack, "RunWithLocks returns when its ctx ends, whatever the number of names")
		})
	}
}

// TestRunWithLocksReleaseTimeoutOnce: with no deadline, the releases of a
// RunWithLocks over 3 names on a hung Redis take one ReleaseTimeout, not
// one each.
func TestRunWithLocksReleaseTimeoutOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	const releaseTimeout = time.Second
	l := e.locker(t, &Options{ReleaseTimeout: releaseTimeout})
	t.Cleanup(e.srv.Resume)
	var paused time.Time
	err := l.RunWithLocks(context.Background(), manyNames(t, 3), func(ctx context.Context, leases []*Lease) error {
		e.srv.Pause()
		paused = time.Now()
		return nil
	})
	took := time.Since(paused)
	require.NoError(t, err, "the work returned nil; the releases go on in the background")
	assert.Less(t, took, releaseTimeout+deadlineSlack, "one ReleaseTimeout for all the names")
	e.srv.Resume()
	require.NoError(t, l.Close())
	for _, name := range manyNames(t, 3) {
		assert.False(t, keyExists(t, e.srv, "lock:{"+name+"}"), "released in the background once Redis answers")
	}
}

// TestAcquireAllGiveBackBoundOnce: an AcquireAll over 400 names on a Ring
// that waits for its last name, busy, and is ended while Redis hangs,
// returns when its context ends, not after one release grace per name it
// gives back (2.3s late before).
func TestAcquireAllGiveBackBoundOnce(t *testing.T) {
	t.Parallel()
	a, b := redistest.Start(t), redistest.Start(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr}})
	t.Cleanup(func() { _ = ring.Close() })
	l, err := New(ring, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	t.Cleanup(a.Resume)
	t.Cleanup(b.Resume)

	names := manyNames(t, 400)
	last := names[len(names)-1] // sorted last: taken last
	held, err := l.Acquire(ctx, last, WithTTL(time.Minute))
	require.NoError(t, err)
	shard, err := ring.GetShardClientForKey(held.Key())
	require.NoError(t, err)

	c, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := l.AcquireAll(c, names, WithWait(time.Minute))
		done <- err
	}()
	// It waits for the last name once subscribed to its releases, the 399
	// others held.
	require.Eventually(t, func() bool {
		n, err := shard.Do(ctx, "PUBSUB", "SHARDNUMSUB", held.Key()).Slice()
		return err == nil && len(n) == 2 && n[1] == int64(1)
	}, 30*time.Second, time.Millisecond)
	a.Pause()
	b.Pause()
	cancelled := time.Now()
	cancel()
	err = <-done
	returned := time.Since(cancelled)
	require.ErrorIs(t, err, context.Canceled)
	assert.Less(t, returned, deadlineSlack, "AcquireAll returns when its ctx ends, whatever the names it gives back")
}
