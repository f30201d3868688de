package redlock

import (
	"context"
	"io"
	"log/slog"
	"strconv"
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

// env is a Quorum over n redis-servers of its own, with an admin client
// per node.
type env struct {
	q      *Quorum
	srvs   []*redistest.Server
	admins []*redis.Client
}

func newEnv(t *testing.T, n int) env {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	g := tasks.New(realClock{}, time.Second, log, func(error) bool { return false })
	closed := make(chan struct{})
	var e env
	nodes := make([]*deployment.Deployment, n)
	for i := range n {
		srv := redistest.Start(t)
		client := srv.Client(&redis.Options{MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
		admin := srv.Client(nil)
		t.Cleanup(func() { _ = client.Close(); _ = admin.Close() })
		e.srvs, e.admins = append(e.srvs, srv), append(e.admins, admin)
		nodes[i] = deployment.New(goredis.New(client, driver.Options{}), deployment.Config{KeyPrefix: "lock:",
			TTL: 10 * time.Second, Owner: "me", ReleaseTimeout: time.Second, FenceRetention: time.Hour,
			Logger: log, Clock: realClock{}, Tasks: g, Name: "node " + strconv.Itoa(i)})
	}
	e.q = New(nodes, Config{KeyPrefix: "lock:", Owner: "me", ReleaseTimeout: time.Second, FenceRetention: time.Hour,
		MinRetryBackoff: 8 * time.Millisecond, MaxRetryBackoff: 512 * time.Millisecond, Clock: realClock{}, Tasks: g, Closed: closed})
	// Cleanups run last first: these before the clients close.
	t.Cleanup(func() {
		close(closed)
		by := time.Now().Add(5 * time.Second)
		e.q.Close(by)
		g.Close(by)
	})
	return e
}

func (e env) lease(name, token string) store.Lease {
	return e.q.Lock(store.Spec{Name: name, Token: []byte(token), TTL: 10 * time.Second, Owner: "owner-" + token})
}

// holders returns the token holding key on each node ("" where none).
func (e env) holders(key string) []string {
	out := make([]string, len(e.admins))
	for i, a := range e.admins {
		v, _ := a.Get(ctx, key).Result()
		out[i], _, _ = keys.Parse(v)
	}
	return out
}

func TestQuorumAcquireAndRelease(t *testing.T) {
	e := newEnv(t, 3)
	a, b := e.lease("n", "a"), e.lease("n", "b")
	got := a.Acquire(ctx)
	require.True(t, got.OK, "%+v", got)
	assert.Positive(t, got.Fence)
	require.Eventually(t, func() bool { return assert.ObjectsAreEqual([]string{"a", "a", "a"}, e.holders(a.Key())) },
		5*time.Second, time.Millisecond, "every node granted it")

	busy := b.Acquire(ctx)
	require.False(t, busy.OK)
	require.NoError(t, busy.Err)
	assert.Equal(t, "owner-a", busy.Busy.Owner)

	h, err := e.q.Inspect(ctx, "n", false)
	require.NoError(t, err)
	assert.Equal(t, keys.Value("a", got.Fence, "owner-a"), h.Value)

	r, _, err := a.Release(ctx, store.Release, time.Second)
	require.NoError(t, err)
	assert.Equal(t, store.Done, r)
	require.Eventually(t, func() bool { return assert.ObjectsAreEqual([]string{"", "", ""}, e.holders(a.Key())) },
		5*time.Second, time.Millisecond, "every node deleted it")

	next := b.Acquire(ctx)
	require.True(t, next.OK)
	assert.Greater(t, next.Fence, got.Fence, "fences increase")
}

// A minority down is not an outage; a majority down is, and an attempt
// that reached a minority gives back what it got.
func TestQuorumSurvivesAMinority(t *testing.T) {
	e := newEnv(t, 3)
	e.srvs[2].Kill()
	a := e.lease("n", "a")
	got := a.Acquire(ctx)
	require.True(t, got.OK, "%+v", got)
	r, err := a.Extend(ctx, time.Minute, true)
	require.NoError(t, err)
	assert.Equal(t, store.Done, r)
	_, _, err = a.Release(ctx, store.Release, time.Second)
	require.NoError(t, err)

	e.srvs[1].Kill()
	b := e.lease("n", "b")
	lost := b.Acquire(ctx)
	require.False(t, lost.OK)
	require.Error(t, lost.Err, "no quorum")
	require.Eventually(t, func() bool { return e.admins[0].Exists(ctx, b.Key()).Val() == 0 },
		5*time.Second, time.Millisecond, "node 0's grant given back")
}

// An attempt that meets a split (nodes held by different tokens) gets no
// quorum and takes nothing for good.
func TestQuorumSplitTakesNothing(t *testing.T) {
	e := newEnv(t, 3)
	key := e.lease("n", "x").Key()
	require.NoError(t, e.admins[0].Set(ctx, key, keys.Value("x", 1, "x"), time.Minute).Err())
	require.NoError(t, e.admins[1].Set(ctx, key, keys.Value("y", 2, "y"), time.Minute).Err())
	got := e.lease("n", "a").Acquire(ctx)
	require.False(t, got.OK)
	require.Eventually(t, func() bool { return e.holders(key)[2] == "" },
		5*time.Second, time.Millisecond, "node 2's grant given back")
}
