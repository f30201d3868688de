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
// PTTL; a release nobody waits in line for GET, EXISTS of the line, DEL, the
// marker's SET and the wake-up's SPUBLISH.
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
	assert.Equal(t, map[string]int{"evalsha": 1, "get": 1, "del": 1, "set": 1, "exists": 1, "spublish": 1},
		commandCounts(t, e.srv), "a release nobody waits in line for")
}

// TestReleasePublishesItsWakeUp: every release publishes "released" on the
// lock's channel, one SPUBLISH, which costs the server less than counting
// the channel's subscribers first; a subscriber hears it.
func TestReleasePublishesItsWakeUp(t *testing.T) {
	e := newEnv(t, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	for i := range 3 {
		resetStats(t, e.srv)
		lease, err := l.Acquire(ctx, name)
		require.NoError(t, err)
		require.NoError(t, lease.Release(ctx))
		assert.Equal(t, 1, commandCounts(t, e.srv)["spublish"], "release %d, nobody subscribed", i)
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
