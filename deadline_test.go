package fencelock

// Issue 9, section 1: the caller's deadline bounds every call, whatever the
// go-redis client's options, and the clean-ups that outlive a call run in
// the background, owned by the Locker.

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
)

// deadlineSlack is how much later than its caller's deadline a call may
// return and still count as "within a few milliseconds": generous for -race
// on a loaded two-core machine, and still far below the seconds that a
// synchronous clean-up (ReleaseTimeout, 5s by default) or go-redis's
// ReadTimeout (3s) and retries take.
const deadlineSlack = 300 * time.Millisecond

// clientOptionCases are go-redis client options under which a call must
// still return by its caller's deadline: with and without
// ContextTimeoutEnabled, with go-redis's default MaxRetries (a timed-out
// command is retried) and without retries, and with a ReadTimeout longer
// than the caller would ever wait.
var clientOptionCases = []struct {
	name string
	opts redis.Options
}{
	{"ContextTimeoutEnabled", redis.Options{ContextTimeoutEnabled: true}},
	{"ContextTimeoutEnabled without retries", redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1}},
	{"go-redis defaults", redis.Options{}},
	{"long ReadTimeout", redis.Options{ReadTimeout: 10 * time.Second}},
}

// returnsBy runs f, which must return within d of its start plus
// deadlineSlack, and returns f's error.
func returnsBy(t *testing.T, d time.Duration, what string, f func() error) error {
	t.Helper()
	start := time.Now()
	err := f()
	elapsed := time.Since(start)
	assert.Less(t, elapsed, d+deadlineSlack, "%s returned %v after its caller's %v deadline", what, elapsed-d, d)
	return err
}

// requireNoVerdict checks that err is the error of a call whose ctx ended
// before Redis gave any verdict: it matches ctxErr and no class of this
// package.
func requireNoVerdict(t *testing.T, err, ctxErr error, what string) {
	t.Helper()
	require.Error(t, err, what)
	assert.ErrorIs(t, err, ctxErr, "%s: %v", what, err)
	assert.NotErrorIs(t, err, ErrNotObtained, "%s: a Redis that does not answer is not busy", what)
	assert.NotErrorIs(t, err, ErrUnavailable, "%s: ctx ended before any verdict", what)
	assert.NotErrorIs(t, err, ErrNotHeld, "%s: ctx ended before any verdict", what)
	assert.NotContains(t, err.Error(), "\n", "%s: one line", what)
}

// withTimeout returns a context that ends after d, cancelled when the test
// ends.
func withTimeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

// pause stops srv with SIGSTOP until the test ends (or an earlier Resume).
// Call it after the Lockers on srv were created, so that the server is
// resumed before their Close waits for what runs in the background.
func pause(t *testing.T, srv *redistest.Server) {
	t.Helper()
	srv.Pause()
	t.Cleanup(srv.Resume)
}

// keyExists reports whether key exists on srv.
func keyExists(t *testing.T, srv *redistest.Server, key string) bool {
	t.Helper()
	n, err := srv.Do("EXISTS", key)
	require.NoError(t, err)
	return n != int64(0)
}

