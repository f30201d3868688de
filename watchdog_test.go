package fencelock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func testLogger() (*slog.Logger, *syncBuffer) {
	var b syncBuffer
	return slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug})), &b
}

// countScript counts the runs of the named script that reached the server.
func countScript(e *env, name string) *atomic.Int64 {
	var n atomic.Int64
	e.hook.set(nil, func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == name {
			n.Add(1)
		}
		return nil
	})
	return &n
}

func TestRunWithLockRenewsWhileWorkRuns(t *testing.T) {
	e := newEnv(t, nil)
	log, logs := testLogger()
	l := e.locker(t, &Options{TTL: 300 * time.Millisecond, Logger: log})
	renewals := countScript(e, "extend")
	name := uniqueName(t)

	var key string
	err := l.RunWithLock(ctx, name, func(ctx context.Context, lease *Lease) error {
		key = lease.Key()
		time.Sleep(time.Second) // more than three TTLs
		if err := ctx.Err(); err != nil {
			return err
		}
		got, err := e.admin.Get(ctx, lease.Key()).Result()
		if err != nil {
			return err
		}
		assert.True(t, strings.HasPrefix(got, lease.Token()+" "), "still held after three TTLs")
		return nil
	})
	require.NoError(t, err)
	assert.GreaterOrEqual(t, renewals.Load(), int64(5), "renewed about every 100ms over 1s")
	n, err := e.admin.Exists(ctx, key).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "released after the work")
	assert.Contains(t, logs.String(), "fencelock: acquired")
	assert.Contains(t, logs.String(), "fencelock: released")
	assert.NotContains(t, logs.String(), "lost")
}

func TestRunWithLockReturnsWorkError(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	boom := errors.New("boom")
	err := l.RunWithLock(ctx, uniqueName(t), func(context.Context, *Lease) error { return boom })
	assert.Equal(t, boom, err, "the work's own error, unwrapped")
	n, err := e.admin.Exists(ctx, "lock:{"+uniqueName(t)+"}").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "released after a failed work")
}

func TestRunWithLockTakenOverOrDeleted(t *testing.T) {
	for _, tc := range []struct {
		name   string
		meddle func(e *env, key string) error
	}{
		{"overwritten", func(e *env, key string) error { return e.admin.Set(ctx, key, "someone-else", time.Minute).Err() }},
		{"deleted", func(e *env, key string) error { return e.admin.Del(ctx, key).Err() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			var onLost atomic.Int32
			log, logs := testLogger()
			l := e.locker(t, &Options{TTL: 3 * time.Second, Logger: log, OnLost: func(lease *Lease, cause error) {
				assert.ErrorIs(t, cause, ErrLost)
				onLost.Add(1)
			}})
			var lag time.Duration
			var key string
			err := l.RunWithLock(ctx, uniqueName(t), func(ctx context.Context, lease *Lease) error {
				key = lease.Key()
				meddled := time.Now()
				if err := tc.meddle(e, lease.Key()); err != nil {
					return err
				}
				<-ctx.Done()
				lag = time.Since(meddled)
				assert.ErrorIs(t, context.Cause(ctx), ErrLost)
				return ctx.Err()
			})
			require.ErrorIs(t, err, ErrLost, "RunWithLock reports the loss")
			require.ErrorIs(t, err, context.Canceled, "joined with the work's error")
			assert.Less(t, lag, 2*time.Second, "noticed within one renewal interval (1s) plus slack")
			assert.Equal(t, int32(1), onLost.Load())
			assert.Contains(t, logs.String(), "level=ERROR msg=\"fencelock: lease lost\"")
			if tc.name == "overwritten" {
				got, err := e.admin.Get(ctx, key).Result()
				require.NoError(t, err)
				assert.Equal(t, "someone-else", got, "the new holder's lock is left alone")
			}
		})
	}
}

