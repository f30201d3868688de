package fencelock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
)

// Watchdog timing without sleeping through real TTLs: inside a synctest
// bubble the clock is fake and jumps ahead whenever every goroutine of the
// bubble is blocked, while the Redis calls still go to a real redis-server
// (the fake clock waits for them). The server's own TTLs run in real time, so
// a 30s lock never expires on it during these tests.

// bubbleLocker returns a Locker whose client, created inside the bubble, has
// hook; the client is closed before the bubble ends.
func bubbleLocker(t *testing.T, srv *redistest.Server, hook *faultHook, opts *Options) *Locker {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	c.AddHook(hook)
	t.Cleanup(func() { _ = c.Close() })
	l, err := New(c, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestSyncRenewsEveryThirdOfTTL(t *testing.T) {
	srv := redistest.Start(t)
	synctest.Test(t, func(t *testing.T) {
		hook := &faultHook{}
		var renewals atomic.Int64
		hook.set(nil, func(_ context.Context, cmd redis.Cmder) error {
			if scriptName(cmd) == "extend" {
				renewals.Add(1)
			}
			return nil
		})
		l := bubbleLocker(t, srv, hook, nil) // TTL 30s, renewal every 10s
		start := time.Now()
		err := l.RunWithLock(ctx, "sync-renew", func(ctx context.Context, lease *Lease) error {
			time.Sleep(5*time.Minute + time.Second) // ten TTLs of work
			return ctx.Err()
		})
		require.NoError(t, err)
		assert.Equal(t, 5*time.Minute+time.Second, time.Since(start))
		assert.Equal(t, int64(30), renewals.Load(), "one renewal every 10s over 5 minutes")
	})
}

func TestSyncHungRenewalCancelsAtDeadline(t *testing.T) {
	srv := redistest.Start(t)
	synctest.Test(t, func(t *testing.T) {
		hook := &faultHook{}
		l := bubbleLocker(t, srv, hook, nil)
		release := make(chan struct{})
		var leaseDeadline, cancelledAt time.Time
		var acquired time.Time
		err := l.RunWithLock(ctx, "sync-hung", func(ctx context.Context, lease *Lease) error {
			acquired = lease.acquired
			leaseDeadline = lease.Deadline()
			// From now on every renewal hangs until the test lets it go.
			hook.set(func(_ context.Context, cmd redis.Cmder) error {
				if scriptName(cmd) == "extend" {
					<-release
					return errors.New("test: hung call finally failed")
				}
				return nil
			}, nil)
			<-ctx.Done()
			cancelledAt = time.Now()
			close(release)
			hook.set(nil, nil)
			return nil
		})
		require.ErrorIs(t, err, ErrLost)
		assert.Equal(t, leaseDeadline, cancelledAt, "cancelled exactly at the local deadline")
		assert.Equal(t, 30*time.Second-300*time.Millisecond-2*time.Millisecond, cancelledAt.Sub(acquired))
	})
}

func TestSyncFailingRenewalsRetryThenLose(t *testing.T) {
	srv := redistest.Start(t)
	synctest.Test(t, func(t *testing.T) {
		hook := &faultHook{}
		l := bubbleLocker(t, srv, hook, nil)
		var attempts atomic.Int64
		down := errors.New("test: connection refused")
		var deadline, cancelledAt time.Time
		err := l.RunWithLock(ctx, "sync-failing", func(ctx context.Context, lease *Lease) error {
			deadline = lease.Deadline()
			hook.set(func(_ context.Context, cmd redis.Cmder) error {
				if scriptName(cmd) == "extend" {
					attempts.Add(1)
					return down
				}
				return nil
			}, nil)
			<-ctx.Done()
			cancelledAt = time.Now()
			hook.set(nil, nil)
			return nil
		})
		require.ErrorIs(t, err, ErrLost)
		require.ErrorIs(t, err, down, "the cause wraps the last renewal error")
		assert.Equal(t, deadline, cancelledAt)
		// First renewal at 10s, then retries after 0.3-0.6s, 0.6-1.25s, ...
		// capped at 2.5-5s, until the deadline at 29.698s.
		assert.GreaterOrEqual(t, attempts.Load(), int64(6), "retried")
		assert.LessOrEqual(t, attempts.Load(), int64(16), "with a backoff, not a busy loop")
	})
}

func TestSyncRecoversAfterTransientFailure(t *testing.T) {
	srv := redistest.Start(t)
	synctest.Test(t, func(t *testing.T) {
		hook := &faultHook{}
		l := bubbleLocker(t, srv, hook, nil)
		var failures atomic.Int64
		err := l.RunWithLock(ctx, "sync-transient", func(ctx context.Context, lease *Lease) error {
			hook.set(func(_ context.Context, cmd redis.Cmder) error {
				if scriptName(cmd) == "extend" && failures.Add(1) <= 3 {
					return errors.New("test: blip")
				}
				return nil
			}, nil)
			time.Sleep(2 * time.Minute)
			return ctx.Err()
		})
		require.NoError(t, err, "three failed renewals within the TTL are not a loss")
		assert.Greater(t, failures.Load(), int64(3))
	})
}
