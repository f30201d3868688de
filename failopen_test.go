package fencelock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
)

// Issue 23, section 2: FailOpen that works under a deadline, decided per
// call.

// outages are the two ways Redis is not there, each on a fresh server (or
// port) per test: a redis-server SIGSTOPped (hung), and a port where nothing
// listens (refused). Each returns clients with go-redis's default options.
var outages = []struct {
	name  string
	cause string // in the error's text
	start func(t *testing.T, n int) []redis.UniversalClient
}{
	{"hung", "no reply within", func(t *testing.T, n int) []redis.UniversalClient {
		var cs []redis.UniversalClient
		for range n {
			srv := redistest.Start(t)
			c := srv.Client(nil)
			require.NoError(t, c.Ping(ctx).Err()) // a connection in the pool, as in a running service
			pause(t, srv)
			cs = append(cs, c)
		}
		return cs
	}},
	{"refused", "connection refused", func(t *testing.T, n int) []redis.UniversalClient {
		var cs []redis.UniversalClient
		for range n {
			c := redis.NewClient(&redis.Options{Addr: closedAddr(t)})
			t.Cleanup(func() { _ = c.Close() })
			cs = append(cs, c)
		}
		return cs
	}},
}

// lockerOn returns a Locker with opts over cs: New on one client, NewRedlock
// on several.
func lockerOn(t *testing.T, cs []redis.UniversalClient, opts *Options) *Locker {
	t.Helper()
	var l *Locker
	var err error
	if len(cs) == 1 {
		l, err = New(cs[0], opts)
	} else {
		l, err = NewRedlock(cs, opts)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// TestFailOpenUnderADeadline: with default options and FailOpen, a
// RunWithLock with a 1s (and a 500ms) deadline on a hung or a refusing
// Redis, single or Redlock, runs its work degraded before the deadline,
// with time left, and its Acquire error says why. Before AttemptTimeout the
// attempt outlived the deadline and the work never ran.
func TestFailOpenUnderADeadline(t *testing.T) {
	t.Parallel()
	for _, o := range outages {
		for _, nodes := range []int{1, 3} {
			t.Run(o.name+map[int]string{1: "/single", 3: "/redlock"}[nodes], func(t *testing.T) {
				t.Parallel()
				log, logs := testLogger()
				l := lockerOn(t, o.start(t, nodes), &Options{FailOpen: true, Logger: log, ReleaseTimeout: time.Second})
				name := uniqueName(t)
				for _, d := range []time.Duration{time.Second, 500 * time.Millisecond} {
					rctx := withTimeout(t, d)
					start := time.Now()
					var ranAt time.Duration
					var fence int64 = -1
					err := l.RunWithLock(rctx, name, func(ctx context.Context, lease *Lease) error {
						ranAt, fence = time.Since(start), lease.Fence()
						require.True(t, lease.Degraded())
						return ctx.Err()
					})
					require.NoError(t, err, "deadline %v: the work ran degraded, with its ctx alive", d)
					assert.Zero(t, fence, "deadline %v: a degraded lease's fence", d)
					assert.Less(t, ranAt, d, "deadline %v: the work ran before the deadline", d)
				}
				assert.True(t, logged(logs, name, "fail-open"), "logged at Error:\n%s", logs)
				assert.Contains(t, logs.String(), o.cause)
			})
		}
	}
}

// TestAttemptTimeout: one attempt that gets no reply within AttemptTimeout
// counts as Redis unavailable, saying so, whatever go-redis's options (here
// its defaults: a 3s read timeout, retried); a wait tries again after it;
// and the lock a late reply might bring is given back once Redis answers.
func TestAttemptTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	l := e.locker(t, &Options{AttemptTimeout: 200 * time.Millisecond})
	require.NoError(t, e.client.Ping(ctx).Err())
	name := uniqueName(t)
	pause(t, e.srv)

	start := time.Now()
	_, err := l.Acquire(ctx, name)
	took := time.Since(start)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.NotErrorIs(t, err, ErrNotObtained)
	assert.Contains(t, err.Error(), "no reply within 200ms")
	assert.Less(t, took, time.Second, "the attempt ended at its AttemptTimeout")
	assert.GreaterOrEqual(t, took, 200*time.Millisecond)

	var attempts atomic.Int64
	e.hook.set(func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "acquire" {
			attempts.Add(1)
		}
		return nil
	}, nil)
	_, err = l.Acquire(withTimeout(t, 2*time.Second), name, WithWait(time.Minute))
	require.ErrorIs(t, err, ErrUnavailable, "the last attempt's verdict")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.GreaterOrEqual(t, attempts.Load(), int64(3), "a waiting Acquire tries again after each timed-out attempt")

	e.srv.Resume()
	require.Eventually(t, func() bool { return !keyExists(t, e.srv, "lock:{"+name+"}") }, 10*time.Second,
		10*time.Millisecond, "the late attempts' lock is given back")
	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err, "the lock is free")
	require.NoError(t, lease.Release(ctx))
}

