package fencelock

// Issue 29: New and NewRedlock accept go-redis's AutoPipeliner
// (client.AutoPipeline()), which batches the scripts; every feature works
// through it: deadlines, the database tag, pub/sub and WAIT on a plain
// connection, and a batch resent after its reply was lost.

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/redistest"
)

// autoPipeline returns c's AutoPipeliner, closed when the test ends.
func autoPipeline(t *testing.T, c interface {
	AutoPipeline() (*redis.AutoPipeliner, error)
}) *redis.AutoPipeliner {
	t.Helper()
	ap, err := c.AutoPipeline()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ap.Close() })
	return ap
}

// batchCount is a go-redis hook that counts the script calls the
// AutoPipeliner sent in batches (pipelines) of more than one command.
type batchCount struct{ batched, alone atomic.Int64 }

func (*batchCount) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (*batchCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *batchCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := int64(0)
		for _, cmd := range cmds {
			if scriptName(cmd) != "" {
				n++
			}
		}
		if len(cmds) > 1 {
			h.batched.Add(n)
		} else {
			h.alone.Add(n)
		}
		return next(ctx, cmds)
	}
}

// TestAutoPipelinerEveryFeature runs a Locker through an AutoPipeliner of a
// client on database 2, beside one through a plain client of the same
// database: locks exclude each other across them, releases through either
// wake waiters of the other (the channels carry the same database tag),
// fair waiting, extension, the watchdog, Inspect and Check work, and
// concurrent calls are batched.
func TestAutoPipelinerEveryFeature(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(&redis.Options{DB: 2})
	counted := &batchCount{}
	c.AddHook(counted)
	slow := &Options{MinRetryBackoff: 10 * time.Second, MaxRetryBackoff: 20 * time.Second} // woken, or nothing
	pl, err := New(autoPipeline(t, c), slow)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pl.Close() })
	plain, err := New(srv.Client(&redis.Options{DB: 2}), slow)
	require.NoError(t, err)
	t.Cleanup(func() { _ = plain.Close() })
	name := uniqueName(t)

	for _, tc := range []struct {
		what           string
		holder, waiter *Locker
		opts           []Option
	}{
		{"plain holder, pipelined waiter", plain, pl, nil},
		{"pipelined holder, plain waiter", pl, plain, nil},
		{"pipelined holder, pipelined fair waiter", pl, pl, []Option{WithFair()}},
	} {
		held, err := tc.holder.Acquire(ctx, name, WithTTL(time.Minute))
		require.NoError(t, err, tc.what)
		_, err = tc.waiter.Acquire(ctx, name)
		require.ErrorIs(t, err, ErrNotObtained, "%s: excluded", tc.what)
		got := acquireInBackground(t, tc.waiter, name, append(tc.opts, WithWait(time.Minute))...)
		require.Eventually(t, func() bool {
			info, err := tc.holder.Inspect(ctx, name)
			return err == nil && info.Waiters > 0
		}, 5*time.Second, time.Millisecond, "%s: the waiter subscribed", tc.what)
		require.NoError(t, held.Release(ctx), tc.what)
		r := requireAcquired(t, got, 5*time.Second, tc.what+": woken by the release, not by its 10s backoff")
		assert.Greater(t, r.lease.Fence(), held.Fence(), "%s: fences increase", tc.what)
		require.NoError(t, r.lease.Release(ctx), tc.what)
	}

	// Extend, the watchdog, Inspect.
	lease, err := pl.Acquire(ctx, name, WithTTL(time.Second))
	require.NoError(t, err)
	require.NoError(t, lease.Extend(ctx, 2*time.Second))
	work := lease.KeepAlive(ctx)
	time.Sleep(1500 * time.Millisecond)
	require.NoError(t, work.Err(), "the watchdog renews through the AutoPipeliner")
	info, err := pl.Inspect(ctx, name)
	require.NoError(t, err)
	assert.True(t, info.Held)
	assert.Equal(t, lease.Fence(), info.Fence)
	require.NoError(t, lease.Release(ctx))

	findings, err := pl.Check(ctx)
	require.NoError(t, err)
	for _, f := range findings {
		assert.NotEqual(t, SeverityCritical, f.Severity, "%+v", f)
		assert.NotContains(t, f.Seen, "cannot inspect", "%+v", f)
	}

	// Concurrent calls share batches.
	counted.batched.Store(0)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			for j := range 20 {
				lease, err := pl.Acquire(ctx, name+"."+strconv.Itoa(i))
				if !assert.NoError(t, err, "goroutine %d, call %d", i, j) {
					return
				}
				assert.NoError(t, lease.Release(ctx))
			}
		})
	}
	wg.Wait()
	t.Logf("script calls in batches of more than one command: %d of %d", counted.batched.Load(), 16*20*2)
	assert.Positive(t, counted.batched.Load(), "the AutoPipeliner batched script calls")
}

// TestAutoPipelinerReplicasWaitOnTheScriptsConnection: with Options.Replicas,
// WAIT must follow the script on the connection that wrote it; WAIT on a
// connection without writes returns at once with every replica. With the
// replica paused, an acquisition through an AutoPipeliner is therefore
// short of acknowledgements.
func TestAutoPipelinerReplicasWaitOnTheScriptsConnection(t *testing.T) {
	t.Parallel()
	master, rs, _, _ := replicated(t, 1, nil)
	t.Cleanup(rs[0].Resume)
	l, err := New(autoPipeline(t, master.Client(nil)), &Options{Replicas: 1, ReplicaTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	name := uniqueName(t)
	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err, "the replica acknowledges")
	require.NoError(t, lease.Release(ctx))

	rs[0].Pause()
	_, err = l.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "0 of 1 replicas acknowledged")
}

