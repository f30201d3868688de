package deployment_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock/internal/deployment"
	"github.com/fencelock/fencelock/internal/driver"
	"github.com/fencelock/fencelock/internal/goredis"
	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/fencelock/fencelock/internal/store"
	"github.com/fencelock/fencelock/internal/tasks"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var ctx = context.Background()

type realClock struct{}

func (realClock) Now() time.Time                       { return time.Now() }
func (realClock) NewTimer(d time.Duration) *time.Timer { return time.NewTimer(d) }

// env is a Deployment on a redis-server of its own, and an admin client.
type env struct {
	d     *deployment.Deployment
	admin *redis.Client
}

func newEnv(t *testing.T) env {
	t.Helper()
	srv := redistest.Start(t)
	client := srv.Client(nil)
	admin := srv.Client(nil)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	g := tasks.New(realClock{}, time.Second, log, func(error) bool { return false })
	d := deployment.New(goredis.New(client, driver.Options{}), deployment.Config{KeyPrefix: "lock:", TTL: 10 * time.Second, Owner: "me",
		ReleaseTimeout: time.Second, FenceRetention: time.Hour, Logger: log, Clock: realClock{}, Tasks: g})
	t.Cleanup(func() {
		by := time.Now().Add(5 * time.Second)
		d.Close(by)
		g.Close(by)
		_ = client.Close()
		_ = admin.Close()
	})
	return env{d: d, admin: admin}
}

func (e env) lease(name, token string, fair bool) store.Lease {
	return e.d.Lock(store.Spec{Name: name, Token: []byte(token), TTL: 10 * time.Second, Owner: "owner-" + token, Fair: fair})
}

func TestLeaseLifecycle(t *testing.T) {
	e := newEnv(t)
	a, b := e.lease("n", "a", false), e.lease("n", "b", false)
	assert.Equal(t, "lock:{n}", a.Key())
	assert.Equal(t, "a", a.Token())

	got := a.Acquire(ctx)
	require.True(t, got.OK, "%+v", got)
	assert.Positive(t, got.Fence)
	again := a.Acquire(ctx)
	require.True(t, again.OK, "a retry of the holder's token is ours")
	assert.Equal(t, got.Fence, again.Fence, "with the same fence")

	busy := b.Acquire(ctx)
	require.False(t, busy.OK)
	require.NoError(t, busy.Err)
	assert.Equal(t, "owner-a", busy.Busy.Owner)
	assert.InDelta(t, 10*time.Second, busy.Busy.TTL, float64(time.Second))

	h, err := b.Read(ctx)
	require.NoError(t, err)
	assert.Equal(t, keys.Value("a", got.Fence, "owner-a"), h.Value)
	assert.Equal(t, got.Fence, h.Counter)

	r, err := a.Extend(ctx, time.Minute, false)
	require.NoError(t, err)
	assert.Equal(t, store.Done, r)
	assert.InDelta(t, time.Minute, e.admin.PTTL(ctx, a.Key()).Val(), float64(time.Second))
	r, err = b.Extend(ctx, time.Minute, true)
	require.NoError(t, err)
	assert.Equal(t, store.Taken, r, "another's token")

	r, perr, err := b.Release(ctx, store.Release, time.Second)
	require.NoError(t, err)
	require.NoError(t, perr)
	assert.Equal(t, store.Taken, r, "another's token deletes nothing")
	r, _, err = a.Release(ctx, store.Release, time.Second)
	require.NoError(t, err)
	assert.Equal(t, store.Done, r)
	assert.Zero(t, e.admin.Exists(ctx, a.Key()).Val())
	r, _, err = a.Release(ctx, store.Release, time.Second)
	require.NoError(t, err)
	assert.Equal(t, store.Done, r, "a resent release reports what the first did (the marker)")
	assert.ErrorIs(t, a.Acquire(ctx).Err, store.ErrRetired, "a late copy of a released token's attempt takes nothing")

	r, err = a.Extend(ctx, time.Minute, false)
	require.NoError(t, err)
	assert.Equal(t, store.Gone, r)

	next := b.Acquire(ctx)
	require.True(t, next.OK)
	assert.Greater(t, next.Fence, got.Fence, "fences increase")
}

// An abandon retires the token: a late copy of the attempt it gave up
// never takes the lock, for as long as such a lock would live.
func TestAbandonRefusesALateAttempt(t *testing.T) {
	e := newEnv(t)
	a := e.lease("n", "a", false)
	r, _, err := a.Release(ctx, store.Abandon, 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, store.Gone, r, "it held nothing")
	marker := keys.ForLease("lock:", "n", []byte("a"))[keys.MarkerKey]
	assert.InDelta(t, 10*time.Second, e.admin.PTTL(ctx, marker).Val(), float64(time.Second))
	assert.ErrorIs(t, a.Acquire(ctx).Err, store.ErrRetired)
	assert.Zero(t, e.admin.Exists(ctx, a.Key()).Val())
}