// TestAttemptTimeoutInvalid: a negative or sub-millisecond AttemptTimeout
// is refused by New.
func TestAttemptTimeoutInvalid(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never used
	t.Cleanup(func() { _ = c.Close() })
	for _, d := range []time.Duration{-time.Second, time.Microsecond} {
		_, err := New(c, &Options{AttemptTimeout: d})
		require.ErrorIs(t, err, ErrInvalid, "%v", d)
		assert.Contains(t, err.Error(), "AttemptTimeout")
	}
}

// TestWithFailOpen: the per-call option overrides Options.FailOpen both
// ways for RunWithLock, and makes Acquire return a degraded lease and a nil
// error on an outage, single and Redlock, hung and refused; it never opens
// on a busy lock.
func TestWithFailOpen(t *testing.T) {
	t.Parallel()
	for _, o := range outages {
		for _, nodes := range []int{1, 3} {
			t.Run(o.name+map[int]string{1: "/single", 3: "/redlock"}[nodes], func(t *testing.T) {
				t.Parallel()
				cs := o.start(t, nodes)
				log, logs := testLogger()
				closed := lockerOn(t, cs, &Options{Logger: log, ReleaseTimeout: time.Second})
				open := lockerOn(t, cs, &Options{FailOpen: true, ReleaseTimeout: time.Second})
				name := uniqueName(t)
				rctx := withTimeout(t, 5*time.Second)

				ran := false
				err := closed.RunWithLock(rctx, name, func(_ context.Context, lease *Lease) error {
					ran = lease.Degraded()
					return nil
				}, WithFailOpen(true))
				require.NoError(t, err)
				assert.True(t, ran, "WithFailOpen(true) opens a fail-closed Locker's RunWithLock")

				ran = false
				err = open.RunWithLock(rctx, name, func(context.Context, *Lease) error { ran = true; return nil },
					WithFailOpen(false))
				require.ErrorIs(t, err, ErrUnavailable)
				assert.False(t, ran, "WithFailOpen(false) closes a fail-open Locker's RunWithLock")

				_, err = open.Acquire(rctx, name)
				require.ErrorIs(t, err, ErrUnavailable, "Acquire fails closed without WithFailOpen(true)")

				lease, err := closed.Acquire(rctx, name, WithFailOpen(true))
				require.NoError(t, err)
				require.NotNil(t, lease)
				assert.True(t, lease.Degraded())
				assert.Zero(t, lease.Fence())
				assert.ErrorIs(t, lease.Release(rctx), ErrNotHeld, "nothing to release")
				assert.True(t, logged(logs, name, "fail-open"), "the degraded Acquire is logged at Error:\n%s", logs)
			})
		}
	}
}

// TestWithFailOpenNeverOnABusyLock: a busy lock, single or Redlock, is
// ErrNotObtained for Acquire and RunWithLock with WithFailOpen(true).
func TestWithFailOpenNeverOnABusyLock(t *testing.T) {
	t.Parallel()
	e := newRedlockEnv(t, 3, nil)
	single := lockerFor(t, e.clients[0], nil)
	quorum := e.locker(t, nil)
	for what, l := range map[string]*Locker{"single": single, "redlock": quorum} {
		name := uniqueName(t) + "." + what
		held, err := l.Acquire(ctx, name)
		require.NoError(t, err)
		_, err = l.Acquire(ctx, name, WithFailOpen(true))
		require.ErrorIs(t, err, ErrNotObtained, what)
		ran := false
		err = l.RunWithLock(ctx, name, func(context.Context, *Lease) error { ran = true; return nil }, WithFailOpen(true))
		require.ErrorIs(t, err, ErrNotObtained, what)
		assert.False(t, ran, what)
		require.NoError(t, held.Release(ctx))
	}
}

// TestFairAcquireWithEndedContextMakesNoRedisCall (bug 7): a fair Acquire
// whose ctx has already ended returns its error without a Redis call, and
// opens no subscription connection.
func TestFairAcquireWithEndedContextMakesNoRedisCall(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err := l.Acquire(cctx, uniqueName(t), WithWait(time.Second), WithFair())
	requireNoVerdict(t, err, context.Canceled, "fair Acquire")
	time.Sleep(100 * time.Millisecond) // a subscription would be made in the background
	assert.Zero(t, e.hook.calls.Load(), "no command")
	assert.Zero(t, pubsubClients(t, e), "no subscription connection")
	assert.Zero(t, openHubs(l))
	assert.False(t, errors.Is(err, ErrUnavailable))
}

