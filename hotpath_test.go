package fencelock

// Issue 29: the hot path pays only for what it uses. The scripts' common
// cases run only the commands the lock and its fence need, and a release
// publishes only when someone may be waiting.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
)

// commandCounts returns how many times srv ran each command since the last
// CONFIG RESETSTAT, as INFO commandstats names them (a script's own calls
// count too), without CONFIG, INFO and what a new connection sends.
func commandCounts(t *testing.T, srv *redistest.Server) map[string]int {
	t.Helper()
	out := map[string]int{}
	for k, v := range srv.Info("commandstats") {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok || strings.HasPrefix(name, "config") || strings.HasPrefix(name, "client") ||
			name == "info" || name == "hello" || name == "select" || name == "auth" {
			continue
		}
		var n int
		_, err := fmt.Sscanf(v, "calls=%d,", &n)
		require.NoError(t, err, v)
		out[name] = n
	}
	return out
}

func resetStats(t *testing.T, srv *redistest.Server) {
	t.Helper()
	_, err := srv.Do("CONFIG", "RESETSTAT")
	require.NoError(t, err)
}

// TestScriptsCommonCaseCommands: a free lock with no queue costs the acquire
// script one EXISTS (the token marker and the queue at once), the GET, the
// fence's TIME and SET, and the lock's SET; a busy answer EXISTS, GET and
// PTTL; a release nobody waits for GET, DEL, the marker's SET, EXISTS of the
// queue and the subscriber count, and no publish.
func TestScriptsCommonCaseCommands(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	warm, err := l.Acquire(ctx, name+".warm") // the scripts loaded, the first (loud) release done
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))

	resetStats(t, e.srv)
	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"evalsha": 1, "exists": 1, "get": 1, "time": 1, "set": 2}, commandCounts(t, e.srv),
		"a free lock")

	resetStats(t, e.srv)
	_, err = l.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrNotObtained)
	assert.Equal(t, map[string]int{"evalsha": 1, "exists": 1, "get": 1, "pttl": 1}, commandCounts(t, e.srv),
		"a busy lock")

	resetStats(t, e.srv)
	require.NoError(t, lease.Release(ctx))
	assert.Equal(t, map[string]int{"evalsha": 1, "get": 1, "del": 1, "set": 1, "exists": 1, "pubsub|shardnumsub": 1},
		commandCounts(t, e.srv), "a release nobody waits for")
}

// TestReleasePublishesOnlyWhenSomeoneMayWait: with nobody subscribed to the
// lock's channel, a release publishes nothing (but a Locker's first, which
// tries the permission); with a subscriber, it publishes "released".
func TestReleasePublishesOnlyWhenSomeoneMayWait(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	for i := range 3 {
		resetStats(t, e.srv)
		lease, err := l.Acquire(ctx, name)
		require.NoError(t, err)
		require.NoError(t, lease.Release(ctx))
		want := 0
		if i == 0 {
			want = 1 // the Locker's first release tries the permission
		}
		assert.Equal(t, want, commandCounts(t, e.srv)["spublish"], "release %d, nobody subscribed", i)
	}

	sub := e.admin.SSubscribe(ctx, l.opts.KeyPrefix+"{"+name+"}") // the channel of a lock on database 0
	t.Cleanup(func() { _ = sub.Close() })
	_, err := sub.Receive(ctx) // the confirmation
	require.NoError(t, err)
	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	require.NoError(t, lease.Release(ctx))
	msg, err := sub.ReceiveTimeout(ctx, 5*time.Second)
	require.NoError(t, err, "a subscriber hears the release")
	assert.Contains(t, fmt.Sprint(msg), "released")
}