// The fence counter outlives the lock and is floored by the server's
// time: a lost counter does not take fences back.
func TestFencesIncreaseWithoutTheCounter(t *testing.T) {
	e := newEnv(t)
	a := e.lease("n", "a", false)
	first := a.Acquire(ctx)
	require.True(t, first.OK)
	_, _, err := a.Release(ctx, store.Release, time.Second)
	require.NoError(t, err)
	require.NoError(t, e.admin.Del(ctx, "lock:{n}:fence").Err())
	second := e.lease("n", "b", false).Acquire(ctx)
	require.True(t, second.OK)
	assert.Greater(t, second.Fence, first.Fence)

	// A counter ahead of the clock is counted on from.
	ahead := second.Fence + int64(time.Hour/time.Microsecond)
	require.NoError(t, e.admin.Set(ctx, "lock:{n}:fence", ahead, time.Hour).Err())
	_, _, err = e.lease("n", "b", false).Release(ctx, store.Release, time.Second)
	require.NoError(t, err)
	third := e.lease("n", "c", false).Acquire(ctx)
	require.True(t, third.OK)
	assert.Equal(t, ahead+1, third.Fence)
}

// A fair attempt on a busy lock joins its line; the holder's release
// grants the lock to the first in line, in the same step.
func TestReleaseGrantsToTheFirstInLine(t *testing.T) {
	e := newEnv(t)
	a := e.lease("n", "a", false)
	got := a.Acquire(ctx)
	require.True(t, got.OK)
	w := e.lease("n", "w", true)
	busy := w.Acquire(ctx)
	require.False(t, busy.OK)
	assert.Equal(t, []string{"w"}, e.admin.ZRange(ctx, "lock:{n}:q", 0, -1).Val(), "joined the line")
	plain := e.lease("n", "p", false).Acquire(ctx)
	require.False(t, plain.OK, "a plain attempt does not join the line")
	assert.Equal(t, []string{"w"}, e.admin.ZRange(ctx, "lock:{n}:q", 0, -1).Val())

	_, _, err := a.Release(ctx, store.Release, time.Second)
	require.NoError(t, err)
	h, err := w.Read(ctx)
	require.NoError(t, err)
	holder, _, _ := keys.Parse(h.Value)
	assert.Equal(t, "w", holder, "granted to the waiter")
	assert.Empty(t, e.admin.ZRange(ctx, "lock:{n}:q", 0, -1).Val(), "it left the line")
	took := w.Acquire(ctx)
	require.True(t, took.OK, "its next attempt finds the lock its own")
	assert.Greater(t, took.Fence, got.Fence)
}

// A release wakes a plain waiter listening on the lock's channel.
func TestReleaseWakesAWaiter(t *testing.T) {
	e := newEnv(t)
	a := e.lease("n", "a", false)
	require.True(t, a.Acquire(ctx).OK)
	b := e.lease("n", "b", false)
	wake := b.Wakeup()
	busy := b.Acquire(ctx)
	require.False(t, busy.OK)
	woken, _ := wake.Next(busy, true, time.Minute)
	select { // the subscription's confirmation: a release in between is not missed
	case <-woken:
	case <-time.After(5 * time.Second):
		t.Fatal("the subscription was not confirmed")
	}
	wake.Woken()
	busy = b.Acquire(ctx)
	require.False(t, busy.OK, "still held")
	woken, _ = wake.Next(busy, true, time.Minute)
	select {
	case <-woken:
		t.Fatal("woken before the release")
	case <-time.After(50 * time.Millisecond):
	}
	_, _, err := a.Release(ctx, store.Release, time.Second)
	require.NoError(t, err)
	select {
	case <-woken:
	case <-time.After(5 * time.Second):
		t.Fatal("the release woke nobody")
	}
	wake.Woken()
	assert.True(t, b.Acquire(ctx).OK)
	wake.Leave(nil, true)
}

// Inspect reads a lock and how many wait for it, changing nothing.
func TestInspect(t *testing.T) {
	e := newEnv(t)
	h, err := e.d.Inspect(ctx, "n", true)
	require.NoError(t, err)
	assert.Empty(t, h.Value, "a lock never taken")
	assert.Zero(t, h.Counter)
	a := e.lease("n", "a", false)
	got := a.Acquire(ctx)
	require.True(t, got.OK)
	h, err = e.d.Inspect(ctx, "n", true)
	require.NoError(t, err)
	assert.Equal(t, got.Fence, h.Counter)
	assert.Zero(t, h.Waiters)
	assert.InDelta(t, 10*time.Second, h.PTTL, float64(time.Second))
}

// A call's context bounds it: on a paused server, an acquire returns by
// its deadline with the context's error.
func TestAcquireStopsAtItsDeadline(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(&redis.Options{ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	g := tasks.New(realClock{}, time.Second, log, func(error) bool { return false })
	d := deployment.New(goredis.New(client, driver.Options{}), deployment.Config{KeyPrefix: "lock:", TTL: time.Second, Owner: "me",
		ReleaseTimeout: time.Second, FenceRetention: time.Hour, Logger: log, Clock: realClock{}, Tasks: g})
	t.Cleanup(func() { d.Close(time.Now().Add(time.Second)); g.Close(time.Now().Add(time.Second)) })
	require.True(t, d.Traits().Deadlines)
	require.NoError(t, client.Ping(ctx).Err())
	srv.Pause()
	t.Cleanup(srv.Resume)
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	got := d.Lock(store.Spec{Name: "n", Token: []byte("a"), TTL: time.Second}).Acquire(cctx)
	assert.ErrorIs(t, got.Err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second, "by the deadline, not the server's resumption")
}