func TestLostWhenLossHiddenByNilWork(t *testing.T) {
	// The work ignores its context and returns nil: RunWithLock still tells
	// the caller that exclusion may have been broken.
	e := newEnv(t, nil)
	l := e.locker(t, &Options{TTL: 300 * time.Millisecond})
	err := l.RunWithLock(ctx, uniqueName(t), func(ctx context.Context, lease *Lease) error {
		require.NoError(t, e.admin.Del(ctx, lease.Key()).Err())
		time.Sleep(500 * time.Millisecond)
		return nil
	})
	require.ErrorIs(t, err, ErrLost)
}

func TestRedisStoppedMidWorkCancelsBeforeExpiry(t *testing.T) {
	e := newEnv(t, &redis.Options{MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	const ttl = 3 * time.Second
	log, logs := testLogger()
	l := e.locker(t, &Options{TTL: ttl, ReleaseTimeout: 200 * time.Millisecond, Logger: log})

	var acquired, cancelled, deadline time.Time
	err := l.RunWithLock(ctx, uniqueName(t), func(ctx context.Context, lease *Lease) error {
		acquired = lease.acquired
		e.srv.Kill()
		<-ctx.Done()
		cancelled = time.Now()
		deadline = lease.Deadline()
		return context.Cause(ctx)
	})
	require.ErrorIs(t, err, ErrLost)
	require.ErrorIs(t, err, ErrUnavailable, "the cause wraps the last renewal error")
	assert.False(t, cancelled.Before(deadline), "not cancelled while the lease was still certainly held")
	// The deadline the watchdog cancels at comes before the server can
	// expire the lock; that the cancellation comes exactly then is
	// TestSyncFailingRenewalsRetryThenLose's (a fake clock): here the
	// watchdog's timer fires when the machine runs it (330ms late once,
	// under load), so it must only come within a TTL of it.
	assert.True(t, deadline.Before(acquired.Add(ttl)), "deadline %v after the request was sent, before the server's expiry at %v",
		deadline.Sub(acquired), ttl)
	assert.True(t, cancelled.Before(deadline.Add(ttl)), "cancelled %v after the deadline", cancelled.Sub(deadline))
	t.Logf("cancelled %v after the request was sent; the server could expire the lock at %v", cancelled.Sub(acquired), ttl)
	assert.Contains(t, logs.String(), "level=WARN msg=\"fencelock: renewal failed\"")
}

func TestHungRenewalDoesNotDelayCancellation(t *testing.T) {
	// SIGSTOP the server: the renewal call hangs (go-redis's ReadTimeout is
	// 3s by default and ContextTimeoutEnabled is off), but the work context
	// is cancelled on the local deadline timer, before the TTL runs out.
	e := newEnv(t, nil)
	const ttl = 3 * time.Second // drift allowance 32ms: room for scheduling delays under -race
	l := e.locker(t, &Options{TTL: ttl})
	var acquired, cancelled time.Time
	err := l.RunWithLock(ctx, uniqueName(t), func(ctx context.Context, lease *Lease) error {
		acquired = lease.acquired
		e.srv.Pause()
		t.Cleanup(e.srv.Resume)
		<-ctx.Done()
		cancelled = time.Now()
		e.srv.Resume()
		return nil
	})
	require.ErrorIs(t, err, ErrLost)
	assert.True(t, cancelled.Before(acquired.Add(ttl)), "cancelled %v after acquisition, TTL %v", cancelled.Sub(acquired), ttl)
}

func TestNoRenewalAfterRelease(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, &Options{TTL: time.Second, RenewInterval: 5 * time.Millisecond})
	renewals := countScript(e, "extend")
	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	workCtx := lease.KeepAlive(ctx)
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, lease.Release(ctx))
	after := renewals.Load()
	assert.Positive(t, after, "the watchdog renewed")
	time.Sleep(100 * time.Millisecond)
	assert.Equal(t, after, renewals.Load(), "no renewal after Release")
	assert.ErrorIs(t, context.Cause(workCtx), ErrNotHeld, "Release cancels the KeepAlive context")
	assert.NotErrorIs(t, context.Cause(workCtx), ErrLost)

	again := lease.KeepAlive(ctx)
	assert.Error(t, again.Err(), "KeepAlive after Release returns a cancelled context")
}