// TestAutoPipelinerDeadlines: an AutoPipeliner runs its batches on its own
// context, and waits for go-redis's ReadTimeout (3s, retried) on a hung
// server; the calls still return by their caller's deadline, and Release
// by ReleaseTimeout without one. What they left in flight finishes once
// the server answers again, and Close waits for it.
func TestAutoPipelinerDeadlines(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l, err := New(autoPipeline(t, srv.Client(nil)), &Options{ReleaseTimeout: time.Second})
	require.NoError(t, err)
	name := uniqueName(t)
	released, err := l.Acquire(ctx, name+".released")
	require.NoError(t, err)
	dropped, err := l.Acquire(ctx, name+".dropped")
	require.NoError(t, err)
	pause(t, srv)

	d := 200 * time.Millisecond
	c := withTimeout(t, d)
	err = returnsBy(t, d, "Acquire(ctx 200ms)", func() error {
		_, err := l.Acquire(c, name+".acquire")
		return err
	})
	requireNoVerdict(t, err, context.DeadlineExceeded, "Acquire")

	c = withTimeout(t, d)
	err = returnsBy(t, d, "Release(ctx 200ms)", func() error { return released.Release(c) })
	requireNoVerdict(t, err, context.DeadlineExceeded, "Release")

	err = returnsBy(t, time.Second, "Release(no deadline, ReleaseTimeout 1s)", func() error {
		return dropped.Release(context.Background())
	})
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "no reply within ReleaseTimeout 1s")

	srv.Resume()
	require.NoError(t, l.Close())
	admin := srv.Client(nil)
	for _, key := range []string{released.Key(), dropped.Key()} {
		assert.Zero(t, admin.Exists(ctx, key).Val(), "%s: released in the background, and Close waited", key)
	}
	key, _ := l.keys(name + ".acquire")
	assert.Zero(t, admin.Exists(ctx, key).Val(), "the given-up attempt left no lock")
}

// TestAutoPipelinerBatchReplyLost: the proxy drops the reply to a batch of
// concurrent acquisitions after the server ran it (and closes the
// connection); go-redis resends the whole batch on a new connection, and
// each acquisition, found already taken by its own token, returns the
// fence the lost run issued: one fence per acquisition. A release whose
// batch reply is lost is resent too and reports success, per its token's
// marker.
func TestAutoPipelinerBatchReplyLost(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr}) // MaxRetries 3
	t.Cleanup(func() { _ = client.Close() })
	ap := autoPipeline(t, client)
	l, err := New(ap, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	admin := srv.Client(nil)
	name := uniqueName(t)
	warm, err := l.Acquire(ctx, name+".warm") // dials, loads the scripts, the first (loud) release
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))
	evalshas := func() int64 {
		t.Helper()
		return int64(commandCounts(t, srv)["evalsha"])
	}

	const callers = 8
	leases := make([]*Lease, callers)
	errs := make([]error, callers)
	before := evalshas()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			<-start
			leases[i], errs[i] = l.Acquire(ctx, name+"."+strconv.Itoa(i), WithWait(5*time.Second))
		})
	}
	proxy.DropNextReply()
	close(start)
	wg.Wait()
	for i, lease := range leases {
		require.NoError(t, errs[i], "caller %d", i)
		v, err := admin.Get(ctx, lease.Key()).Result()
		require.NoError(t, err)
		token, fence, _ := keys.Parse(v)
		assert.Equal(t, lease.Token(), token, "caller %d holds its lock", i)
		assert.Equal(t, fence, lease.Fence(), "caller %d: the fence the server stored", i)
		counter, err := admin.Get(ctx, lease.Key()+keys.Fence).Int64()
		require.NoError(t, err)
		assert.Equal(t, fence, counter, "caller %d: one fence issued", i)
	}
	resent := evalshas() - before - callers
	t.Logf("%d of the %d acquisitions ran twice: their batch's reply was lost and the batch resent", resent, callers)
	assert.Positive(t, resent, "a batch was resent")

	before = evalshas()
	proxy.DropNextReply()
	require.NoError(t, leases[0].Release(ctx), "the resent release reports what the lost one did")
	assert.Equal(t, int64(2), evalshas()-before, "the release ran twice")
	assert.Zero(t, admin.Exists(ctx, leases[0].Key()).Val())
	for _, lease := range leases[1:] {
		require.NoError(t, lease.Release(ctx))
	}
}

// TestAutoPipelinerRedlock: NewRedlock takes AutoPipeliners as its nodes.
func TestAutoPipelinerRedlock(t *testing.T) {
	t.Parallel()
	var clients []redis.UniversalClient
	for range 3 {
		clients = append(clients, autoPipeline(t, redistest.Start(t).Client(nil)))
	}
	l, err := NewRedlock(clients, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	name := uniqueName(t)
	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	_, err = l.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrNotObtained)
	require.NoError(t, lease.Extend(ctx, time.Minute))
	require.NoError(t, lease.Release(ctx))
	again, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	assert.Greater(t, again.Fence(), lease.Fence())
	require.NoError(t, again.Release(ctx))
}
