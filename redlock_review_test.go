package fencelock

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A's lock expires on every node (an admin DEL stands for the expiry), then
// B acquires it, with a larger fence, and releases it. A's Extend, before
// A's local deadline, finds the lock free everywhere: a repair with A's
// fence would store a fence older than the nodes have issued (A's, B's,
// A's again). Every node refuses it, and Extend reports the lock not held.
func TestRedlockRepairNeverStoresAnOlderFence(t *testing.T) {
	e := newRedlockEnv(t, 3, nil)
	la := e.locker(t, nil)
	lb := e.locker(t, nil)
	name := uniqueName(t)
	a, err := la.Acquire(ctx, name, WithTTL(10*time.Second))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return e.holders(t, a.Key(), a.Token()) == 3 },
		time.Second, time.Millisecond, "A holds every node")
	for _, admin := range e.admins {
		require.NoError(t, admin.Del(ctx, a.Key()).Err())
	}
	b, err := lb.Acquire(ctx, name, WithTTL(10*time.Second))
	require.NoError(t, err)
	require.Greater(t, b.Fence(), a.Fence())
	require.NoError(t, b.Release(ctx))
	require.Eventually(t, func() bool { return e.holders(t, b.Key(), b.Token()) == 0 },
		time.Second, time.Millisecond, "B released every node")

	require.ErrorIs(t, a.Extend(ctx, time.Minute), ErrNotHeld)
	time.Sleep(50 * time.Millisecond) // the detached node calls
	for i, admin := range e.admins {
		v, err := admin.Get(ctx, a.Key()).Result()
		assert.False(t, err == nil && strings.HasPrefix(v, a.Token()+" "), "node %d repaired with A's stale fence: %q", i, v)
	}
}
