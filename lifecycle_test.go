package fencelock

import (
	"context"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFailedAcquireOtherDialRefusedIsCleanedUp: an attempt sent on a pooled
// connection to a paused server times out while another call of the same
// client fails to dial. The failed dial says nothing of the attempt's own
// request, which was sent: the Acquire's clean-up gives back the lock its
// late request takes once the server resumes.
func TestFailedAcquireOtherDialRefusedIsCleanedUp(t *testing.T) {
	t.Parallel()
	var refuse atomic.Bool
	var d net.Dialer
	e := newEnv(t, &redis.Options{DialerRetries: 1, MaxRetries: -1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if refuse.Load() {
				return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
			}
			return d.DialContext(ctx, network, addr)
		}})
	log, logs := testLogger()
	l := e.locker(t, &Options{Logger: log, AttemptTimeout: 400 * time.Millisecond, ReleaseTimeout: time.Second})
	name := uniqueName(t)
	// The scripts loaded, and one idle connection: the attempt's.
	warm, err := l.Acquire(ctx, name+".warm")
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))
	pause(t, e.srv)

	pinged := make(chan error, 1)
	go func() {
		time.Sleep(100 * time.Millisecond) // the attempt hangs on the pooled connection
		refuse.Store(true)
		pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		pinged <- e.client.Ping(pctx).Err() // needs a connection of its own: refused
	}()
	_, err = l.Acquire(ctx, name)
	require.Error(t, <-pinged)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "no reply within 400ms (AttemptTimeout): dial tcp", "names the failed dial")
	refuse.Store(false)
	e.srv.Resume()

	key, _ := l.keys(name)
	assert.Eventually(t, func() bool { return !keyExists(t, e.srv, key) }, 5*time.Second, 10*time.Millisecond,
		"the late request's lock given back:\n%s", logs)
	time.Sleep(100 * time.Millisecond)
	pttl, _ := e.srv.Do("PTTL", key)
	assert.Equal(t, int64(-2), pttl, "no orphan lock")
}

// releaseGate is an Observer whose Start of a Release runs before, once.
type releaseGate struct {
	once   sync.Once
	before func()
}

func (g *releaseGate) Start(ctx context.Context, op Op, _ string) context.Context {
	if op == OpRelease {
		g.once.Do(g.before)
	}
	return ctx
}
func (*releaseGate) End(context.Context, Event)    {}
func (*releaseGate) Notify(context.Context, Event) {}

// TestRunWithLockLossReportedOnce: a renewal that finds the lock gone
// after the work returned, as its release starts, makes the watchdog report
// the loss; the release, which then finds the lease not held, reports it
// no second time. OnLost is called once per lease.
func TestRunWithLockLossReportedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	renewing, reply := make(chan struct{}), make(chan struct{})
	var renewOnce sync.Once
	e.hook.set(nil, func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "extend" {
			renewOnce.Do(func() { close(renewing); <-reply }) // its reply held until the release starts
		}
		return nil
	})
	var losses atomic.Int32
	reported := make(chan struct{}, 2)
	gate := &releaseGate{before: func() {
		close(reply)
		select { // the watchdog reports the loss before Release stops it
		case <-reported:
		case <-time.After(5 * time.Second):
		}
	}}
	l := e.locker(t, &Options{TTL: 5 * time.Second, RenewInterval: 50 * time.Millisecond, Observer: gate,
		OnLost: func(*Lease, error) { losses.Add(1); reported <- struct{}{} }})
	name := uniqueName(t)
	err := l.RunWithLock(ctx, name, func(ctx context.Context, lease *Lease) error {
		key, _ := l.keys(name)
		_, derr := e.srv.Do("DEL", key) // lost: the next renewal finds it gone
		require.NoError(t, derr)
		<-renewing
		return nil
	})
	require.ErrorIs(t, err, ErrLost)
	assert.Equal(t, int32(1), losses.Load(), "OnLost once for one loss")
}

// TestOptionsReleaseTimeoutBounded: New rejects a ReleaseTimeout longer than
// the longest TTL (it is a marker's PX, and Close's wait), naming the option
// and the bound; at the bound, Release works.
func TestOptionsReleaseTimeoutBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for _, d := range []time.Duration{math.MaxInt64, maxTTL + time.Millisecond} {
		_, err := New(e.client, &Options{ReleaseTimeout: d})
		require.ErrorIs(t, err, ErrInvalid, "%v", d)
		assert.Contains(t, err.Error(), "ReleaseTimeout")
		assert.Contains(t, err.Error(), "longer than the maximum "+maxTTL.String())
	}
	l := e.locker(t, &Options{ReleaseTimeout: maxTTL})
	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	require.NoError(t, lease.Release(ctx))
}

// TestCloseDuringAttemptOnCallersGoroutine: with ContextTimeoutEnabled, an
// Acquire(context.Background()) runs its attempt on its caller's goroutine.
// Close is called while it hangs on a paused server; the attempt takes the
// lock once the server resumes, and Acquire gives it back and returns
// ErrClosed: no lease after Close, nothing left held.
func TestCloseDuringAttemptOnCallersGoroutine(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &redis.Options{ContextTimeoutEnabled: true})
	l := e.locker(t, &Options{AttemptTimeout: 5 * time.Second, ReleaseTimeout: time.Second})
	name := uniqueName(t)
	warm, err := l.Acquire(ctx, name+".warm") // the scripts loaded
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))
	pause(t, e.srv)

	type result struct {
		lease *Lease
		err   error
	}
	done := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(context.Background(), name)
		done <- result{lease, err}
	}()
	time.Sleep(50 * time.Millisecond)
	resumed := time.AfterFunc(250*time.Millisecond, e.srv.Resume) // 300ms after the Acquire began
	defer resumed.Stop()
	require.NoError(t, l.Close())
	r := <-done
	require.ErrorIs(t, r.err, ErrClosed)
	assert.Nil(t, r.lease)
	key, _ := l.keys(name)
	assert.Eventually(t, func() bool { return !keyExists(t, e.srv, key) }, 3*time.Second, 10*time.Millisecond,
		"the lock the attempt took is given back")
}
