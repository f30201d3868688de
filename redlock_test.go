package fencelock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/fencelock/fencelock/internal/redlock"
	"github.com/fencelock/fencelock/internal/store"
)

// redlockEnv is n independent redis-servers and a Redlock Locker over them.
type redlockEnv struct {
	srvs    []*redistest.Server
	clients []redis.UniversalClient // the Locker's, one per server
	hooks   []*faultHook
	admins  []*redis.Client
}

func newRedlockEnv(t *testing.T, n int, opts *redis.Options) *redlockEnv {
	t.Helper()
	e := &redlockEnv{}
	for range n {
		srv := redistest.Start(t)
		c := srv.Client(opts)
		h := &faultHook{}
		c.AddHook(h)
		e.srvs = append(e.srvs, srv)
		e.clients = append(e.clients, c)
		e.hooks = append(e.hooks, h)
		e.admins = append(e.admins, srv.Client(&redis.Options{MaxRetries: -1}))
	}
	return e
}

func (e *redlockEnv) locker(t *testing.T, opts *Options) *Locker {
	t.Helper()
	l, err := NewRedlock(e.clients, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// holders returns how many servers hold key for token.
func (e *redlockEnv) holders(t *testing.T, key, token string) int {
	t.Helper()
	n := 0
	for _, a := range e.admins {
		v, err := a.Get(ctx, key).Result()
		if err == nil && strings.HasPrefix(v, token+" ") {
			n++
		}
	}
	return n
}

func TestRedlockInvalid(t *testing.T) {
	e := newRedlockEnv(t, 1, nil)
	var nilClient *redis.Client
	for _, tc := range []struct {
		name    string
		clients []redis.UniversalClient
		msg     string
	}{
		{"none", nil, "no redis clients"},
		{"nil", []redis.UniversalClient{e.clients[0], nil}, "client 1 is nil"},
		{"typed nil", []redis.UniversalClient{nilClient}, "client 0 is nil"},
		{"twice", []redis.UniversalClient{e.clients[0], e.clients[0]}, "the same client"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewRedlock(tc.clients, nil)
			require.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, err.Error(), tc.msg)
			assert.Zero(t, e.hooks[0].calls.Load(), "no Redis call")
		})
	}
}

func TestRedlockAcquireRelease(t *testing.T) {
	e := newRedlockEnv(t, 3, nil)
	l := e.locker(t, nil)
	lease, err := l.Acquire(ctx, uniqueName(t), WithTTL(10*time.Second))
	require.NoError(t, err)
	assert.Positive(t, lease.Fence())
	require.Eventually(t, func() bool { return e.holders(t, lease.Key(), lease.Token()) == 3 },
		time.Second, time.Millisecond, "held on every node")
	for _, a := range e.admins {
		v, err := a.Get(ctx, lease.Key()).Result()
		require.NoError(t, err)
		_ = v
	}
	_, err = l.Acquire(ctx, uniqueName(t))
	require.ErrorIs(t, err, ErrNotObtained)

	require.NoError(t, lease.Extend(ctx, time.Minute))
	assert.Eventually(t, func() bool {
		for _, a := range e.admins {
			if pttl, err := a.PTTL(ctx, lease.Key()).Result(); err != nil || pttl < 50*time.Second {
				return false
			}
		}
		return true
	}, time.Second, time.Millisecond, "extended on every node")
	require.NoError(t, lease.Release(ctx))
	// Release waits a round trip's grace for the nodes after the quorum
	// (TestRedlockHealthyNodesAgreeWhenACallReturns); a slower one follows.
	assert.Eventually(t, func() bool { return e.holders(t, lease.Key(), lease.Token()) == 0 },
		time.Second, time.Millisecond, "released on every node")
	assert.ErrorIs(t, lease.Release(ctx), ErrNotHeld)

	next, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	assert.Greater(t, next.Fence(), lease.Fence())
	require.NoError(t, next.Release(ctx))
}