func TestCancelledRequestStillReleases(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil) // TTL 30s: a lock left behind would be visible
	name := uniqueName(t)
	reqCtx, cancel := context.WithCancel(ctx)
	err := l.RunWithLock(reqCtx, name, func(ctx context.Context, lease *Lease) error {
		cancel() // the client hung up
		<-ctx.Done()
		return ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, ErrLost)
	n, err := e.admin.Exists(ctx, "lock:{"+name+"}").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "released although the request context was cancelled")
}

func TestPanicReleasesThenRepanics(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	func() {
		defer func() {
			assert.Equal(t, "boom", recover(), "the panic continues")
		}()
		_ = l.RunWithLock(ctx, name, func(context.Context, *Lease) error { panic("boom") })
	}()
	n, err := e.admin.Exists(ctx, "lock:{"+name+"}").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "released before the panic continued")
}

func TestRunWithLockNotRun(t *testing.T) {
	e := newEnv(t, &redis.Options{MaxRetries: -1})
	l := e.locker(t, nil)
	name := uniqueName(t)
	ran := false
	work := func(context.Context, *Lease) error { ran = true; return nil }

	assert.ErrorIs(t, l.RunWithLock(ctx, name, nil), ErrInvalid)
	assert.ErrorIs(t, l.RunWithLock(ctx, "", work), ErrInvalid)

	held, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	assert.ErrorIs(t, l.RunWithLock(ctx, name, work), ErrNotObtained)
	assert.False(t, ran, "work does not run when the lock is busy")
	require.NoError(t, held.Release(ctx))

	e.srv.Kill()
	err = l.RunWithLock(ctx, name, work)
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.False(t, ran, "fail-closed: work does not run when Redis is down")
}

func TestFailOpen(t *testing.T) {
	e := newEnv(t, &redis.Options{MaxRetries: -1})
	log, logs := testLogger()
	l := e.locker(t, &Options{FailOpen: true, Logger: log})
	name := uniqueName(t)

	held, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	ran := false
	err = l.RunWithLock(ctx, name, func(context.Context, *Lease) error { ran = true; return nil })
	assert.ErrorIs(t, err, ErrNotObtained, "fail-open does not bypass a busy lock")
	assert.False(t, ran)
	_ = held

	e.srv.Kill()
	boom := errors.New("boom")
	err = l.RunWithLock(ctx, name, func(ctx context.Context, lease *Lease) error {
		ran = true
		assert.True(t, lease.Degraded())
		assert.Zero(t, lease.Fence())
		assert.ErrorIs(t, lease.Extend(ctx, time.Minute), ErrNotHeld)
		return boom
	})
	assert.True(t, ran, "fail-open: work runs when Redis is down")
	assert.Equal(t, boom, err)
	assert.Contains(t, logs.String(), "level=ERROR msg=\"fencelock: redis unavailable, running without the lock (fail-open)\"")
}

func TestMaxHold(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, &Options{TTL: 300 * time.Millisecond, MaxHold: 500 * time.Millisecond})
	start := time.Now()
	err := l.RunWithLock(ctx, uniqueName(t), func(ctx context.Context, lease *Lease) error {
		<-ctx.Done() // a hung work
		return nil
	})
	held := time.Since(start)
	require.ErrorIs(t, err, ErrLost)
	assert.Contains(t, err.Error(), "MaxHold")
	assert.GreaterOrEqual(t, held, 500*time.Millisecond, "renewed until MaxHold")
	assert.Less(t, held, 2*time.Second, "then stopped within about a TTL")
}

func TestKeepAliveWithAcquire(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, &Options{TTL: 300 * time.Millisecond})
	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	workCtx := lease.KeepAlive(ctx)
	second := lease.KeepAlive(ctx) // a second call shares the watchdog
	time.Sleep(700 * time.Millisecond)
	require.NoError(t, workCtx.Err(), "kept alive past two TTLs")
	require.NoError(t, e.admin.Del(ctx, lease.Key()).Err())
	<-workCtx.Done()
	<-second.Done()
	assert.ErrorIs(t, context.Cause(workCtx), ErrLost)
	assert.ErrorIs(t, context.Cause(second), ErrLost)
	assert.ErrorIs(t, lease.Release(ctx), ErrNotHeld)
	assert.ErrorIs(t, context.Cause(lease.KeepAlive(ctx)), ErrLost, "KeepAlive on a lost lease")
}