// TestDeadlineBoundsCallsOnPausedServer: with redis-server SIGSTOPped,
// Acquire (try-once, and with WithWait), Extend and Release return within a
// few milliseconds of their caller's deadline or cancellation, whatever the
// go-redis options; the error matches ctx's and claims no verdict; and what
// they left in flight finishes in the background once Redis answers again:
// Close waits for it, the released lock is deleted and the given-up
// attempts leave no lock behind.
func TestDeadlineBoundsCallsOnPausedServer(t *testing.T) {
	t.Parallel()
	for _, tc := range clientOptionCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := tc.opts
			e := newEnv(t, &opts)
			l := e.locker(t, nil)
			name := uniqueName(t)
			extended, err := l.Acquire(ctx, name+".extended")
			require.NoError(t, err)
			released, err := l.Acquire(ctx, name+".released")
			require.NoError(t, err)
			pause(t, e.srv)

			d := 200 * time.Millisecond
			c := withTimeout(t, d)
			err = returnsBy(t, d, "Acquire(ctx 200ms)", func() error {
				_, err := l.Acquire(c, name+".acquire0")
				return err
			})
			requireNoVerdict(t, err, context.DeadlineExceeded, "Acquire")

			c = withTimeout(t, d)
			err = returnsBy(t, d, "Acquire(ctx 200ms, WithWait(1s))", func() error {
				_, err := l.Acquire(c, name+".acquire1", WithWait(time.Second))
				return err
			})
			requireNoVerdict(t, err, context.DeadlineExceeded, "Acquire with WithWait")

			d = 100 * time.Millisecond
			cc, cancel := context.WithCancel(ctx)
			defer cancel()
			timer := time.AfterFunc(d, cancel)
			defer timer.Stop()
			err = returnsBy(t, d, "Acquire(ctx cancelled after 100ms)", func() error {
				_, err := l.Acquire(cc, name+".acquire2", WithWait(time.Minute))
				return err
			})
			requireNoVerdict(t, err, context.Canceled, "cancelled Acquire")

			d = 200 * time.Millisecond
			c = withTimeout(t, d)
			err = returnsBy(t, d, "Extend(ctx 200ms)", func() error { return extended.Extend(c, time.Minute) })
			requireNoVerdict(t, err, context.DeadlineExceeded, "Extend")

			c = withTimeout(t, d)
			err = returnsBy(t, d, "Release(ctx 200ms)", func() error { return released.Release(c) })
			requireNoVerdict(t, err, context.DeadlineExceeded, "Release")

			// Redis answers again: what the calls left in flight finishes
			// in the background, and Close waits for it.
			e.srv.Resume()
			require.NoError(t, l.Close())
			assert.False(t, keyExists(t, e.srv, released.Key()), "the release goes on in the background and Close waits for it")
			for i := range 3 {
				key, _ := l.keys(fmt.Sprintf("%s.acquire%d", name, i))
				assert.False(t, keyExists(t, e.srv, key), "no lock is left held by an attempt of an Acquire that gave up")
			}
			require.NoError(t, extended.Release(ctx), "the extended lease is still held")
		})
	}
}

// TestDeadlineRunWithLockServerPausedMidWork: redis-server is SIGSTOPped
// while the work runs. When the lease is lost (its deadline passes without
// a renewal) the work's ctx is cancelled, and RunWithLock returns as soon as
// the work does: the release of the lost lease goes on in the background.
// When the caller's ctx ends, RunWithLock returns by its deadline. Either
// way the lock is deleted once Redis answers again, and Close waits for it.
func TestDeadlineRunWithLockServerPausedMidWork(t *testing.T) {
	t.Parallel()
	for _, tc := range clientOptionCases {
		if tc.opts.ContextTimeoutEnabled && tc.opts.MaxRetries != 0 {
			continue // ContextTimeoutEnabled alone tells as much
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			t.Run("lease lost", func(t *testing.T) {
				t.Parallel()
				opts := tc.opts
				e := newEnv(t, &opts)
				l := e.locker(t, nil)
				t.Cleanup(e.srv.Resume) // after the Locker's Close was registered: runs before it
				name := uniqueName(t)
				const ttl = 600 * time.Millisecond
				start := time.Now()
				var workReturned time.Time
				var cause error
				err := l.RunWithLock(ctx, name, func(ctx context.Context, lease *Lease) error {
					e.srv.Pause()
					select {
					case <-ctx.Done():
					case <-time.After(10 * time.Second): // the test fails below
					}
					cause = context.Cause(ctx)
					workReturned = time.Now()
					return nil
				}, WithTTL(ttl))
				returned := time.Now()
				require.ErrorIs(t, err, ErrLost)
				assert.ErrorIs(t, cause, ErrLost, "the work's ctx is cancelled when the lease is lost")
				assert.Less(t, workReturned.Sub(start), ttl+deadlineSlack, "the work's ctx is cancelled by the lease's deadline")
				assert.Less(t, returned.Sub(workReturned), deadlineSlack,
					"RunWithLock returns when the work does; the release of the lost lease goes on in the background")

				e.srv.Resume()
				require.NoError(t, l.Close())
				assert.False(t, keyExists(t, e.srv, "lock:{"+name+"}"), "released in the background once Redis answers; Close waited")
			})
			t.Run("ctx deadline", func(t *testing.T) {
				t.Parallel()
				opts := tc.opts
				e := newEnv(t, &opts)
				l := e.locker(t, nil)
				t.Cleanup(e.srv.Resume)
				name := uniqueName(t)
				d := 500 * time.Millisecond
				c := withTimeout(t, d)
				ran := false
				err := returnsBy(t, d, "RunWithLock(ctx 500ms)", func() error {
					return l.RunWithLock(c, name, func(ctx context.Context, lease *Lease) error {
						ran = true
						e.srv.Pause()
						<-ctx.Done()
						return ctx.Err()
					})
				})
				require.True(t, ran)
				require.ErrorIs(t, err, context.DeadlineExceeded)
				assert.NotErrorIs(t, err, ErrLost, "the lease was not lost")

				e.srv.Resume()
				require.NoError(t, l.Close())
				assert.False(t, keyExists(t, e.srv, "lock:{"+name+"}"), "released in the background once Redis answers; Close waited")
			})
		})
	}
}