// TestOutagesAreBoundedAndClosable: on a hung or a refusing Redis, single
// and Redlock, with go-redis's default options, a try-once Acquire is
// ErrUnavailable at its AttemptTimeout, saying why; a waiting Acquire
// returns ErrClosed when its Locker is closed, within a round trip; Close
// returns within ReleaseTimeout and a little; and Acquire after Close is
// ErrClosed at once.
func TestOutagesAreBoundedAndClosable(t *testing.T) {
	t.Parallel()
	for _, o := range outages {
		for _, nodes := range []int{1, 3} {
			t.Run(o.name+map[int]string{1: "/single", 3: "/redlock"}[nodes], func(t *testing.T) {
				t.Parallel()
				const attemptTimeout = 300 * time.Millisecond
				l := lockerOn(t, o.start(t, nodes), &Options{AttemptTimeout: attemptTimeout, ReleaseTimeout: time.Second})
				name := uniqueName(t)

				start := time.Now()
				_, err := l.Acquire(ctx, name)
				took := time.Since(start)
				require.ErrorIs(t, err, ErrUnavailable)
				assert.Contains(t, err.Error(), o.cause)
				assert.Less(t, took, time.Second, "at the 300ms AttemptTimeout")

				waiting := make(chan error, 1)
				go func() {
					_, err := l.Acquire(ctx, name, WithWait(time.Minute))
					waiting <- err
				}()
				time.Sleep(500 * time.Millisecond) // attempts in flight and timed out
				closing := time.Now()
				require.NoError(t, l.Close())
				assert.Less(t, time.Since(closing), 1500*time.Millisecond, "Close within ReleaseTimeout (1s) and a little")
				select {
				case err := <-waiting:
					require.ErrorIs(t, err, ErrClosed)
					assert.NotErrorIs(t, err, ErrUnavailable, "ErrClosed alone")
				case <-time.After(time.Second):
					t.Fatal("the waiting Acquire did not return after Close")
				}
				start = time.Now()
				_, err = l.Acquire(ctx, name)
				require.ErrorIs(t, err, ErrClosed)
				// At once: an attempt on the hung Redis would take the
				// AttemptTimeout (50ms was the machine's speed).
				assert.Less(t, time.Since(start), attemptTimeout, "at once, without an attempt")
			})
		}
	}
}

// TestFailOpenWaitingUnderADeadline: a fail-open RunWithLock that waits
// (WithWait) longer than its ctx allows stops waiting for an outage at
// half the time before its deadline, and runs its work degraded then,
// plain and fair. Before, its attempts shrank with the time left and the
// call ended with its ctx, the work never run.
func TestFailOpenWaitingUnderADeadline(t *testing.T) {
	t.Parallel()
	for _, o := range outages {
		for _, fair := range []bool{false, true} {
			t.Run(o.name+map[bool]string{false: "/plain", true: "/fair"}[fair], func(t *testing.T) {
				t.Parallel()
				l := lockerOn(t, o.start(t, 1), &Options{FailOpen: true, ReleaseTimeout: time.Second})
				opts := []Option{WithWait(5 * time.Second)}
				if fair {
					opts = append(opts, WithFair())
				}
				start := time.Now()
				var ranAt time.Duration
				err := l.RunWithLock(withTimeout(t, 2*time.Second), uniqueName(t), func(ctx context.Context, lease *Lease) error {
					ranAt = time.Since(start)
					require.True(t, lease.Degraded())
					return ctx.Err()
				}, opts...)
				require.NoError(t, err)
				assert.Greater(t, ranAt, 900*time.Millisecond, "it waited for the outage to end, about half the time")
				assert.Less(t, ranAt, 1800*time.Millisecond, "and ran degraded before the 2s deadline")
			})
		}
	}
}

// TestFairFailOpenNeverOnABusyLockAfterAnError: a fair waiter in line
// whose keep-alive failed once, and whose later keep-alives found it still
// waiting, ends its wait with ErrNotObtained, not the old error: fail-open
// does not run the work while the lock is held.
func TestFairFailOpenNeverOnABusyLockAfterAnError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	name := uniqueName(t)
	held, err := e.locker(t, nil).Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	defer held.Release(ctx)
	l := e.locker(t, &Options{FailOpen: true})
	var failed atomic.Bool
	e.hook.set(func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "queue" && failed.CompareAndSwap(false, true) {
			return errors.New("test: connection reset") // one keep-alive fails, not sent
		}
		return nil
	}, nil)
	ran := false
	err = l.RunWithLock(ctx, name, func(context.Context, *Lease) error { ran = true; return nil },
		WithWait(1500*time.Millisecond), WithFair())
	require.True(t, failed.Load(), "a keep-alive failed")
	require.ErrorIs(t, err, ErrNotObtained)
	assert.NotErrorIs(t, err, ErrUnavailable)
	assert.False(t, ran, "fail-open never runs the work on a busy lock")
}