func TestRenewIntervalValidation(t *testing.T) {
	e := newEnv(t, nil)
	_, err := New(e.client, &Options{TTL: time.Second, RenewInterval: time.Second})
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = New(e.client, &Options{MaxHold: -1})
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = New(e.client, &Options{RenewInterval: -1})
	assert.ErrorIs(t, err, ErrInvalid)
	l := e.locker(t, &Options{RenewInterval: time.Second})
	_, err = l.Acquire(ctx, "x", WithTTL(time.Second))
	assert.ErrorIs(t, err, ErrInvalid, "RenewInterval not shorter than the call's TTL")
}

func TestSlowRoundTripsDoNotStretchRenewals(t *testing.T) {
	// Renewals are scheduled from the previous renewal's start: with a
	// 240ms round trip and TTL 600ms (interval 200ms) the lease survives. If
	// the interval were counted from each reply, the second renewal would
	// be answered at 880ms, after the deadline at 792ms.
	e := newEnv(t, nil)
	l := e.locker(t, &Options{TTL: 600 * time.Millisecond})
	warm, err := l.Acquire(ctx, uniqueName(t)) // cache the scripts: no NOSCRIPT round trip
	require.NoError(t, err)
	require.NoError(t, warm.Extend(ctx, time.Second))
	require.NoError(t, warm.Release(ctx))
	e.hook.set(func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "extend" {
			time.Sleep(240 * time.Millisecond)
		}
		return nil
	}, nil)
	err = l.RunWithLock(ctx, uniqueName(t), func(ctx context.Context, lease *Lease) error {
		time.Sleep(1500 * time.Millisecond)
		return ctx.Err()
	})
	require.NoError(t, err)
}

func TestClockBehindSystemTime(t *testing.T) {
	// A lease's deadline is on the Locker's clock, which need not agree with
	// time.Now: renewals must still get the time that is left.
	e := newEnv(t, nil)
	l := e.locker(t, &Options{TTL: 300 * time.Millisecond,
		Clock: fakeNow(func() time.Time { return time.Now().Add(-time.Hour) })})
	err := l.RunWithLock(ctx, uniqueName(t), func(ctx context.Context, lease *Lease) error {
		time.Sleep(time.Second)
		return ctx.Err()
	})
	require.NoError(t, err, "renewed on a healthy network although the clock is an hour behind")
}

func TestShorterExtendIsTracked(t *testing.T) {
	// A user's Extend that shortens the TTL moves the deadline earlier; the
	// watchdog must follow it, not the deadline it knew before.
	e := newEnv(t, nil)
	l := e.locker(t, &Options{TTL: 3 * time.Second})
	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	workCtx := lease.KeepAlive(ctx)
	e.hook.set(onScript("extend", errReplyLost), nil) // from now on every extend fails before it is sent
	require.ErrorIs(t, lease.Extend(ctx, 200*time.Millisecond), ErrUnavailable)
	// Outcome unknown: the server may expire the lock in 200ms.
	select {
	case <-workCtx.Done():
		assert.ErrorIs(t, context.Cause(workCtx), ErrLost)
		assert.False(t, time.Now().Before(lease.Deadline()), "not before the (moved) deadline")
	case <-time.After(2 * time.Second):
		t.Fatal("the work context outlived the shortened deadline by more than 1.8s")
	}
	e.hook.set(nil, nil)
	_ = lease.Release(ctx)
}

func TestExtendNotHeldCancelsAtOnce(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, &Options{TTL: 30 * time.Second}) // renewals every 10s
	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	workCtx := lease.KeepAlive(ctx)
	require.NoError(t, e.admin.Del(ctx, lease.Key()).Err())
	require.ErrorIs(t, lease.Extend(ctx, time.Minute), ErrNotHeld)
	select {
	case <-workCtx.Done():
		assert.ErrorIs(t, context.Cause(workCtx), ErrLost)
	case <-time.After(2 * time.Second):
		t.Fatal("the work context was not cancelled when Extend found the lock not held")
	}
	assert.ErrorIs(t, lease.Release(ctx), ErrNotHeld)
}