// TestDeadlineCleanupRunsInBackgroundWaitedForByClose: the clean-up after an
// Acquire that gave up and a Release whose ctx ended go on in the
// background; Close waits for them while Redis does not answer, and they
// are logged.
func TestDeadlineCleanupRunsInBackgroundWaitedForByClose(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &redis.Options{ContextTimeoutEnabled: true})
	log, logs := testLogger()
	l := e.locker(t, &Options{Logger: log})
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name+".held")
	require.NoError(t, err)
	pause(t, e.srv)

	d := 200 * time.Millisecond
	err = returnsBy(t, d, "Acquire(ctx 200ms)", func() error {
		_, err := l.Acquire(withTimeout(t, d), name)
		return err
	})
	requireNoVerdict(t, err, context.DeadlineExceeded, "Acquire")
	err = returnsBy(t, d, "Release(ctx 200ms)", func() error { return held.Release(withTimeout(t, d)) })
	requireNoVerdict(t, err, context.DeadlineExceeded, "Release")

	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_ = l.Close()
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while the clean-ups' calls were in flight on a paused Redis (ReleaseTimeout 5s)")
	case <-time.After(300 * time.Millisecond):
	}
	e.srv.Resume()
	select {
	case <-closed:
	case <-time.After(4 * time.Second):
		t.Fatal("Close did not return after Redis answered again")
	}
	assert.True(t, logged(logs, name, "clean-up"),
		"the clean-up after the failed Acquire is visible in the logs:\n%s", logs)
	assert.True(t, logged(logs, held.Name(), "releas"),
		"the background release is visible in the logs:\n%s", logs)
	assert.False(t, keyExists(t, e.srv, "lock:{"+name+"}"), "no lock left by the Acquire that gave up")
	assert.False(t, keyExists(t, e.srv, held.Key()), "the background release deleted the lock")
}

// TestDeadlineLateAttemptIsHarmless: the server is paused for 0.7s,
// ReleaseTimeout is 300ms and Acquire(ctx 200ms) gives up with its attempt
// sent; the attempt runs when the server resumes, after the first clean-up
// call timed out. Within a second of Redis answering again the lock is
// free.
func TestDeadlineLateAttemptIsHarmless(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts redis.Options
	}{
		{"ContextTimeoutEnabled", redis.Options{ContextTimeoutEnabled: true}},
		{"go-redis defaults", redis.Options{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := tc.opts
			e := newEnv(t, &opts)
			l := e.locker(t, &Options{ReleaseTimeout: 300 * time.Millisecond})
			other, err := New(e.admin, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = other.Close() })
			name := uniqueName(t)

			// The scripts are cached and the client has a connection, so
			// the attempt is written to the server's socket at once and
			// runs, as EVALSHA, when the server resumes.
			warm, err := l.Acquire(ctx, name+".warm")
			require.NoError(t, err)
			require.NoError(t, warm.Release(ctx))

			pause(t, e.srv)
			paused := time.Now()
			_, err = l.Acquire(withTimeout(t, 200*time.Millisecond), name)
			require.Error(t, err)
			require.NotErrorIs(t, err, ErrNotObtained)
			time.Sleep(time.Until(paused.Add(700 * time.Millisecond)))
			e.srv.Resume()

			var got *Lease
			require.Eventually(t, func() bool {
				lease, err := other.Acquire(ctx, name)
				if err != nil {
					return false
				}
				got = lease
				return true
			}, time.Second, 10*time.Millisecond, "the lock is free within a second of Redis answering again")
			require.NoError(t, l.Close())
			require.NoError(t, got.Release(ctx), "the lock taken after the resume is still its holder's")
			key, _ := l.keys(name)
			assert.False(t, keyExists(t, e.srv, key), "no late attempt took the lock")
		})
	}
}

// logged reports whether a line of logs is about the lock called name and
// contains msg.
func logged(logs *syncBuffer, name, msg string) bool {
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, msg) && slices.Contains(strings.Fields(line), "lock="+name) {
			return true
		}
	}
	return false
}

// dialCounter counts the connections a go-redis client tries to open.
type dialCounter struct{ n atomic.Int64 }

var _ redis.Hook = (*dialCounter)(nil)

