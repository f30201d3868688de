package fencevalkey

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valkey-io/valkey-go"

	"github.com/fencelock/fencelock/internal/driver"
	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
)

func testClient(t *testing.T, o driver.Options) (*client, *redistest.Server) {
	t.Helper()
	s := redistest.Start(t)
	rc, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{s.Addr}, DisableCache: true})
	require.NoError(t, err)
	t.Cleanup(rc.Close)
	return newClient(rc, o), s
}

// Replies look as go-redis's Do gives them.
func TestReplies(t *testing.T) {
	c, _ := testClient(t, driver.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	call := func(args ...any) any {
		t.Helper()
		v, err := c.Call(ctx, args)
		require.NoError(t, err)
		return v
	}
	assert.Equal(t, "OK", call("SET", "k", 1.5))
	assert.Equal(t, "1.5", call("GET", "k"))
	assert.Nil(t, call("GET", "missing"))
	assert.Equal(t, int64(1), call("INCR", "n"))
	assert.Equal(t, int64(1), call("RPUSH", "l", []byte("a")))
	assert.Equal(t, int64(2), call("RPUSH", "l", true))
	assert.Equal(t, []any{"a", "1"}, call("LRANGE", "l", 0, -1))
	assert.Equal(t, []any{int64(1), nil, "x"}, call("EVAL", "return {1, false, 'x'}", 0))
	info, ok := call("INFO", "server").(string)
	require.True(t, ok)
	assert.True(t, strings.HasPrefix(info, "# Server"), "a verbatim string without its format: %q", info[:10])
	hello, ok := call("HELLO", 3).(map[any]any)
	require.True(t, ok)
	assert.Equal(t, int64(3), hello["proto"])
	cfg, ok := call("CONFIG", "GET", "appendonly").(map[any]any)
	require.True(t, ok)
	assert.Equal(t, "no", cfg["appendonly"])
}

// Error replies have a RedisError method and the server's message.
func TestErrorReplies(t *testing.T) {
	c, _ := testClient(t, driver.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.Call(ctx, []any{"NOSUCHCOMMAND"})
	var rerr interface{ RedisError() }
	require.ErrorAs(t, err, &rerr)
	assert.True(t, strings.HasPrefix(err.Error(), "ERR unknown command"), err.Error())
	assert.True(t, store.IsUnknownCommand(err))
	assert.Equal(t, store.Misconfigured, store.ClassOf(err))

	_, err = c.Call(ctx, []any{"EVALSHA", "0123456789012345678901234567890123456789", 0})
	assert.True(t, script.IsNoScript(err), "%v", err)

	_, err = c.Call(ctx, []any{"HSET", "h", "f", "v"})
	require.NoError(t, err)
	_, err = c.Call(ctx, []any{"GET", "h"})
	assert.True(t, strings.HasPrefix(err.Error(), "WRONGTYPE"), err.Error())
	_, err = c.Call(ctx, []any{"EVAL", "return redis.call('GET', KEYS[1])", 1, "h"})
	assert.Equal(t, "WRONGTYPE", store.Code(err.Error()), err.Error())

	errs := c.Pipe(ctx, true, []any{"SET", "t", "1"}, []any{"INCR", "h"})
	require.Len(t, errs, 3)
	assert.NoError(t, errs[0])
	assert.Error(t, errs[1], "INCR of a hash fails inside EXEC")
	assert.NoError(t, errs[2])
	errs = c.Pipe(ctx, true, []any{"SET", "t", "1"}, []any{"NOSUCHCOMMAND"})
	assert.Error(t, errs[1])
	assert.Contains(t, errs[2].Error(), "EXECABORT")
	for _, err := range c.Pipe(ctx, false, []any{"PING"}, []any{"GET", "t"}) {
		assert.NoError(t, err)
	}
}

// A script and WAIT: the reply with a ReplicaError when too few replicas
// acknowledged; the script is loaded with EVAL after NOSCRIPT.
func TestRunWait(t *testing.T) {
	c, s := testClient(t, driver.Options{Replicas: 1, ReplicaTimeout: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := s.Do("SCRIPT", "FLUSH")
	require.NoError(t, err)
	reply, err := c.Run(ctx, script.Inspect, false, []any{"lock:{x}", "lock:{x}:fence"}, nil)
	assert.True(t, store.ReplicaShort(err), "no replica: %v", err)
	assert.NotNil(t, reply)
	var short *store.ReplicaError
	require.True(t, errors.As(err, &short))
	assert.Equal(t, int64(0), short.Acked)
}

func TestServersStandalone(t *testing.T) {
	c, s := testClient(t, driver.Options{})
	servers, err := c.Servers(context.Background())
	require.NoError(t, err)
	require.Len(t, servers, 1)
	assert.Equal(t, s.Addr, servers[0].Addr)
	assert.Equal(t, s.Addr, c.Addr())
}

// With a stale slot map, Run follows MOVED to the slot's new master, and
// sends WAIT there.
func TestRunFollowsMoved(t *testing.T) {
	cl := redistest.StartClusterN(t, 2, 0)
	rc, err := valkey.NewClient(valkey.ClientOption{InitAddress: cl.Addrs(), DisableCache: true})
	require.NoError(t, err)
	t.Cleanup(rc.Close)
	c := newClient(rc, driver.Options{Replicas: 1, ReplicaTimeout: 10 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "lock:{moved}"
	slot := keys.Slot(key)
	before, err := c.slots.master(ctx, slot)
	require.NoError(t, err)
	to := cl.Masters[0]
	if cl.MasterOf(slot) == to {
		to = cl.Masters[1]
	}
	cl.MigrateSlot(slot, to)
	stale, err := c.slots.master(ctx, slot)
	require.NoError(t, err)
	require.Equal(t, before, stale, "the map is not reloaded by itself")

	reply, err := c.Run(ctx, script.Inspect, false, []any{key, key + ":fence"}, nil)
	assert.True(t, store.ReplicaShort(err), "WAIT ran on the new master (no replica there): %v", err)
	assert.NotNil(t, reply)
	require.Eventually(t, func() bool {
		addr, err := c.slots.master(ctx, slot)
		return err == nil && addr == to.Addr
	}, 5*time.Second, 20*time.Millisecond, "MOVED reloads the slot map")
}

// While the slot migrates, Run follows ASK: ASKING, the script and WAIT on
// the importing master.
func TestRunFollowsAsk(t *testing.T) {
	cl := redistest.StartClusterN(t, 2, 0)
	rc, err := valkey.NewClient(valkey.ClientOption{InitAddress: cl.Addrs(), DisableCache: true})
	require.NoError(t, err)
	t.Cleanup(rc.Close)
	c := newClient(rc, driver.Options{Replicas: 1, ReplicaTimeout: 10 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "lock:{asked}"
	slot := keys.Slot(key)
	from := cl.MasterOf(slot)
	to := cl.Masters[0]
	if from == to {
		to = cl.Masters[1]
	}
	_, err = to.Do("CLUSTER", "SETSLOT", slot, "IMPORTING", cl.NodeID(from))
	require.NoError(t, err)
	_, err = from.Do("CLUSTER", "SETSLOT", slot, "MIGRATING", cl.NodeID(to))
	require.NoError(t, err)

	// One key, missing on the migrating master: ASK (with several, Redis
	// answers TRYAGAIN).
	exists := &script.Script{Name: "exists", Src: "return redis.call('EXISTS', KEYS[1])"}
	reply, err := c.Run(ctx, exists, true, []any{key}, nil)
	assert.True(t, store.ReplicaShort(err), "WAIT ran after the script: %v", err)
	assert.Equal(t, int64(0), reply)
}

// A slot that keeps moving (ASK to a master that answers MOVED back) is
// Unavailable after a few redirects, not the redirect (a refusal).
func TestRunRedirectLoop(t *testing.T) {
	cl := redistest.StartClusterN(t, 2, 0)
	rc, err := valkey.NewClient(valkey.ClientOption{InitAddress: cl.Addrs(), DisableCache: true})
	require.NoError(t, err)
	t.Cleanup(rc.Close)
	c := newClient(rc, driver.Options{Replicas: 1, ReplicaTimeout: 10 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "lock:{loop}"
	slot := keys.Slot(key)
	from := cl.MasterOf(slot)
	to := cl.Masters[0]
	if from == to {
		to = cl.Masters[1]
	}
	_, err = from.Do("CLUSTER", "SETSLOT", slot, "MIGRATING", cl.NodeID(to)) // to does not import it
	require.NoError(t, err)
	exists := &script.Script{Name: "exists", Src: "return redis.call('EXISTS', KEYS[1])"}
	_, err = c.Run(ctx, exists, true, []any{key}, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "slot is moving")
	assert.Equal(t, store.Unavailable, store.ClassOf(err))
	_, err = from.Do("CLUSTER", "SETSLOT", slot, "STABLE")
	require.NoError(t, err)
}

// evalCmd sends what build makes of script.Args, routed by the same slot;
// Eval and Run load a script the server lacks with EVAL after NOSCRIPT.
func TestEvalCmd(t *testing.T) {
	c, s := testClient(t, driver.Options{})
	b := c.c.B()
	ks := []any{"lock:{x}", "lock:{x}:fence"}
	argv := []any{"token", int64(10000), 3, 1.5, true, time.Second}
	for _, eval := range []bool{false, true} {
		want, key, keyed := build(b, script.Args(script.Inspect, eval, ks, argv))
		got := evalCmd(b, script.Inspect, eval, ks, argv)
		assert.Equal(t, want.Commands()[1:], got.Commands()[1:])
		assert.True(t, strings.EqualFold(want.Commands()[0], got.Commands()[0]))
		assert.Equal(t, want.Slot(), got.Slot())
		assert.True(t, keyed)
		assert.Equal(t, "lock:{x}", key)
	}
	none := evalCmd(b, script.Inspect, false, nil, nil)
	assert.Equal(t, []string{"EVALSHA", script.Inspect.Hash.(string), "0"}, none.Commands())

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, run := range []func() (any, error){
		func() (any, error) { return c.Eval(ctx, script.Inspect, ks, nil) },
		func() (any, error) { return c.Run(ctx, script.Inspect, false, ks, nil) },
		func() (any, error) { return c.Run(ctx, script.Inspect, true, ks, nil) },
	} {
		_, err := s.Do("SCRIPT", "FLUSH")
		require.NoError(t, err)
		reply, err := run()
		require.NoError(t, err)
		assert.NotNil(t, reply)
	}
}
