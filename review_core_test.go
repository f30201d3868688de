package fencelock

import (
	"context"
	"net"
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