func TestRedlockOneWinnerAndOrderedFences(t *testing.T) {
	e := newRedlockEnv(t, 5, nil)
	name := uniqueName(t)
	const workers, rounds = 6, 15
	var (
		inside, overlap atomic.Int32
		mu              sync.Mutex
		fences          []int64
		quorumHeld      atomic.Int32
	)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			var clients []redis.UniversalClient
			for _, s := range e.srvs {
				clients = append(clients, s.Client(nil))
			}
			l, err := NewRedlock(clients, nil)
			if err != nil {
				errs <- err
				return
			}
			defer l.Close()
			for range rounds {
				lease, err := l.Acquire(ctx, name, WithWait(20*time.Second))
				if err != nil {
					errs <- err
					return
				}
				if inside.Add(1) > 1 {
					overlap.Add(1)
				}
				mu.Lock()
				fences = append(fences, lease.Fence())
				mu.Unlock()
				time.Sleep(time.Millisecond)
				// The clean-ups of this call's failed attempts never touch
				// what its last attempt was granted.
				if e.holders(t, lease.Key(), lease.Token()) >= 3 {
					quorumHeld.Add(1)
				}
				inside.Add(-1)
				if err := lease.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Zero(t, overlap.Load(), "overlapping holders")
	assert.Equal(t, int32(workers*rounds), quorumHeld.Load(), "every holder held a quorum while it worked")
	require.Len(t, fences, workers*rounds)
	for i := 1; i < len(fences); i++ {
		assert.Greater(t, fences[i], fences[i-1], "fence %d in acquisition order", i)
	}
}

func TestRedlockMinorityDown(t *testing.T) {
	e := newRedlockEnv(t, 3, &redis.Options{MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	l := e.locker(t, &Options{TTL: 600 * time.Millisecond})
	e.srvs[2].Kill()
	var fence int64
	err := l.RunWithLock(ctx, uniqueName(t), func(ctx context.Context, lease *Lease) error {
		fence = lease.Fence()
		time.Sleep(1500 * time.Millisecond) // renewed on the two nodes left
		return ctx.Err()
	})
	require.NoError(t, err, "a minority down is not an outage")
	assert.Positive(t, fence)

	e.srvs[1].Pause()
	t.Cleanup(e.srvs[1].Resume)
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = l.Acquire(cctx, uniqueName(t)+"-majority")
	assert.Less(t, time.Since(start), time.Second, "returns by the ctx deadline")
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrNotObtained)
}

func TestRedlockMajorityDownLeavesNothingHeld(t *testing.T) {
	e := newRedlockEnv(t, 3, &redis.Options{MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	l := e.locker(t, &Options{TTL: time.Second})
	name := uniqueName(t)
	e.srvs[1].Pause()
	t.Cleanup(e.srvs[1].Resume)
	e.srvs[2].Kill()

	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := l.Acquire(cctx, name)
	elapsed := time.Since(start)
	require.ErrorIs(t, err, ErrUnavailable, "a majority down is an outage")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.NotErrorIs(t, err, ErrNotObtained)
	assert.Less(t, elapsed, 800*time.Millisecond, "returns by the ctx deadline")
	assert.NotContains(t, err.Error(), "\n")

	// The nodes come back: the grant node 0 gave, and the one the paused
	// node 1 had queued, are given back by the clean-up.
	e.srvs[1].Resume()
	e.srvs[2].Restart()
	key, _ := l.keys(name)
	require.Eventually(t, func() bool {
		for _, a := range e.admins {
			if n, err := a.Exists(ctx, key).Result(); err != nil || n != 0 {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond, "no lock left held once the nodes are back")
	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err, "and the lock can be taken")
	require.NoError(t, lease.Release(ctx))
}

func TestRedlockFencesIncreaseThroughNodeFaults(t *testing.T) {
	// Fences of successive acquisitions stay strictly increasing while any
	// minority of the nodes is restarted empty, killed, paused or slow.
	e := newRedlockEnv(t, 5, &redis.Options{MaxRetries: -1, DialTimeout: 100 * time.Millisecond, ContextTimeoutEnabled: true})
	l := e.locker(t, &Options{TTL: time.Second})
	name := uniqueName(t)
	var last int64
	step := func(what string) {
		t.Helper()
		for range 3 {
			lease, err := l.Acquire(ctx, name, WithWait(5*time.Second))
			require.NoError(t, err, what)
			assert.Greater(t, lease.Fence(), last, what)
			last = lease.Fence()
			require.NoError(t, lease.Release(ctx), what)
		}
	}
	step("all up")
	e.srvs[0].Restart()
	step("node 0 restarted empty")
	e.srvs[1].Restart()
	e.srvs[2].Restart()
	step("nodes 1 and 2 restarted empty")
	e.srvs[3].Kill()
	e.srvs[4].Kill()
	step("nodes 3 and 4 killed")
	e.srvs[3].Restart()
	e.srvs[4].Restart()
	e.srvs[0].Pause()
	e.srvs[1].Pause()
	t.Cleanup(e.srvs[0].Resume)
	t.Cleanup(e.srvs[1].Resume)
	step("nodes 0 and 1 paused")
	e.srvs[0].Resume()
	e.srvs[1].Resume()
	step("all back")
}

func TestRedlockRenewalRepairsANodeRestartedEmpty(t *testing.T) {
	e := newRedlockEnv(t, 3, nil)
	l := e.locker(t, &Options{TTL: 600 * time.Millisecond}) // renewed every 200ms
	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	defer lease.Release(ctx)
	workCtx := lease.KeepAlive(ctx)
	require.Eventually(t, func() bool { return e.holders(t, lease.Key(), lease.Token()) == 3 }, time.Second, time.Millisecond)

	e.srvs[1].Restart() // without persistence: the lock is gone there
	require.Eventually(t, func() bool { return e.holders(t, lease.Key(), lease.Token()) == 3 }, 2*time.Second, 5*time.Millisecond,
		"the next renewal puts the lock back on the restarted node")
	time.Sleep(time.Second) // and keeps it there
	assert.Equal(t, 3, e.holders(t, lease.Key(), lease.Token()))
	require.NoError(t, workCtx.Err())
	got, err := e.admins[1].Get(ctx, lease.Key()).Result()
	require.NoError(t, err)
	assert.Equal(t, lease.Token()+" "+strconv.FormatInt(lease.Fence(), 10)+" "+l.opts.Owner, got, "with the lease's fence and owner")
	require.NoError(t, lease.Release(ctx))
	assert.Eventually(t, func() bool { return e.holders(t, lease.Key(), lease.Token()) == 0 },
		time.Second, time.Millisecond, "released on every node")
}

func TestRedlockFenceOrderRestsOnTheIntersection(t *testing.T) {
	// Lease A is acquired on nodes {0, 1} (node 2 down) and returns. Node 1
	// is wiped. Lease B is acquired on {1, 2} (node 0 down): the two quorums
	// intersect at node 1 only.
	//
	// To take the servers' clocks out of the argument, A's fence is far
	// ahead of them (its counters start there), so only a counter that B
	// reads can order B after A.
	const ahead = int64(1) << 60
	setup := func(t *testing.T) (e *redlockEnv, l *Locker, name, fenceKey string) {
		e = newRedlockEnv(t, 3, &redis.Options{MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
		l = e.locker(t, nil)
		name = uniqueName(t)
		_, fenceKey = l.keys(name)
		for _, a := range e.admins[:2] {
			require.NoError(t, a.Set(ctx, fenceKey, ahead, 0).Err())
		}
		return e, l, name, fenceKey
	}
	acquireOn := func(t *testing.T, e *redlockEnv, l *Locker, name string, down int) *Lease {
		t.Helper()
		e.srvs[down].Pause()
		defer e.srvs[down].Resume()
		// With a wait: the previous acquisition's grant and release, queued
		// on the node that was paused, may still be on their way.
		lease, err := l.Acquire(ctx, name, WithWait(10*time.Second))
		require.NoError(t, err)
		require.NoError(t, lease.Release(ctx))
		return lease
	}
	// acquireA acquires A on nodes 0 and 1 with a Locker of its own, closed
	// once node 2 has run what was queued for it while paused: a late grant
	// there would be given A's fence in the background. Node 2, outside A's
	// quorum, is then wiped, so that only the intersection can know A's
	// fence.
	acquireA := func(t *testing.T, e *redlockEnv, name string) *Lease {
		t.Helper()
		la, err := NewRedlock(e.clients, nil)
		require.NoError(t, err)
		a := acquireOn(t, e, la, name, 2)
		require.NoError(t, la.Close())
		require.NoError(t, e.admins[2].FlushAll(ctx).Err())
		return a
	}

	t.Run("the intersection kept its data", func(t *testing.T) {
		e, l, name, _ := setup(t)
		a := acquireA(t, e, name)
		assert.Equal(t, ahead+1, a.Fence())
		require.NoError(t, e.admins[0].FlushAll(ctx).Err()) // a node of A's quorum, outside B's
		b := acquireOn(t, e, l, name, 0)
		assert.Greater(t, b.Fence(), a.Fence(), "node 1 kept A's fence in its counter")
	})
	t.Run("the intersection counted to less than the fence", func(t *testing.T) {
		// A is granted by nodes 0 and 1, whose counters disagree: node 0
		// counts to A's fence, node 1 to less, so phase 2 must raise node
		// 1's counter before A is returned. Node 0 is then wiped, and B
		// reads only node 1's counter of A's quorum.
		e, l, name, fenceKey := setup(t)
		require.NoError(t, e.admins[0].Set(ctx, fenceKey, ahead+10, 0).Err())
		a := acquireA(t, e, name)
		assert.Equal(t, ahead+11, a.Fence())
		require.NoError(t, e.admins[0].FlushAll(ctx).Err())
		b := acquireOn(t, e, l, name, 0)
		assert.Greater(t, b.Fence(), a.Fence(), "node 1's counter was raised to A's fence")
	})
	t.Run("the intersection lost its data", func(t *testing.T) {
		e, l, name, _ := setup(t)
		a := acquireA(t, e, name)
		require.NoError(t, e.admins[1].FlushAll(ctx).Err()) // the intersection, restarted empty
		b := acquireOn(t, e, l, name, 0)
		// What is left is the servers' clocks: B's fence is their time,
		// behind A's. This is the case the documentation warns about.
		assert.Less(t, b.Fence(), a.Fence(), "no node of B's quorum knew A's fence")
		t.Logf("A's fence %d, B's fence %d (the servers' time)", a.Fence(), b.Fence())
	})
}

func TestRedlockFenceOneRoundWhenCountersAgree(t *testing.T) {
	// Nodes whose counters agree count on in step: each fence is one more
	// than the last, and an acquire+release is one script call per node
	// each way, with no phase 2.
	const start = int64(1) << 50
	e := newRedlockEnv(t, 5, nil)
	// A first Locker loads the scripts; Close waits for its background
	// calls (grants and releases still on their way to the last nodes, the
	// fence written to late nodes), so that none is counted below.
	first := e.locker(t, nil)
	warm, err := first.Acquire(ctx, uniqueName(t)+"-warm")
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))
	require.NoError(t, first.Close())
	l := e.locker(t, nil)
	name := uniqueName(t)
	_, fenceKey := l.keys(name)
	for _, a := range e.admins {
		require.NoError(t, a.Set(ctx, fenceKey, start, 0).Err())
		require.NoError(t, a.ConfigResetStat(ctx).Err())
	}
	const n = 10
	for i := range n {
		lease, err := l.Acquire(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, start+int64(i)+1, lease.Fence())
		// Acquire returns once a quorum granted, and Release once a quorum
		// released: a release must not overtake a grant still on its way
		// to a node, nor the next grant a release (the node would refuse
		// it, and its counter would fall behind).
		require.Eventually(t, func() bool { return e.holders(t, lease.Key(), lease.Token()) == len(e.admins) },
			time.Second, time.Millisecond)
		require.NoError(t, lease.Release(ctx))
		require.Eventually(t, func() bool { return e.holders(t, lease.Key(), lease.Token()) == 0 },
			time.Second, time.Millisecond)
	}
	require.NoError(t, l.Close()) // every call has reached its node
	var calls int64
	for i, a := range e.admins {
		for _, cmd := range []string{"evalsha", "eval"} {
			calls += commandCalls(t, a, cmd)
		}
		got, err := a.Get(ctx, fenceKey).Int64()
		require.NoError(t, err)
		assert.Equal(t, start+n, got, "node %d's counter", i)
	}
	assert.Equal(t, int64(2*n*len(e.admins)), calls, "a grant and a release per node and acquisition")
}

// commandCalls returns how many times the server ran cmd since its stats
// were reset (INFO commandstats).
func commandCalls(t *testing.T, c *redis.Client, cmd string) int64 {
	t.Helper()
	info, err := c.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	for line := range strings.Lines(info) {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, _, _ := strings.Cut(rest, ",")
			calls, err := strconv.ParseInt(n, 10, 64)
			require.NoError(t, err)
			return calls
		}
	}
	return 0
}

func TestRedlockFenceCountersAtTheirMaximum(t *testing.T) {
	e := newRedlockEnv(t, 3, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	_, fenceKey := l.keys(name)
	for _, a := range e.admins {
		require.NoError(t, a.Set(ctx, fenceKey, math.MaxInt64-1, 0).Err())
	}
	last, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	assert.Equal(t, int64(math.MaxInt64), last.Fence(), "the last fence there is, exact beyond 2^53")
	require.NoError(t, last.Release(ctx))
	// Release returns once a quorum deleted the lock; the last node's
	// release goes on in the background. Wait for it, so what is found
	// below is what the failed Acquire left.
	for i, a := range e.admins {
		require.Eventually(t, func() bool {
			n, err := a.Exists(ctx, last.Key()).Result()
			return err == nil && n == 0
		}, 2*time.Second, time.Millisecond, "node %d released the last lease", i)
	}

	_, err = l.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrMisconfigured, "no fence left to issue")
	assert.NotErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "maximum")
	for i, a := range e.admins {
		// A node whose counter had one fence left (its grant of the last
		// lease was retired by the release before it came) granted this
		// Acquire; it is given back in the background.
		require.Eventually(t, func() bool { return a.Exists(ctx, last.Key()).Val() == 0 }, 2*time.Second, time.Millisecond,
			"node %d: no lock is left without a quorum's fence", i)
		got, err := a.Get(ctx, fenceKey).Result()
		require.NoError(t, err)
		assert.Equal(t, strconv.FormatInt(math.MaxInt64, 10), got, "node %d's counter is unchanged", i)
	}
}

func TestRedlockLateGrantStoresTheLeaseFence(t *testing.T) {
	// Node 2 answers 100ms late and its counter is ahead: its grant, read
	// after the quorum's, stores the value its own counter reached. The
	// lease's fence is then written there too, so every node holding the
	// lease stores it, and Inspect reports it with a node of the quorum
	// paused.
	const ahead = int64(1) << 60
	e := newRedlockEnv(t, 3, nil)
	proxy := redistest.StartProxy(t, e.srvs[2].Addr)
	proxy.SetLatency(50 * time.Millisecond)
	slow := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	t.Cleanup(func() { _ = slow.Close() })
	l, err := NewRedlock([]redis.UniversalClient{e.clients[0], e.clients[1], slow}, &Options{ReleaseTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	name := uniqueName(t)
	_, fenceKey := l.keys(name)
	for i, a := range e.admins {
		c := ahead
		if i == 2 {
			c += 100
		}
		require.NoError(t, a.Set(ctx, fenceKey, c, 0).Err())
	}
	lease, err := l.Acquire(ctx, name, WithTTL(10*time.Second))
	require.NoError(t, err)
	assert.Equal(t, ahead+1, lease.Fence(), "nodes 0 and 1 made the quorum")
	want := lease.Token() + " " + strconv.FormatInt(lease.Fence(), 10) + " " + l.opts.Owner
	require.Eventually(t, func() bool { return e.admins[2].Get(ctx, lease.Key()).Val() == want },
		2*time.Second, 5*time.Millisecond, "the late node stores the lease's fence")

	e.srvs[0].Pause()
	t.Cleanup(e.srvs[0].Resume)
	info, err := l.Inspect(ctx, name)
	require.NoError(t, err)
	assert.True(t, info.Held)
	assert.Equal(t, lease.Fence(), info.Fence)
	assert.Equal(t, lease.Fence(), info.LastFence, "the q-th largest counter")
	e.srvs[0].Resume()
	require.NoError(t, lease.Release(ctx))
}

func TestRedlockNodeOutOfMemoryIsNotMisconfigured(t *testing.T) {
	// The lock is held by A on nodes 0 and 1; node 2 is out of memory, so
	// it refuses the grant's first write. B's attempt gets nodes 3 and 4:
	// busy, with a quorum of nodes answering; a node out of memory (as one
	// read-only during a failover) is a node down, not a misconfiguration,
	// so B waits instead of giving up.
	e := newRedlockEnv(t, 5, nil)
	a := e.locker(t, nil)
	name := uniqueName(t)
	held, err := a.Acquire(ctx, name, WithTTL(10*time.Second))
	require.NoError(t, err)
	for _, admin := range e.admins[2:] {
		require.NoError(t, admin.Del(ctx, held.Key()).Err())
	}
	require.NoError(t, e.admins[2].ConfigSet(ctx, "maxmemory", "1").Err())
	t.Cleanup(func() { _ = e.admins[2].ConfigSet(ctx, "maxmemory", "0").Err() })

	b := e.locker(t, nil)
	start := time.Now()
	_, err = b.Acquire(ctx, name, WithWait(300*time.Millisecond))
	require.ErrorIs(t, err, ErrNotObtained, "busy, not refused")
	assert.NotErrorIs(t, err, ErrMisconfigured)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "it waited")
	require.NoError(t, e.admins[2].ConfigSet(ctx, "maxmemory", "0").Err())
	_ = held.Release(ctx) // ErrNotHeld: held on two nodes of five
}

// process returns a Redlock Locker over clients of its own, as another
// process would have, and the hooks of those clients (calls counts the
// commands each sent).
func (e *redlockEnv) process(t *testing.T, opts *Options) (*Locker, []*faultHook) {
	t.Helper()
	var clients []redis.UniversalClient
	var hooks []*faultHook
	for _, srv := range e.srvs {
		c := srv.Client(nil)
		h := &faultHook{}
		c.AddHook(h)
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
		hooks = append(hooks, h)
	}
	l, err := NewRedlock(clients, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l, hooks
}

// lineOf returns the members of the Redlock line of the lock at key on the
// node of admin, first first.
func lineOf(t *testing.T, admin *redis.Client, key string) []string {
	t.Helper()
	m, err := admin.ZRange(ctx, key+":q", 0, -1).Result()
	require.NoError(t, err)
	return m
}

// holding returns a Locker over e's nodes, the test's lock name, and a
// lease of it that Locker holds for a minute.
func (e *redlockEnv) holding(t *testing.T) (*Locker, string, *Lease) {
	t.Helper()
	l := e.locker(t, nil)
	name := uniqueName(t)
	held, err := l.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	e.heldEverywhere(t, held)
	return l, name, held
}

// heldEverywhere waits until every node holds lease: Acquire returns once a
// quorum granted it, and the tests count on every node holding it (a node
// killed next must not leave a bare quorum; a waiter must find it busy on
// node 0, where its line is, not free).
func (e *redlockEnv) heldEverywhere(t *testing.T, lease *Lease) {
	t.Helper()
	for i := range e.admins {
		e.heldOn(t, i, lease)
	}
}

// heldOn waits until node i holds lease.
func (e *redlockEnv) heldOn(t *testing.T, i int, lease *Lease) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.HasPrefix(e.admins[i].Get(ctx, lease.Key()).Val(), lease.Token()+" ") },
		redlockPatience, time.Millisecond, "node %d holds the lease", i)
}

// requireLine waits until the line of the lock at key on node 0 has n
// calls in it, for redlockPatience at most.
func (e *redlockEnv) requireLine(t *testing.T, key string, n int, msgAndArgs ...any) {
	t.Helper()
	require.Eventually(t, func() bool { return len(lineOf(t, e.admins[0], key)) == n },
		redlockPatience, time.Millisecond, msgAndArgs...)
}

// requireSubscribers waits until n Lockers subscribe to the channel of the
// lock at key on node i, for redlockPatience at most.
func (e *redlockEnv) requireSubscribers(t *testing.T, i int, key string, n int, msg string) {
	t.Helper()
	require.Eventually(t, func() bool {
		m, err := e.admins[i].PubSubShardNumSub(ctx, key).Result()
		return err == nil && m[key] == int64(n)
	}, redlockPatience, time.Millisecond, msg)
}

// firstNodeFirst returns the after-hooks (see faultHook) for the clients,
// one a node, of a Redlock Locker, and sets them on all but node 1's, whose
// hook the caller sets with its own before-hook: a node other than the
// first answers a grant (redlock_grant) of an attempt only once the first
// node has answered the attempt's grant (or the call's context ends), and
// redlock.MaxGrace after that. An attempt joins the first node's line, and decides
// a split, only with the first node's answer; the busy answers of the
// others, when they are a quorum, end its reading of the answers after a
// grace of 5-100ms (quorumGrace), which a busy machine can outlast before
// it runs the first node's call. The first node's answer is read when its
// goroutine hands it on, after the hook: the others' redlock.MaxGrace later gives
// it that, and a grace of redlock.MaxGrace after them.
func firstNodeFirst(hooks []*faultHook) []func(context.Context, redis.Cmder) error {
	var (
		mu       sync.Mutex
		answered = map[string]chan struct{}{} // closed once the first node answered the attempt's (token's) grant
	)
	first := func(token string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if answered[token] == nil {
			answered[token] = make(chan struct{})
		}
		return answered[token]
	}
	after := make([]func(context.Context, redis.Cmder) error, len(hooks))
	for i := range hooks {
		after[i] = func(c context.Context, cmd redis.Cmder) error {
			if scriptName(cmd) != "redlock_grant" {
				return nil
			}
			// EVALSHA sha numkeys key... token ...
			args := cmd.Args()
			numKeys, _ := args[2].(int)
			token, _ := args[3+numKeys].(string)
			ch := first(token)
			if i == 0 {
				mu.Lock()
				select {
				case <-ch: // asked again
				default:
					close(ch)
				}
				mu.Unlock()
				return nil
			}
			select {
			case <-ch:
				time.Sleep(redlock.MaxGrace)
			case <-c.Done():
			}
			return nil
		}
		if i != 1 {
			hooks[i].set(nil, after[i])
		}
	}
	return after
}

// redlockPatience bounds the waits of the Redlock tests for what must
// happen (a waiter in line, a subscription, a message already sent): long
// enough that only its not happening fails a test, not a busy machine.
// Less than waitAndHold's wait.
const redlockPatience = 30 * time.Second

// namedOnly are the options of a Locker whose waiters in line attempt
// again only after minutes (half MaxRetryBackoff at least): within
// redlockPatience, only a release that names them explains their lock.
var namedOnly = &Options{MinRetryBackoff: 10 * time.Minute, MaxRetryBackoff: 10 * time.Minute}

// A holder is a waitAndHold in the background.
type holder struct {
	got     chan *Lease
	release chan struct{}
	done    chan error
}

// waitAndHold waits for the lock in the background, up to a minute, sends
// the lease on got when it has it, and releases it when release is closed
// or ctx ends; done gets the outcome.
func waitAndHold(ctx context.Context, l *Locker, name string) *holder {
	h := &holder{got: make(chan *Lease, 1), release: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		lease, err := l.Acquire(ctx, name, WithWait(time.Minute))
		if err != nil {
			h.done <- err
			return
		}
		h.got <- lease
		select {
		case <-h.release:
		case <-ctx.Done():
		}
		h.done <- lease.Release(context.Background())
	}()
	return h
}

// finish releases the lease h holds, and checks the outcome.
func (h *holder) finish(t *testing.T) {
	t.Helper()
	close(h.release)
	require.NoError(t, <-h.done)
}

func (h *holder) obtained(t *testing.T, within time.Duration, msg string) *Lease {
	t.Helper()
	select {
	case lease := <-h.got:
		return lease
	case err := <-h.done:
		t.Fatalf("%s: %v", msg, err)
	case <-time.After(within):
		t.Fatalf("%s: not obtained within %v", msg, within)
	}
	return nil
}

func TestRedlockReleaseWakesTheNextInLine(t *testing.T) {
	// Three waiters, each a process of its own, join the first node's line
	// in turn. A release wakes the first in line alone: the others make no
	// attempt until their turn, and each turn comes by the release (their
	// pauses are minutes, the lock's TTL a minute). Before the line, every
	// release woke every waiter, and each tried.
	e := newRedlockEnv(t, 3, nil)
	l, name, held := e.holding(t)
	var waiters []*holder
	// grants[i] counts the scripts waiter i sent to node 1: one per
	// attempt, until it holds the lock.
	grants := make([]atomic.Int64, 3)
	answered := make([]atomic.Int64, 3) // and node 1's answers to them
	for i := range 3 {
		wl, h := e.process(t, namedOnly)
		// The line's channel lingers redlockPatience after its last
		// waiter left (channelLinger, 1s, otherwise): the check of it at
		// the end does not race the machine.
		nodeWaits(wl, 0).SetChannelLinger(redlockPatience)
		// An attempt joins the line only when it has the first node's
		// answer: nodes 1 and 2 say busy after it, whatever the order the
		// machine runs the calls in (see firstNodeFirst).
		after := firstNodeFirst(h)
		h[1].set(func(_ context.Context, cmd redis.Cmder) error {
			if cmd.Name() == "evalsha" || cmd.Name() == "eval" {
				grants[i].Add(1)
			}
			return nil
		}, func(c context.Context, cmd redis.Cmder) error {
			err := after[1](c, cmd)
			if cmd.Name() == "evalsha" || cmd.Name() == "eval" {
				answered[i].Add(1)
			}
			return err
		})
		waiters = append(waiters, waitAndHold(ctx, wl, name))
		e.requireLine(t, held.Key(), i+1, "waiter %d joins the line", i)
	}
	members := lineOf(t, e.admins[0], held.Key())
	e.requireSubscribers(t, 0, held.Key(), 3, "the three subscribe on the line's node")
	for i := 1; i < 3; i++ {
		m, err := e.admins[i].PubSubShardNumSub(ctx, held.Key()).Result()
		require.NoError(t, err)
		assert.Zero(t, m[held.Key()], "node %d: a waiter in line does not hear its releases", i)
	}
	attempts := func(i int) int64 { return grants[i].Load() }
	// The first in line tries again on its subscription's confirmation (it
	// may have been released meanwhile). That attempt must be over on node 1
	// before the release: one found busy on node 0 and granted on nodes 1
	// and 2 after the release reached them would hold a quorum without node
	// 0, whose line it then never leaves (it failed so beside a load).
	require.Eventually(t, func() bool { return answered[0].Load() >= 2 }, redlockPatience, time.Millisecond,
		"the first in line tries again on its subscription's confirmation")
	time.Sleep(50 * time.Millisecond) // the others' confirmations: only the first in line tries again on its own
	before := []int64{attempts(0), attempts(1), attempts(2)}
	assert.Equal(t, []int64{1, 1}, before[1:], "behind the first, the confirmation of a subscription wakes no one")

	released := time.Now()
	require.NoError(t, held.Release(ctx))
	for turn := range 3 {
		// Within redlockPatience, less than the waiters' pauses: by the
		// release, not a pause.
		lease := waiters[turn].obtained(t, redlockPatience, "woken by name")
		t.Logf("turn %d: the lock %v after the release", turn, time.Since(released))
		time.Sleep(100 * time.Millisecond) // a waiter woken in vain would try meanwhile
		for later := turn + 1; later < 3; later++ {
			assert.Equal(t, before[later], attempts(later), "turn %d: waiter %d made no attempt", turn, later)
		}
		assert.Eventually(t, func() bool { // node 0 may answer after the quorum
			return slices.Equal(members[turn+1:], lineOf(t, e.admins[0], held.Key()))
		}, redlockPatience, time.Millisecond, "turn %d: the lease's call left the line, the others kept their places", turn)
		e.heldOn(t, 0, lease) // a release that reached node 0 before its late grant would name no one there
		released = time.Now()
		waiters[turn].finish(t)
	}
	assert.Eventually(t, func() bool {
		n, err := e.admins[0].Exists(ctx, held.Key()+":q", held.Key()+":qi").Result()
		return err == nil && n == 0
	}, redlockPatience, time.Millisecond, "no line is left behind")
	info, err := l.Inspect(ctx, name)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, info.Waiters, 1, "the last waiter's subscription lingers, as LockInfo says")
}

func TestRedlockLineEntriesExpire(t *testing.T) {
	// An entry lives max(1s, 4 × MaxRetryBackoff) after its call's last
	// attempt, and the line's keys as long as their last entry. A waiter
	// cut off from the first node leaves an entry nobody keeps alive: it
	// expires.
	e := newRedlockEnv(t, 3, nil)
	l := e.locker(t, nil)
	for _, tc := range []struct {
		maxBackoff, entryTTL time.Duration
	}{{100 * time.Millisecond, time.Second}, {500 * time.Millisecond, 2 * time.Second}} {
		t.Run(tc.maxBackoff.String(), func(t *testing.T) {
			name := uniqueName(t)
			held, err := l.Acquire(ctx, name, WithTTL(time.Minute))
			require.NoError(t, err)
			defer held.Release(ctx)
			e.heldEverywhere(t, held)
			key := held.Key()
			wl, hooks := e.process(t, &Options{MaxRetryBackoff: tc.maxBackoff})
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			w := waitAndHold(wctx, wl, name)
			var ended error              // the waiter's Acquire returned: say why rather than wait out the patience
			seen := new(strings.Builder) // a Stringer: the message reads it at the end
			require.Eventually(t, func() bool {
				select {
				case ended = <-w.done:
					return true
				default:
				}
				line, err := e.admins[0].ZRangeWithScores(ctx, key+":q", 0, -1).Result()
				seen.Reset()
				_, _ = fmt.Fprint(seen, line, err)
				return err == nil && len(line) == 1
			}, redlockPatience, time.Millisecond, "the waiter joins the line; node 0's line last read %s", seen)
			require.NoError(t, ended, "the waiter's Acquire returned before joining the line")
			within := func(d time.Duration) bool { return d > tc.entryTTL-time.Second/2 && d <= tc.entryTTL }
			for _, k := range []string{":q", ":qi"} {
				pttl, err := e.admins[0].PTTL(ctx, key+k).Result()
				require.NoError(t, err)
				assert.True(t, within(pttl), "%s expires after %v: %v", k, tc.entryTTL, pttl)
			}
			expiry, err := e.admins[0].HGet(ctx, key+":qi", lineOf(t, e.admins[0], key)[0]).Int64()
			require.NoError(t, err)
			assert.True(t, within(time.Until(time.UnixMilli(expiry))), "the entry expires after %v", tc.entryTTL)
			cut := errors.New("test: cut off")
			hooks[0].set(func(context.Context, redis.Cmder) error { return cut }, nil)
			if tc.entryTTL > time.Second {
				// A Locker whose entries live 1s joins: the keys still
				// live as long as the first entry, which nothing keeps
				// alive any more.
				sl, _ := e.process(t, &Options{MaxRetryBackoff: 100 * time.Millisecond})
				waitAndHold(wctx, sl, name)
				e.requireLine(t, key, 2, "the second waiter joins the line")
				pttl, err := e.admins[0].PTTL(ctx, key+":q").Result()
				require.NoError(t, err)
				assert.Greater(t, pttl, time.Second, "a shorter entry does not shorten the line")
			}
			cancel() // the cut-off waiter's leave does not arrive
			e.requireLine(t, key, 0, "the entries expire")
		})
	}
}

func TestRedlockAbandonKeepsTheLine(t *testing.T) {
	// An Acquire that gives up with an attempt's outcome unknown abandons
	// it on every node: on the first, the line is not a fair queue, and
	// nothing is handed over to it, nor taken out of it.
	e := newRedlockEnv(t, 3, nil)
	_, _, held := e.holding(t)
	key := held.Key()
	live := time.Now().Add(time.Minute).UnixMilli()
	for i, m := range []string{"a", "b"} {
		require.NoError(t, e.admins[0].ZAdd(ctx, key+":q", redis.Z{Score: float64(i + 1), Member: m}).Err())
		require.NoError(t, e.admins[0].HSet(ctx, key+":qi", m, live).Err())
	}
	r, _, err := held.h.Release(ctx, store.Abandon, held.currentTTL())
	require.NoError(t, err)
	assert.Equal(t, store.Done, r, "the lock was deleted")
	require.Eventually(t, func() bool { return e.admins[0].Exists(ctx, key).Val() == 0 },
		2*time.Second, time.Millisecond, "node 0 deleted the lock") // Release returns on a quorum
	assert.Equal(t, []string{"a", "b"}, lineOf(t, e.admins[0], key), "the line is left as it was")
}

func TestRedlockOutOfLineListensEverywhere(t *testing.T) {
	// The first node lost the lock (restarted empty): a waiter's attempt
	// gets that node, not a quorum, and gives it back. It is not in line,
	// and listens on every node; the holder's release wakes it.
	e := newRedlockEnv(t, 3, nil)
	_, name, held := e.holding(t)
	require.NoError(t, e.admins[0].Del(ctx, held.Key()).Err())
	wl, _ := e.process(t, slowPolling)
	w := waitAndHold(ctx, wl, name)
	e.requireSubscribers(t, 2, held.Key(), 1, "the waiter listens on the other nodes")
	assert.Empty(t, lineOf(t, e.admins[0], held.Key()), "not in line")
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, held.Release(ctx))
	w.obtained(t, 5*time.Second, "woken by a release on the other nodes (pauses 10-20s)")
	w.finish(t)
}

func TestRedlockBusyStandsWithoutReplicas(t *testing.T) {
	// With Options.Replicas, an attempt's busy answer is a fact whatever
	// the replicas did: busy (ErrNotObtained), not ErrUnavailable. The
	// nodes here have no replica.
	e := newRedlockEnv(t, 3, nil)
	name := uniqueName(t)
	l := e.locker(t, &Options{Replicas: 1, ReplicaTimeout: 20 * time.Millisecond})
	key, _ := l.keys(name)
	for _, a := range e.admins {
		require.NoError(t, a.Set(ctx, key, "other 1 someone", time.Minute).Err())
	}
	_, err := l.Acquire(ctx, name, WithWait(100*time.Millisecond))
	require.ErrorIs(t, err, ErrNotObtained)
	assert.NotErrorIs(t, err, ErrUnavailable)
}

func TestRedlockInLineWakesAfterAPauseWhenNotNamed(t *testing.T) {
	// The first entry's call is gone (its process died a moment ago): a
	// release names it, and the waiter behind it tries after its pause,
	// at most MaxRetryBackoff, not the lock's TTL (a minute).
	e := newRedlockEnv(t, 3, nil)
	_, name, held := e.holding(t)
	key := held.Key()
	require.NoError(t, e.admins[0].ZAdd(ctx, key+":q", redis.Z{Score: 1, Member: "dead"}).Err())
	require.NoError(t, e.admins[0].HSet(ctx, key+":qi", "dead", time.Now().Add(time.Minute).UnixMilli()).Err())
	wl, _ := e.process(t, &Options{MinRetryBackoff: 200 * time.Millisecond, MaxRetryBackoff: 400 * time.Millisecond})
	w := waitAndHold(ctx, wl, name)
	e.requireLine(t, key, 2, "the waiter joins the line behind the dead entry")
	require.NoError(t, held.Release(ctx))
	w.obtained(t, 2*time.Second, "after its pause")
	w.finish(t)
}

func TestRedlockInLineTriesWhenTheHoldersTTLRunsOut(t *testing.T) {
	// The holder never releases (its process died): the lock expires after
	// its TTL, and nothing is published. The waiter in line tries then,
	// not after its pause (10-20s).
	e := newRedlockEnv(t, 3, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	// A TTL of 2s leaves a busy machine time to start the waiter before it
	// runs out; the waiter must then get the lock within the TTL and 7s,
	// before its first pause (10s at least) ends.
	held, err := l.Acquire(ctx, name, WithTTL(2*time.Second))
	require.NoError(t, err)
	wl, _ := e.process(t, slowPolling)
	w := waitAndHold(ctx, wl, name)
	e.requireLine(t, held.Key(), 1, "the waiter is in line")
	w.obtained(t, 7*time.Second, "when the holder's TTL ran out")
	w.finish(t)
}

func TestRedlockEmptyLineReleaseWakesWhoWasInIt(t *testing.T) {
	// The waiter's entry is gone (expired while its process was paused,
	// say): the release finds the line empty and publishes "released" on
	// the first node, which wakes it at once (its pauses are 10-20s).
	e := newRedlockEnv(t, 3, nil)
	_, name, held := e.holding(t)
	wl, _ := e.process(t, slowPolling)
	w := waitAndHold(ctx, wl, name)
	e.requireLine(t, held.Key(), 1, "the waiter is in line")
	e.requireSubscribers(t, 0, held.Key(), 1, "the waiter listens on the line's node")
	require.NoError(t, e.admins[0].Del(ctx, held.Key()+":q", held.Key()+":qi").Err())
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, held.Release(ctx))
	w.obtained(t, 5*time.Second, "woken by the release")
	w.finish(t)
}

func TestRedlockLineNodeDownEveryReleaseWakes(t *testing.T) {
	// Without the first node there is no line: a waiter subscribes on the
	// other nodes, and their releases wake it.
	e := newRedlockEnv(t, 3, &redis.Options{MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	_, name, held := e.holding(t)
	e.srvs[0].Kill()
	wl, _ := e.process(t, slowPolling)
	w := waitAndHold(ctx, wl, name)
	e.requireSubscribers(t, 1, held.Key(), 1, "the waiter subscribes on the other nodes")
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, held.Release(ctx))
	w.obtained(t, 5*time.Second, "woken by a release on the other nodes (pauses 10-20s)")
	w.finish(t)
}

func TestRedlockLineNodeLostWhileInLine(t *testing.T) {
	// A waiter in line hears only the line's node. When that node goes
	// away, the waiter tries at once (its subscription broke), is out of
	// line, subscribes on the others and is woken by their releases.
	e := newRedlockEnv(t, 3, &redis.Options{MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	_, name, held := e.holding(t)
	wl, _ := e.process(t, slowPolling)
	w := waitAndHold(ctx, wl, name)
	e.requireLine(t, held.Key(), 1, "the waiter is in line")
	e.requireSubscribers(t, 0, held.Key(), 1, "the waiter listens on the line's node")
	e.srvs[0].Kill()
	e.requireSubscribers(t, 1, held.Key(), 1, "the waiter subscribes on the other nodes")
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, held.Release(ctx))
	w.obtained(t, 5*time.Second, "woken by a release on the other nodes (pauses 10-20s)")
	w.finish(t)
}

func TestRedlockLineSkipsWhoIsGone(t *testing.T) {
	e := newRedlockEnv(t, 3, nil)
	_, name, held := e.holding(t)
	key := held.Key()

	// A process that died in line: its entry, first, expired.
	past := time.Now().Add(-time.Second).UnixMilli()
	require.NoError(t, e.admins[0].ZAdd(ctx, key+":q", redis.Z{Score: 1, Member: "dead"}).Err())
	require.NoError(t, e.admins[0].HSet(ctx, key+":qi", "dead", past).Err())
	// A waiter that gave up: its Acquire leaves the line.
	gl, _ := e.process(t, slowPolling)
	gctx, giveUp := context.WithCancel(ctx)
	gone := waitAndHold(gctx, gl, name)
	e.requireLine(t, key, 2, "the second waiter joins the line")
	wl, _ := e.process(t, slowPolling)
	w := waitAndHold(ctx, wl, name)
	e.requireLine(t, key, 3, "the third waiter joins the line")
	giveUp()
	require.ErrorIs(t, <-gone.done, context.Canceled)
	e.requireLine(t, key, 2, "the Acquire that gave up leaves the line")

	time.Sleep(50 * time.Millisecond)
	require.NoError(t, held.Release(ctx))
	w.obtained(t, 5*time.Second, "named by the release past the expired entry (pauses 10-20s)")
	e.requireLine(t, key, 0, "the expired entry was pruned")
	w.finish(t)
}

func TestRedlockReleaseTakesItsCallOutOfLine(t *testing.T) {
	// The lease was granted by nodes 1 and 2 while node 0 was another's:
	// its attempt joined node 0's line. Its release takes it out, so that
	// no later release names a call that is over.
	e := newRedlockEnv(t, 3, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	key, _ := l.keys(name)
	require.NoError(t, e.admins[0].Set(ctx, key, "other 1 someone", time.Minute).Err())
	lease, err := l.Acquire(ctx, name, WithWait(time.Second))
	require.NoError(t, err)
	// Node 0's answer may come after the quorum's.
	e.requireLine(t, key, 1, "node 0 was busy: the attempt joined its line")
	require.NoError(t, lease.Release(ctx)) // returns when nodes 1 and 2 answered
	e.requireLine(t, key, 0, "the release took its call out of the line")
}

func TestRedlockFailOpenOnlyWithoutAQuorum(t *testing.T) {
	e := newRedlockEnv(t, 3, &redis.Options{MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	l := e.locker(t, &Options{FailOpen: true})
	name := uniqueName(t)
	e.srvs[0].Kill()
	var degraded []bool
	work := func(_ context.Context, lease *Lease) error { degraded = append(degraded, lease.Degraded()); return nil }
	require.NoError(t, l.RunWithLock(ctx, name, work))
	e.srvs[1].Kill()
	require.NoError(t, l.RunWithLock(ctx, name, work))
	assert.Equal(t, []bool{false, true}, degraded, "a minority down is not an outage; a majority down is")
}

func TestRedlockReleaseReachesSlowNodes(t *testing.T) {
	// Node 2 answers 200ms late: the lease is granted by nodes 0 and 1
	// while node 2's grant is in flight, and released at once. Node 2 must
	// not keep the lock.
	e := newRedlockEnv(t, 2, nil)
	slow := redistest.Start(t)
	proxy := redistest.StartProxy(t, slow.Addr)
	slowClient := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	t.Cleanup(func() { _ = slowClient.Close() })
	require.NoError(t, slowClient.Ping(ctx).Err()) // connected before the latency
	proxy.SetLatency(100 * time.Millisecond)
	l, err := NewRedlock([]redis.UniversalClient{e.clients[0], e.clients[1], slowClient}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	admin := slow.Client(nil)

	for range 3 {
		lease, err := l.Acquire(ctx, uniqueName(t))
		require.NoError(t, err)
		require.NoError(t, lease.Release(ctx))
		// The slow node's grant and release arrive in either order, each
		// after a few of its 200ms round trips (a new connection, NOSCRIPT).
		assert.Eventually(t, func() bool {
			n, err := admin.Exists(ctx, lease.Key()).Result()
			return err == nil && n == 0
		}, 3*time.Second, 10*time.Millisecond, "the slow node does not keep the lock")
	}
}

func TestRedlockMinorityHungKeepsDeadlines(t *testing.T) {
	// A hung node's calls wait ReadTimeout, 30s: ten times the TTL. A call
	// that waited for it would outlast the lease; the bounds below are
	// fractions of it, which a busy machine does not reach (with go-redis's
	// 3s, a TTL of 600ms and "acquired within 300ms", it could).
	const hang, ttl = 30 * time.Second, 3 * time.Second
	e := newRedlockEnv(t, 3, &redis.Options{ReadTimeout: hang})
	l := e.locker(t, &Options{TTL: ttl})
	e.srvs[2].Pause()
	t.Cleanup(e.srvs[2].Resume)
	start := time.Now()
	err := l.RunWithLock(ctx, uniqueName(t), func(ctx context.Context, lease *Lease) error {
		assert.Less(t, time.Since(start), hang/3, "acquired without waiting for the hung node")
		time.Sleep(ttl + ttl/2) // renewed by the two other nodes
		return ctx.Err()
	})
	require.NoError(t, err)
	assert.Less(t, time.Since(start), ttl+ttl/2+hang/3, "released without waiting for the hung node")
}

func TestRedlockInspect(t *testing.T) {
	e := newRedlockEnv(t, 3, nil)
	l := e.locker(t, &Options{Owner: "pod-1"})
	name := uniqueName(t)
	before := time.Now()
	lease, err := l.Acquire(ctx, name, WithTTL(10*time.Second))
	require.NoError(t, err)
	info, err := l.Inspect(ctx, name)
	require.NoError(t, err)
	assert.True(t, info.Held)
	assert.Equal(t, "pod-1", info.Owner)
	assert.Equal(t, lease.Fence(), info.Fence)
	assert.Equal(t, lease.Fence(), info.LastFence)
	assertTTLLeft(t, info.TTL, 10*time.Second, before)
	ttl, err := lease.TTL(ctx)
	require.NoError(t, err)
	assertTTLLeft(t, ttl, 10*time.Second, before)

	// Held on a minority only: not held.
	require.NoError(t, e.admins[0].Del(ctx, lease.Key()).Err())
	require.NoError(t, e.admins[1].Del(ctx, lease.Key()).Err())
	info, err = l.Inspect(ctx, name)
	require.NoError(t, err)
	assert.False(t, info.Held, "one node of three is not a quorum")
	_, err = lease.TTL(ctx)
	assert.ErrorIs(t, err, ErrNotHeld)
	_ = lease.Release(ctx)
}

func TestRedlockInspectReportsTheFenceMostHoldersStore(t *testing.T) {
	// Four of five nodes hold the lock for one token; they store two
	// fences (a node that granted after the quorum stores its own until
	// the lease's is written there). Inspect reports the one most of them
	// store, the larger on a tie.
	e := newRedlockEnv(t, 5, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	key, _ := l.keys(name)
	for _, tc := range []struct {
		fences []int64 // per node; 0: not held there
		want   int64
	}{
		{[]int64{7, 9, 7, 9, 0}, 9},
		{[]int64{9, 7, 9, 7, 0}, 9},
		{[]int64{7, 7, 9, 7, 0}, 7},
		{[]int64{0, 9, 7, 7, 7}, 7},
	} {
		for i, f := range tc.fences {
			if f == 0 {
				require.NoError(t, e.admins[i].Del(ctx, key).Err())
				continue
			}
			require.NoError(t, e.admins[i].Set(ctx, key, "tok "+strconv.FormatInt(f, 10)+" pod", time.Minute).Err())
		}
		info, err := l.Inspect(ctx, name)
		require.NoError(t, err)
		require.True(t, info.Held)
		assert.Equal(t, tc.want, info.Fence, "fences %v", tc.fences)
	}
}

func TestRedlockInspectNeedsAQuorumOfAnswers(t *testing.T) {
	// Two nodes of three hung: one answer cannot say whether a quorum
	// holds the lock, so Inspect is unavailable (by ReleaseTimeout), not
	// "not held".
	e := newRedlockEnv(t, 3, nil)
	l := e.locker(t, &Options{ReleaseTimeout: 200 * time.Millisecond})
	name := uniqueName(t)
	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	e.srvs[1].Pause()
	e.srvs[2].Pause()
	t.Cleanup(e.srvs[1].Resume)
	t.Cleanup(e.srvs[2].Resume)
	start := time.Now()
	_, err = l.Inspect(ctx, name)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "1 of 3 nodes answered, 2 needed")
	assert.Less(t, time.Since(start), time.Second, "bounded by ReleaseTimeout")
	e.srvs[1].Resume()
	e.srvs[2].Resume()
	require.NoError(t, lease.Release(ctx))
}

// A lease held on a bare quorum {0, 1, 4} (common under contention), then
// node 4 dies: 4 of 5 nodes are up and the holder still believes it holds
// the lock. Another Locker with FailOpen is refused by nodes 0 and 1 (busy),
// granted 2 and 3, and cannot reach 4: a quorum of nodes answered, so this
// is busy, not an outage, and FailOpen must not run the work.
func TestRedlockFailOpenNotWithAQuorumUp(t *testing.T) {
	e := newRedlockEnv(t, 5, &redis.Options{MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	name := uniqueName(t)
	l := e.locker(t, &Options{FailOpen: true})
	key, _ := l.keys(name)
	for _, i := range []int{0, 1, 4} { // the holder's bare quorum
		require.NoError(t, e.admins[i].Set(ctx, key, "holder-token 42", 30*time.Second).Err())
	}
	e.srvs[4].Kill()

	ran, degraded := false, false
	err := l.RunWithLock(ctx, name, func(_ context.Context, lease *Lease) error {
		ran, degraded = true, lease.Degraded()
		return nil
	})
	require.False(t, ran, "FailOpen ran the work (degraded %v) with 4 of 5 nodes up and the lock held by another", degraded)
	require.ErrorIs(t, err, ErrNotObtained)
}

// A node restarted empty is put back at a renewal also when its reply comes
// after the quorum's: here it is 5ms farther away than the others (another
// zone).
func TestRedlockRenewalRepairsAFarNode(t *testing.T) {
	var srvs []*redistest.Server
	var clients []redis.UniversalClient
	var admins []*redis.Client
	var far *redistest.Proxy
	for i := range 5 {
		s := redistest.Start(t)
		srvs = append(srvs, s)
		admins = append(admins, s.Client(nil))
		addr := s.Client(nil).Options().Addr
		if i == 4 {
			far = redistest.StartProxy(t, addr)
			far.SetLatency(5 * time.Millisecond)
			addr = far.Addr
		}
		c := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	l, err := NewRedlock(clients, &Options{TTL: 600 * time.Millisecond}) // renewed every 200ms
	require.NoError(t, err)
	defer l.Close()
	lease, err := l.Acquire(ctx, uniqueName(t))
	require.NoError(t, err)
	defer lease.Release(ctx)
	work := lease.KeepAlive(ctx)
	holds := func(i int) bool {
		v, err := admins[i].Get(ctx, lease.Key()).Result()
		return err == nil && len(v) > len(lease.Token()) && v[:len(lease.Token())] == lease.Token()
	}
	require.Eventually(t, func() bool { return holds(4) }, time.Second, time.Millisecond, "the far node holds the lock")
	srvs[4].Restart()
	time.Sleep(2 * time.Second) // 10 renewals
	require.NoError(t, work.Err())
	require.True(t, holds(4), "the far node restarted empty got the lock back at a renewal")
}

// A lease granted on 4 of 5 nodes (the 5th still held by a previous holder
// whose release had not reached it yet) keeps the lock when 2 of its 4
// nodes hang: the 5th node has become free, and a renewal takes it while
// the lease still holds a quorum, so 3 nodes hold it.
func TestRedlockRenewalTakesAFreeNode(t *testing.T) {
	e := newRedlockEnv(t, 5, &redis.Options{MaxRetries: -1, DialTimeout: 100 * time.Millisecond, ContextTimeoutEnabled: true})
	l := e.locker(t, &Options{TTL: 600 * time.Millisecond}) // renewed every 200ms
	name := uniqueName(t)
	key, _ := l.keys(name)
	// The previous holder's lock is still on node 4, for 100ms more.
	require.NoError(t, e.admins[4].Set(ctx, key, "previous-holder 1", 100*time.Millisecond).Err())
	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	defer lease.Release(ctx)
	work := lease.KeepAlive(ctx)
	e.srvs[0].Pause() // two of the lease's four nodes hang
	e.srvs[1].Pause()
	defer e.srvs[0].Resume()
	defer e.srvs[1].Resume()
	time.Sleep(1500 * time.Millisecond)
	// Nodes 2, 3 (the lease's) and 4 (free since 100ms after the acquire)
	// answer: a quorum of reachable nodes where nobody else holds the lock.
	require.NoError(t, work.Err(), "lease lost with a minority hung: %v", context.Cause(work))
}

// Kleppmann's double grant on 3 nodes: A holds {0, 1} (node 2 unreachable
// for A), node 1 is restarted empty, B acquires {1, 2}. A's work returns
// before its deadline: its Release finds the lock on node 0 only, fewer than
// a quorum, and RunWithLock reports the loss.
func TestRedlockReleaseReportsADoubleGrant(t *testing.T) {
	e := newRedlockEnv(t, 3, &redis.Options{MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	unreachable := errors.New("node 2 unreachable from A")
	e.hooks[2].set(func(context.Context, redis.Cmder) error { return unreachable }, nil)
	// A's first renewal comes at a third of its TTL: had it come before B
	// took nodes 1 and 2, it would have taken node 1 back (a renewal repairs
	// a node that lost the lock), and B, waiting inside A's work, would
	// never have got a quorum. With 3s, a loaded machine's B was slower
	// than that second. B waits redlockPatience, a third of A's TTL.
	a := e.locker(t, &Options{TTL: 3 * redlockPatience})

	var clients []redis.UniversalClient
	for _, s := range e.srvs {
		clients = append(clients, s.Client(&redis.Options{MaxRetries: -1}))
	}
	b, err := NewRedlock(clients, nil)
	require.NoError(t, err)
	defer b.Close()

	name := uniqueName(t)
	var bFence int64
	// WithWait: a first attempt that a loaded machine fails (A dials with a
	// 100ms timeout) is tried again; it changes nothing else here.
	err = a.RunWithLock(ctx, name, func(ctx context.Context, lease *Lease) error {
		e.srvs[1].Restart() // A's lock lost on node 1: A now holds {0} only
		bl, err := b.Acquire(ctx, name, WithWait(redlockPatience))
		require.NoError(t, err, "B gets {1, 2}: a quorum")
		bFence = bl.Fence()
		return nil // A's work returns before its first renewal
	}, WithWait(redlockPatience))
	require.NotZero(t, bFence, "A's work did not run: %v", err)
	// B held a quorum while A's work ran: mutual exclusion was broken.
	require.ErrorIs(t, err, ErrLost, "A's RunWithLock reports the loss")
}

// heldElsewhere makes nodes hold the lock at key for another token, and
// returns a hook for those nodes' clients that gives the lock back on all
// of them, once, when each has answered a grant script (busy, then).
func (e *redlockEnv) heldElsewhere(t *testing.T, key string, nodes ...int) func(context.Context, redis.Cmder) error {
	t.Helper()
	for _, i := range nodes {
		require.NoError(t, e.admins[i].Set(ctx, key, "another 1 someone", time.Minute).Err())
	}
	var answered atomic.Int64
	return func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "redlock_grant" {
			if answered.Add(1) == int64(len(nodes)) {
				for _, i := range nodes {
					assert.NoError(t, e.admins[i].Del(ctx, key).Err()) // not require: a node's goroutine
				}
			}
		}
		return nil
	}
}

func TestRedlockFirstNodeDecidesASplit(t *testing.T) {
	// An attempt that got the first node and one other finds the other
	// three held by another (a release on its way, an attempt that lost the
	// first node and gives them back). It asks those three again, shortly
	// after, and gets them: a split ends with a winner. Before, the attempt
	// gave up, and neither side held the lock.
	e := newRedlockEnv(t, 5, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	key := "lock:{" + name + "}"
	giveBack := e.heldElsewhere(t, key, 2, 3, 4)
	for i := 2; i < 5; i++ {
		e.hooks[i].set(nil, giveBack)
	}
	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err, "asked again, nodes 2-4 grant it")
	assert.Equal(t, 5, e.holders(t, key, lease.Token()))
	require.NoError(t, lease.Release(ctx))
}

func TestRedlockOnlyTheFirstNodesHolderAsksAgain(t *testing.T) {
	// The same split, with the first node held by another: the attempt does
	// not ask again (had it, nodes 1-4 would have made a quorum), so that
	// two attempts of a split never both hold on; it gives back what it got.
	e := newRedlockEnv(t, 5, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	key := "lock:{" + name + "}"
	require.NoError(t, e.admins[0].Set(ctx, key, "another 1 someone", time.Minute).Err())
	giveBack := e.heldElsewhere(t, key, 3, 4)
	var grants [5]atomic.Int64
	for i, h := range e.hooks {
		h.set(nil, func(c context.Context, cmd redis.Cmder) error {
			if scriptName(cmd) == "redlock_grant" {
				grants[i].Add(1)
			}
			if i >= 3 {
				return giveBack(c, cmd)
			}
			return nil
		})
	}
	_, err := l.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrNotObtained)
	for i := range grants {
		assert.Equal(t, int64(1), grants[i].Load(), "node %d: one grant, not asked again", i)
	}
	require.Eventually(t, func() bool {
		n := 0
		for _, a := range e.admins {
			n += int(a.Exists(ctx, key).Val())
		}
		return n == 1
	}, 5*time.Second, 10*time.Millisecond,
		"nodes 1 and 2 given back: only node 0 (another's) holds it")
}

func TestRedlockSplitAskedAgainCleansUpWhatItCannotSee(t *testing.T) {
	// Asked again, node 2 grants the lock but its answer never comes (the
	// call ends at its timeout); nodes 3 and 4 stay held. The attempt gets
	// no quorum, and gives back nodes 0, 1 and 2: the grant it did not see
	// too.
	e := newRedlockEnv(t, 5, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	key := "lock:{" + name + "}"
	for i := 2; i < 5; i++ {
		require.NoError(t, e.admins[i].Set(ctx, key, "another 1 someone", time.Minute).Err())
	}
	// Only an attempt that holds the first node asks again: the busy
	// answers come after nodes 0 and 1 granted it (and redlock.MaxGrace after, for
	// their goroutines to hand the grants on; see firstNodeFirst), not
	// before, whatever the order the machine runs the calls in. And the
	// calls asked again get twice the nodes' answer time, at least 5ms, to
	// reach node 2: as if the nodes had answered in 100ms lately (the
	// attempt's own answers move that average by an eighth), so that they
	// get there on a busy machine too.
	l.store.(*redlock.Quorum).SetAnswerTime(100 * time.Millisecond)
	var firstTwo sync.WaitGroup
	firstTwo.Add(2)
	for i := range 2 {
		var once sync.Once
		e.hooks[i].set(nil, func(_ context.Context, cmd redis.Cmder) error {
			if scriptName(cmd) == "redlock_grant" {
				once.Do(firstTwo.Done)
			}
			return nil
		})
	}
	var grants atomic.Int64
	e.hooks[2].set(nil, func(c context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) != "redlock_grant" {
			return nil
		}
		if grants.Add(1) == 1 {
			firstTwo.Wait()
			time.Sleep(redlock.MaxGrace)
			assert.NoError(t, e.admins[2].Del(ctx, key).Err()) // free when asked again
			return nil
		}
		<-c.Done() // granted, and the answer lost
		return c.Err()
	})
	for i := 3; i < 5; i++ {
		var once sync.Once
		e.hooks[i].set(nil, func(_ context.Context, cmd redis.Cmder) error {
			if scriptName(cmd) == "redlock_grant" {
				once.Do(func() { firstTwo.Wait(); time.Sleep(redlock.MaxGrace) })
			}
			return nil
		})
	}
	_, err := l.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrNotObtained)
	assert.GreaterOrEqual(t, grants.Load(), int64(2), "node 2 asked again")
	require.Eventually(t, func() bool {
		for i, a := range e.admins {
			if n := a.Exists(ctx, key).Val(); n != map[bool]int64{true: 1, false: 0}[i >= 3] {
				return false
			}
		}
		return true
	}, redlockPatience, 10*time.Millisecond, "nodes 0-2 given back, 3 and 4 still another's")
}

func TestRedlockTurnIsAnnouncedToItsLockerAlone(t *testing.T) {
	// Two waiters, each a process of its own, in line. A release names the
	// first on its Locker's own channel: the other Locker's connection, and
	// everyone on the lock's channel, hear nothing. Before, every Locker
	// waiting for the lock heard every turn: eight waiters, eight messages
	// and wake-ups per release, instead of one.
	e := newRedlockEnv(t, 3, nil)
	_, name, held := e.holding(t)
	var lockers []*Locker
	var waiters []*holder
	for i := range 2 {
		wl, _ := e.process(t, namedOnly)
		lockers = append(lockers, wl)
		waiters = append(waiters, waitAndHold(ctx, wl, name))
		e.requireLine(t, held.Key(), i+1, "waiter %d joins the line", i)
	}
	channels := []string{held.Key(), held.Key() + ":n:" + lineTag(lockers[0]), held.Key() + ":n:" + lineTag(lockers[1])}
	for i, ch := range channels[1:] {
		e.requireSubscribers(t, 0, ch, 1, "waiter "+strconv.Itoa(i)+"'s Locker listens on its own channel")
	}
	sub := e.admins[0].SSubscribe(ctx, channels...)
	defer sub.Close()
	for range channels {
		_, err := sub.Receive(ctx) // confirmations
		require.NoError(t, err)
	}
	require.NoError(t, held.Release(ctx))
	first := waiters[0].obtained(t, redlockPatience, "woken by name")
	msg, err := sub.ReceiveTimeout(ctx, redlockPatience) // sent before the waiter could have the lock
	require.NoError(t, err)
	m, ok := msg.(*redis.Message)
	require.True(t, ok, "a message: %v", msg)
	assert.Equal(t, channels[1], m.Channel, "on the named call's Locker's channel")
	assert.Equal(t, "next "+first.h.(interface{ Line() string }).Line(), m.Payload)
	_, err = sub.ReceiveTimeout(ctx, 200*time.Millisecond)
	assert.Error(t, err, "nothing else: not on the lock's channel, not to the other Locker")
	e.heldOn(t, 0, first) // a release that reached node 0 before its late grant would name no one there
	waiters[0].finish(t)
	waiters[1].obtained(t, redlockPatience, "the second's turn, on its channel")
	waiters[1].finish(t)
}

func TestRedlockSplitAskedAgainSlowlyIsStillBusy(t *testing.T) {
	// Nodes 1 and 2 are held by another, and answer a grant asked again too
	// late. They said busy, and nothing since: the lock is held, not
	// unavailable (1 of 3 nodes did not become an outage), and FailOpen
	// does not run the work without it.
	e := newRedlockEnv(t, 3, nil)
	name := uniqueName(t)
	key := "lock:{" + name + "}"
	for i := 1; i < 3; i++ {
		require.NoError(t, e.admins[i].Set(ctx, key, "another 1 someone", time.Minute).Err())
		var grants atomic.Int64
		e.hooks[i].set(nil, func(_ context.Context, cmd redis.Cmder) error {
			if scriptName(cmd) == "redlock_grant" && grants.Add(1) > 1 {
				time.Sleep(50 * time.Millisecond) // the answer comes after the attempt stopped waiting
			}
			return nil
		})
	}
	l := e.locker(t, nil)
	_, err := l.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrNotObtained)
	assert.NotErrorIs(t, err, ErrUnavailable)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)

	open := e.locker(t, &Options{FailOpen: true})
	ran := false
	err = open.RunWithLock(ctx, name, func(context.Context, *Lease) error { ran = true; return nil })
	require.ErrorIs(t, err, ErrNotObtained)
	assert.False(t, ran, "the work did not run without the lock")
	require.Eventually(t, func() bool { return e.admins[0].Exists(ctx, key).Val() == 0 }, 5*time.Second, 10*time.Millisecond,
		"node 0 given back")
}

func TestRedlockOutOfLineWaiterHearsItsTurn(t *testing.T) {
	// A waiter whose first busy answer came without the first node (its
	// call there failed) waits out of line, on every node; its later
	// attempts join the first node's line, and its turn is named on its
	// Locker's channel there, which it listens to as well. Without it, a
	// turn named before the other nodes' releases wake it is lost, and the
	// line behind it waits for a pause.
	e := newRedlockEnv(t, 3, nil)
	_, name, held := e.holding(t)
	wl, hooks := e.process(t, slowPolling)
	var first atomic.Bool
	hooks[0].set(func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == "redlock_grant" && first.CompareAndSwap(false, true) {
			return errors.New("node 0 unreachable, once")
		}
		return nil
	}, nil)
	h := waitAndHold(ctx, wl, name)
	for i := range 3 {
		e.requireSubscribers(t, i, held.Key(), 1, "out of line: on every node's channel")
	}
	e.requireSubscribers(t, 0, held.Key()+":n:"+lineTag(wl), 1, "and on its turn channel on node 0")
	require.NoError(t, held.Release(ctx))
	h.obtained(t, 5*time.Second, "woken by the release")
	h.finish(t)
}

func TestRedlockSplitAskedAgainOnlyWithinHalfTheValidity(t *testing.T) {
	// The split of TestRedlockFirstNodeDecidesASplit with a 10ms TTL: half
	// the validity (3.95ms) leaves no room for a pause and an answer's
	// timeout (5ms at least), so the attempt does not ask again, and gives
	// up at once.
	e := newRedlockEnv(t, 5, nil)
	l := e.locker(t, nil)
	for range 3 { // scripts loaded, the time a quorum takes to answer learnt
		warm, err := l.Acquire(ctx, uniqueName(t)+"-warm-up")
		require.NoError(t, err)
		require.NoError(t, warm.Release(ctx))
	}
	name := uniqueName(t)
	key := "lock:{" + name + "}"
	giveBack := e.heldElsewhere(t, key, 2, 3, 4)
	var grants atomic.Int64
	for i := 2; i < 5; i++ {
		e.hooks[i].set(nil, func(c context.Context, cmd redis.Cmder) error {
			if scriptName(cmd) == "redlock_grant" {
				grants.Add(1)
			}
			return giveBack(c, cmd)
		})
	}
	_, err := l.Acquire(ctx, name, WithTTL(10*time.Millisecond))
	require.ErrorIs(t, err, ErrNotObtained)
	assert.Equal(t, int64(3), grants.Load(), "nodes 2-4 asked once")
}

// countGrants counts the grant scripts answered through hooks.
func countGrants(hooks []*faultHook) *atomic.Int64 {
	var n atomic.Int64
	for _, h := range hooks {
		h.set(nil, func(_ context.Context, cmd redis.Cmder) error {
			if scriptName(cmd) == "redlock_grant" {
				n.Add(1)
			}
			return nil
		})
	}
	return &n
}

func TestRedlockFirstNodeAsksAgainAtMostThreeTimes(t *testing.T) {
	// Nodes 2-4 stay held by another: the attempt that got nodes 0 and 1
	// asks them again three times, then gives up (ErrNotObtained) and
	// gives back what it got.
	e := newRedlockEnv(t, 5, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	key := "lock:{" + name + "}"
	for i := 2; i < 5; i++ {
		require.NoError(t, e.admins[i].Set(ctx, key, "another 1 someone", time.Minute).Err())
	}
	grants := countGrants(e.hooks[2:])
	_, err := l.Acquire(ctx, name)
	require.ErrorIs(t, err, ErrNotObtained)
	assert.Equal(t, int64(3*(1+3)), grants.Load(), "nodes 2-4: one grant, then three asked again")
	require.Eventually(t, func() bool {
		return e.admins[0].Exists(ctx, key).Val()+e.admins[1].Exists(ctx, key).Val() == 0
	}, 5*time.Second, 10*time.Millisecond, "nodes 0 and 1 given back")
}

func TestRedlockUntaggedTurnIsNamedOnTheLocksChannel(t *testing.T) {
	// A line id without a Locker's tag (written by an earlier version) is
	// named on the lock's channel, where every waiting Locker listens.
	e := newRedlockEnv(t, 3, nil)
	_, _, held := e.holding(t)
	key := held.Key()
	require.NoError(t, e.admins[0].ZAdd(ctx, key+":q", redis.Z{Score: 1, Member: "a"}).Err())
	require.NoError(t, e.admins[0].HSet(ctx, key+":qi", "a", time.Now().Add(time.Minute).UnixMilli()).Err())
	sub := e.admins[0].SSubscribe(ctx, key)
	defer sub.Close()
	_, err := sub.Receive(ctx) // confirmation
	require.NoError(t, err)
	require.NoError(t, held.Release(ctx))
	msg, err := sub.ReceiveTimeout(ctx, 2*time.Second)
	require.NoError(t, err)
	m, ok := msg.(*redis.Message)
	require.True(t, ok, "a message: %v", msg)
	assert.Equal(t, "next a", m.Payload)
}

// A hung minority holds up no read: with 1 of 5 nodes stopped, Inspect and
// Lease.TTL return once a quorum has answered and the healthy rest has had
// a round trip's grace, not after ReleaseTimeout (5s), and succeed under a
// 1s deadline. The bounds are generous: the bug took 5s or the deadline.
func TestRedlockHungNodeHoldsUpNoRead(t *testing.T) {
	e := newRedlockEnv(t, 5, nil)
	l := e.locker(t, nil)
	name := uniqueName(t)
	lease, err := l.Acquire(ctx, name, WithTTL(time.Minute))
	require.NoError(t, err)
	e.heldEverywhere(t, lease)
	e.srvs[4].Pause()
	t.Cleanup(e.srvs[4].Resume)

	for _, deadline := range []time.Duration{0, time.Second} {
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if deadline > 0 {
			cctx, cancel = context.WithTimeout(ctx, deadline)
		}
		start := time.Now()
		info, err := l.Inspect(cctx, name)
		elapsed := time.Since(start)
		require.NoError(t, err, "Inspect, deadline %v", deadline)
		assert.Less(t, elapsed, 900*time.Millisecond, "Inspect, deadline %v", deadline)
		assert.True(t, info.Held)
		assert.Equal(t, lease.Fence(), info.Fence)
		assert.Equal(t, lease.Fence(), info.LastFence)

		start = time.Now()
		ttl, err := lease.TTL(cctx)
		elapsed = time.Since(start)
		require.NoError(t, err, "TTL, deadline %v", deadline)
		assert.Less(t, elapsed, 900*time.Millisecond, "TTL, deadline %v", deadline)
		assert.Greater(t, ttl, 30*time.Second)
		cancel()
	}
}

// When Extend or Release returns with every node healthy, every node has
// already applied it: the calls wait a round trip's grace for the nodes
// after the quorum. Node 2 answers 2ms later than the others (1ms each
// way), so a call that returned at the quorum would leave it behind every
// time.
func TestRedlockHealthyNodesAgreeWhenACallReturns(t *testing.T) {
	e := newRedlockEnv(t, 3, nil)
	proxy := redistest.StartProxy(t, e.srvs[2].Addr)
	proxy.SetLatency(time.Millisecond)
	slow := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	t.Cleanup(func() { _ = slow.Close() })
	// replied[n] is when node n last answered a script, as its client read
	// the answer.
	var mu sync.Mutex
	var replied [3]time.Time
	slowHook := &faultHook{}
	slow.AddHook(slowHook)
	for n, h := range []*faultHook{e.hooks[0], e.hooks[1], slowHook} {
		h.set(nil, func(_ context.Context, cmd redis.Cmder) error {
			if scriptName(cmd) != "" {
				mu.Lock()
				replied[n] = time.Now()
				mu.Unlock()
			}
			return nil
		})
	}
	l, err := NewRedlock([]redis.UniversalClient{e.clients[0], e.clients[1], slow}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	name := uniqueName(t)
	// A first round loads the scripts on node 2 and dials its connections:
	// a call's first use of a script there takes two round trips more.
	warm, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	require.NoError(t, warm.Extend(ctx, time.Minute))
	require.NoError(t, warm.Release(ctx))
	require.Eventually(t, func() bool { return e.holders(t, warm.Key(), warm.Token()) == 0 },
		redlockPatience, time.Millisecond, "released on every node")

	// agree checks, for a call that started at start and returned at
	// returned, that every node applied it (done), or else that the call
	// waited the least grace it gives the others (quorumGrace, redlock.MinGrace)
	// after a quorum answered. A node that answered within it may still
	// have been left out, when the machine paused its goroutine between
	// reading the answer and handing it on (then the round proves less,
	// and says so); without the grace, the call returns at the quorum's
	// answers, and the 1ms node has not applied it yet.
	strict := 0
	agree := func(round int, call string, start, returned time.Time, done func(n int) bool) {
		t.Helper()
		var late []int
		for n := range e.admins {
			if !done(n) {
				late = append(late, n)
			}
		}
		if len(late) == 0 {
			strict++
			return
		}
		var times [3]time.Time
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			times = replied
			return !times[0].Before(start) && !times[1].Before(start) && !times[2].Before(start)
		}, redlockPatience, time.Millisecond, "round %d: every node answers the %s", round, call)
		quorum := slices.SortedFunc(slices.Values(times[:]), time.Time.Compare)[1]
		waited := returned.Sub(quorum)
		assert.GreaterOrEqual(t, waited, redlock.MinGrace, "round %d: nodes %v had not applied the %s when it returned, "+
			"%v after a quorum answered", round, late, call, waited)
		for _, n := range late {
			t.Logf("round %d: node %d had not applied the %s, which returned %v after a quorum answered and %v before it did",
				round, n, call, waited, times[n].Sub(returned))
		}
	}

	for i := range 20 {
		lease, err := l.Acquire(ctx, name, WithTTL(10*time.Second))
		require.NoError(t, err, "round %d", i)
		require.Eventually(t, func() bool { return e.holders(t, lease.Key(), lease.Token()) == 3 },
			redlockPatience, time.Millisecond, "round %d: held on every node", i)

		start := time.Now()
		require.NoError(t, lease.Extend(ctx, time.Minute), "round %d", i)
		agree(i, "extend", start, time.Now(), func(n int) bool {
			pttl, err := e.admins[n].PTTL(ctx, lease.Key()).Result()
			require.NoError(t, err)
			return pttl > 30*time.Second
		})

		start = time.Now()
		require.NoError(t, lease.Release(ctx), "round %d", i)
		agree(i, "release", start, time.Now(), func(n int) bool {
			v, err := e.admins[n].Exists(ctx, lease.Key()).Result()
			require.NoError(t, err)
			return v == 0
		})
		if t.Failed() {
			break
		}
	}
	t.Logf("%d of 40 calls returned with every node applied", strict)
}