// TestFailOpenNeverAfterABusyAnswer: a fail-open call that found the lock
// busy, and then Redis hung, does not run its work degraded while the
// holder it was told of still holds the lock: its error is the busy one.
func TestFailOpenNeverAfterABusyAnswer(t *testing.T) {
	t.Parallel()
	for _, fair := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "fair"}[fair], func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, nil)
			name := uniqueName(t)
			_, err := e.locker(t, nil).Acquire(ctx, name, WithTTL(time.Minute))
			require.NoError(t, err)
			l := e.locker(t, &Options{ReleaseTimeout: time.Second})
			afterFirstAcquire(e, func() { e.srv.Pause() })
			t.Cleanup(e.srv.Resume)
			opts := []Option{WithWait(5 * time.Second), WithFailOpen(true)}
			if fair {
				opts = append(opts, WithFair())
			}
			ran := false
			err = l.RunWithLock(withTimeout(t, 2*time.Second), name,
				func(context.Context, *Lease) error { ran = true; return nil }, opts...)
			require.ErrorIs(t, err, ErrNotObtained)
			assert.NotErrorIs(t, err, ErrUnavailable)
			assert.False(t, ran, "the holder still holds the lock: no degraded run")
			e.srv.Resume()
		})
	}
}

// TestCloseEndsARedlockAttemptInFlight: a Redlock Acquire whose attempt is
// in flight on hung nodes (AttemptTimeout 5s) returns ErrClosed within a
// round trip of Close, not at its AttemptTimeout.
func TestCloseEndsARedlockAttemptInFlight(t *testing.T) {
	t.Parallel()
	l := lockerOn(t, outages[0].start(t, 3), &Options{AttemptTimeout: 5 * time.Second, ReleaseTimeout: time.Second})
	done := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, uniqueName(t), WithWait(time.Minute))
		done <- err
	}()
	time.Sleep(300 * time.Millisecond) // its first attempt in flight
	closed := time.Now()
	require.NoError(t, l.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrClosed)
		assert.Less(t, time.Since(closed), 1500*time.Millisecond, "within Close's own bound, not at AttemptTimeout")
	case <-time.After(6 * time.Second):
		t.Fatal("the Acquire did not return after Close")
	}
}

// TestRefusedAttemptNeedsNoCleanup: an attempt that timed out with every
// dial of its own refused never reached Redis: no clean-up follows.
func TestRefusedAttemptNeedsNoCleanup(t *testing.T) {
	t.Parallel()
	log, logs := testLogger()
	l := lockerOn(t, outages[1].start(t, 1), &Options{Logger: log, AttemptTimeout: 300 * time.Millisecond})
	name := uniqueName(t)
	_, err := l.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "no reply within 300ms (AttemptTimeout): dial tcp")
	assert.False(t, logged(logs, name, "clean-up"), "no clean-up:\n%s", logs)
}

// TestRedlockTimedOutAttemptIsCleanedUp: a Redlock attempt that timed out
// while one node refused connections and two hung is of unknown outcome on
// the hung nodes, whatever the refused one's dials said: once they resume,
// the grants they applied late are given back.
func TestRedlockTimedOutAttemptIsCleanedUp(t *testing.T) {
	t.Parallel()
	refused := outages[1].start(t, 1)
	var srvs []*redistest.Server
	cs := []redis.UniversalClient{refused[0]}
	for range 2 {
		srv := redistest.Start(t)
		c := srv.Client(nil)
		require.NoError(t, c.Ping(ctx).Err())
		srvs = append(srvs, srv)
		cs = append(cs, c)
	}
	l := lockerOn(t, cs, &Options{AttemptTimeout: 300 * time.Millisecond, ReleaseTimeout: time.Second})
	for _, s := range srvs {
		pause(t, s)
	}
	name := uniqueName(t)
	_, err := l.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrUnavailable)
	for _, s := range srvs {
		s.Resume()
	}
	key, _ := l.keys(name)
	require.Eventually(t, func() bool { return !keyExists(t, srvs[0], key) && !keyExists(t, srvs[1], key) },
		10*time.Second, 10*time.Millisecond, "the hung nodes' late grants given back")
}
