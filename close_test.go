package fencelock

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 23, section 3: Close ends what waits.

// TestClosedLockerMakesNoRedisCall: after Close, Acquire (try-once,
// waiting, fair) and RunWithLock return ErrClosed at once, with no Redis
// call and no subscription, and fail-open never opens on it; a lease held
// before Close is extended and released as before.
func TestClosedLockerMakesNoRedisCall(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	l := e.locker(t, &Options{FailOpen: true})
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name+".held", WithTTL(time.Minute))
	require.NoError(t, err)
	require.NoError(t, l.Close())
	before := e.hook.calls.Load()

	for _, tc := range []struct {
		what string
		opts []Option
	}{
		{"try once", nil},
		{"WithWait", []Option{WithWait(time.Minute)}},
		{"WithFair", []Option{WithWait(time.Minute), WithFair()}},
		{"WithFailOpen(true)", []Option{WithFailOpen(true)}},
	} {
		// At once: no Redis call (counted below), and no wait, which would
		// last the minute (100ms was the machine's speed).
		start := time.Now()
		lease, err := l.Acquire(ctx, name, tc.opts...)
		assert.Less(t, time.Since(start), 10*time.Second, "%s: at once", tc.what)
		require.ErrorIs(t, err, ErrClosed, tc.what)
		assert.Nil(t, lease, tc.what)
		for _, other := range []error{ErrNotObtained, ErrUnavailable, ErrMisconfigured, ErrInvalid} {
			assert.NotErrorIs(t, err, other, "%s: ErrClosed alone", tc.what)
		}
		assert.Equal(t, OutcomeClosed, OutcomeOf(err))
		ran := false
		err = l.RunWithLock(ctx, name, func(context.Context, *Lease) error { ran = true; return nil }, tc.opts...)
		require.ErrorIs(t, err, ErrClosed, tc.what)
		assert.False(t, ran, "%s: the work does not run, fail-open or not", tc.what)
	}
	assert.Equal(t, before, e.hook.calls.Load(), "no Redis call after Close")
	assert.Zero(t, pubsubClients(t, e), "no subscription after Close")

	require.NoError(t, held.Extend(ctx, time.Minute), "a lease held at Close is extended as before")
	require.NoError(t, held.Release(ctx), "and released")
	assert.False(t, keyExists(t, e.srv, held.Key()))
}

// TestCloseEndsWaitingAcquires: an Acquire waiting for a busy lock when
// Close is called (plain or fair, pausing 20s between attempts) returns
// ErrClosed at once, and leaves nothing behind: the holder's release finds
// nobody in line, and the lock free.
func TestCloseEndsWaitingAcquires(t *testing.T) {
	t.Parallel()
	for _, fair := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "fair"}[fair], func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, nil)
			name := uniqueName(t)
			held, err := e.locker(t, nil).Acquire(ctx, name, WithTTL(time.Minute))
			require.NoError(t, err)
			l := e.locker(t, slowPolling)
			opts := []Option{WithWait(time.Minute)}
			if fair {
				opts = append(opts, WithFair())
			}
			done := make(chan error, 1)
			go func() {
				_, err := l.Acquire(ctx, name, opts...)
				done <- err
			}()
			require.Eventually(t, func() bool { return pubsubClients(t, e) == 1 }, 5*time.Second, time.Millisecond,
				"the waiter subscribes")
			time.Sleep(50 * time.Millisecond) // its confirmation handled: it sleeps
			closed := time.Now()
			require.NoError(t, l.Close())
			select {
			case err := <-done:
				require.ErrorIs(t, err, ErrClosed)
				assert.NotErrorIs(t, err, ErrNotObtained, "ErrClosed alone, though the lock was busy")
				assert.Less(t, time.Since(closed), time.Second, "within a round trip of Close")
			case <-time.After(5 * time.Second):
				t.Fatal("the waiting Acquire did not return after Close (it pauses 20s between attempts)")
			}
			if fair {
				n, err := e.admin.ZCard(ctx, held.Key()+":q").Result()
				require.NoError(t, err)
				assert.Zero(t, n, "the fair waiter left the line")
			}
			require.NoError(t, held.Release(ctx))
			time.Sleep(50 * time.Millisecond) // a hand-over, if any, would be done
			assert.False(t, keyExists(t, e.srv, held.Key()), "nobody was handed the lock")
		})
	}
}

// TestCloseIsBoundedOnAHungRedis (bug 6): with Redis SIGSTOPped and
// ReleaseTimeout 1s, Close returns within ReleaseTimeout and a little,
// whatever the waiting Acquire calls (plain with a deadline, fair) have in
// flight, and those calls return ErrClosed. go-redis's own timeouts (3s a
// read, retried) kept Close waiting about 9.5s before.
func TestCloseIsBoundedOnAHungRedis(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	name := uniqueName(t)
	holder := e.locker(t, nil)
	_, err := holder.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	l := e.locker(t, &Options{ReleaseTimeout: time.Second})
	pause(t, e.srv)

	plain := make(chan error, 1)
	go func() {
		_, err := l.Acquire(withTimeout(t, 30*time.Second), name, WithWait(30*time.Second))
		plain <- err
	}()
	fair := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, name, WithWait(30*time.Second), WithFair())
		fair <- err
	}()
	time.Sleep(200 * time.Millisecond) // both have an attempt in flight on the paused server

	start := time.Now()
	require.NoError(t, l.Close())
	took := time.Since(start)
	assert.Less(t, took, time.Second+500*time.Millisecond, "Close within ReleaseTimeout (1s) and a little")
	for what, c := range map[string]chan error{"plain": plain, "fair": fair} {
		select {
		case err := <-c:
			assert.ErrorIs(t, err, ErrClosed, what)
		case <-time.After(time.Second):
			t.Errorf("the %s Acquire did not return after Close", what)
		}
	}
	e.srv.Resume() // the calls still in go-redis end, for goleak
}

// TestCloseEndsAWaiterInARedlockLine: a Redlock Acquire waiting in line when
// its Locker is closed returns ErrClosed at once and leaves the line; the
// next in line is named by the release.
func TestCloseEndsAWaiterInARedlockLine(t *testing.T) {
	t.Parallel()
	e := newRedlockEnv(t, 3, nil)
	_, name, held := e.holding(t)
	closing, _ := e.process(t, slowPolling)
	gone := waitAndHold(ctx, closing, name)
	e.requireLine(t, held.Key(), 1, "the first waiter joins the line")
	other, _ := e.process(t, slowPolling)
	next := waitAndHold(ctx, other, name)
	e.requireLine(t, held.Key(), 2, "the second joins behind it")
	time.Sleep(50 * time.Millisecond) // their confirmations handled: they sleep their 20s pauses

	closed := time.Now()
	require.NoError(t, closing.Close())
	select {
	case err := <-gone.done:
		require.ErrorIs(t, err, ErrClosed)
		assert.Less(t, time.Since(closed), time.Second, "within a round trip of Close")
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting Acquire did not return after Close")
	}
	e.requireLine(t, held.Key(), 1, "the closed Locker's call left the line")
	require.NoError(t, held.Release(ctx))
	next.obtained(t, 5*time.Second, "named by the release, not after its 20s pause")
	next.finish(t)
}