func (h *dialCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		h.n.Add(1)
		return next(ctx, network, addr)
	}
}

func (h *dialCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *dialCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// closedAddr returns a loopback address where nothing listens: a port
// bound by a socket that does not listen, until the test ends, so that
// connections to it are refused and no other test's server or proxy can
// take the port meanwhile (a port merely found free and closed can be
// handed out again at once: seen as "EOF" instead of "connection refused").
func closedAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}

func TestClosedAddrIsRefusedAndReserved(t *testing.T) {
	addr := closedAddr(t)
	_, err := net.DialTimeout("tcp", addr, time.Second)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	_, err = net.Listen("tcp", addr)
	require.ErrorIs(t, err, syscall.EADDRINUSE, "no other test can listen there meanwhile")
}

// refusedClient returns a go-redis client, with go-redis's default options,
// for an address where nothing listens, and counts its dials.
func refusedClient(t *testing.T, addr string) (*redis.Client, *dialCounter) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	h := &dialCounter{}
	c.AddHook(h)
	return c, h
}

// TestDeadlineDialRefusedNeedsNoCleanup: a try-once Acquire against a port
// where nothing listens never reached Redis, so it starts no clean-up: it
// dials exactly as often as a raw PING does (go-redis's own retries), logs
// no clean-up, and leaves nothing for Close to wait for.
func TestDeadlineDialRefusedNeedsNoCleanup(t *testing.T) {
	t.Parallel()
	addr := closedAddr(t)

	// A raw PING on an identical client, at the same time: go-redis's
	// dials and retries take more than a second.
	ping, pingDials := refusedClient(t, addr)
	pinged := make(chan error, 1)
	go func() { pinged <- ping.Ping(ctx).Err() }()

	c, dials := refusedClient(t, addr)
	log, logs := testLogger()
	// An AttemptTimeout longer than go-redis's retries lets the attempt
	// dial as often as the PING.
	l, err := New(c, &Options{Logger: log, AttemptTimeout: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	_, err = l.Acquire(ctx, uniqueName(t))
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "connection refused")
	require.Error(t, <-pinged)
	assert.Equal(t, pingDials.n.Load(), dials.n.Load(), "the Acquire dials as often as a PING: no clean-up call")
	assert.NotContains(t, logs.String(), "clean-up", "no clean-up for an attempt that never reached Redis")

	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_ = l.Close()
	}()
	select {
	case <-closed:
	case <-time.After(time.Second):
		t.Error("Close waited for a clean-up: nothing should run in the background")
		<-closed
	}
	assert.Equal(t, pingDials.n.Load(), dials.n.Load(), "no clean-up dialled in the background either")
}

// TestNoDeadlineOnAHungRedis measures the figures GUARANTEES.md ("Deadlines
// and the watchdog") and the README quote for calls without a deadline on a
// SIGSTOPped redis-server, with go-redis's default options: Extend waits for
// go-redis to give up, 10.0s measured on the connection that hung and 5.0s
// on the new connection a later call dials (go-redis v9.23.0); Release
// returns ErrUnavailable at Options.ReleaseTimeout (5s).
func TestNoDeadlineOnAHungRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 20s")
	}
	t.Parallel()
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	var leases []*Lease
	for i := range 3 {
		lease, err := l.Acquire(ctx, fmt.Sprintf("%s.%d", name, i))
		require.NoError(t, err)
		leases = append(leases, lease)
	}
	pause(t, e.srv)
	timed := func(what string, f func() error) (time.Duration, error) {
		start := time.Now()
		err := f()
		took := time.Since(start)
		t.Logf("%s without a deadline: %v after %v", what, err, took)
		return took, err
	}

	took, err := timed("Extend", func() error { return leases[0].Extend(context.Background(), time.Minute) })
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Greater(t, took, 9*time.Second, "the first call, on the connection that hung")
	assert.Less(t, took, 11*time.Second, "GUARANTEES.md quotes 10s")

	took, err = timed("Extend", func() error { return leases[1].Extend(context.Background(), time.Minute) })
	require.ErrorIs(t, err, ErrUnavailable)
	assert.InDelta(t, 5*time.Second, took, float64(time.Second), "a later call, on a new connection: GUARANTEES.md quotes 5s")

	took, err = timed("Release", func() error { return leases[2].Release(context.Background()) })
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "no reply within ReleaseTimeout 5s")
	assert.InDelta(t, 5*time.Second, took, float64(deadlineSlack), "Release is bounded by ReleaseTimeout")
	e.srv.Resume()
}