func TestKeepAliveRacingRelease(t *testing.T) {
	e := newEnv(t, nil)
	var falseLost atomic.Int32
	l := e.locker(t, &Options{TTL: time.Second, OnLost: func(*Lease, error) { falseLost.Add(1) }})
	for range 50 {
		lease, err := l.Acquire(ctx, uniqueName(t))
		require.NoError(t, err)
		got := make(chan context.Context, 1)
		go func() { got <- lease.KeepAlive(ctx) }()
		require.NoError(t, lease.Release(ctx))
		workCtx := <-got
		select {
		case <-workCtx.Done():
		case <-time.After(time.Second):
			t.Fatal("a KeepAlive context that raced Release was not cancelled")
		}
		lease.mu.Lock()
		wd := lease.wd
		lease.mu.Unlock()
		if wd != nil {
			select {
			case <-wd.done:
			case <-time.After(time.Second):
				t.Fatal("a watchdog outlived Release")
			}
		}
	}
	assert.Zero(t, falseLost.Load(), "OnLost for released leases")
}

func TestReleaseInsideWork(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	err := l.RunWithLock(ctx, uniqueName(t), func(ctx context.Context, lease *Lease) error {
		return lease.Release(ctx) // done early
	})
	require.NoError(t, err, "a release by the work itself is not a loss")
}

func TestRenewalIsOneRoundTripOnAnEmptyScriptCache(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, &Options{TTL: 300 * time.Millisecond})
	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	require.NoError(t, e.admin.ScriptFlush(ctx).Err()) // as after a restart or failover
	var calls atomic.Int32
	e.hook.set(func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "extend" {
			calls.Add(1)
		}
		return nil
	}, nil)
	workCtx := lease.KeepAlive(ctx)
	require.Eventually(t, func() bool { return calls.Load() >= 1 }, 5*time.Second, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	assert.Equal(t, int32(1), calls.Load(), "the first renewal is one command, not EVALSHA then EVAL")
	require.NoError(t, workCtx.Err())
	require.NoError(t, lease.Release(ctx))
}

func TestWatchdogFollowsShorterTTL(t *testing.T) {
	// After the work shortens the TTL, renewals come at a third of the new
	// TTL, not of the old one.
	_, l := newMini(t)
	err := l.RunWithLock(ctx, "shorter", func(ctx context.Context, lease *Lease) error {
		if err := lease.Extend(ctx, 300*time.Millisecond); err != nil {
			return err
		}
		time.Sleep(1500 * time.Millisecond) // five of the new TTLs
		return ctx.Err()
	}, WithTTL(3*time.Second))
	require.NoError(t, err)
}

func TestGoexitReleases(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.RunWithLock(ctx, name, func(context.Context, *Lease) error {
			runtime.Goexit() // as t.FailNow in the work would
			return nil
		})
	}()
	<-done
	n, err := e.admin.Exists(ctx, "lock:{"+name+"}").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "released when the work called runtime.Goexit")
}

// TestKeepAliveCtxEndReleases: the end of KeepAlive's ctx stops the
// renewals and releases the lease in the background (issue 28: a lease
// kept alive and never released was renewed until the process died).
func TestKeepAliveCtxEndReleases(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil) // TTL 30s: gone within the bound below is a release, not an expiry
	name := uniqueName(t)
	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	cctx, cancel := context.WithCancel(ctx)
	workCtx := lease.KeepAlive(cctx)
	cancel()
	<-workCtx.Done()
	assert.ErrorIs(t, context.Cause(workCtx), context.Canceled, "the work's context ends with ctx's cause")
	start := time.Now()
	for keyExists(t, e.srv, lease.Key()) {
		require.Less(t, time.Since(start), 2*time.Second, "released within 2s of the end of KeepAlive's ctx")
		time.Sleep(5 * time.Millisecond)
	}
	second, err := l.Acquire(ctx, name)
	require.NoError(t, err, "a second Acquire takes the released lock")
	assert.Greater(t, second.Fence(), lease.Fence())
	assert.ErrorIs(t, lease.Release(ctx), ErrNotHeld, "released already")
	assert.ErrorIs(t, context.Cause(lease.KeepAlive(ctx)), ErrNotHeld, "KeepAlive on a released lease")
	require.NoError(t, second.Release(ctx))
}

