package conformance

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/redistest"
)

// nameOf returns a lock name unique to the test, with suffix.
func nameOf(t *testing.T, suffix string) string {
	return strings.NewReplacer("/", ".", " ", "_").Replace(t.Name()) + suffix
}

// lockKey is the key of the lock called name under the default KeyPrefix.
func lockKey(name string) string { return "lock:{" + name + "}" }

// acquired is the outcome of an Acquire run in the background.
type acquired struct {
	lease *fencelock.Lease
	err   error
	at    time.Time
}

// inBackground runs acquire on its own goroutine; the test's end cancels
// its context and waits for it, and releases what it obtained.
func inBackground(t *testing.T, acquire func(ctx context.Context) (*fencelock.Lease, error)) <-chan acquired {
	t.Helper()
	ctx, cancel := context.WithCancel(bg)
	got := make(chan acquired, 1)
	done := make(chan struct{})
	var lease *fencelock.Lease
	go func() {
		defer close(done)
		l, err := acquire(ctx)
		lease = l
		got <- acquired{lease: l, err: err, at: time.Now()}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if lease != nil {
			rctx, rcancel := context.WithTimeout(bg, 5*time.Second)
			defer rcancel()
			_ = lease.Release(rctx) // ErrNotHeld if the test released it
		}
	})
	return got
}

// acquireInBackground is inBackground of l.Acquire(name, opts...).
func acquireInBackground(t *testing.T, l *fencelock.Locker, name string, opts ...fencelock.Option) <-chan acquired {
	t.Helper()
	return inBackground(t, func(ctx context.Context) (*fencelock.Lease, error) { return l.Acquire(ctx, name, opts...) })
}

// requireAcquired waits up to d for a background Acquire's outcome, which
// must be a lease.
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

// requireNotYet checks that a background Acquire has not returned.
func requireNotYet(t *testing.T, got <-chan acquired, msg string) {
	t.Helper()
	select {
	case r := <-got:
		t.Fatalf("%s: returned early (lease %v, err %v)", msg, r.lease != nil, r.err)
	default:
	}
}

// subscribers returns how many connections of srv subscribe to channel,
// sharded (SSUBSCRIBE) or not.
func subscribers(t *testing.T, srv *redistest.Server, channel string) int64 {
	t.Helper()
	var n int64
	for _, cmd := range []string{"SHARDNUMSUB", "NUMSUB"} {
		v, err := srv.Do("PUBSUB", cmd, channel)
		require.NoError(t, err)
		reply, _ := v.([]any)
		require.Len(t, reply, 2, "PUBSUB %s reply", cmd)
		c, _ := reply[1].(int64)
		n += c
	}
	return n
}

// requireSubscribed waits until a waiter for the lock key listens on
// srv for its release.
func requireSubscribed(t *testing.T, srv *redistest.Server, key string) {
	t.Helper()
	require.Eventually(t, func() bool { return subscribers(t, srv, key) >= 1 },
		within, 5*time.Millisecond, "a waiter for %s subscribed on %s", key, srv.Addr)
}

// keyExists reports whether key exists on srv.
func keyExists(t *testing.T, srv *redistest.Server, key string) bool {
	t.Helper()
	n, err := srv.Do("EXISTS", key)
	require.NoError(t, err)
	return n != int64(0)
}

// requireBusy checks that err is a busy lock's (ErrNotObtained) and no other sentinel.
func requireBusy(t *testing.T, err error, msgAndArgs ...any) {
	t.Helper()
	require.ErrorIs(t, err, fencelock.ErrNotObtained, msgAndArgs...)
	assert.NotErrorIs(t, err, fencelock.ErrUnavailable, msgAndArgs...)
	assert.NotErrorIs(t, err, fencelock.ErrMisconfigured, msgAndArgs...)
}

// release releases lease, which must still be held.
func release(t *testing.T, lease *fencelock.Lease) {
	t.Helper()
	require.NoError(t, lease.Release(callCtx(t)), "release %s", lease.Name())
}