// TestKeepAliveLastCtxEndReleases: with several KeepAlive calls, the lease
// is released once every one's ctx has ended; until then it is renewed.
func TestKeepAliveLastCtxEndReleases(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, &Options{TTL: 300 * time.Millisecond})
	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	first, cancelFirst := context.WithCancel(ctx)
	second, cancelSecond := context.WithCancel(ctx)
	lease.KeepAlive(first)
	secondWork := lease.KeepAlive(second)
	cancelFirst()
	time.Sleep(time.Second) // more than three TTLs
	got, err := e.admin.Get(ctx, lease.Key()).Result()
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(got, lease.Token()+" "), "still renewed while a KeepAlive ctx lives")
	require.NoError(t, secondWork.Err())
	cancelSecond()
	start := time.Now()
	for keyExists(t, e.srv, lease.Key()) {
		require.Less(t, time.Since(start), 200*time.Millisecond, "released, before it could expire")
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRunWithLockCtxEndKeepsLockUntilWorkReturns: RunWithLock's work
// context is derived from ctx, but the lock is renewed until the work
// returns, and released then, also when ctx ended first.
func TestRunWithLockCtxEndKeepsLockUntilWorkReturns(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, &Options{TTL: 300 * time.Millisecond})
	name := uniqueName(t)
	cctx, cancel := context.WithCancel(ctx)
	var key string
	err := l.RunWithLock(cctx, name, func(workCtx context.Context, lease *Lease) error {
		key = lease.Key()
		cancel()
		<-workCtx.Done()
		time.Sleep(time.Second) // winding down, past three TTLs
		got, err := e.admin.Get(ctx, lease.Key()).Result()
		if err != nil || !strings.HasPrefix(got, lease.Token()+" ") {
			return fmt.Errorf("not held while the work runs after ctx ended: %q, %v", got, err)
		}
		return nil
	})
	require.NoError(t, err)
	assert.False(t, keyExists(t, e.srv, key), "released when the work returned")
}

// When ctx has ended before the release after the work answers (a slow
// link), RunWithLock returns by then, and the release goes on in the
// background: a lock deleted under the work is reported lost from there, to
// OnLost (it was reported to nobody), and a held one is released.
func TestRunWithLockCtxEndedReleaseAnswers(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	t.Cleanup(func() { _ = client.Close() })
	admin := srv.Client(nil)

	for _, deleted := range []bool{false, true} {
		t.Run(fmt.Sprint("deleted=", deleted), func(t *testing.T) {
			var lost atomic.Int32
			l, err := New(client, &Options{OnLost: func(*Lease, error) { lost.Add(1) }})
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close() })
			runCtx, cancel := context.WithCancel(ctx)
			var key string
			err = l.RunWithLock(runCtx, uniqueName(t), func(ctx context.Context, lease *Lease) error {
				key = lease.Key()
				if deleted {
					require.NoError(t, admin.Del(context.Background(), key).Err())
				}
				proxy.SetLatency(100 * time.Millisecond) // the release answers long after ctx's end
				cancel()
				return nil
			})
			require.NoError(t, err, "the release's answer came after ctx's end")
			if !deleted {
				require.Eventually(t, func() bool { return !keyExists(t, srv, key) }, 5*time.Second, time.Millisecond,
					"released in the background")
			}
			proxy.SetLatency(0)
			if deleted {
				require.Eventually(t, func() bool { return lost.Load() == 1 }, 5*time.Second, time.Millisecond,
					"OnLost called by the background release")
			}
			require.NoError(t, l.Close()) // waits for the background release
			want := int32(0)
			if deleted {
				want = 1
			}
			assert.Equal(t, want, lost.Load(), "OnLost calls")
		})
	}
}
